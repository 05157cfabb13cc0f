"""What one pass will do, decided once: ``decide(readings, config) -> Decision``. Pure.

The reconcile pass reads everything into one ``Readings`` value (``vultrscale.read``), hands it
here, and carries out the ``Decision`` it gets back step by step (``vultrscale.apply``), asking
nothing more and deciding nothing more. The decision holds:

- the steps of the pass, typed and in the order that keeps a kill safe: ledger transitions and
  adoptions, the draining flag for workers of draining instances, each drain verdict (a delete
  started, a wait, an error, the stop sent again), the deletes earlier passes began, then the
  plan's replacements and scale-in (the draining mark before the SSH stop), the revives (the
  ledger row running before the SSH start), the creates (with their count and price) and what
  the fleet remembers for the next pass;
- what the pass saw (``Observation``) and sized (``Plan``), the errors it reports, whether a
  refused plan or price stops it before any change or only stops its creates;

and ``next_change(config, decision)`` says the first moment the same observation
could be decided differently, as each rule times itself (a floor starting or ending, a
cool-down or the idle window ending, a paid hour, a drain deadline, a boot timeout, a new UTC
hour for the budget).

The rules live in ``lifecycle`` (an instance's states and drain verdicts), ``policy`` (the
size of the fleet) and ``budget``; this module joins them into the pass's one answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from vultrscale.config import Config
from vultrscale.core import boottime
from vultrscale.core.model import (
    ActionKind,
    FleetState,
    HostTarget,
    Instance,
    InstanceState,
    LedgerRow,
    Observation,
    Plan,
    PlanPrice,
    ServiceState,
    frozen_from,
)
from vultrscale.rules import budget, lifecycle, offerings, policy
from vultrscale.rules.lifecycle import Transition, Verdict
from vultrscale.rules.offerings import Choice, OfferingView
from vultrscale.rules.readings import Readings

if TYPE_CHECKING:
    from vultrscale.vultr.models import VInstance


# --- the steps ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class UpdateAddress:
    """Same state, a new address: the ledger learns it."""

    label: str
    main_ip: str | None
    internal_ip: str | None


@dataclass(frozen=True, slots=True)
class Adopt:
    """A tagged instance the ledger did not know: insert its row, billed at ``price``."""

    label: str
    note: str
    instance_id: str
    state: InstanceState
    plan: str
    region: str
    created_at: datetime
    price: PlanPrice | None  # its own plan's, else the fleet's; None: neither is known


@dataclass(frozen=True, slots=True)
class Move:
    """A ledger row moves to ``state`` (what the cloud shows: a boot, an instance gone)."""

    label: str
    note: str
    state: InstanceState
    instance_id: str | None = None  # learnt from the cloud; None: unchanged
    main_ip: str | None = None
    internal_ip: str | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class FlagWorkersDraining:
    """The workers of draining instances are told to claim nothing (one restarted, or first
    started, after its drain began would claim again)."""

    labels: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Note:
    """A result to record, no port touched: a drain waiting, a drain with no SSH target."""

    label: str
    text: str


@dataclass(frozen=True, slots=True)
class Fail:
    """An instance's error to report (the pass ends with exit 1), no port touched."""

    label: str
    text: str


@dataclass(frozen=True, slots=True)
class StartDelete:
    """Mark the row deleting, then DELETE the instance (a drained one, or one stuck in boot)."""

    label: str
    instance_id: str | None
    why: str


@dataclass(frozen=True, slots=True)
class RetryDelete:
    """DELETE again an instance an earlier pass began deleting (locked then, or unverified)."""

    label: str
    instance_id: str | None


@dataclass(frozen=True, slots=True)
class MarkDraining:
    """Scale-in: the row and its worker draining, before any stop is sent (kill-safe)."""

    label: str


@dataclass(frozen=True, slots=True)
class Stop:
    """`systemctl stop --no-block` on each target. ``first``: a drain starting now (recorded
    as such); otherwise the stop sent again to a worker still active."""

    targets: tuple[HostTarget, ...]
    first: bool


