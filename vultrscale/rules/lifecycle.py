"""The life of one fleet instance, decided. Pure: values and ``now`` in, values out.

Decisions about one instance live here, beside ``policy.decide`` (which sizes the fleet and
picks the instances to replace: only one whose worker holds no live lease, on readable
signals):

- the ledger state machine: a ledger row, what Vultr lists, whether its worker was seen and
  how long ago things happened -> the row's next state (``sync``);
- the drain verdicts: what `systemctl is-active` said (or why it could not be asked), how long
  the drain has run and the leases its worker holds -> delete, wait, send the stop again, or
  report an error (``drain_step``);
- adoption: where the row of a tagged instance the ledger did not know goes (``adoption``);
- revival: whether a draining instance's worker can be started again (``revivable``).
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol, TypeVar

from vultrscale.core.model import (
    InstanceState,
    LedgerRow,
    PlanPrice,
    ServiceState,
    WorkerView,
    retired_label,
)
from vultrscale.rules import budget

# A create intent whose instance never shows up in the tagged list within this time is dead:
# the POST failed before Vultr acted (or never happened).
CREATE_VISIBILITY_GRACE = timedelta(minutes=5)
# Vultr sometimes answers 404 / omits an instance from lists just after a create.
POST_VISIBILITY_GRACE = timedelta(minutes=3)
# Past drain.timeout, wait this much more before deleting a drain that never reported stopped.
DRAIN_MARGIN = timedelta(seconds=30)
# A worker heartbeat older than this (on the database's clock) does not count as "seen":
# booting -> running needs one, and a running instance without one is no longer capacity.
WORKER_SEEN_WITHIN = timedelta(minutes=5)

_BOOT_ORDER = {
    InstanceState.CREATING: 0,
    InstanceState.PENDING: 1,
    InstanceState.BOOTING: 2,
    InstanceState.RUNNING: 3,
}
NO_TARGET = "no address or pinned host key"


class Listed(Protocol):
    """An instance as the cloud lists it (``vultr.models.VInstance`` is one)."""

    @property
    def id(self) -> str: ...
    @property
    def label(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def server_status(self) -> str: ...
    @property
    def main_ip(self) -> str: ...
    @property
    def internal_ip(self) -> str: ...
    @property
    def plan(self) -> str: ...
    @property
    def region(self) -> str: ...
    @property
    def date_created(self) -> datetime | None: ...


_L = TypeVar("_L", bound=Listed)


@dataclass(frozen=True, slots=True)
class Transition:
    """A ledger change: ``row`` moves to ``state`` (or, with ``adopt``, is inserted)."""

    label: str
    state: InstanceState
    note: str
    instance_id: str | None = None  # learnt from the cloud; None: unchanged
    main_ip: str | None = None
    internal_ip: str | None = None
    error: str | None = None
    adopt: bool = False
    address_only: bool = False  # same state, a new address


def worker_seen(workers: Mapping[str, WorkerView], label: str) -> bool:
    """The instance's worker heartbeated within WORKER_SEEN_WITHIN (the database's clock)."""
    w = workers.get(label)
    return w is not None and w.seen


def boot_state(v: Listed, seen: bool, own_workers: bool) -> InstanceState:
    """Where a booting instance stands: running once its worker reported in (or, for a queue
    whose workers do not report to us, once Vultr says it is up)."""
    if seen:
        return InstanceState.RUNNING
    if not own_workers and v.status == "active" and v.server_status == "ok":
        return InstanceState.RUNNING  # no worker table to watch: the instance is up
    return InstanceState.BOOTING if v.status == "active" else InstanceState.PENDING


def needs_lookup(row: LedgerRow, now: datetime) -> bool:
    """The list did not show this row's instance: must the pass GET it before calling it gone?
    Only "not found" means gone; an intent or a fresh POST is judged by its age instead."""
    if row.state is InstanceState.CREATING or not row.instance_id:
        return False
    posted = row.posted_at or row.created_at
    return not (row.state is InstanceState.PENDING and now - posted < POST_VISIBILITY_GRACE)


def next_state(
    row: LedgerRow, v: Listed | None, now: datetime, *, seen: bool, own_workers: bool
) -> tuple[InstanceState, str | None, str | None]:
    """(new state, instance id learnt, error note) for one ledger row. ``v`` is the instance as
    listed, or as found by a GET when the list missed it; None: not at Vultr."""
    s = row.state
    if v is None:
        if s is InstanceState.CREATING:
            if now - row.created_at > CREATE_VISIBILITY_GRACE:
                return InstanceState.GONE, None, "create never became an instance"
            return s, None, None
        posted = row.posted_at or row.created_at
        if s is InstanceState.PENDING and now - posted < POST_VISIBILITY_GRACE:
            return s, None, None  # 404 just after create: not visible yet
        return InstanceState.GONE, None, None
    iid = v.id if row.instance_id != v.id else None
    if s is InstanceState.RUNNING and own_workers and not seen:
        # Its worker stopped heartbeating: it is no longer capacity. Back to booting, where
        # boot_timeout replaces it if the worker does not come back (and holds no lease).
        return InstanceState.BOOTING, iid, "worker not seen; waiting for it to come back"
    if s in _BOOT_ORDER:
        new = boot_state(v, seen, own_workers)
        if _BOOT_ORDER[new] < _BOOT_ORDER[s]:
            new = s
        return new, iid, None
    return s, iid, None


def _address(v: Listed | None) -> tuple[str | None, str | None]:
    if v is None:
        return None, None
    ip = v.main_ip if v.main_ip not in ("", "0.0.0.0") else None
    return ip, v.internal_ip or None


def by_label(listed: Iterable[_L], rows: Mapping[str, LedgerRow]) -> dict[str, _L]:
    """The tagged instances keyed by the ledger label each goes by. Vultr does not make labels
    unique, and an instance made in its console may have none, yet every tagged instance must
    be tracked, counted against the cap and the budget, and adoptable, drainable, deletable:

    - one the ledger knows by id goes by that row's label;
    - another keeps its own label when it is the only tagged instance with it and no ledger row
      holds that label for another instance (a create intent, not yet given an id, is its row);
    - any other goes by ``<label>@<id>`` (``unlabelled@<id>`` without a label)."""
    listed = list(listed)
    claims = Counter(v.label for v in listed)
    known = {r.instance_id: label for label, r in rows.items() if r.instance_id}
    out = {known[v.id]: v for v in listed if v.id in known}
    for v in listed:
        if v.id in known:
            continue
        row = rows.get(v.label)
        own = (
            v.label
            and claims[v.label] == 1
            and v.label not in out
            and (row is None or not row.instance_id)
        )
        out[v.label if own else f"{v.label or 'unlabelled'}@{v.id}"] = v
    return out


def sync(
    rows: Iterable[LedgerRow],
    listed: Mapping[str, Listed],
    workers: Mapping[str, WorkerView],
    now: datetime,
    *,
    own_workers: bool,
) -> list[Transition]:
    """Bring the ledger in line with the cloud: follow boots, mark gone, adopt strangers.

    ``listed`` is by label: the tagged list, plus the instances a GET found that the list
    missed (``needs_lookup``). Rows with no change give no transition."""
    by_id = {v.id: v for v in listed.values()}
    known: set[str] = set()
    labels: set[str] = set()
    out: list[Transition] = []
    for row in rows:
        labels.add(row.label)
        v = by_id.get(row.instance_id) if row.instance_id else listed.get(row.label)
        if v is not None:
            known.add(v.id)
        ip, internal = _address(v)
        seen = worker_seen(workers, row.label)
        new, iid, error = next_state(row, v, now, seen=seen, own_workers=own_workers)
        if new is row.state and iid is None and error is None:
            if ip and ip != row.main_ip:
                out.append(Transition(row.label, new, "", None, ip, internal, address_only=True))
            continue
        note = f"{row.state.value} -> {new.value}" + (f" ({error})" if error else "")
        out.append(Transition(row.label, new, note, iid, ip, internal, error))
    for label, v in listed.items():  # the label it goes by (``by_label``), not always its own
        if v.id in known or label in labels:
            continue
        state = boot_state(v, worker_seen(workers, label), own_workers)
        ip, internal = _address(v)
        note = f"adopted ({state.value}): tagged at Vultr, missing from the ledger"
        out.append(Transition(label, state, note, v.id, ip, internal, adopt=True))
    return out


def applied(
    rows: Mapping[str, LedgerRow],
    transitions: Iterable[Transition],
    listed: Mapping[str, Listed],
    fleet: str,
    now: datetime,
    prices: Mapping[str, PlanPrice] | None = None,
) -> dict[str, LedgerRow]:
    """The ledger rows as they are once ``transitions`` are written at ``now`` (gone rows
    dropped). ``prices``: by plan, what an adopted instance is billed at (``adopted_row``)."""
    out = dict(rows)
    for t in transitions:
        row = out.get(t.label)
        if t.adopt:
            v = listed[t.label]
            price = (prices or {}).get(v.plan)
            out[t.label] = adopted_row(
                fleet, t.label, v, t.state, v.date_created or now, now, price
            )
        elif row is not None:
            out[t.label] = row.moved(
                t.state,
                now,
                instance_id=t.instance_id or row.instance_id,
                main_ip=t.main_ip or row.main_ip,
                internal_ip=t.internal_ip or row.internal_ip,
            )
        if out[t.label].state is InstanceState.GONE:
            del out[t.label]
    return out


def adopted_row(
    fleet: str,
    label: str,
    v: Listed,
    state: InstanceState,
    created: datetime,
    now: datetime,
    price: PlanPrice | None = None,
) -> LedgerRow:
    """The row ``sync`` adopts, as ``label`` (see ``by_label``), for a tagged instance the
    ledger did not know, billed at ``price``, its own plan's (None: the fleet plan's, as the
    budget takes a row with no price of its own). It has no ``posted_at``, as this scaler
    never POSTed it: its boot_timeout counts from its adoption, not from its creation at Vultr
    (``LedgerRow.boot_since``). One adopted running has run (``running_at``): should its
    worker go quiet, boot_timeout counts from then."""
    return LedgerRow.new(
        label,
        fleet,
        state,
        created,
        instance_id=v.id,
        plan=v.plan,
        region=v.region,
        hourly_rate=price.hourly if price else None,
        monthly_cost=price.monthly if price else None,
        main_ip=v.main_ip,
        internal_ip=v.internal_ip,
        running_at=now if state is InstanceState.RUNNING else None,
        state_since=now,
    )


@dataclass(frozen=True, slots=True)
class LabelHolder:
    """The ledger row that has a label now (of any fleet): enough to decide an adoption."""

    state: InstanceState
    instance_id: str | None
    gone_at: datetime | None


@dataclass(frozen=True, slots=True)
class Adoption:
    """Where the row of an adopted instance goes (``adoption``)."""

    label: str  # the label it is recorded under
    retire_as: str | None  # first, another instance's gone row under the label moves here
    revive: bool  # its own gone row comes back under ``label``; else a new row is inserted


def adoption(
    label: str, instance_id: str, holder: LabelHolder | None, *, own_gone: bool
) -> Adoption:
    """How a tagged instance the ledger did not know is recorded, for every ledger:

    - its own gone row (the same instance: the list missed it long enough to be taken for
      gone) comes back: its creation, stamps and pinned key are still its own;
    - another instance's gone row under ``label`` (a name used before) is kept under its
      retired label, so this month's bill keeps its cost; the new row starts afresh;
    - a live row of another instance (another fleet's) under ``label`` is left alone: this one
      is recorded under ``<label>@<instance id>``, the name ``by_label`` gives a shared label.
    ``holder``: the row that has ``label`` now, if any; ``own_gone``: a gone row of this
    instance exists (under any label)."""
    retire_as = None
    taken = False
    if holder is not None and holder.instance_id != instance_id:
        if holder.state is InstanceState.GONE:
            retire_as = retired_label(label, holder.instance_id, holder.gone_at)
        else:
            taken = True
    final = retired_label(label, instance_id) if taken else label
    return Adoption(final, retire_as, own_gone)


# --- drains ------------------------------------------------------------------------------------


class Verdict(enum.StrEnum):
    DELETE = "delete"  # drained (or past its deadline with no live lease): delete it now
    WAIT = "wait"  # not yet: look again next pass
    ERROR = "error"  # the worker could not be asked and the grace has not run out


@dataclass(frozen=True, slots=True)
class DrainStep:
    """What to do with one draining instance this pass, and why. ``restop``: send the stop
    again (the worker is still active: the first one never arrived); never with DELETE."""

    label: str
    verdict: Verdict
    why: str
    restop: bool = False


def changes_at(
    row: LedgerRow, *, timeout: timedelta, unreachable_grace: timedelta
) -> list[datetime]:
    """When this module's rules may answer otherwise for ``row`` read again as it is: a
    drain's deadline (``drain.timeout`` and the margin) and its unreachable grace
    (``drain_step``), a fresh POST's visibility grace, and a create intent's (``next_state``).
    A deadline passed only after it (``waited > deadline``) changes the instant past it."""
    if row.state is InstanceState.DRAINING:
        began = drain_began(row)
        return [
            began + timeout + DRAIN_MARGIN + budget.PAST,
            began + unreachable_grace + budget.PAST,
        ]
    if row.state in (InstanceState.PENDING, InstanceState.BOOTING):
        return [(row.posted_at or row.created_at) + POST_VISIBILITY_GRACE]
    if row.state is InstanceState.CREATING:
        return [row.created_at + CREATE_VISIBILITY_GRACE + budget.PAST]
    return []


def drain_began(row: LedgerRow) -> datetime:
    """When a draining row's drain began: what its deadline and grace count from."""
    return row.draining_at or row.state_since


def drain_step(
    label: str,
    service: ServiceState | str,
    waited: timedelta,
    live: int | None,
    *,
    timeout: timedelta,
    unreachable_grace: timedelta,
) -> DrainStep:
    """The verdict for one draining instance. ``service`` is what `systemctl is-active` said,
    or why it could not be asked (an SSH error, or NO_TARGET); ``live`` the live leases of its
    worker, None when the queue could not be read."""
    deadline = timeout + DRAIN_MARGIN
    if isinstance(service, ServiceState):
        if service.stopped:
            if live is None:
                return DrainStep(
                    label, Verdict.WAIT, f"worker {service}; queue unreadable, not deleting yet"
                )
            if live:
                why = f"worker {service}; waiting for {live} live lease(s) to expire"
                return DrainStep(label, Verdict.WAIT, why)
            return DrainStep(label, Verdict.DELETE, f"worker {service}")
        restop = service is ServiceState.ACTIVE
        if waited > deadline:
            why = f"drain past its deadline (worker {service})"
            return _past_deadline(label, live, why, restop)
        return DrainStep(label, Verdict.WAIT, f"draining: worker {service}", restop)
    if waited > unreachable_grace or waited > deadline:
        return _past_deadline(label, live, f"unreachable past its grace ({service})", False)
    return DrainStep(label, Verdict.ERROR, f"drain check failed: {service}")


def _past_deadline(label: str, live: int | None, why: str, restop: bool) -> DrainStep:
    if live is None:
        return DrainStep(label, Verdict.WAIT, f"{why}; queue unreadable, not deleting", restop)
    if live > 0:
        # Past the deadline the promise allows a delete; the lease will be recovered by
        # expiry. We still wait for the lease to lapse: a live lease means a worker that
        # heartbeats, and an instance that heartbeats is not dead.
        why = f"{why}; worker still holds {live} live lease(s), waiting"
        return DrainStep(label, Verdict.WAIT, why, restop)
    return DrainStep(label, Verdict.DELETE, why)  # no stop for a host being deleted


# --- revival -----------------------------------------------------------------------------------

# What `systemctl is-active` may say of a draining instance's worker for `systemctl start` to
# bring a worker that claims jobs back (systemd's service_start):
# - inactive or failed: the old process is gone; start spawns a new one at once;
# - deactivating: the old process got its SIGTERM and is draining. A start cannot take the
#   signal back: systemd answers the start job "try again later" (-EAGAIN) while the unit
#   stops, keeps the job queued (it replaces the stop job, whose SIGTERM was already sent),
#   and runs it once the old process has exited: within the worker's drain time, bounded by
#   TimeoutStopSec. The old process gives back what it did not finish; the new one claims;
# - activating: Restart=on-failure is about to spawn one ("already on it": start is a no-op).
# Each new process registers with the draining flag its instance's ledger row gives it
# (``db.queue.register_worker``), so the row must be running before the start is sent.
# Not active: a worker that runs while its instance drains never got the stop, but did read
# the draining mark from the database, and holds it for the rest of its life; a start on an
# active unit does nothing, so that worker would never claim again.
REVIVABLE = frozenset(
    {ServiceState.INACTIVE, ServiceState.FAILED, ServiceState.DEACTIVATING, ServiceState.ACTIVATING}
)


# A revive whose start failed leaves this at the head of the row's last_error, for a person to
# read, and marks the row never to be revived again (``LedgerRow.never_revive``; it drains
# again, apply._start): else a host that refuses every start (an image baked before the
# sudoers rule allowed it) would be revived and refused every pass, holding back the create
# that replaces it.
START_FAILED = "systemctl start failed"


def revivable(
    state: InstanceState,
    service: ServiceState | str | None,
    reachable: bool,
    never_revive: bool = False,
) -> bool:
    """Can this instance's worker be started again instead of booting a new instance?

    ``state`` is its ledger row's state as the pass read it: only DRAINING, never DELETING
    (once its delete has been sent, the instance may vanish under the worker). A delete that
    this pass's drain verdict would start has not been sent yet: the row still reads DRAINING
    and may be revived instead. ``service``: what `systemctl is-active` said this pass (an
    SSH error or no target: a string; not asked: None); ``reachable``: it has an SSH target;
    ``never_revive``: its row's mark (a start that failed before)."""
    return (
        state is InstanceState.DRAINING
        and reachable
        and isinstance(service, ServiceState)
        and service in REVIVABLE
        and not never_revive
    )
