"""One reconcile pass: lock -> check -> observe -> decide -> apply -> record.

- *Check*: every local precondition (``Parts.preflight``: the scaler's key file, the metrics
  target) and the plan's price are checked before anything is changed; a refused pass raises
  ``UsageError`` (exit 2) and its row in ``fleet_events`` is its only write. A plan or price
  that stops passing on a fleet that has instances refuses only creates: the pass drains and
  deletes as usual and ends with exit 2.
- *Observe* builds one frozen ``Observed`` value through the ports (ledger rows, what Vultr
  lists, workers, queue signals, drain probes, price) and writes nothing.
- *Decide* is pure: ``lifecycle`` (ledger state machine, drain verdicts) and ``policy.decide``.
- *Apply* carries the decision out through the ports; a failure on one instance is that
  instance's error, and the rest of the fleet is still acted on.
- *Record*: every pass that held the lock writes its ``fleet_events`` row, failed ones too.

The pass is level-triggered and safe to kill at any point: every irreversible step is preceded
by a ledger write that lets the next pass find it (the create intent right before the POST, the
draining mark before the SSH stop), and a pass never waits for a drain to finish.
"""

from __future__ import annotations

import logging
import math
import random
import string
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from vultrscale import budget, lifecycle, policy
from vultrscale.clock import Clock
from vultrscale.config import Config
from vultrscale.errors import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_RUNTIME,
    EXIT_USAGE,
    DatabaseError,
    RuntimeFailure,
    UsageError,
    VultrscaleError,
    redact,
)
from vultrscale.lifecycle import DrainStep, Transition, Verdict
from vultrscale.model import (
    ActionKind,
    FleetState,
    HostTarget,
    Instance,
    InstanceState,
    LedgerRow,
    Observation,
    PassEvent,
    Plan,
    PlanPrice,
    ServiceState,
    Signals,
    WorkerView,
    frozen_from,
)
from vultrscale.ports import Cloud, DrainTransport, FleetLedger, QueueSignals, Store
from vultrscale.ssh import fan_out_bound_s
from vultrscale.vultr.errors import (
    AmbiguousCreate,
    AuthError,
    InstanceLocked,
    NotFound,
    VultrError,
    unknown_region,
)

if TYPE_CHECKING:
    from vultrscale.vultr.models import VInstance, VPlan

log = logging.getLogger("vultrscale.reconcile")

# How long a plan check (its price, and that the fleet's region offers it) is trusted before
# Vultr is asked again. Shared through the ledger by every pass of every process, so a steady
# one-shot pass (cron) makes one request, the list; a price change is seen within it.
PRICE_TTL = timedelta(minutes=10)


@dataclass
class Parts:
    """The ports a pass works through, and the local checks it makes before acting."""

    cloud: Cloud
    store: Store
    drain: DrainTransport
    clock: Clock
    keygen: Callable[[], tuple[str, str]]  # -> (private OpenSSH PEM, public line)
    render_user_data: Callable[[str, str, str], str]  # (label, host private, host public)
    # Local preconditions, each raising UsageError: run before anything is changed.
    preflight: Sequence[Callable[[], object]] = ()
    rng: random.Random = field(default_factory=random.Random)
    # Per process: the plan check it made (fresh as long as its copy in the ledger), and the
    # snapshot it found complete.
    cache: dict[str, Any] = field(default_factory=dict)
    # List the cloud in a thread while the ledger and the queue are read: for the real parts
    # both wait on the network, and the pass takes the longer of the two, not their sum. Off
    # for the in-memory ports, where a thread is pure cost.
    overlap_reads: bool = False

    def close(self) -> None:
        """Release the cloud's and the store's connections; the parts' owner calls it once,
        after the last pass."""
        try:
            self.cloud.close()
        finally:
            self.store.close()


@dataclass
class PassResult:
    """What one pass saw, decided, did and what went wrong."""

    exit_code: int
    at: datetime
    lock_held: bool = False
    dry_run: bool = False
    plan: Plan | None = None
    observation: Observation | None = None
    actions: list[dict[str, Any]] = field(default_factory=list)
    results: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    duration_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        obs = self.observation
        return {
            "at": self.at.isoformat(),
            "exit_code": self.exit_code,
            "dry_run": self.dry_run,
            "lock_held": self.lock_held,
            "inputs": obs.summary() if obs else None,
            "plan": self.plan.summary() if self.plan else None,
            "actions": self.actions,
            "results": self.results,
            "errors": self.errors,
            "duration_s": round(self.duration_s, 3),
        }

    def note(self, label: str, what: str) -> None:
        self.results.append({"label": label, "result": what})


