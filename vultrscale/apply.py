"""The write stage of a pass: every change it makes, through the ports.

``apply`` carries out the decision's steps (``decision.Step``) in their kill-safe order and
records each outcome in the pass's result: a failure on one instance is that instance's error,
and the rest of the fleet is still acted on. The ledger is handed the step values themselves.
``remember`` keeps what the read stage learnt (the offerings' checks), ``save_profile`` a new
forecast profile (a pass that succeeded only), ``record`` the pass's ``fleet_events`` row.

Every irreversible step is preceded by a ledger write that lets the next pass find it (the
create intent right before the POST, the draining mark before the SSH stop, the row running
before the SSH start), and a pass never waits for a drain to finish.
"""

from __future__ import annotations

import enum
import logging
import random
import string
from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from vultrscale.config import Config, Offering, format_duration
from vultrscale.core.forecast import Profile
from vultrscale.core.model import HostTarget, InstanceState, PassEvent
from vultrscale.errors import DatabaseError
from vultrscale.ports import Cloud, DrainTransport, FleetLedger, Parts, PassCache, PriceCheck
from vultrscale.redaction import redact
from vultrscale.rules import lifecycle, offerings
from vultrscale.rules.decision import (
    Adopt,
    Create,
    Decision,
    Fail,
    FlagWorkersDraining,
    MarkDraining,
    Move,
    Note,
    RetryDelete,
    Revive,
    SaveFleetState,
    StartDelete,
    Stop,
    UpdateAddress,
)
from vultrscale.rules.offerings import Choice
from vultrscale.rules.readings import Readings
from vultrscale.ssh import fan_out_bound_s
from vultrscale.vultr.errors import (
    AmbiguousCreate,
    BadRequest,
    InstanceLimit,
    InstanceLocked,
    NotFound,
    OfferingUnavailable,
    VultrError,
)

log = logging.getLogger("vultrscale.apply")


class Outcomes(Protocol):
    """Where the write stage puts what each step did: the pass's result
    (``reconcile.PassResult``), which the pass records whatever happens next."""

    errors: list[str]
    # Creates Vultr refused: (offering name, "unavailable" | "unclassified" | "instance_limit").
    refusals: list[tuple[str, str]]

    def note(self, label: str, what: str) -> None: ...


def apply(
    cfg: Config,
    parts: Parts,
    ledger: FleetLedger,
    decision: Decision,
    snapshot: str,
    out: Outcomes,
) -> None:
    """Carry the decision's steps out through the ports, in their (kill-safe) order, and
    record each outcome: a failure on one instance is that instance's error, the rest go on."""
    now = decision.now
    created = 0  # instances Vultr accepted: the fleet state's last scale-up depends on it
    revived = 0  # rows back to running: a scale-up too
    for step in decision.steps:
        match step:
            case UpdateAddress():
                ledger.update_address(step)
            case Adopt():
                out.note(step.label, step.note)
                ledger.adopt(step, now)
            case Move():
                out.note(step.label, step.note)
                ledger.transition(step, now)
            case FlagWorkersDraining(labels):
                ledger.mark_workers_draining(list(labels))
            case Note(label, text):
                out.note(label, text)
            case Fail(label, text):
                out.errors.append(f"{label}: {text}")
            case StartDelete(label, instance_id, why):
                ledger.transition(Move(label, why, InstanceState.DELETING), now)
                out.note(label, f"delete: {why}")
                _delete(parts.cloud, ledger, label, instance_id, now, out)
            case RetryDelete(label, instance_id):
                _delete(parts.cloud, ledger, label, instance_id, now, out)
            case MarkDraining(label):
                ledger.mark_draining(label, now)
            case Stop(targets, first):
                _stop(parts.drain, ledger, targets, out, first=first)
            case Revive(label, target, reason):
                # The order and why it is kill-safe: decision.Revive.
                ledger.revive(label, now)
                out.note(label, f"revive: {reason}")
                # Only a start sent is a scale-up (its cool-down): a refused one adds nothing.
                revived += _start(parts.drain, ledger, target, now, out)
            case Create():
                created += _create(cfg, parts, ledger, step, snapshot, now, out)
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


