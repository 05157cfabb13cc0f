"""In-memory adapters of the pass's ports: a pass with no Postgres, no HTTP and no SSH.

The unit tier drives ``reconcile.run_pass`` on these with a ``FakeClock``, and the what-if
simulator replays days of workload through them. Build a pass like this::

    clock = FakeClock(start)
    cloud = MemoryCloud(clock)                      # plan, region and snapshot preset
    ledger = MemoryLedger("workers")                # cfg.fleet.name
    signals = MemorySignals(Signals(ready=12, in_flight=0))
    drain = MemoryDrain()
    parts = memory_parts(clock, cloud, ledger, signals, drain)
    run_pass(cfg, parts)

They keep the real adapters' promises that the pass relies on (``NotFound`` for an unknown
id, ``InstanceLocked`` while an instance is locked, the ledger's first-time transition stamps,
an SSH failure as that host's value) and nothing more. Cheap per call: no copies of the fleet
beyond the lists a port returns.
"""

from __future__ import annotations

import itertools
import random
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from vultrscale.core import boottime
from vultrscale.core.clock import Clock
from vultrscale.core.model import (
    FleetState,
    HostTarget,
    InstanceState,
    LedgerRow,
    OfferingMark,
    PassEvent,
    ServiceState,
    Signals,
    StoredReads,
    WorkerView,
)
from vultrscale.errors import DatabaseError, SSHError
from vultrscale.ports import AccountLedger, JobHistory, QueueSignals, Session, read_apart
from vultrscale.rules.decision import Move
from vultrscale.rules.offerings import OfferingCheck
from vultrscale.vultr import refusals
from vultrscale.vultr.errors import (
    BadRequest,
    InstanceLimit,
    InstanceLocked,
    NotFound,
    OfferingUnavailable,
)
from vultrscale.vultr.models import VInstance, VPlan, VSnapshot

if TYPE_CHECKING:
    from vultrscale.config import Config
    from vultrscale.core.forecast import Bucket, Profile
    from vultrscale.ports import Parts
    from vultrscale.rules.decision import Adopt, UpdateAddress
    from vultrscale.rules.offerings import Choice

PLAN = VPlan("vc2-1c-2gb", vcpu_count=1, ram=2048, monthly_cost=10.0, hourly_cost=0.015)
SNAPSHOT = "cb676a46-66fd-4dfb-b839-443f2e6c0b60"  # a Vultr id: config check takes only those