@dataclass(frozen=True, slots=True)
class Revive:
    """Start a draining instance's worker again instead of booting a new one (its delete not
    sent). Carried out in this order, each step safe to be the last a killed pass did:

    1. the ledger row back to running (``draining_at`` cleared) and its workers' draining flag
       cleared, in one transaction. First, because a worker process registers with the flag
       its instance's row gives it (``db.queue.register_worker``): started before this, it
       would register draining and claim nothing for the rest of its life. Killed here, the
       row is running without a worker: the next pass sees the worker not seen and moves it
       to booting, where it is capacity for ``boot_timeout`` and then replaced (it holds no
       lease): a late create, never a lost job, and no second drain of it is needed;
    2. `systemctl start --no-block` over the instance's pinned SSH (``DrainTransport.
       start_many``). It returns at once: a worker still deactivating starts again once its
       drain has ended (``lifecycle.REVIVABLE``). A refusal is the instance's error; the row
       goes back to draining, marked never to be revived again (``LedgerRow.never_revive``,
       ``apply._start``), and the next pass creates in its place;
    3. the fleet state (``SaveFleetState``): the revive counts as the pass's scale-up, for the
       down cool-down. Killed before it, only that damping is lost: the idle window still
       guards a second drain."""

    label: str
    target: HostTarget
    reason: str


@dataclass(frozen=True, slots=True)
class Create:
    """``count`` new instances, each intent written right before its POST, on the usable
    offerings in order of preference (``choices``, each at its plan's price and bounded by
    the budget at it): a create refused for an offering goes on with the next. ``plan``,
    ``region`` and ``price`` are the first choice's. The reason is the plan's."""

    count: int
    plan: str
    region: str
    price: PlanPrice
    reason: str
    choices: tuple[Choice, ...] = ()


@dataclass(frozen=True, slots=True)
class SaveFleetState:
    """What the next pass must remember. The last scale-up is the pass's time when a create
    was accepted (the outcome decides it), else ``before``'s; nothing is written when all
    three stay as they were."""

    before: FleetState
    last_scale_down: datetime | None
    idle_since: datetime | None


Step = (
    UpdateAddress
    | Adopt
    | Move
    | FlagWorkersDraining
    | Note
    | Fail
    | StartDelete
    | RetryDelete
    | MarkDraining
    | Stop
    | Revive
    | Create
    | SaveFleetState
)
# The steps that leave the world as it was: a pass of only these is steady.
_SILENT = (Note, Fail)


@dataclass(frozen=True, slots=True)
class Decision:
    """Everything a pass will do and why: the one value ``apply`` carries out."""

    now: datetime  # the pass's time: every step is done as of it
    steps: tuple[Step, ...]
    observation: Observation
    plan: Plan
    errors: tuple[str, ...]  # reported by the pass before it acts (exit 1, or 2 if refused)
    refused: bool  # the plan or price refused: no create, and the pass ends with exit 2
    refused_outright: bool  # ... with nothing to wind down: stop before any change
    rows: Mapping[str, LedgerRow]  # the ledger as the transitions, verdicts and revives leave it
    offerings: tuple[OfferingView, ...] = ()  # each offering usable or skipped, and why
    misconfigured: bool = False  # the queue preset does not match the database: exit 2

    @property
    def creates(self) -> int:
        return sum(s.count for s in self.steps if isinstance(s, Create))

    @property
    def steady(self) -> bool:
        """Nothing to carry out: no port would be asked to change anything."""
        return all(isinstance(s, _SILENT) for s in self.steps)


# --- pure helpers ------------------------------------------------------------------------------


def target(cfg: Config, row: LedgerRow, v: VInstance | None) -> HostTarget | None:
    """Where to reach an instance's worker over SSH; None without an address or pinned key."""
    f = cfg.fleet
    if f.ssh_address == "internal_ip":
        address = (v.internal_ip if v else row.internal_ip) or ""
    else:
        address = (v.main_ip if v else row.main_ip) or ""
    if not row.host_key or address in ("", "0.0.0.0"):
        return None
    return HostTarget(row.label, address, f.ssh_port, f.ssh_user, row.host_key, f.service)