def remember(cfg: Config, ledger: FleetLedger, cache: PassCache, reads: Readings) -> None:
    """Keep the offerings' checks the read stage asked of Vultr, for every pass of every
    process (a dry run keeps none); with every offering asked anew, this process keeps them
    too, as fresh as their copy in the ledger (``read.PRICE_TTL``)."""
    for check in reads.new_checks:
        ledger.save_offering_check(check, reads.now)
    if reads.new_checks and len(reads.new_checks) == len(offerings.of(cfg)):
        cache.price_check = PriceCheck(reads.new_checks, reads.now)


def save_profile(ledger: FleetLedger, profile: Profile) -> None:
    """Replace the ledger's forecast profile with the one this pass computed (a pass that
    succeeded only: a failed one changes nothing but its row and the steps it carried out)."""
    ledger.save_forecast_profile(profile)


def record(ledger: FleetLedger, event: PassEvent, *, quiet: bool) -> int | None:
    """Write the pass's fleet_events row; its id. When the pass already failed (``quiet``), a
    failure to record is logged (None) and the pass's own error is the one reported."""
    try:
        return ledger.record_event(event)
    except DatabaseError as exc:
        if not quiet:
            raise
        log.warning("could not record the failed pass: %s", exc)
        return None


# --- the hosts ----------------------------------------------------------------------------------


