"""Value types shared by the policy, the reconcile pass and the views. No I/O here.

``Observation`` is everything a pass saw; ``decide()`` turns it into a ``Plan`` of ``Action``s,
each with its reason, plus the clamps that applied.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from vultrscale.core.boottime import BootTime
    from vultrscale.core.forecast import Profile
    from vultrscale.core.limits import Clamp
    from vultrscale.errors import DatabaseError

_T = TypeVar("_T")


def frozen_from(cls: type[_T], fields: dict[str, Any]) -> _T:
    """An instance of the frozen dataclass ``cls`` (not slotted) from ALL its fields, set in
    one step.

    The generated ``__init__`` of a frozen dataclass sets each field with its own
    ``object.__setattr__`` call: for a value of twenty fields built per instance of the fleet
    on every pass, that is most of its cost. Only where every field is named (the tests
    compare such values with ones built by ``__init__``)."""
    obj = object.__new__(cls)
    obj.__dict__.update(fields)
    return obj


class InstanceState(enum.StrEnum):
    """Ledger state of one instance of the fleet (``fleet_instances.state``)."""

    CREATING = "creating"  # intent written, POST not yet confirmed
    PENDING = "pending"  # Vultr accepted it; not yet active
    BOOTING = "booting"  # active at Vultr; its worker not yet seen in `workers`
    RUNNING = "running"  # its worker has reported in
    DRAINING = "draining"  # marked draining; `systemctl stop --no-block` sent or due
    DELETING = "deleting"  # drained; DELETE sent or being retried (e.g. locked)
    GONE = "gone"  # no longer at Vultr


# The states that count as capacity. Asked per instance many times a pass: one set, tested
# directly in the per-instance loops (``state in CAPACITY_STATES``, no property call).
CAPACITY_STATES = frozenset(
    {InstanceState.CREATING, InstanceState.PENDING, InstanceState.BOOTING, InstanceState.RUNNING}
)


@dataclass(frozen=True)
class LedgerRow:
    """One row of ``fleet_instances``: what the ledger knows of one instance."""

    label: str
    fleet: str
    state: InstanceState
    instance_id: str | None
    plan: str | None
    region: str | None
    hourly_rate: float | None
    monthly_cost: float | None
    host_key: str | None
    main_ip: str | None
    internal_ip: str | None
    created_at: datetime
    posted_at: datetime | None
    active_at: datetime | None
    running_at: datetime | None
    draining_at: datetime | None
    deleting_at: datetime | None
    gone_at: datetime | None
    state_since: datetime
    delete_attempts: int
    last_error: str | None
    # Its worker refused to start again (a revive's start failed): never revived again.
    never_revive: bool = False

    @classmethod
    def new(
        cls, label: str, fleet: str, state: InstanceState, created_at: datetime, **columns: Any
    ) -> LedgerRow:
        """A row as an INSERT leaves it: the ``columns`` given, NULL in the others, no delete
        attempts, in its state since ``created_at`` unless ``state_since`` is given."""
        values: dict[str, Any] = dict.fromkeys(cls.__dataclass_fields__)
        values.update(label=label, fleet=fleet, state=state, created_at=created_at)
        values.update(state_since=created_at, delete_attempts=0, never_revive=False)
        values.update(columns)
        return cls(**values)

    def moved(self, state: InstanceState, now: datetime, **columns: Any) -> LedgerRow:
        """This row as a transition to ``state`` at ``now`` leaves it (the ledger's rule, in
        Postgres and in memory alike): ``state_since`` restarts when the state changes, the
        state's own stamp (``STATE_STAMPS``) is set the first time, and ``columns`` change."""
        changes: dict[str, Any] = {"state": state, **columns}
        if state is not self.state:
            changes["state_since"] = now
        stamp = STATE_STAMPS.get(state)
        if stamp is not None and getattr(self, stamp) is None:
            changes[stamp] = now
        if posts_intent(self.state, state) and self.posted_at is None:
            changes["posted_at"] = now
        return replace(self, **changes)

    @property
    def boot_since(self) -> datetime:
        """Where ``boot_timeout``'s clock starts: at the create, for an instance this scaler made
        and is booting; for one that ran before (its worker went quiet) or that was adopted
        (no POST of ours, so no ``posted_at``, whatever Vultr said of it: pending, booting,
        up), when the ledger saw it enter its boot state."""
        if self.running_at is not None or self.posted_at is None:
            return self.state_since
        return self.created_at


def retired_label(label: str, instance_id: str | None, gone_at: datetime | None = None) -> str:
    """The label a gone row takes once a later instance is adopted under its label (a name
    used before, by hand): the row stays, and its cost stays in the month's bill. Unique by
    the instance id (Vultr's, unique in the ledger too), else by when the row went."""
    if instance_id:
        return f"{label}@{instance_id}"
    return f"{label}@gone-{gone_at.timestamp():.6f}" if gone_at else f"{label}@none"