def live_leases(reads: Readings, label: str) -> int | None:
    """Live leases of the instance's worker; None when the queue could not be read."""
    if reads.signals is None:
        return None
    w = reads.workers.get(label)
    return w.live_leases if w else 0


def _last_scales(reads: Readings) -> tuple[datetime | None, datetime | None]:
    """The last scale-up and scale-down: the later of the fleet state's and the ledger rows'.
    The fleet state is written at the end of a pass, so a pass that died after its POST or its
    drain (or whose only POST had an unclear outcome) left it unwritten, and the next pass
    skipped the cool-down and ``max_step_up``'s pace. A row shows a scale-up when this scaler
    wrote its create intent and the POST went or may have gone out (posted, or still waiting
    for its answer; not a refused POST, nor an adopted row), a scale-down by its draining_at."""
    up, down = reads.state.last_scale_up, reads.state.last_scale_down
    creating = InstanceState.CREATING
    for row in (*reads.rows.values(), *reads.gone):
        if (row.posted_at is not None or row.state is creating) and (
            up is None or row.created_at > up
        ):
            up = row.created_at
        if row.draining_at is not None and (down is None or row.draining_at > down):
            down = row.draining_at
    return up, down


def _not_after(when: datetime | None, now: datetime) -> datetime | None:
    """A stored time later than now (written while a clock ran ahead) is read as now."""
    return None if when is None else min(when, now)


def _instance(cfg: Config, reads: Readings, row: LedgerRow, billed: float) -> Instance:
    v = reads.listed.get(row.label)
    w = reads.workers.get(row.label)
    # Revivable is judged on the row as read (DRAINING), not as this pass's drain verdict
    # leaves it (DELETING): a delete this pass would start has not been sent.
    before = reads.rows.get(row.label)
    service = reads.probes.get(row.label)
    return frozen_from(  # per instance per pass: every field named, set in one step
        Instance,
        {
            "label": row.label,
            "state": row.state,
            "id": row.instance_id,
            "created_at": row.created_at,
            "state_since": row.state_since,
            "vultr_status": v.status if v else "",
            "power_status": v.power_status if v else "",
            "server_status": v.server_status if v else "",
            "main_ip": (v.main_ip if v else row.main_ip) or "",
            "internal_ip": (v.internal_ip if v else row.internal_ip) or "",
            "live_leases": w.live_leases if w is not None and reads.signals is not None else 0,
            "worker_last_seen": w.last_seen if w else None,
            "draining_since": row.draining_at,
            "billed_usd": billed,
            "hourly_rate": row.hourly_rate or 0.0,
            "monthly_cost": row.monthly_cost or 0.0,
            "boot_since": row.boot_since,
            "service": service if isinstance(service, ServiceState) else None,
            "revivable": lifecycle.revivable(
                before.state if before else row.state,
                service,
                target(cfg, row, v) is not None,
                (before or row).never_revive,
            ),
            "plan": row.plan or "",
            "region": row.region or "",
        },
    )


# --- the decision ------------------------------------------------------------------------------


