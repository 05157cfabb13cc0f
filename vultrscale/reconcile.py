"""One reconcile pass: lock -> check -> observe -> decide -> apply -> record.

- *Check*: every local precondition (``Parts.preflight``: the scaler's key file, the metrics
  target) and the plan's price are checked before anything is changed; a refused pass raises
  ``UsageError`` (exit 2) and its row in ``fleet_events`` is its only write. A plan or price
  that stops passing on a fleet that has instances refuses only creates: the pass drains and
  deletes as usual and ends with exit 2. A queue preset that does not match the database (its
  library's tables missing, or of another version) holds the fleet and ends with exit 2 too.
- *Observe* builds one frozen ``Readings`` value through the ports (ledger rows, what Vultr
  lists, workers, queue signals, drain probes, price) and writes nothing.
- *Decide* is pure: ``lifecycle`` (ledger state machine, drain verdicts) and ``policy.decide``.
- *Apply* carries the decision out through the ports; a failure on one instance is that
  instance's error, and the rest of the fleet is still acted on.
- *Record*: every pass that held the lock writes its ``fleet_events`` row, failed ones too
  (a Ctrl-C as it writes it is raised after); the forecast's cache only a pass that succeeded.

The pass is level-triggered and safe to kill at any point: every irreversible step is preceded
by a ledger write that lets the next pass find it (the create intent right before the POST, the
draining mark before the SSH stop), and a pass never waits for a drain to finish.
"""

from __future__ import annotations

import enum
import logging
import random
import string
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from vultrscale import forecast, interrupts, lifecycle, offerings
from vultrscale.clock import Clock
from vultrscale.config import Config, Offering, format_duration
from vultrscale.decision import (
    Adopt,
    Create,
    Decision,
    Fail,
    FlagWorkersDraining,
    MarkDraining,
    Move,
    Note,
    Readings,
    RetryDelete,
    Revive,
    SaveFleetState,
    StartDelete,
    Stop,
    UpdateAddress,
    decide,
    priced,
)
from vultrscale.errors import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_RUNTIME,
    EXIT_USAGE,
    DatabaseError,
    RuntimeFailure,
    UsageError,
    VultrscaleError,
)
from vultrscale.model import (
    Action,
    HostTarget,
    InstanceState,
    Observation,
    PassEvent,
    Plan,
)
from vultrscale.observe import observe
from vultrscale.offerings import Choice, OfferingCheck
from vultrscale.ports import (
    Cloud,
    DrainTransport,
    FleetLedger,
    JobHistory,
    PriceCheck,
    QueueSignals,
)
from vultrscale.ports import Parts as Parts  # re-exported: the pass's callers build them
from vultrscale.redaction import redact
from vultrscale.ssh import fan_out_bound_s
from vultrscale.vultr.errors import (
    AmbiguousCreate,
    AuthError,
    BadRequest,
    InstanceLimit,
    InstanceLocked,
    NotFound,
    OfferingUnavailable,
    VultrError,
    unknown_region,
)

if TYPE_CHECKING:
    pass

log = logging.getLogger("vultrscale.reconcile")

# How long a plan check (its price, and that the fleet's region offers it) is trusted before
# Vultr is asked again. Shared through the ledger by every pass of every process, so a steady
# one-shot pass (cron) makes one request, the list; a price change is seen within it.
PRICE_TTL = timedelta(minutes=10)