# --- the pass ----------------------------------------------------------------------------------


def run_pass(
    cfg: Config, parts: Parts, *, dry_run: bool = False, take_lock: bool = True
) -> PassResult:
    """One reconcile pass. Raises UsageError (exit 2) for bad input before changing anything,
    DatabaseError (exit 1) when Postgres fails; other failures are in the result.

    ``take_lock=False`` is for read-only views (``status``): they must work while a pass runs,
    and only a dry run may skip the lock."""
    if not take_lock and not dry_run:
        raise ValueError("only a dry run may skip the fleet lock")
    started = time.monotonic()
    result = PassResult(EXIT_OK, parts.clock.now(), dry_run=dry_run)
    try:
        with parts.store.session(cfg) as (ledger, signals):
            if take_lock and not ledger.lock():
                result.lock_held = True
                return result
            checks = parts.preflight if take_lock else ()  # a read-only view acts on nothing
            _checked_pass(cfg, parts, checks, ledger, signals, result)
    finally:
        parts.drain.close()  # connections are reused within a pass, not across passes
        result.duration_s = time.monotonic() - started
    return result


def _checked_pass(
    cfg: Config,
    parts: Parts,
    checks: Sequence[Callable[[], object]],
    ledger: FleetLedger,
    signals: QueueSignals,
    result: PassResult,
) -> None:
    """Check, observe, decide, apply; record the pass whatever happens (dry runs excepted)."""
    failed = True
    try:
        for check in checks:
            check()
        price, api_error, refused = None, None, None
        try:
            price = _price(cfg, parts, ledger, result.at, save=not result.dry_run)
        except AuthError:
            raise
        except VultrError as exc:
            api_error = f"Vultr API: {exc}"
        except UsageError as exc:  # the plan, its region or its price: nothing may be created
            refused = exc
        obs = observe(
            cfg, parts, ledger, signals, result.at, price, api_error, probe=not result.dry_run
        )
        if refused is not None and not (obs.rows or obs.listed):
            raise refused  # a fleet with nothing to wind down: refused before any change
        decision = decide(obs, cfg)
        result.observation, result.plan = decision.observation, decision.plan
        result.actions = [
            {"kind": a.kind.value, "label": a.label, "reason": a.reason}
            for a in decision.plan.actions
        ]
        result.errors.extend(e for e in (obs.api_error, obs.signal_error, obs.price_error) if e)
        if refused is not None:
            # A running fleet whose plan or price stops passing (Vultr raised the price above
            # the ceiling, retired the plan): no create, but drains and deletes go on, or
            # instances on their way out would bill on. The pass still ends as a usage error.
            result.errors.append(f"{refused.message}: nothing is created ({refused.hint})")
        if not result.dry_run:
            # Bad input (no snapshot, or one not complete) stops the pass before any change.
            creates = decision.plan.creates if price is not None else 0
            if creates:  # exit 2 now, not a user-data with the scaler's credentials later
                cfg.worker_database_url()
            snapshot = _snapshot(cfg, parts, ledger) if creates else ""
            apply(cfg, parts, ledger, obs, decision, snapshot, result)
        result.exit_code = (
            EXIT_USAGE if refused is not None else EXIT_RUNTIME if result.errors else EXIT_OK
        )
        failed = False
    except VultrscaleError as exc:
        result.exit_code = exc.exit_code
        result.errors.append(exc.message)
        raise
    except Exception as exc:  # a bug: the CLI reports it; its ledger row must not say "ok"
        result.exit_code = EXIT_RUNTIME
        result.errors.append(f"unexpected {type(exc).__name__}: {exc}")
        raise
    except KeyboardInterrupt:  # Ctrl-C mid-pass (`--loop`): nor must this one's
        result.exit_code = EXIT_INTERRUPTED  # as the CLI exits with
        result.errors.append("interrupted (SIGINT) before the pass finished")
        raise
    finally:
        if result.errors:
            # Belt and braces: whatever an adapter put in an error, no secret reaches the ledger.
            secrets = cfg.secrets.values()
            result.errors = [redact(e, secrets) for e in result.errors]
        if not result.dry_run:
            _record(ledger, result, quiet=failed)