def _stop(
    drain: DrainTransport,
    ledger: FleetLedger,
    targets: Sequence[HostTarget],
    out: Outcomes,
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
            out.errors.append(f"{label}: systemctl stop failed: {err}")
        elif first:
            out.note(label, "drain started: systemctl stop --no-block sent")


def _start(
    drain: DrainTransport,
    ledger: FleetLedger,
    target: HostTarget,
    now: datetime,
    out: Outcomes,
) -> int:
    """`systemctl start --no-block` on a revived instance (1 when sent); a refusal is that
    host's error, and the instance goes back to draining (row and workers' flag), never to be
    revived again (``LedgerRow.never_revive``): counted as capacity it would hold back a
    create until ``boot_timeout`` replaced it. Draining again, the next pass stops it again
    or deletes it, and creates what is missing. Were the start carried out after all (the
    answer lost), its worker reads its flag and claims nothing; the stop sent again drains
    it: no job is lost either way."""
    ledger.extend_lock(fan_out_bound_s(1))  # SSH is not under the pass's deadline (see _stop)
    err = drain.start_many([target]).get(target.label)
    if err is not None:
        ledger.start_refused(target.label, now, f"{lifecycle.START_FAILED}: {err}")
        out.errors.append(
            f"{target.label}: {lifecycle.START_FAILED}: {err}; back to draining (the next pass "
            "creates in its place)"
        )
        return 0
    out.note(target.label, "worker started again: systemctl start --no-block sent")
    return 1


# --- the cloud ----------------------------------------------------------------------------------


def _delete(
    cloud: Cloud,
    ledger: FleetLedger,
    label: str,
    instance_id: str | None,
    now: datetime,
    out: Outcomes,
) -> None:
    """DELETE and verify it is gone; a locked instance is retried on a later pass."""
    gone = Move(label, "deleted", InstanceState.GONE)
    if not instance_id:
        ledger.transition(gone, now)
        return
    try:
        cloud.delete_instance(instance_id)
    except NotFound:
        pass
    except InstanceLocked as exc:
        ledger.note_error(label, str(exc), delete=True)
        out.note(label, "delete refused: instance locked at Vultr; retrying next pass")
        return
    except VultrError as exc:
        ledger.note_error(label, str(exc), delete=True)
        out.errors.append(f"{label}: delete failed: {exc}")
        return
    try:
        cloud.get_instance(instance_id)
    except NotFound:
        ledger.transition(gone, now)
        out.note(label, "deleted")
        return
    except VultrError as exc:
        out.note(label, f"deleted; verification deferred ({exc})")
        return
    out.note(label, "delete accepted; still listed, verifying next pass")


def _create(
    cfg: Config,
    parts: Parts,
    ledger: FleetLedger,
    step: Create,
    snapshot: str,
    now: datetime,
    out: Outcomes,
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
            outcome = _create_one(cfg, parts, ledger, choice, snapshot, now, out)
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
    out: Outcomes,
) -> _Outcome:
    """One intent and its POST on ``choice``'s offering, and what the step does next."""
    f, o = cfg.fleet, choice.offering
    label = new_label(cfg, parts.rng, now)
    private, public = parts.keygen()
    # A worker runs as many jobs at once as its offering is sized for (asked only then: a
    # renderer written before offerings takes three arguments).
    if o.jobs_per_instance:
        user_data = parts.render_user_data(label, private, public, o.jobs_per_instance)
    else:
        user_data = parts.render_user_data(label, private, public)
    ledger.insert_intent(label, choice, public, now)
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
        out.errors.append(
            f"{label}: create outcome unknown on {o.name} ({exc}); the next pass looks it up "
            "by label"
        )
        return _Outcome.STOP
    except VultrError as exc:
        refused = Move(label, "create refused", InstanceState.GONE, error=_masked(cfg, str(exc)))
        ledger.transition(refused, now)
        return _refused(cfg, ledger, label, o, exc, now, out)
    ledger.transition(Move(label, "created", InstanceState.PENDING, inst.id), now)
    out.note(label, f"created {inst.id} on {o.name}")
    return _Outcome.CREATED


def _refused(
    cfg: Config,
    ledger: FleetLedger,
    label: str,
    o: Offering,
    exc: VultrError,
    now: datetime,
    out: Outcomes,
) -> _Outcome:
    """What a create Vultr refused means for the step (its intent already gone): the
    account's limit or any error ends it; an offering sold out, not offered there, or refused
    in words the scaler does not know is skipped for ``fleet.unavailable_for``, and the step
    goes on with the next offering."""
    f = cfg.fleet
    if isinstance(exc, InstanceLimit):
        out.refusals.append((o.name, "instance_limit"))
        out.errors.append(
            f"{label}: create refused on {o.name}: the account is at its instance limit "
            f"({exc.api_message or exc}); no offering is tried this pass ({exc.hint})"
        )
        return _Outcome.STOP
    # The key's permission (403) or a redirect says nothing of the offering: as any error.
    if not isinstance(exc, BadRequest) or (
        not isinstance(exc, OfferingUnavailable) and exc.status in _NOT_THE_OFFERING
    ):
        out.errors.append(f"{label}: create refused on {o.name}: {exc}")
        return _Outcome.STOP
    kind = "unavailable" if isinstance(exc, OfferingUnavailable) else "unclassified"
    # Stored (offering_marks), shown by status and recorded in the pass's results: the
    # config's secrets are masked as in the pass's errors.
    words = _masked(cfg, exc.api_message or str(exc))
    ledger.mark_unavailable(o.region, o.plan, now + f.unavailable_for, words)
    out.refusals.append((o.name, kind))
    out.note(
        label,
        f"create refused on {o.name} ({'unavailable' if kind == 'unavailable' else 'refused'}"
        f": {words}); {o.name} skipped for {format_duration(f.unavailable_for)}, the next "
        "offering is tried",
    )
    if kind == "unclassified":
        out.errors.append(f"{label}: create refused on {o.name}: {words}")
    return _Outcome.NEXT_OFFERING


# Refusals that say nothing of the offering: the API key's permission (ACL), a redirect.
_NOT_THE_OFFERING = frozenset({403, *range(300, 400)})


def _masked(cfg: Config, text: str) -> str:
    """``text`` with the config's secrets masked (Vultr's words may echo what was sent)."""
    return redact(text, cfg.secrets.values())


def new_label(cfg: Config, rng: random.Random, now: datetime) -> str:
    """A new instance's label: ``<label_prefix>-<unix time>-<4 random characters>``."""
    suffix = "".join(rng.choices(string.ascii_lowercase + string.digits, k=4))
    return f"{cfg.fleet.label_prefix}-{int(now.timestamp())}-{suffix}"