@dataclass
class PassResult:
    """What one pass saw, decided, did and what went wrong."""

    exit_code: int
    at: datetime
    lock_held: bool = False
    dry_run: bool = False
    plan: Plan | None = None
    observation: Observation | None = None
    decision: Decision | None = None  # everything the pass decided (None: it never got there)
    results: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    pass_id: int | None = None  # its fleet_events id (the pass id `events` shows); None: unrecorded
    # Creates Vultr refused this pass: (offering name, "unavailable" | "unclassified" |
    # "instance_limit"), for the metrics.
    refusals: list[tuple[str, str]] = field(default_factory=list)

    @property
    def actions(self) -> tuple[Action, ...]:
        """The plan's actions, each with its reason (none when the pass never decided)."""
        return () if self.plan is None else self.plan.actions

    def action_rows(self) -> list[dict[str, Any]]:
        """The actions as ``--json`` and the ``fleet_events`` row show them."""
        return [{"kind": a.kind.value, "label": a.label, "reason": a.reason} for a in self.actions]

    def to_json(self) -> dict[str, Any]:
        obs = self.observation
        return {
            "at": self.at.isoformat(),
            "exit_code": self.exit_code,
            "dry_run": self.dry_run,
            "lock_held": self.lock_held,
            "inputs": obs.summary() if obs else None,
            "plan": self.plan.summary() if self.plan else None,
            "actions": self.action_rows(),
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
    except VultrscaleError as exc:
        exc.pass_id = result.pass_id  # recorded (or None) before the error left the pass
        raise
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
        offered: dict[tuple[str, str], OfferingCheck] = {}
        api_error, refused = None, None
        try:
            offered = _offering_checks(cfg, parts, ledger, result.at, save=not result.dry_run)
            # No offering's plan, region or price passes: nothing may be created.
            refused = _refusal(cfg, offered)
        except AuthError:
            raise
        except VultrError as exc:
            api_error = f"Vultr API: {exc}"
        reads = observe(
            cfg,
            parts,
            ledger,
            signals,
            result.at,
            offered,
            api_error,
            refused,
            probe=not result.dry_run,
        )
        reads, fresh_profile = _forecast(cfg, parts, reads)
        decision = decide(reads, cfg)
        if decision.refused_outright and refused is not None:  # nothing to wind down
            raise refused
        result.decision = decision
        result.observation, result.plan = decision.observation, decision.plan
        result.errors.extend(decision.errors)
        if not result.dry_run:
            # Bad input (no snapshot, or one not complete) stops the pass before any change.
            if decision.creates:  # exit 2 now, not a user-data with the scaler's credentials later
                cfg.worker_database_url()
            snapshot = _snapshot(cfg, parts, ledger) if decision.creates else ""
            parts.before_changes(decision.plan)
            apply(cfg, parts, ledger, decision, snapshot, result)
        result.exit_code = (
            EXIT_USAGE
            if decision.refused or decision.misconfigured
            else EXIT_RUNTIME
            if result.errors
            else EXIT_OK
        )
        # The forecast's cache is written by a pass that succeeded only: a failed one (the API
        # down, no snapshot, a refusal) changes nothing but its fleet_events row and the steps
        # it carried out. The profile stays in this process's cache for its next pass to save.
        if fresh_profile is not None and result.exit_code == EXIT_OK and not result.dry_run:
            ledger.save_forecast_profile(fresh_profile)
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
        # A Ctrl-C now is raised once the pass is recorded: it cut the row's write, and a pass
        # that ran (and created) left none.
        with interrupts.held_off():
            if result.errors:
                # Belt and braces: whatever an adapter put in an error, no secret reaches the
                # ledger.
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
        actions=result.action_rows(),
        results=result.results,
        errors=result.errors,
        exit_code=result.exit_code,
    )
    try:
        result.pass_id = ledger.record_event(event)
    except DatabaseError as exc:
        if not quiet:
            raise
        log.warning("could not record the failed pass: %s", exc)


# --- check -------------------------------------------------------------------------------------


def _offering_checks(
    cfg: Config, parts: Parts, ledger: FleetLedger, now: datetime, *, save: bool
) -> dict[tuple[str, str], OfferingCheck]:
    """By (region, plan), what Vultr says of each offering of the fleet: its plan's price and
    whether its region's availability lists it. Asked at most every PRICE_TTL (the checks are
    shared through the ledger by every pass of every process), so a steady pass asks nothing.
    ``save``: remember the checks made (a dry run writes nothing)."""
    keys = [(o.region, o.plan) for o in offerings.of(cfg)]
    mine = parts.cache.price_check  # checks this process made and saved
    if mine is not None and mine.at <= now < mine.at + PRICE_TTL:
        cached = {(c.region, c.plan): c for c in mine.checks}
        if all(k in cached for k in keys):  # as fresh as their copy in the ledger
            return cached
    checks = ledger.offering_checks(keys, now, PRICE_TTL)
    missing = [k for k in keys if k not in checks]
    for region, plan in missing:
        check = _check_offering(parts.cloud, region, plan, listed=bool(cfg.fleet.offerings))
        checks[(region, plan)] = check
        if save:
            ledger.save_offering_check(check, now)
    if save and missing and len(missing) == len(keys):
        parts.cache.price_check = PriceCheck(tuple(checks.values()), now)
    return checks