class MemoryCloud:
    """The Cloud port: instances boot ``boot_after`` after their POST (pending -> active)."""

    def __init__(
        self,
        clock: Clock,
        *,
        plans: Sequence[VPlan] = (PLAN,),
        regions: dict[str, set[str]] | None = None,
        snapshots: dict[str, str] | None = None,
        boot_after: timedelta = timedelta(seconds=60),
    ) -> None:
        self.clock = clock
        self.plans = {p.id: p for p in plans}
        self.regions = regions if regions is not None else {"ewr": set(self.plans)}
        self.snapshots = snapshots if snapshots is not None else {SNAPSHOT: "complete"}
        self.boot_after = boot_after
        self.instances: dict[str, VInstance] = {}  # by id
        self.locked: set[str] = set()  # ids whose DELETE answers "locked"
        self._booting: dict[str, datetime] = {}  # id -> when it becomes active
        self._ids = itertools.count(1)
        self.posts = 0
        self.deletes = 0
        # Stock (docs/offerings.md): (region, plan) sold out, each refusing creates; the
        # account's instance limit (None: none). See sell_out, restock.
        self.sold_out: set[tuple[str, str]] = set()
        self.instance_limit: int | None = None
        self.refused = 0  # creates refused for stock or the limit (not counted in ``posts``)

    def sell_out(self, region: str, plan: str, *, unlist: bool = False) -> None:
        """The plan runs out of stock in the region: creates there are refused (as Vultr words
        it); ``unlist``: the region's availability stops listing the plan too."""
        self.sold_out.add((region, plan))
        if unlist:
            self.regions.get(region, set()).discard(plan)

    def restock(self, region: str, plan: str) -> None:
        """The plan is back in the region: listed, and creates there succeed."""
        self.sold_out.discard((region, plan))
        self.regions.setdefault(region, set()).add(plan)

    def _refusal(self, region: str, plan: str) -> BadRequest | None:
        """The refusal Vultr would answer a create on ``region``/``plan`` with, if any: the
        account's limit first (it holds whatever the plan), then the stock."""
        if self.instance_limit is not None and len(self.instances) >= self.instance_limit:
            text = refusals.CREATE_FAILED + refusals.INSTANCE_LIMIT
            return InstanceLimit(
                f"POST /v2/instances failed: 400 {text}", status=400, api_message=text
            )
        if (region, plan) in self.sold_out or plan not in self.regions.get(region, set()):
            text = refusals.CREATE_FAILED + refusals.SOLD_OUT
            return OfferingUnavailable(
                f"POST /v2/instances failed: 400 {text}", status=400, api_message=text
            )
        return None

    def _tick(self) -> None:
        if not self._booting:
            return
        now = self.clock.now()
        for iid, due in list(self._booting.items()):
            if due <= now and iid in self.instances:
                n = int(iid.rsplit("-", 1)[1])
                self.instances[iid] = replace(
                    self.instances[iid],
                    status="active",
                    power_status="running",
                    server_status="ok",
                    main_ip=f"10.{n // 65536 % 256}.{n // 256 % 256}.{n % 256}",
                )
                del self._booting[iid]

    def list_instances(self, tag: str | None = None) -> list[VInstance]:
        self._tick()
        return [v for v in self.instances.values() if tag is None or tag in v.tags]

    def get_instance(self, instance_id: str) -> VInstance:
        self._tick()
        try:
            return self.instances[instance_id]
        except KeyError:
            raise NotFound(f"instance {instance_id} not found", status=404) from None

    def create_instance(
        self,
        *,
        region: str,
        plan: str,
        label: str,
        tags: Sequence[str],
        snapshot_id: str | None = None,
        user_data: str | None = None,
        hostname: str | None = None,
        attach_vpc: Sequence[str] = (),
        firewall_group_id: str | None = None,
    ) -> VInstance:
        refusal = self._refusal(region, plan)
        if refusal is not None:
            self.refused += 1
            raise refusal
        self.posts += 1
        iid = f"inst-{next(self._ids)}"
        now = self.clock.now()
        v = VInstance(
            id=iid,
            label=label,
            status="pending",
            power_status="stopped",
            server_status="none",
            main_ip="0.0.0.0",
            region=region,
            plan=plan,
            date_created=now,
            tags=tuple(tags),
        )
        self.instances[iid] = v
        self._booting[iid] = now + self.boot_after
        return v

    def delete_instance(self, instance_id: str) -> None:
        if instance_id not in self.instances:
            raise NotFound(f"instance {instance_id} not found", status=404)
        if instance_id in self.locked:
            raise InstanceLocked(f"instance {instance_id} is locked", status=500)
        self.deletes += 1
        del self.instances[instance_id]

    def get_plan(self, plan_id: str) -> VPlan:
        try:
            return self.plans[plan_id]
        except KeyError:
            raise NotFound(f"plan {plan_id} not found", status=404) from None

    def region_availability(self, region: str) -> set[str]:
        return self.regions.get(region, set())

    def get_snapshot(self, snapshot_id: str) -> VSnapshot:
        try:
            return VSnapshot(snapshot_id, status=self.snapshots[snapshot_id])
        except KeyError:
            raise NotFound(f"snapshot {snapshot_id} not found", status=404) from None

    def close(self) -> None:
        pass