def posts_intent(old: InstanceState, new: InstanceState) -> bool:
    """A create intent found already past PENDING (its POST's answer was lost, then the list
    showed it booting) is stamped ``posted_at`` as it leaves CREATING, as one moved to PENDING
    is: only an adopted row, never POSTed by this scaler, has none (``LedgerRow.boot_since``)."""
    return old is InstanceState.CREATING and new not in _NOT_POSTED


_NOT_POSTED = frozenset({InstanceState.CREATING, InstanceState.PENDING, InstanceState.GONE})

# The column of fleet_instances each state stamps the first time a row enters it.
STATE_STAMPS: dict[InstanceState, str] = {
    InstanceState.PENDING: "posted_at",
    InstanceState.BOOTING: "active_at",
    InstanceState.RUNNING: "running_at",
    InstanceState.DRAINING: "draining_at",
    InstanceState.DELETING: "deleting_at",
    InstanceState.GONE: "gone_at",
}


@dataclass(frozen=True)
class WorkerView:
    """The workers of one instance as the ``workers`` table shows them."""

    instance_label: str
    last_seen: datetime
    draining: bool
    live_leases: int
    seen: bool  # heartbeat within the window, judged on the database's clock


@dataclass(frozen=True)
class FleetState:
    """The fleet's memory between passes (``fleet_state``)."""

    snapshot_id: str | None = None
    last_scale_up: datetime | None = None
    last_scale_down: datetime | None = None
    idle_since: datetime | None = None


@dataclass(frozen=True)
class StoredReads:
    """What a pass reads of Postgres, read together (one round trip, whatever the queue
    preset): the fleet's rows (not gone, and gone since the month began), its instances'
    workers, the fleet's state, and the queue's signals or why they could not be read."""

    rows: list[LedgerRow]
    workers: dict[str, WorkerView]
    state: FleetState
    signals: Signals | None = None
    signal_error: DatabaseError | None = None
    # Offerings whose creates Vultr refused, remembered by earlier passes (any process).
    marks: tuple[OfferingMark, ...] = ()
    # The cached forecast profile (``forecast_profiles``), read only with a forecast mode.
    forecast: Profile | None = None
    # The fleet's newest boots (``boottime.is_boot``, at most ``boottime.LAST_BOOTS``), gone
    # before the month too: what the boot time is learned from.
    boots: list[LedgerRow] = field(default_factory=list)


@dataclass(frozen=True)
class OfferingMark:
    """A create Vultr refused on ``region``/``plan``: the offering is skipped until ``until``.
    ``refusals`` counts every refusal the fleet has had there (the metrics' counter)."""

    region: str
    plan: str
    until: datetime
    reason: str
    refusals: int = 1


@dataclass(frozen=True)
class Instance:
    """One instance as the pass sees it: the ledger row joined with Vultr's view and leases."""

    label: str
    state: InstanceState
    id: str | None = None  # Vultr id; None while only the create intent exists
    created_at: datetime | None = None  # when the create intent was written (billing starts ~here)
    state_since: datetime | None = None
    vultr_status: str = ""  # pending | active | suspended | resizing
    power_status: str = ""
    server_status: str = ""  # none | locked | installingbooting | ok
    main_ip: str = ""
    internal_ip: str = ""
    live_leases: int = 0
    worker_last_seen: datetime | None = None
    draining_since: datetime | None = None
    billed_usd: float = 0.0  # this calendar month
    hourly_rate: float = 0.0
    monthly_cost: float = 0.0  # the plan's monthly cost when created; 0: use the current price
    boot_since: datetime | None = None  # boot_timeout's clock (LedgerRow.boot_since); None: created
    # A draining instance: what `systemctl is-active` said this pass (None: not asked), and
    # whether its worker can be started again instead of a create (``lifecycle.revivable``).
    service: ServiceState | None = None
    revivable: bool = False
    plan: str = ""  # its Vultr plan and region (the offering it runs on); "": not known
    region: str = ""