def _record(ledger: FleetLedger, result: PassResult, *, quiet: bool) -> None:
    """Write the pass's fleet_events row. When the pass already failed, a failure to record
    is logged and the pass's own error is the one reported."""
    event = PassEvent(
        at=result.at,
        dry_run=False,
        observation=result.observation,
        plan=result.plan,
        actions=result.actions,
        results=result.results,
        errors=result.errors,
        exit_code=result.exit_code,
    )
    try:
        ledger.record_event(event)
    except DatabaseError as exc:
        if not quiet:
            raise
        log.warning("could not record the failed pass: %s", exc)


# --- check -------------------------------------------------------------------------------------


def _price(
    cfg: Config, parts: Parts, ledger: FleetLedger, now: datetime, *, save: bool
) -> PlanPrice:
    """The plan's price, checked with Vultr at most every PRICE_TTL (the check is shared
    through the ledger by every pass of every process): an unknown plan, a plan not in the
    region and a ceiling below one instance-month are refused (exit 2) before anything is
    touched. ``save``: remember a check that passed (a dry run writes nothing)."""
    fleet = cfg.fleet
    mine = parts.cache.get("price")  # (price, when): a check this process made and saved
    if mine is not None and mine[1] <= now < mine[1] + PRICE_TTL:
        price = mine[0]  # as fresh as its copy in the ledger: the loop need not ask it
    else:
        price = ledger.plan_check(fleet.plan, fleet.region, now, PRICE_TTL)
        if price is None:
            price = _check_plan(cfg, parts.cloud)
            if save:
                ledger.save_plan_check(price, fleet.region, now)
                parts.cache["price"] = (price, now)
    ceiling = cfg.budget.monthly_ceiling_usd
    if cfg.policy.max_instances > 0 and ceiling < price.monthly:
        raise UsageError(
            f"budget.monthly_ceiling_usd ({ceiling:g}) is lower than one instance-month of "
            f"{fleet.plan} (${price.monthly:g})",
            hint="Raise the ceiling or pick a cheaper plan.",
        )
    return price


def _check_plan(cfg: Config, cloud: Cloud) -> PlanPrice:
    """Ask Vultr for the plan's price and whether the fleet's region offers it."""
    fleet = cfg.fleet
    try:
        plan = cloud.get_plan(fleet.plan)
    except NotFound:
        raise UsageError(
            f"fleet.plan {fleet.plan!r} is not a Vultr plan",
            hint="Pick a plan id from https://api.vultr.com/v2/plans (e.g. vc2-1c-2gb).",
        ) from None
    try:
        available = cloud.region_availability(fleet.region)
    except NotFound:
        raise unknown_region(fleet.region) from None
    if fleet.plan not in available:
        raise UsageError(
            f"plan {fleet.plan!r} is not offered in region {fleet.region!r}",
            hint="Choose another plan or region; GET /v2/regions/<id>/availability lists them.",
        )
    price = priced(plan)
    if price is None:
        raise UsageError(
            f"Vultr lists plan {fleet.plan!r} without a usable price (monthly_cost read as "
            f"{plan.monthly_cost!r}, hourly_cost {plan.hourly_cost!r}): the budget cannot be "
            "held, so nothing is created",
            hint="Check GET /v2/plans for the plan; pick another plan if it has no price.",
        )
    return price


def priced(plan: VPlan) -> PlanPrice | None:
    """The plan's price; None when Vultr lists none usable. No price is not a price of zero: a
    monthly_cost absent, null or unreadable (parsed as 0.0), read as $0, would pass every
    ceiling, and the budget would limit nothing."""
    monthly, hourly = plan.monthly_cost, plan.hourly_cost
    if not (math.isfinite(monthly) and monthly > 0) or (
        hourly is not None and not (math.isfinite(hourly) and hourly > 0)
    ):
        return None
    return PlanPrice(plan.id, float(monthly), hourly)


def _snapshot(cfg: Config, parts: Parts, ledger: FleetLedger) -> str:
    """The snapshot to boot from: fleet.snapshot_id, else the recorded one; must be complete."""
    sid = cfg.fleet.snapshot_id or ledger.recorded_snapshot() or ""
    if sid and parts.cache.get("snapshot") == sid:
        return sid  # checked complete before; a newly baked one is picked up next pass
    if not sid:
        raise UsageError(
            "no snapshot to create instances from",
            hint="Run `vultrscale snapshot --from-instance ID` or set fleet.snapshot_id.",
        )
    try:
        snap = parts.cloud.get_snapshot(sid)
    except NotFound:
        raise UsageError(
            f"snapshot {sid} does not exist at Vultr",
            hint="Bake one with `vultrscale snapshot` or fix fleet.snapshot_id.",
        ) from None
    if snap.status != "complete":
        raise UsageError(
            f"snapshot {sid} is {snap.status}, not complete",
            hint="Wait for it (`vultrscale snapshot` shows progress) or use another one.",
        )
    parts.cache["snapshot"] = sid
    return sid