@dataclass
class MemoryLedger:
    """The FleetLedger port for one fleet. ``workers`` is what the ``workers`` table would say
    (the caller keeps ``seen`` and ``live_leases`` current); ``events`` holds every recorded
    pass; ``held_elsewhere`` makes ``lock`` answer that another pass holds it."""

    fleet: str
    instances: dict[str, LedgerRow] = field(default_factory=dict)
    workers_by_label: dict[str, WorkerView] = field(default_factory=dict)
    state: FleetState = field(default_factory=FleetState)
    events: list[PassEvent] = field(default_factory=list)  # read as the fleet_events rows
    snapshot: str | None = None
    held_elsewhere: bool = False
    lock_extensions: list[float] = field(default_factory=list)  # this pass's extend_lock's
    # (plan, region) -> (check, checked at): the offering checks every pass shares.
    plan_checks: dict[tuple[str, str], tuple[OfferingCheck, datetime]] = field(default_factory=dict)
    # (region, plan) -> the refused creates remembered (offering_marks).
    marks: dict[tuple[str, str], OfferingMark] = field(default_factory=dict)
    profile: Profile | None = None  # the cached forecast profile (``forecast_profiles``)
    # The account's records (``MemoryAccount.add`` sets it); None: a fleet on its own.
    account: AccountLedger | None = None

    def lock(self) -> bool:
        self.lock_extensions.clear()  # one pass's: a long simulation keeps no history
        return not self.held_elsewhere

    def extend_lock(self, seconds: float) -> None:
        self.lock_extensions.append(seconds)

    def rows(self, since: datetime) -> list[LedgerRow]:
        out = [
            r
            for r in self.instances.values()
            if r.state is not InstanceState.GONE or (r.gone_at is not None and r.gone_at >= since)
        ]
        out.sort(key=lambda r: (r.created_at, r.label))
        return out

    def workers(
        self, seen_within: timedelta, labels: Sequence[str] | None = None
    ) -> dict[str, WorkerView]:
        w = self.workers_by_label
        if labels is None:
            labels = [r.label for r in self.instances.values() if r.state is not InstanceState.GONE]
        return {label: w[label] for label in labels if label in w}

    def fleet_state(self) -> FleetState:
        return self.state

    def reads(
        self,
        since: datetime,
        seen_within: timedelta,
        signals: QueueSignals,
        *,
        forecast: bool = False,
    ) -> StoredReads:
        return replace(
            read_apart(self, since, seen_within, signals, forecast=forecast),
            marks=tuple(self.marks.values()),
            boots=self.boots(),
        )

    def boots(self) -> list[LedgerRow]:
        """The fleet's newest boots, as Postgres reads them (``ledger._BOOTS``)."""
        return boottime.newest_boots(self.instances.values())

    def forecast_profile(self) -> Profile | None:
        return self.profile

    def save_forecast_profile(self, profile: Profile) -> None:
        self.profile = profile

    def recorded_snapshot(self) -> str | None:
        return self.snapshot

    def offering_checks(
        self, keys: Sequence[tuple[str, str]], now: datetime, ttl: timedelta
    ) -> dict[tuple[str, str], OfferingCheck]:
        out = {}
        for region, plan in keys:
            found = self.plan_checks.get((plan, region))
            if found is not None and now - ttl < found[1] <= now:
                check = found[0]  # as Postgres gives it back: the price and the listing
                out[(region, plan)] = OfferingCheck.of(region, plan, check.price, check.listed)
        return out

    def save_offering_check(self, check: OfferingCheck, now: datetime) -> None:
        if check.price is not None:
            self.plan_checks[(check.plan, check.region)] = (check, now)

    def mark_unavailable(self, region: str, plan: str, until: datetime, reason: str) -> None:
        before = self.marks.get((region, plan))
        refusals = before.refusals + 1 if before else 1
        self.marks[(region, plan)] = OfferingMark(region, plan, until, reason, refusals)

    def insert_intent(self, label: str, choice: Choice, host_key: str, now: datetime) -> None:
        if label in self.instances:
            raise DatabaseError(f"fleet ledger: label {label} exists")
        price = choice.price
        self.instances[label] = LedgerRow.new(
            label,
            self.fleet,
            InstanceState.CREATING,
            now,
            plan=choice.offering.plan,
            region=choice.offering.region,
            hourly_rate=price.hourly,
            monthly_cost=price.monthly,
            host_key=host_key,
        )

    def transition(self, move: Move, now: datetime) -> None:
        row = self.instances.get(move.label)
        if row is None:
            return  # an UPDATE of no row
        self.instances[move.label] = row.moved(
            move.state,
            now,
            instance_id=move.instance_id or row.instance_id,
            main_ip=move.main_ip or row.main_ip,
            internal_ip=move.internal_ip or row.internal_ip,
            last_error=move.error,
        )

    def adopt(self, step: Adopt, now: datetime) -> None:
        from vultrscale.rules.lifecycle import LabelHolder, adopted_row, adoption

        gone = InstanceState.GONE
        label, instance_id, state = step.label, step.instance_id, step.state
        note = "adopted: tagged at Vultr but missing from the ledger"
        held = self.instances.get(label)
        own = next(
            (r for r in self.instances.values() if (r.instance_id, r.state) == (instance_id, gone)),
            None,
        )
        holder = None if held is None else LabelHolder(held.state, held.instance_id, held.gone_at)
        where = adoption(label, instance_id, holder, own_gone=own is not None)
        if where.retire_as is not None:
            self.instances[where.retire_as] = replace(
                self.instances.pop(label), label=where.retire_as
            )
        label = where.label
        if own is not None:  # its own gone row comes back
            del self.instances[own.label]
            self.instances[label] = replace(
                own,
                label=label,
                state=state,
                state_since=now,
                running_at=own.running_at or (now if state is InstanceState.RUNNING else None),
                gone_at=None,
                draining_at=None,
                deleting_at=None,
                last_error=note,
            )
            return
        v = VInstance(id=instance_id, label=label, plan=step.plan, region=step.region)
        row = adopted_row(self.fleet, label, v, state, step.created_at, now)
        price = step.price
        self.instances[label] = replace(
            row,
            hourly_rate=price.hourly if price else None,
            monthly_cost=price.monthly if price else None,
            main_ip=None,
            internal_ip=None,
            last_error=note,
        )

    def note_error(self, label: str, error: str, *, delete: bool = False) -> None:
        row = self.instances[label]
        attempts = row.delete_attempts + (1 if delete else 0)
        self.instances[label] = replace(row, last_error=error, delete_attempts=attempts)

    def update_address(self, step: UpdateAddress) -> None:
        row = self.instances[step.label]
        self.instances[step.label] = replace(
            row,
            main_ip=step.main_ip or row.main_ip,
            internal_ip=step.internal_ip or row.internal_ip,
        )

    def mark_workers_draining(self, labels: Iterable[str]) -> None:
        for label in labels:
            w = self.workers_by_label.get(label)
            if w is not None and not w.draining:
                self.workers_by_label[label] = replace(w, draining=True)

    def mark_draining(self, label: str, now: datetime) -> None:
        self.transition(Move(label, "draining", InstanceState.DRAINING), now)
        self.mark_workers_draining([label])

    def revive(self, label: str, now: datetime) -> None:
        row = self.instances.get(label)
        if row is None or row.state is not InstanceState.DRAINING:
            return  # as the UPDATE's WHERE: only a draining row comes back
        self.instances[label] = row.moved(
            InstanceState.RUNNING, now, draining_at=None, last_error=None
        )
        w = self.workers_by_label.get(label)
        if w is not None and w.draining:
            self.workers_by_label[label] = replace(w, draining=False)

    def start_refused(self, label: str, now: datetime, error: str) -> None:
        self.transition(Move(label, "start refused", InstanceState.DRAINING, error=error), now)
        row = self.instances.get(label)
        if row is not None:
            self.instances[label] = replace(row, never_revive=True)
        self.mark_workers_draining([label])

    def save_fleet_state(
        self,
        now: datetime,
        *,
        last_scale_up: datetime | None,
        last_scale_down: datetime | None,
        idle_since: datetime | None,
    ) -> None:
        self.state = FleetState(self.state.snapshot_id, last_scale_up, last_scale_down, idle_since)

    def record_event(self, event: PassEvent) -> int:
        self.events.append(event)  # its summaries are built only if a test or a view reads it
        return len(self.events)