def _forecast(
    cfg: Config, parts: Parts, reads: Readings
) -> tuple[Readings, forecast.Profile | None]:
    """The readings with a fresh forecast profile, and that profile when the ledger's is older
    (for the pass to save if it succeeds; else None): the ledger's while it is fresh, else this
    process's, else one computed from the queue's history. The history is scanned once per
    ``policy.forecast.refresh``, not every pass. A history that cannot be read keeps the cached
    profile, if any, and never fails the pass: the forecast only ever raises a floor."""
    fc = cfg.policy.forecast
    cached = reads.forecast
    if fc.mode == "off" or parts.history is None or (cached and cached.fresh(fc, reads.now)):
        return reads, None
    mine = parts.cache.profile
    if mine is not None and mine.fresh(fc, reads.now):
        return replace(reads, forecast=mine), mine
    try:
        profile = forecast_profile(cfg, parts.history, cached, reads.now)
    except DatabaseError as exc:
        log.warning("the floor forecast keeps its last profile: %s", exc)
        kept = reads if cached is not None and cached.fits(fc) else replace(reads, forecast=None)
        return kept, None
    parts.cache.profile = profile
    return replace(reads, forecast=profile), profile


def forecast_profile(
    cfg: Config, history: JobHistory, cached: forecast.Profile | None, now: datetime
) -> forecast.Profile:
    """The forecast profile at ``now``: ``cached`` while it is fresh, else computed from
    ``history`` over the weeks ``policy.forecast`` looks back (``DatabaseError`` when it
    cannot be read). The pass and `vultrscale forecast` both take it from here."""
    fc = cfg.policy.forecast
    if cached is not None and cached.fresh(fc, now):
        return cached
    return forecast.compute(
        history.buckets(now - fc.weeks * forecast.WEEK, now, fc.slot),
        now,
        slot=fc.slot,
        weeks=fc.weeks,
        quantile=fc.quantile,
        min_history=fc.min_history,
        pool=fc.pool,
    )


def _check_offering(cloud: Cloud, region: str, plan: str, *, listed: bool) -> OfferingCheck:
    """Ask Vultr for the plan's price and whether the region's availability lists it.
    ``listed``: the offering is one of ``[[fleet.offerings]]`` (else fleet.region/plan)."""
    try:
        vplan = cloud.get_plan(plan)
    except NotFound:
        return OfferingCheck(
            region,
            plan,
            None,
            False,
            f"{'plan' if listed else 'fleet.plan'} {plan!r} is not a Vultr plan",
            "Pick a plan id from https://api.vultr.com/v2/plans (e.g. vc2-1c-2gb).",
        )
    try:
        available = cloud.region_availability(region)
    except NotFound:
        unknown = unknown_region(region)
        problem = f"region {region!r} is not a Vultr region" if listed else unknown.message
        return OfferingCheck(region, plan, None, False, problem, unknown.hint or "")
    price = priced(vplan)
    if price is None:
        return OfferingCheck(
            region,
            plan,
            None,
            plan in available,
            f"Vultr lists plan {plan!r} without a usable price (monthly_cost read as "
            f"{vplan.monthly_cost!r}, hourly_cost {vplan.hourly_cost!r}): the budget cannot be "
            "held, so nothing is created",
            "Check GET /v2/plans for the plan; pick another plan if it has no price.",
        )
    return OfferingCheck.of(region, plan, price, plan in available)