# --- observe -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Observed:
    """Everything one pass read, before deciding anything. Observing writes nothing."""

    now: datetime
    rows: Mapping[str, LedgerRow]  # the ledger's rows not gone, by label
    gone: tuple[LedgerRow, ...]  # rows gone this month (their cost is in this month's bill)
    listed: Mapping[str, VInstance]  # by label: the tagged list, plus what a GET found it miss
    workers: Mapping[str, WorkerView]
    signals: Signals | None
    price: PlanPrice | None
    state: FleetState
    probes: Mapping[str, ServiceState | str]  # draining rows: is-active, or why it wasn't asked
    signal_error: str | None = None
    api_error: str | None = None
    # By plan: the fleet plan's price and those of the instances adopted this pass on another
    # plan (made by hand: each is billed at its own plan's price, not the fleet's).
    prices: Mapping[str, PlanPrice] = field(default_factory=dict)
    price_error: str | None = None  # an adopted instance's plan Vultr lists without a price


def observe(
    cfg: Config,
    parts: Parts,
    ledger: FleetLedger,
    signals_port: QueueSignals,
    now: datetime,
    price: PlanPrice | None,
    api_error: str | None,
    *,
    probe: bool,
) -> Observed:
    """Read the cloud, the ledger, the queue and (with ``probe``) the draining hosts.
    ``api_error``: the price could not be read, so the cloud is not asked again."""
    listing = _listing(parts, cfg.fleet.tag, skip=api_error is not None)
    signals, signal_error = None, None
    try:
        signals = signals_port.read()
    except DatabaseError as exc:
        signal_error = f"queue signals: {exc}"
    rows: dict[str, LedgerRow] = {}
    gone: list[LedgerRow] = []
    for r in ledger.rows(since=budget.month_bounds(now)[0]):
        if r.state is InstanceState.GONE:
            gone.append(r)
        else:
            rows[r.label] = r
    workers = ledger.workers(lifecycle.WORKER_SEEN_WITHIN)
    state = ledger.fleet_state()
    listed: dict[str, VInstance] = {}
    try:
        listed = lifecycle.by_label(listing(), rows)
    except AuthError:
        raise
    except VultrError as exc:
        api_error = f"Vultr API: {exc}"
    if api_error is None:
        try:
            listed.update(_looked_up(parts.cloud, rows.values(), listed, now))
        except AuthError:
            raise
        except VultrError as exc:  # a GET that would confirm a missing instance failed
            api_error = f"Vultr API: {exc}"
    unknown = set(listed) - rows.keys()  # tagged, not in the ledger: adopted
    # One tracked under a name of the ledger's (``<label>@<id>``: its label empty or shared,
    # see ``lifecycle.by_label``) has its worker report under its own label: those workers'
    # heartbeats and live leases are its too (never deleted while they hold one).
    aliased = {t: v.label for t, v in listed.items() if t != v.label and t not in workers}
    if unknown or aliased:
        found = ledger.workers(
            lifecycle.WORKER_SEEN_WITHIN, sorted(unknown | set(aliased.values()))
        )
        workers.update((label, found[label]) for label in unknown if label in found)
        for label, own in aliased.items():
            if own in found:
                workers[label] = replace(found[own], instance_label=label)
    prices: dict[str, PlanPrice] = {price.plan: price} if price is not None else {}
    price_error = None
    if unknown and api_error is None:
        try:
            found_prices, unpriced = _plan_prices(
                parts.cloud, {listed[t].plan for t in unknown} - prices.keys()
            )
        except AuthError:
            raise
        except VultrError as exc:  # adopted at a guessed price, never: the pass holds
            api_error = f"Vultr API: {exc}"
        else:
            prices.update(found_prices)
            if unpriced:
                who = sorted(t for t in unknown if listed[t].plan in unpriced)
                price_error = (
                    f"{', '.join(who)}: adopted on plan(s) {', '.join(sorted(unpriced))}, which "
                    f"Vultr lists without a usable price; billed at {cfg.fleet.plan}'s price"
                )
    probes: dict[str, ServiceState | str] = {}
    if probe and api_error is None:
        probes = _probe_drains(cfg, parts.drain, ledger, rows.values(), listed)
    return Observed(
        now=now,
        rows=rows,
        gone=tuple(gone),
        listed=listed,
        workers=workers,
        signals=signals,
        price=price,
        state=state,
        probes=probes,
        signal_error=signal_error,
        api_error=api_error,
        prices=prices,
        price_error=price_error,
    )