@dataclass(frozen=True)
class Signals:
    """What the queue says, read in one transaction. Never a stand-in for missing data."""

    ready: int
    in_flight: int
    expired_leases: int = 0
    oldest_ready_seconds: float = 0.0
    leases_by_worker: dict[str, int] = field(default_factory=dict)
    # The queue's recent finished jobs (vultrscale.rules.waits.RECENT_JOBS newest within
    # RECENT_WINDOW): how many, and their mean run time. None: this preset does not tell.
    recent_jobs: int | None = None
    recent_job_seconds: float | None = None
    # The jobs that arrived within vultrscale.rules.waits.ARRIVAL_WINDOW. None: not told.
    recent_arrivals: int | None = None

    @property
    def demand(self) -> int:
        return self.ready + self.in_flight + self.expired_leases

    def summary(self) -> dict[str, int | float]:
        """The numbers as the ledger, `--json` and `status` show them."""
        return {
            "ready": self.ready,
            "in_flight": self.in_flight,
            "expired_leases": self.expired_leases,
            "oldest_ready_seconds": round(self.oldest_ready_seconds, 1),
            # The wait rule's job history, where the preset reports it.
            **({} if self.recent_jobs is None else {"recent_jobs": self.recent_jobs}),
            **(
                {}
                if self.recent_job_seconds is None
                else {"recent_job_seconds": round(self.recent_job_seconds, 1)}
            ),
            **({} if self.recent_arrivals is None else {"recent_arrivals": self.recent_arrivals}),
        }

    @property
    def idle(self) -> bool:
        return self.demand == 0


# Vultr bills at most 672 hours (28 days) in a month: the hourly rate of a plan without one.
HOURS_PER_MONTH = 672.0
# A job enqueued without max_attempts is dead after this many attempts (the schema's default too).
DEFAULT_MAX_ATTEMPTS = 3


@dataclass(frozen=True)
class PlanPrice:
    """A Vultr plan's price. ``hourly`` is the API's hourly_cost, else monthly / 672."""

    plan: str
    monthly: float
    hourly_cost: float | None = None

    @property
    def hourly(self) -> float:
        return self.hourly_cost if self.hourly_cost else self.monthly / HOURS_PER_MONTH


@dataclass(frozen=True, slots=True)
class AccountSpend:
    """What the account's other fleets (every fleet in the database but the pass's own) spend
    this UTC month, for ``account.monthly_ceiling_usd``: their bill so far, that bill if
    their capacity (create intents included) runs to the month's end, and that capacity's
    monthly prices (``budget.account_spend``). ``unknown``: why it could not be read again
    before a create (the account's lock not had in time): no fleet grows on a guess."""

    ceiling: float
    month_to_date_usd: float = 0.0
    committed_usd: float = 0.0
    monthly_usd: float = 0.0
    instances: int = 0  # the others' capacity
    fleets: tuple[str, ...] = ()  # the other fleets with a row this month
    unknown: str = ""


@dataclass(frozen=True)
class Observation:
    """Everything one pass observed. ``signals`` is None when they could not be read."""

    instances: tuple[Instance, ...]
    signals: Signals | None
    price: PlanPrice | None
    signal_error: str | None = None
    api_error: str | None = None
    month_to_date_usd: float = 0.0  # billed so far this UTC month by fleet instances, gone too
    last_scale_up: datetime | None = None
    last_scale_down: datetime | None = None
    idle_since: datetime | None = None  # from the previous pass; policy returns the new one
    # The floor forecast's per-slot profile (``forecast``); None: off, or none computed yet.
    forecast: Profile | None = None
    # Create to worker up, learned from the ledger (vultrscale.core.boottime); None: not known
    # (then the policy plans with policy.boot_time).
    boot_time: BootTime | None = None
    # The account's other fleets, with account.monthly_ceiling_usd set; None: no such ceiling.
    account: AccountSpend | None = None

    def summary(self) -> dict[str, Any]:
        """What the pass saw, as the ledger, `--json` and `status` show it."""
        counts: dict[InstanceState, int] = {}
        for i in self.instances:
            counts[i.state] = counts.get(i.state, 0) + 1
        sig, price = self.signals, self.price
        return {
            "signals": None if sig is None else sig.summary(),
            "signal_error": self.signal_error,
            "api_error": self.api_error,
            "instances": {s.value: counts[s] for s in InstanceState if s in counts},
            "month_to_date_usd": round(self.month_to_date_usd, 4),
            "price": None
            if price is None
            else {"plan": price.plan, "monthly": price.monthly, "hourly": round(price.hourly, 5)},
            "boot_time": None
            if self.boot_time is None
            else {
                "seconds": round(self.boot_time.estimate.total_seconds(), 1),
                "boots": self.boot_time.boots,
                "learned": self.boot_time.learned,
            },
        }


class ActionKind(enum.StrEnum):
    CREATE = "create"
    DRAIN = "drain"  # mark draining, then `systemctl stop --no-block`
    REPLACE = "replace"  # stuck booting past boot_timeout: delete it (a create follows)
    REVIVE = "revive"  # a draining instance, its delete not sent: start its worker again


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    reason: str
    label: str | None = None  # the instance acted on (drain/replace); None for a create

    def describe(self) -> str:
        target = f" {self.label}" if self.label else ""
        return f"{self.kind.value}{target}: {self.reason}"