def _refusal(cfg: Config, checks: dict[tuple[str, str], OfferingCheck]) -> UsageError | None:
    """The refusal of every create when no offering can be used (exit 2): an unknown plan or
    region, a plan its region does not offer, no usable price, a ceiling below one
    instance-month. Each offering is named with why; None while one can be used."""
    why: list[tuple[Offering, str, str]] = []
    for o in offerings.of(cfg):
        check = checks[(o.region, o.plan)]
        if not check.usable:
            why.append((o, check.problem, check.hint))
        elif check.price is not None and (too_dear := offerings.unaffordable(cfg, check.price)):
            why.append((o, too_dear, "Raise the ceiling or pick a cheaper plan."))
        else:
            return None
    if len(why) == 1:
        _, problem, hint = why[0]
        return UsageError(problem, hint=hint)
    return UsageError(
        "no offering of the fleet can be created on: "
        + "; ".join(f"{o.name}: {problem}" for o, problem, _ in why),
        hint="Fix or replace the [[fleet.offerings]] named; GET /v2/plans and "
        "GET /v2/regions/<id>/availability list what Vultr offers.",
    )


def _snapshot(cfg: Config, parts: Parts, ledger: FleetLedger) -> str:
    """The snapshot to boot from: fleet.snapshot_id, else the recorded one; must be complete."""
    sid = cfg.fleet.snapshot_id or ledger.recorded_snapshot() or ""
    if sid and parts.cache.snapshot == sid:
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
    parts.cache.snapshot = sid
    return sid


# --- apply -------------------------------------------------------------------------------------


def apply(
    cfg: Config,
    parts: Parts,
    ledger: FleetLedger,
    decision: Decision,
    snapshot: str,
    result: PassResult,
) -> None:
    """Carry the decision's steps out through the ports, in their (kill-safe) order, and
    record each outcome: a failure on one instance is that instance's error, the rest go on."""
    now = decision.now
    created = 0  # instances Vultr accepted: the fleet state's last scale-up depends on it
    revived = 0  # rows back to running: a scale-up too
    for step in decision.steps:
        match step:
            case UpdateAddress(label, main_ip, internal_ip):
                ledger.update_address(label, main_ip, internal_ip)
            case Adopt():
                result.note(step.label, step.note)
                price = step.price
                ledger.adopt(
                    label=step.label,
                    instance_id=step.instance_id,
                    state=step.state,
                    plan=step.plan,
                    region=step.region,
                    created_at=step.created_at,
                    now=now,
                    hourly_rate=price.hourly if price else None,
                    monthly_cost=price.monthly if price else None,
                )
            case Move():
                result.note(step.label, step.note)
                ledger.transition(
                    step.label,
                    step.state,
                    now,
                    instance_id=step.instance_id,
                    main_ip=step.main_ip,
                    internal_ip=step.internal_ip,
                    last_error=step.error,
                )
            case FlagWorkersDraining(labels):
                ledger.mark_workers_draining(list(labels))
            case Note(label, text):
                result.note(label, text)
            case Fail(label, text):
                result.errors.append(f"{label}: {text}")
            case StartDelete(label, instance_id, why):
                ledger.transition(label, InstanceState.DELETING, now)
                result.note(label, f"delete: {why}")
                _delete(parts.cloud, ledger, label, instance_id, now, result)
            case RetryDelete(label, instance_id):
                _delete(parts.cloud, ledger, label, instance_id, now, result)
            case MarkDraining(label):
                ledger.mark_draining(label, now)
            case Stop(targets, first):
                _stop(parts.drain, ledger, targets, result, first=first)
            case Revive(label, target, reason):
                # The order and why it is kill-safe: decision.Revive.
                ledger.revive(label, now)
                result.note(label, f"revive: {reason}")
                # Only a start sent is a scale-up (its cool-down): a refused one adds nothing.
                revived += _start(parts.drain, ledger, target, now, result)
            case Create():
                created += _create(cfg, parts, ledger, step, snapshot, now, result)
            case SaveFleetState(before, last_scale_down, idle_since):
                up = now if created or revived else before.last_scale_up
                if (up, last_scale_down, idle_since) != (
                    before.last_scale_up,
                    before.last_scale_down,
                    before.idle_since,
                ):
                    ledger.save_fleet_state(
                        now,
                        last_scale_up=up,
                        last_scale_down=last_scale_down,
                        idle_since=idle_since,
                    )