def _plan_prices(cloud: Cloud, plans: set[str]) -> tuple[dict[str, PlanPrice], set[str]]:
    """The prices of ``plans`` (those of instances to adopt, other than the fleet's), and the
    plans Vultr does not list with a usable price."""
    found: dict[str, PlanPrice] = {}
    for plan in sorted(plans):
        try:
            price = priced(cloud.get_plan(plan))
        except NotFound:
            price = None
        if price is not None:
            found[plan] = price
    return found, plans - found.keys()


def _listing(parts: Parts, tag: str, *, skip: bool) -> Callable[[], list[VInstance]]:
    """The cloud's tagged instances, asked now: with ``parts.overlap_reads`` in a thread, so
    the caller reads the ledger meanwhile. Calling the result waits for the answer (or raises
    what the list raised). ``skip``: the cloud already failed this pass, ask it nothing."""
    if skip:
        return list
    if not parts.overlap_reads:
        return lambda: parts.cloud.list_instances(tag=tag)
    answer: list[list[VInstance] | BaseException] = []

    def run() -> None:
        try:
            answer.append(parts.cloud.list_instances(tag=tag))
        except BaseException as exc:  # handed to the caller, who decides what it means
            answer.append(exc)

    # A daemon thread: an interrupted pass exits at once, not after the list's timeout.
    thread = threading.Thread(target=run, name="vultrscale-list", daemon=True)
    thread.start()

    def wait() -> list[VInstance]:
        thread.join()
        got = answer[0]
        if isinstance(got, BaseException):
            raise got
        return got

    return wait


def _looked_up(
    cloud: Cloud, rows: Any, listed: Mapping[str, VInstance], now: datetime
) -> dict[str, VInstance]:
    """GET each instance the list missed whose row needs it. Only "not found" means gone;
    another error is an API error (the pass holds), never a reason to forget a paid instance."""
    ids = {v.id for v in listed.values()}
    found: dict[str, VInstance] = {}
    for row in rows:
        if row.instance_id in ids or not lifecycle.needs_lookup(row, now):
            continue
        try:
            v = cloud.get_instance(row.instance_id)
        except NotFound:
            continue
        # Keyed by the row's label, the name the ledger tracks it by (``<label>@<id>`` for a
        # label empty or shared, see ``lifecycle.by_label``), which the list gives no other
        # instance: keyed by its Vultr label, an aliased instance lost its workers' heartbeats
        # and leases for the pass, and a drain past its deadline deleted it with leases live.
        found[row.label] = v
    return found


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


def _probe_drains(
    cfg: Config,
    drain: DrainTransport,
    ledger: FleetLedger,
    rows: Any,
    listed: Mapping[str, VInstance],
) -> dict[str, ServiceState | str]:
    """`systemctl is-active` on every draining instance that can be reached (read-only)."""
    out: dict[str, ServiceState | str] = {}
    targets = []
    for row in rows:
        if row.state is InstanceState.DRAINING:
            t = target(cfg, row, listed.get(row.label))
            out[row.label] = lifecycle.NO_TARGET
            if t is not None:
                targets.append(t)
    if targets:
        ledger.extend_lock(fan_out_bound_s(len(targets)))
        for label, st in drain.is_active_many(targets).items():
            out[label] = st if isinstance(st, ServiceState) else str(st)
    return out


# --- decide ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Decision:
    """What the pass will do: ledger transitions, drain steps and the plan. Pure values."""

    transitions: tuple[Transition, ...]
    drains: tuple[DrainStep, ...]
    rows: Mapping[str, LedgerRow]  # the ledger as the transitions and drain verdicts leave it
    observation: Observation
    plan: Plan


def live_leases(obs: Observed, label: str) -> int | None:
    """Live leases of the instance's worker; None when the queue could not be read."""
    if obs.signals is None:
        return None
    w = obs.workers.get(label)
    return w.live_leases if w else 0