@dataclass(frozen=True)
class Plan:
    """The decision of one pass: actions with reasons, and every clamp that applied."""

    desired: int  # instances the demand asks for, before floor and cap
    target: int  # what the fleet should have after floor, cap, cool-downs and budget
    capacity: int  # instances counted as capacity now (pending and booting included)
    floor: int
    cap: int
    actions: tuple[Action, ...] = ()
    reasons: tuple[str, ...] = ()
    clamps: tuple[Clamp, ...] = ()  # each limit that held, as a value (words: describe())
    warnings: tuple[str, ...] = ()
    idle_since: datetime | None = None  # to persist for the next pass
    next_scale_in_at: datetime | None = None  # earliest time a scale-in could happen
    demand: int | None = None  # ready + in flight + expired leases; None: signals unreadable
    month_to_date_usd: float | None = None  # this UTC month's bill so far (None: price unknown)
    committed_usd: float | None = None  # month to date + the current fleet run to month end
    # The floor forecast (``policy.forecast``): its mode ("off": none), the floor it asks
    # (acted on only in mode "scale"; None: off, or too little history) and where that comes
    # from (or why there is none).
    forecast_mode: str = "off"
    forecast_floor: int | None = None
    forecast_source: str = ""
    # The wait rule's estimate (``waits``): the longest wait in seconds and the arrival rate
    # it counted, jobs a second; None: not estimated (off, no history, signals unread).
    wait_estimate: float | None = None
    arrival_rate: float | None = None

    def summary(self) -> dict[str, object]:
        """The decision as the ledger, `--json` and `status` show it."""
        return {
            "desired": self.desired,
            "target": self.target,
            "capacity": self.capacity,
            "floor": self.floor,
            "cap": self.cap,
            "reasons": list(self.reasons),
            "clamps": [c.describe() for c in self.clamps],
            "warnings": list(self.warnings),
            "actions": [a.describe() for a in self.actions],
            "next_scale_in_at": self.next_scale_in_at.isoformat()
            if self.next_scale_in_at
            else None,
            "forecast": None
            if self.forecast_mode == "off"
            else {
                "mode": self.forecast_mode,
                "floor": self.forecast_floor,
                "source": self.forecast_source,
            },
            "wait_estimate_seconds": None
            if self.wait_estimate is None or not math.isfinite(self.wait_estimate)
            else round(self.wait_estimate, 1),
            "arrivals_per_minute": None
            if self.arrival_rate is None
            else round(self.arrival_rate * 60, 2),
        }

    @property
    def creates(self) -> int:
        return sum(1 for a in self.actions if a.kind is ActionKind.CREATE)

    @property
    def drains(self) -> tuple[Action, ...]:
        return tuple(a for a in self.actions if a.kind is ActionKind.DRAIN)


class PassEvent(Mapping[str, Any]):
    """One pass as its ``fleet_events`` row records it (``FleetLedger.record_event``), read as
    a mapping of the row's columns. The summaries of what the pass saw and decided
    (``inputs``, ``plan``) are built on their first read, so a ledger that only counts passes
    or looks at their errors (the simulator's) never pays for them."""

    __slots__ = ("_columns", "_observation", "_plan")

    _SUMMARIES = ("inputs", "plan")

    def __init__(
        self,
        *,
        at: datetime,
        dry_run: bool,
        observation: Observation | None,
        plan: Plan | None,
        actions: list[dict[str, Any]],
        results: list[dict[str, Any]],
        errors: list[str],
        exit_code: int,
    ) -> None:
        self._columns: dict[str, Any] = {
            "at": at,
            "dry_run": dry_run,
            "actions": actions,
            "results": results,
            "errors": errors,
            "exit_code": exit_code,
        }
        self._observation, self._plan = observation, plan

    def __getitem__(self, key: str) -> Any:
        columns = self._columns
        if key in self._SUMMARIES and key not in columns:
            obs, plan = self._observation, self._plan
            columns["inputs"] = obs.summary() if obs else None
            columns["plan"] = plan.summary() if plan else None
            self._observation = self._plan = None  # the summaries are all that is kept
        return columns[key]

    def __iter__(self) -> Iterator[str]:
        return iter(
            ("at", "dry_run", "inputs", "plan", "actions", "results", "errors", "exit_code")
        )

    def __len__(self) -> int:
        return 8


class ServiceState(enum.StrEnum):
    """What `systemctl is-active <service>` said on an instance."""

    ACTIVE = "active"
    ACTIVATING = "activating"
    DEACTIVATING = "deactivating"
    INACTIVE = "inactive"
    FAILED = "failed"
    UNKNOWN = "unknown"

    @property
    def stopped(self) -> bool:
        """The worker is no longer running: safe to delete the instance."""
        return self in (ServiceState.INACTIVE, ServiceState.FAILED)


@dataclass(frozen=True)
class HostTarget:
    """Where and how to reach one instance's worker service over SSH."""

    label: str
    address: str
    port: int
    user: str
    host_key: str  # pinned public key, OpenSSH format: "ssh-ed25519 AAAA..."
    service: str