@dataclass
class MemorySignals:
    """The QueueSignals port: ``signals`` as the queue reads now; ``error`` makes them
    unreadable (a ``DatabaseError`` with that text)."""

    signals: Signals = field(default_factory=lambda: Signals(ready=0, in_flight=0))
    error: str | None = None

    def read(self) -> Signals:
        if self.error is not None:
            raise DatabaseError(self.error)
        return self.signals


class MemoryAccount:
    """The AccountLedger port over the MemoryLedgers of the account's fleets (one process's
    passes share it: the lock is a real one, so two fleets' passes in two threads contend)."""

    def __init__(self, ledgers: Iterable[MemoryLedger] = ()) -> None:
        self.ledgers: list[MemoryLedger] = list(ledgers)
        self._lock = threading.Lock()
        self._held = threading.local()
        self.waits: list[float] = []  # each lock's wait, asked

    def add(self, ledger: MemoryLedger) -> None:
        """``ledger``'s fleet is one of the account's: its passes read the others' through it."""
        self.ledgers.append(ledger)
        ledger.account = _FleetAccount(self, ledger.fleet)

    def others(self, fleet: str, since: datetime) -> list[LedgerRow]:
        return [r for led in self.ledgers if led.fleet != fleet for r in led.rows(since)]

    def lock(self, wait_s: float) -> bool:
        self.waits.append(wait_s)
        got = self._lock.acquire(timeout=wait_s)
        self._held.on = got
        return got

    def unlock(self) -> None:
        if getattr(self._held, "on", False):
            self._held.on = False
            self._lock.release()