def decide(obs: Observed, cfg: Config) -> Decision:
    """Pure: the lifecycle's transitions and drain verdicts, then ``policy.decide``."""
    now = obs.now
    transitions: tuple[Transition, ...] = ()
    if obs.api_error is None:
        own = cfg.queue.preset == "vultrscale"  # foreign presets' workers don't report to us
        transitions = tuple(
            lifecycle.sync(obs.rows.values(), obs.listed, obs.workers, now, own_workers=own)
        )
    rows = lifecycle.applied(obs.rows, transitions, obs.listed, cfg.fleet.name, now, obs.prices)
    steps = []
    for label, service in obs.probes.items():
        row = rows.get(label)
        if row is None or row.state is not InstanceState.DRAINING:
            continue
        steps.append(
            lifecycle.drain_step(
                label,
                service,
                now - (row.draining_at or row.state_since),
                live_leases(obs, label),
                timeout=cfg.drain.timeout,
                unreachable_grace=cfg.drain.unreachable_grace,
            )
        )
    for step in steps:
        if step.verdict is Verdict.DELETE:
            rows[step.label] = rows[step.label].moved(InstanceState.DELETING, now)
    bills = budget.ledger_bills([*{**obs.rows, **rows}.values(), *obs.gone], obs.price, now)
    last_up, last_down = _last_scales(obs)
    observation = Observation(
        instances=tuple(_instance(obs, r, bills[r.label]) for r in rows.values()),
        signals=obs.signals,
        price=obs.price,
        signal_error=obs.signal_error,
        api_error=obs.api_error,
        month_to_date_usd=sum(bills.values()),
        last_scale_up=_not_after(last_up, now),
        last_scale_down=_not_after(last_down, now),
        idle_since=_not_after(obs.state.idle_since, now),
    )
    plan = policy.decide(observation, cfg, now)
    return Decision(transitions, tuple(steps), rows, observation, plan)


def _last_scales(obs: Observed) -> tuple[datetime | None, datetime | None]:
    """The last scale-up and scale-down: the later of the fleet state's and the ledger rows'.
    The fleet state is written at the end of a pass, so a pass that died after its POST or its
    drain (or whose only POST had an unclear outcome) left it unwritten, and the next pass
    skipped the cool-down and ``max_step_up``'s pace. A row shows a scale-up when this scaler
    wrote its create intent and the POST went or may have gone out (posted, or still waiting
    for its answer; not a refused POST, nor an adopted row), a scale-down by its draining_at."""
    up, down = obs.state.last_scale_up, obs.state.last_scale_down
    creating = InstanceState.CREATING
    for row in (*obs.rows.values(), *obs.gone):
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


def _instance(obs: Observed, row: LedgerRow, billed: float) -> Instance:
    v = obs.listed.get(row.label)
    w = obs.workers.get(row.label)
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
            "live_leases": w.live_leases if w is not None and obs.signals is not None else 0,
            "worker_last_seen": w.last_seen if w else None,
            "draining_since": row.draining_at,
            "billed_usd": billed,
            "hourly_rate": row.hourly_rate or 0.0,
            "monthly_cost": row.monthly_cost or 0.0,
            "boot_since": row.boot_since,
        },
    )


# --- apply -------------------------------------------------------------------------------------


def apply(
    cfg: Config,
    parts: Parts,
    ledger: FleetLedger,
    obs: Observed,
    decision: Decision,
    snapshot: str,
    result: PassResult,
) -> None:
    """Carry the decision out through the ports, in the order that keeps a kill safe."""
    now = obs.now
    _write_transitions(cfg, ledger, obs, decision.transitions, now, result)
    if obs.api_error is None:
        _progress_drains(cfg, parts, ledger, obs, decision, result)
    plan = decision.plan
    drain_targets: list[HostTarget] = []
    for action in plan.actions:
        row = decision.rows.get(action.label or "")
        if row is None:
            continue
        if action.kind is ActionKind.REPLACE:
            if not lifecycle.may_replace(live_leases(obs, row.label)):
                result.note(row.label, "replace skipped: its worker holds a live lease")
                continue
            _start_delete(parts.cloud, ledger, row, action.reason, now, result)
        elif action.kind is ActionKind.DRAIN:
            ledger.mark_draining(row.label, now)
            t = target(cfg, row, obs.listed.get(row.label))
            if t is None:
                why = f"draining: {lifecycle.NO_TARGET}; the drain deadline applies"
                result.note(row.label, why)
            else:
                drain_targets.append(t)
    _stop(parts.drain, ledger, drain_targets, result, started=True)
    created = 0
    if plan.creates and obs.price is not None:
        created = _create(cfg, parts, ledger, plan.creates, obs.price, snapshot, now, result)
    kept = {
        "last_scale_up": now if created else obs.state.last_scale_up,
        "last_scale_down": now if plan.drains else obs.state.last_scale_down,
        "idle_since": plan.idle_since,
    }
    if kept != {k: getattr(obs.state, k) for k in kept}:  # a steady pass writes nothing here
        ledger.save_fleet_state(now, **kept)