def _stop(
    drain: DrainTransport,
    ledger: FleetLedger,
    targets: Sequence[HostTarget],
    result: PassResult,
    *,
    first: bool,
) -> None:
    """`systemctl stop --no-block` on each target; a host that refuses is that host's error."""
    if not targets:
        return
    # SSH is not under the pass's deadline: say how long it may take, or a pass draining
    # many hosts at once would be reported stuck (and its session named to be killed).
    ledger.extend_lock(fan_out_bound_s(len(targets)))
    for label, err in drain.stop_many(list(targets)).items():
        if err is not None:
            result.errors.append(f"{label}: systemctl stop failed: {err}")
        elif first:
            result.note(label, "drain started: systemctl stop --no-block sent")


def _start(
    drain: DrainTransport,
    ledger: FleetLedger,
    target: HostTarget,
    now: datetime,
    result: PassResult,
) -> int:
    """`systemctl start --no-block` on a revived instance (1 when sent); a refusal is that
    host's error, and the instance goes back to draining (row and workers' flag), never to be
    revived again (``lifecycle.START_FAILED``): counted as capacity it would hold back a
    create until ``boot_timeout`` replaced it. Draining again, the next pass stops it again
    or deletes it, and creates what is missing. Were the start carried out after all (the
    answer lost), its worker reads its flag and claims nothing; the stop sent again drains
    it: no job is lost either way."""
    ledger.extend_lock(fan_out_bound_s(1))  # SSH is not under the pass's deadline (see _stop)
    err = drain.start_many([target]).get(target.label)
    if err is not None:
        ledger.mark_draining(target.label, now)
        ledger.note_error(target.label, f"{lifecycle.START_FAILED}: {err}")  # not revived again
        result.errors.append(
            f"{target.label}: {lifecycle.START_FAILED}: {err}; back to draining (the next pass "
            "creates in its place)"
        )
        return 0
    result.note(target.label, "worker started again: systemctl start --no-block sent")
    return 1


def _delete(
    cloud: Cloud,
    ledger: FleetLedger,
    label: str,
    instance_id: str | None,
    now: datetime,
    result: PassResult,
) -> None:
    """DELETE and verify it is gone; a locked instance is retried on a later pass."""
    if not instance_id:
        ledger.transition(label, InstanceState.GONE, now)
        return
    try:
        cloud.delete_instance(instance_id)
    except NotFound:
        pass
    except InstanceLocked as exc:
        ledger.note_error(label, str(exc), delete=True)
        result.note(label, "delete refused: instance locked at Vultr; retrying next pass")
        return
    except VultrError as exc:
        ledger.note_error(label, str(exc), delete=True)
        result.errors.append(f"{label}: delete failed: {exc}")
        return
    try:
        cloud.get_instance(instance_id)
    except NotFound:
        ledger.transition(label, InstanceState.GONE, now)
        result.note(label, "deleted")
        return
    except VultrError as exc:
        result.note(label, f"deleted; verification deferred ({exc})")
        return
    result.note(label, "delete accepted; still listed, verifying next pass")


def _create(
    cfg: Config,
    parts: Parts,
    ledger: FleetLedger,
    step: Create,
    snapshot: str,
    now: datetime,
    result: PassResult,
) -> int:
    """Create ``step.count`` instances, one POST each, each intent written right before its
    POST, on the step's offerings in order (``Choice.upto`` bounds each). A create refused for
    the offering (sold out, not offered; or in words the scaler does not know) marks it
    unavailable for ``fleet.unavailable_for`` and the step goes on with the next offering; the
    account's instance limit, an unclear outcome or any other error ends the step. Returns how
    many Vultr accepted."""
    created = 0
    # A step built without its choices (by hand) goes to its one plan and region.
    choices = step.choices or (Choice(Offering(step.region, step.plan), step.price, step.count),)
    for choice in choices:
        while created < min(step.count, choice.upto):
            outcome = _create_one(cfg, parts, ledger, choice, snapshot, now, result)
            if outcome is _Outcome.CREATED:
                created += 1
            elif outcome is _Outcome.NEXT_OFFERING:
                break
            else:
                return created
    return created


class _Outcome(enum.Enum):
    CREATED = "created"
    NEXT_OFFERING = "next offering"
    STOP = "stop"