def decide(reads: Readings, cfg: Config) -> Decision:
    """The pass's whole decision: the lifecycle's transitions and drain verdicts, the plan
    (``policy.decide``), and the steps that carry them out, in kill-safe order."""
    now = reads.now
    transitions: tuple[Transition, ...] = ()
    if reads.api_error is None:
        own = cfg.queue.preset == "vultrscale"  # foreign presets' workers don't report to us
        transitions = tuple(
            lifecycle.sync(reads.rows.values(), reads.listed, reads.workers, now, own_workers=own)
        )
    rows = lifecycle.applied(
        reads.rows, transitions, reads.listed, cfg.fleet.name, now, reads.prices
    )
    verdicts = []
    for label, service in reads.probes.items():
        row = rows.get(label)
        if row is None or row.state is not InstanceState.DRAINING:
            continue
        verdicts.append(
            lifecycle.drain_step(
                label,
                service,
                now - lifecycle.drain_began(row),
                live_leases(reads, label),
                timeout=cfg.drain.timeout,
                unreachable_grace=cfg.drain.unreachable_grace,
            )
        )
    for v in verdicts:
        if v.verdict is Verdict.DELETE:
            rows[v.label] = rows[v.label].moved(InstanceState.DELETING, now)
    bills = budget.ledger_bills([*{**reads.rows, **rows}.values(), *reads.gone], reads.price, now)
    last_up, last_down = _last_scales(reads)
    observation = Observation(
        instances=tuple(_instance(cfg, reads, r, bills[r.label]) for r in rows.values()),
        signals=reads.signals,
        price=reads.price,
        signal_error=reads.signal_problem,
        api_error=reads.api_problem,
        month_to_date_usd=sum(bills.values()),
        last_scale_up=_not_after(last_up, now),
        last_scale_down=_not_after(last_down, now),
        idle_since=_not_after(reads.state.idle_since, now),
        forecast=reads.forecast,
        boot_time=boottime.learn(
            [*reads.boots, *reads.gone, *rows.values()], cfg.policy.boot_time, now
        ),
        account=reads.account,
    )
    plan = policy.decide(observation, cfg, now)
    # A revived instance's drain ends here: no verdict for it (no delete, no stop sent again),
    # and the rows as this pass leaves them show it running.
    revived = {a.label for a in plan.actions if a.kind is ActionKind.REVIVE and a.label}
    for label in revived:
        deleting_at = reads.rows[label].deleting_at  # a verdict's DELETING undone
        rows[label] = rows[label].moved(
            InstanceState.RUNNING, now, draining_at=None, deleting_at=deleting_at
        )
    verdicts = [v for v in verdicts if v.label not in revived]

    steps: list[Step] = [*_ledger_steps(reads, transitions)]
    if reads.api_error is None:  # drains are judged on what the cloud showed this pass
        steps += _drain_steps(cfg, reads, verdicts, rows, revived)
    steps += _plan_steps(cfg, reads, observation, plan, rows)
    errors = [e for e in (reads.api_problem, reads.signal_problem, reads.price_error) if e]
    wanted = sum(1 for a in plan.actions if a.kind is ActionKind.CREATE)
    # Each offering refused a moment ago (a refusal of the checks says it itself, below).
    unusable = reads.offerings and not any(v.usable for v in reads.offerings)
    if wanted and unusable and reads.refused is None:
        errors.append(
            f"{wanted} instance(s) wanted, but no offering is usable now: "
            + "; ".join(f"{v.offering.name}: {v.skip}" for v in reads.offerings)
        )
    if reads.refused is not None:
        # A running fleet whose plan or price stops passing (Vultr raised the price above the
        # ceiling, retired the plan): no create, but drains and deletes go on, or instances
        # on their way out would bill on. The pass still ends as a usage error.
        refused = reads.refused
        errors.append(f"{refused.message}: nothing is created ({refused.hint})")
    return Decision(
        now=now,
        steps=tuple(steps),
        observation=observation,
        plan=plan,
        errors=tuple(errors),
        refused=reads.refused is not None,
        refused_outright=reads.refused is not None and not (reads.rows or reads.listed),
        rows=rows,
        offerings=reads.offerings,
        misconfigured=reads.signal_misconfigured,
    )


def _ledger_steps(reads: Readings, transitions: tuple[Transition, ...]) -> list[Step]:
    """The ledger brought in line with the cloud: addresses, moves, adoptions."""
    out: list[Step] = []
    for t in transitions:
        if t.address_only:
            out.append(UpdateAddress(t.label, t.main_ip, t.internal_ip))
        elif t.adopt:
            v = reads.listed[t.label]
            own = reads.prices.get(v.plan) or reads.price  # its own plan's price, else the fleet's
            created = v.date_created or reads.now
            out.append(Adopt(t.label, t.note, v.id, t.state, v.plan, v.region, created, own))
        else:
            out.append(
                Move(t.label, t.note, t.state, t.instance_id, t.main_ip, t.internal_ip, t.error)
            )
    return out