def _progress_drains(
    cfg: Config,
    parts: Parts,
    ledger: FleetLedger,
    obs: Observed,
    decision: Decision,
    result: PassResult,
) -> None:
    """Carry out the drain verdicts and retry the deletes earlier passes began. Never blocks."""
    now = obs.now
    draining = [r.label for r in obs.rows.values() if r.state is InstanceState.DRAINING]
    if draining:
        # A worker restarted (or first started) after the drain began must claim nothing.
        ledger.mark_workers_draining(draining)
    restop = []
    for step in decision.drains:
        row = decision.rows[step.label]
        if step.restop and (t := target(cfg, row, obs.listed.get(row.label))) is not None:
            restop.append(t)
        if step.verdict is Verdict.DELETE:
            _start_delete(parts.cloud, ledger, row, step.why, now, result)
        elif step.verdict is Verdict.WAIT:
            result.note(step.label, step.why)
        else:
            result.errors.append(f"{step.label}: {step.why}")
    _stop(parts.drain, ledger, restop, result, started=False)
    for label, row in decision.rows.items():
        before = obs.rows.get(label)
        if before is not None and before.state is row.state is InstanceState.DELETING:
            _delete(parts.cloud, ledger, row, now, result)  # a delete of an earlier pass


def _write_transitions(
    cfg: Config,
    ledger: FleetLedger,
    obs: Observed,
    transitions: Sequence[Transition],
    now: datetime,
    result: PassResult,
) -> None:
    price = obs.price
    for t in transitions:
        if t.address_only:
            ledger.update_address(t.label, t.main_ip, t.internal_ip)
            continue
        result.note(t.label, t.note)
        if t.adopt:
            v = obs.listed[t.label]
            own = obs.prices.get(v.plan) or price  # its own plan's price, else the fleet's
            ledger.adopt(
                label=t.label,
                instance_id=v.id,
                state=t.state,
                plan=v.plan,
                region=v.region,
                created_at=v.date_created or now,
                now=now,
                hourly_rate=own.hourly if own else None,
                monthly_cost=own.monthly if own else None,
            )
        else:
            ledger.transition(
                t.label,
                t.state,
                now,
                instance_id=t.instance_id,
                main_ip=t.main_ip,
                internal_ip=t.internal_ip,
                last_error=t.error,
            )


def _stop(
    drain: DrainTransport,
    ledger: FleetLedger,
    targets: list[HostTarget],
    result: PassResult,
    *,
    started: bool,
) -> None:
    """`systemctl stop --no-block` on each target; a host that refuses is that host's error."""
    if not targets:
        return
    # SSH is not under the pass's deadline: say how long it may take, or a pass draining
    # many hosts at once would be reported stuck (and its session named to be killed).
    ledger.extend_lock(fan_out_bound_s(len(targets)))
    for label, err in drain.stop_many(targets).items():
        if err is not None:
            result.errors.append(f"{label}: systemctl stop failed: {err}")
        elif started:
            result.note(label, "drain started: systemctl stop --no-block sent")


def _start_delete(
    cloud: Cloud, ledger: FleetLedger, row: LedgerRow, why: str, now: datetime, result: PassResult
) -> None:
    ledger.transition(row.label, InstanceState.DELETING, now)
    result.note(row.label, f"delete: {why}")
    _delete(cloud, ledger, row, now, result)