def _create_one(
    cfg: Config,
    parts: Parts,
    ledger: FleetLedger,
    choice: Choice,
    snapshot: str,
    now: datetime,
    result: PassResult,
) -> _Outcome:
    """One intent and its POST on ``choice``'s offering, and what the step does next."""
    f, o, price = cfg.fleet, choice.offering, choice.price
    label = new_label(cfg, parts.rng, now)
    private, public = parts.keygen()
    # A worker runs as many jobs at once as its offering is sized for (asked only then: a
    # renderer written before offerings takes three arguments).
    if o.jobs_per_instance:
        user_data = parts.render_user_data(label, private, public, o.jobs_per_instance)
    else:
        user_data = parts.render_user_data(label, private, public)
    ledger.insert_intent(
        label=label,
        plan=o.plan,
        region=o.region,
        hourly_rate=price.hourly,
        monthly_cost=price.monthly,
        host_key=public,
        now=now,
    )
    try:
        inst = parts.cloud.create_instance(
            region=o.region,
            plan=o.plan,
            label=label,
            tags=[f.tag],
            snapshot_id=snapshot,
            user_data=user_data,
            hostname=label,
            attach_vpc=list(f.vpc_ids),
            firewall_group_id=f.firewall_group_id or None,
        )
    except AmbiguousCreate as exc:  # never POSTed again blindly: the next pass looks it up
        result.errors.append(
            f"{label}: create outcome unknown on {o.name} ({exc}); the next pass looks it up "
            "by label"
        )
        return _Outcome.STOP
    except InstanceLimit as exc:
        ledger.transition(label, InstanceState.GONE, now, last_error=_masked(cfg, str(exc)))
        result.refusals.append((o.name, "instance_limit"))
        result.errors.append(
            f"{label}: create refused on {o.name}: the account is at its instance limit "
            f"({exc.api_message or exc}); no offering is tried this pass ({exc.hint})"
        )
        return _Outcome.STOP
    except BadRequest as exc:
        if not isinstance(exc, OfferingUnavailable) and exc.status in _NOT_THE_OFFERING:
            # The key's permission (403) or a redirect: no offering takes it; as any error.
            ledger.transition(label, InstanceState.GONE, now, last_error=_masked(cfg, str(exc)))
            result.errors.append(f"{label}: create refused on {o.name}: {exc}")
            return _Outcome.STOP
        # Sold out or not offered there, or words the scaler does not know (reported as
        # Vultr gave them): that offering is skipped for a while, the next one is tried.
        kind = "unavailable" if isinstance(exc, OfferingUnavailable) else "unclassified"
        ledger.transition(label, InstanceState.GONE, now, last_error=_masked(cfg, str(exc)))
        until = now + f.unavailable_for
        # Stored (offering_marks), shown by status and recorded in the pass's results: the
        # config's secrets are masked as in the pass's errors.
        words = _masked(cfg, exc.api_message or str(exc))
        ledger.mark_unavailable(o.region, o.plan, until, words)
        result.refusals.append((o.name, kind))
        result.note(
            label,
            f"create refused on {o.name} ({'unavailable' if kind == 'unavailable' else 'refused'}"
            f": {words}); {o.name} skipped for {format_duration(f.unavailable_for)}, the next "
            "offering is tried",
        )
        if kind == "unclassified":
            result.errors.append(f"{label}: create refused on {o.name}: {words}")
        return _Outcome.NEXT_OFFERING
    except VultrError as exc:
        ledger.transition(label, InstanceState.GONE, now, last_error=_masked(cfg, str(exc)))
        result.errors.append(f"{label}: create refused on {o.name}: {exc}")
        return _Outcome.STOP
    ledger.transition(label, InstanceState.PENDING, now, instance_id=inst.id)
    result.note(label, f"created {inst.id} on {o.name}")
    return _Outcome.CREATED


# Refusals that say nothing of the offering: the API key's permission (ACL), a redirect.
_NOT_THE_OFFERING = frozenset({403, *range(300, 400)})


def _masked(cfg: Config, text: str) -> str:
    """``text`` with the config's secrets masked (Vultr's words may echo what was sent)."""
    return redact(text, cfg.secrets.values())


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