@dataclass(frozen=True)
class _FleetAccount:
    """A MemoryAccount as one fleet's pass sees it."""

    account: MemoryAccount
    fleet: str

    def others(self, since: datetime) -> list[LedgerRow]:
        return self.account.others(self.fleet, since)

    def lock(self, wait_s: float) -> bool:
        return self.account.lock(wait_s)

    def unlock(self) -> None:
        self.account.unlock()


@dataclass
class MemoryStore:
    """The Store port over a MemoryLedger and MemorySignals (one session, reused)."""

    ledger: MemoryLedger
    signals: MemorySignals

    @contextmanager
    def session(self, cfg: Config) -> Iterator[Session]:
        yield Session(self.ledger, self.signals)

    def close(self) -> None:
        pass


@dataclass
class MemoryDrain:
    """The DrainTransport port: ``services`` is each host's `systemctl is-active` answer
    (ACTIVE when absent); a stop makes it INACTIVE (``stop_to`` changes that), a start
    ACTIVE. A host in ``refuse`` answers every call with that SSHError, like a changed host
    key would."""

    services: dict[str, ServiceState] = field(default_factory=dict)
    refuse: dict[str, SSHError] = field(default_factory=dict)
    stop_to: ServiceState = ServiceState.INACTIVE
    stops: list[str] = field(default_factory=list)  # every label a stop was sent to
    starts: list[str] = field(default_factory=list)  # every label a start was sent to (revives)

    def stop_many(self, targets: list[HostTarget]) -> dict[str, SSHError | None]:
        out: dict[str, SSHError | None] = {}
        for t in targets:
            err = self.refuse.get(t.label)
            if err is None:
                self.stops.append(t.label)
                self.services[t.label] = self.stop_to
            out[t.label] = err
        return out

    def start_many(self, targets: list[HostTarget]) -> dict[str, SSHError | None]:
        out: dict[str, SSHError | None] = {}
        for t in targets:
            err = self.refuse.get(t.label)
            if err is None:
                self.starts.append(t.label)
                self.services[t.label] = ServiceState.ACTIVE
            out[t.label] = err
        return out

    def is_active_many(self, targets: list[HostTarget]) -> dict[str, ServiceState | SSHError]:
        return {
            t.label: self.refuse.get(t.label) or self.services.get(t.label, ServiceState.ACTIVE)
            for t in targets
        }

    def close(self) -> None:
        pass


def _user_data(label: str, private: str, public: str, concurrency: int | None = None) -> str:
    """A stand-in user-data: no template rendered in the unit tier or the simulator."""
    jobs = f"# concurrency: {concurrency}\n" if concurrency else ""
    return f"#cloud-config\nhostname: {label}\n{jobs}"


@dataclass
class MemoryHistory:
    """The JobHistory port over a list of jobs: (due at, run seconds, or None while it has not
    finished), as the built-in queue's ``jobs`` table would hold them."""

    jobs: list[tuple[datetime, float | None]] = field(default_factory=list)
    error: str | None = None  # makes the history unreadable (a DatabaseError with this text)

    def buckets(self, since: datetime, until: datetime, width: timedelta) -> list[Bucket]:
        from vultrscale.core import forecast

        if self.error is not None:
            raise DatabaseError(self.error)
        return forecast.buckets(self.jobs, since, until, width)


def host_keys() -> Callable[[], tuple[str, str]]:
    """A keygen that numbers its keys: no cryptography in the unit tier or the simulator."""
    n = itertools.count(1)
    return lambda: ("PRIVATE-KEY", f"ssh-ed25519 AAAAmemory{next(n)}")


def memory_parts(
    clock: Clock,
    cloud: MemoryCloud,
    ledger: MemoryLedger,
    signals: MemorySignals,
    drain: MemoryDrain,
    *,
    preflight: Sequence[Callable[[], object]] = (),
    seed: int = 0,
    history: JobHistory | None = None,
    account: MemoryAccount | None = None,
) -> Parts:
    """The Parts of a pass wholly in memory; ``account``: the account's fleets, this one's
    ledger added to them."""
    from vultrscale.ports import Parts

    if account is not None and all(known is not ledger for known in account.ledgers):
        account.add(ledger)
    return Parts(
        cloud=cloud,
        store=MemoryStore(ledger, signals),
        drain=drain,
        clock=clock,
        keygen=host_keys(),
        render_user_data=_user_data,
        preflight=preflight,
        rng=random.Random(seed),
        history=history,
    )