def _drain_steps(
    cfg: Config,
    reads: Readings,
    verdicts: list[lifecycle.DrainStep],
    rows: Mapping[str, LedgerRow],
    revived: set[str] | frozenset[str] = frozenset(),
) -> list[Step]:
    """The drains earlier passes began: the workers' flag, each verdict, the stops sent again,
    then the deletes earlier passes began (retried until Vultr lets them through). A drain
    this pass revives is none of these: its workers are not flagged again."""
    out: list[Step] = []
    draining = tuple(
        r.label
        for r in reads.rows.values()
        if r.state is InstanceState.DRAINING and r.label not in revived
    )
    if draining:
        out.append(FlagWorkersDraining(draining))
    restop = []
    for v in verdicts:
        row = rows[v.label]
        if v.restop and (t := target(cfg, row, reads.listed.get(row.label))) is not None:
            restop.append(t)
        if v.verdict is Verdict.DELETE:
            out.append(StartDelete(v.label, row.instance_id, v.why))
        elif v.verdict is Verdict.WAIT:
            out.append(Note(v.label, v.why))
        else:
            out.append(Fail(v.label, v.why))
    if restop:
        out.append(Stop(tuple(restop), first=False))
    for label, row in rows.items():
        before = reads.rows.get(label)
        if before is not None and before.state is row.state is InstanceState.DELETING:
            out.append(RetryDelete(label, row.instance_id))
    return out


def _plan_steps(
    cfg: Config,
    reads: Readings,
    observation: Observation,
    plan: Plan,
    rows: Mapping[str, LedgerRow],
) -> list[Step]:
    """The plan's replacements and scale-in (each marked draining before any stop is sent),
    its creates, and the fleet state the next pass reads."""
    out: list[Step] = []
    stops: list[HostTarget] = []
    for action in plan.actions:
        row = rows.get(action.label or "")
        if row is None:
            continue
        if action.kind is ActionKind.REPLACE:
            # policy replaces only an instance whose worker holds no lease, on readable signals
            out.append(StartDelete(row.label, row.instance_id, action.reason))
        elif action.kind is ActionKind.DRAIN:
            out.append(MarkDraining(row.label))
            t = target(cfg, row, reads.listed.get(row.label))
            if t is None:
                why = f"draining: {lifecycle.NO_TARGET}; the drain deadline applies"
                out.append(Note(row.label, why))
            else:
                stops.append(t)
    if stops:
        out.append(Stop(tuple(stops), first=True))
    # Revives before creates: a pass killed between them leaves the revived counted, and the
    # next pass creates only what is still missing.
    revives = 0
    for action in plan.actions:
        row = rows.get(action.label or "")
        if action.kind is ActionKind.REVIVE and row is not None:
            t = target(cfg, row, reads.listed.get(row.label))
            if t is not None:  # revivable only with a target (lifecycle.revivable)
                out.append(Revive(row.label, t, action.reason))
                revives += 1
    creates = [a for a in plan.actions if a.kind is ActionKind.CREATE]
    if creates and reads.price is not None:
        out += _create_steps(cfg, reads, observation, plan, len(creates), creates[0].reason)
    down = reads.now if plan.drains else reads.state.last_scale_down
    created = bool(out) and isinstance(out[-1], Create)  # its outcome may move last_scale_up
    # A revive moves last_scale_up too (the outcome decides it, as for a create). The revived
    # row's draining_at is cleared, but last_scale_down is the fleet state's, written by the
    # pass that drained it, and stays: a scale-in did happen then.
    if (
        created
        or revives
        or (down, plan.idle_since) != (reads.state.last_scale_down, reads.state.idle_since)
    ):
        out.append(SaveFleetState(reads.state, down, plan.idle_since))
    return out