def _delete(
    cloud: Cloud, ledger: FleetLedger, row: LedgerRow, now: datetime, result: PassResult
) -> None:
    """DELETE and verify it is gone; a locked instance is retried on a later pass."""
    if not row.instance_id:
        ledger.transition(row.label, InstanceState.GONE, now)
        return
    try:
        cloud.delete_instance(row.instance_id)
    except NotFound:
        pass
    except InstanceLocked as exc:
        ledger.note_error(row.label, str(exc), delete=True)
        result.note(row.label, "delete refused: instance locked at Vultr; retrying next pass")
        return
    except VultrError as exc:
        ledger.note_error(row.label, str(exc), delete=True)
        result.errors.append(f"{row.label}: delete failed: {exc}")
        return
    try:
        cloud.get_instance(row.instance_id)
    except NotFound:
        ledger.transition(row.label, InstanceState.GONE, now)
        result.note(row.label, "deleted")
        return
    except VultrError as exc:
        result.note(row.label, f"deleted; verification deferred ({exc})")
        return
    result.note(row.label, "delete accepted; still listed, verifying next pass")


def _create(
    cfg: Config,
    parts: Parts,
    ledger: FleetLedger,
    count: int,
    price: PlanPrice,
    snapshot: str,
    now: datetime,
    result: PassResult,
) -> int:
    """Create ``count`` instances, one POST each, each intent written right before its POST.
    Returns how many Vultr accepted."""
    f = cfg.fleet
    created = 0
    for _ in range(count):
        label = new_label(cfg, parts.rng, now)
        private, public = parts.keygen()
        user_data = parts.render_user_data(label, private, public)
        ledger.insert_intent(
            label=label,
            plan=f.plan,
            region=f.region,
            hourly_rate=price.hourly,
            monthly_cost=price.monthly,
            host_key=public,
            now=now,
        )
        try:
            inst = parts.cloud.create_instance(
                region=f.region,
                plan=f.plan,
                label=label,
                tags=[f.tag],
                snapshot_id=snapshot,
                user_data=user_data,
                hostname=label,
                attach_vpc=list(f.vpc_ids),
                firewall_group_id=f.firewall_group_id or None,
            )
        except AmbiguousCreate as exc:
            result.errors.append(
                f"{label}: create outcome unknown ({exc}); the next pass looks it up by label"
            )
            return created
        except VultrError as exc:
            ledger.transition(label, InstanceState.GONE, now, last_error=str(exc))
            result.errors.append(f"{label}: create refused: {exc}")
            return created
        created += 1
        ledger.transition(label, InstanceState.PENDING, now, instance_id=inst.id)
        result.note(label, f"created {inst.id}")
    return created


def new_label(cfg: Config, rng: random.Random, now: datetime) -> str:
    suffix = "".join(rng.choices(string.ascii_lowercase + string.digits, k=4))
    return f"{cfg.fleet.label_prefix}-{int(now.timestamp())}-{suffix}"


# --- the loop ----------------------------------------------------------------------------------


def run_forever(
    cfg: Config,
    parts: Parts,
    *,
    interval: timedelta,
    dry_run: bool = False,
    stop: threading.Event | None = None,
    on_result: Callable[[PassResult], None] = lambda r: None,
    on_error: Callable[[VultrscaleError], None] = lambda e: None,
    max_passes: int | None = None,
) -> int:
    """Run passes every ``interval`` until ``stop`` is set. A runtime failure (of a pass, or
    of ``on_result``) is reported and the loop goes on. A usage error before a first pass ran
    to its result (bad config, a plan Vultr refuses from the start) ends it with exit 2; after
    one (the
    price rose past the ceiling, the snapshot was deleted) it is reported and the loop goes on,
    so the fleet comes back when the condition clears: a refused fleet that wound down to
    nothing used to end the loop there."""
    stop = stop or threading.Event()
    passes = 0
    ran = False  # a pass has run to its result (not one that found the lock held, or failed)
    last = EXIT_OK
    while not stop.is_set():
        began = parts.clock.monotonic()
        try:
            result = run_pass(cfg, parts, dry_run=dry_run)
            ran = ran or not result.lock_held
            last = result.exit_code
            on_result(result)
        except UsageError as exc:
            if not ran:
                raise
            last = exc.exit_code
            on_error(exc)
        except RuntimeFailure as exc:
            last = exc.exit_code
            on_error(exc)
        passes += 1
        if max_passes is not None and passes >= max_passes:
            break
        remaining = interval.total_seconds() - (parts.clock.monotonic() - began)
        if remaining > 0:
            _wait(parts.clock, stop, remaining)
    return last


def _wait(clock: Clock, stop: threading.Event, seconds: float) -> None:
    from vultrscale.clock import SystemClock

    if isinstance(clock, SystemClock):
        stop.wait(seconds)
    else:
        clock.sleep(seconds)