def _create_steps(
    cfg: Config,
    reads: Readings,
    observation: Observation,
    plan: Plan,
    count: int,
    reason: str,
) -> list[Step]:
    """The offerings skipped (each a note with its reason, for the ledger) and the create
    step on the usable ones, in order, each bounded by the budget at its own price."""
    assert reads.price is not None
    views = reads.offerings or (
        OfferingView(offerings.of(cfg)[0], reads.price),  # readings made without checks
    )
    out: list[Step] = [
        Note(f"offering {v.offering.name}", f"skipped: {v.skip}{_for(v, reads.now)}")
        for v in views
        if not v.usable
    ]
    usable = [v for v in views if v.usable]
    if not usable:
        return out
    replaced = [a.label or "" for a in plan.actions if a.kind is ActionKind.REPLACE]
    picks = offerings.choices(
        cfg, observation, usable, count, replaced, plan.demand, plan.floor, reads.now
    )
    first = picks[0]
    o = first.offering
    out.append(Create(count, o.plan, o.region, first.price, reason, picks))
    return out


def _for(view: OfferingView, now: datetime) -> str:
    left = view.left_s(now)
    return f"; skipped {left}s more" if left else ""


# --- when the decision could change ------------------------------------------------------------


def next_change(cfg: Config, decision: Decision) -> datetime | None:
    """The first moment after ``decision.now`` at which the same observation could be decided
    otherwise, gathered from the rules, each of which times itself beside its limit: the
    policy's (a floor starting or ending, the forecast's floor moving, the up cool-down, the
    idle window and the down cool-down ending, paid hours, a boot timeout:
    ``policy.next_changes``), the lifecycle's (a drain's deadline or grace, a create's
    visibility grace: ``lifecycle.changes_at``), a refusal of an offering ending, a new UTC
    hour (the budget's hours left in the month) or month. Earlier is always safe (one more
    pass that finds nothing); never later. None: nothing but a new observation can change
    it. Asked apart from ``decide`` (by ``simulate``, to skip the passes that would change
    nothing): the search for a floor's next start or end is not every pass's cost.

    A decision on readings with an error (the API or the queue unreadable, a price refused)
    promises no time: ``decision.now``. What could not be read may read otherwise at the next
    pass (a 429 burst ends), and a pass held by the error acts then; a replay that took the
    held pass's next change as its next pass slept through a floor's start until the hour."""
    now = decision.now
    if decision.errors:
        return now
    observation, plan, rows = decision.observation, decision.plan, decision.rows
    times = policy.next_changes(observation, plan, cfg, now)
    for row in rows.values():
        times += lifecycle.changes_at(
            row, timeout=cfg.drain.timeout, unreachable_grace=cfg.drain.unreachable_grace
        )
    # A refusal remembered ends: the preferred offering takes the creates again.
    times += [v.until for v in decision.offerings if v.until is not None]
    if rows or plan.clamps:
        times.append(budget.next_hour(now))  # bills, paid hours, the budget's hours left
    times.append(budget.month_bounds(now)[1])
    later = [budget.utc(t) for t in times if budget.utc(t) > budget.utc(now)]
    return min(later) if later else None


def demand_band(cfg: Config, decision: Decision) -> tuple[int, int | None] | None:
    """The queue demands (ready + in flight + expired leases; None above: no upper bound) for
    which the same readings, at a time before ``next_change``, are decided steady too: nothing
    to carry out. Known only for a steady decision on a busy queue whose instances all run:
    then no instance is replaced, booted, drained or scaled in (the queue is not idle), and a
    create needs more demand than the running fleet serves, unless the fleet is at its cap
    (``max_instances`` or the budget's, which moves only at a new hour) or the up cool-down
    runs (until ``next_change``), where no demand creates. None otherwise."""
    observation, plan = decision.observation, decision.plan
    if (
        not decision.steady
        or observation.signals is None
        or observation.signal_error
        or observation.api_error
        or not plan.demand
        or any(i.state is not InstanceState.RUNNING for i in observation.instances)
    ):
        return None
    running = len(observation.instances)
    up_again = policy.up_cooldown_ends(observation, cfg.policy)
    cooling = up_again is not None and up_again > budget.utc(decision.now)
    if plan.cap <= running or cooling:
        return 1, None
    slots = sum(offerings.jobs_per_instance(cfg, i.region, i.plan) for i in observation.instances)
    return 1, slots
