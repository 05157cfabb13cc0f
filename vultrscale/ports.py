"""The ports of a reconcile pass: the narrow interfaces it acts through.

The pass (``vultrscale.reconcile``: ``read`` and ``apply``) knows nothing of HTTP, SQL or SSH;
it talks to these. The ledger is handed the decision's step values (``decision.Adopt``,
``decision.Move``), not their fields one by one.
The adapters are ``vultr.client.VultrClient`` (Cloud), ``db.store.PgStore`` (Store: the
FleetLedger and QueueSignals of one Postgres session), ``ssh.SSHDrain`` (DrainTransport) and
``clock.SystemClock`` (Clock). ``vultrscale.memory`` holds in-memory ones for the unit tests
and the what-if simulator. ``Parts`` bundles one set of them for a pass, with the local checks
made before it acts and what a process's passes keep for the next (``PassCache``).

Every port raises only the project's errors: the cloud ``vultr.errors.VultrError`` (and its
kinds), the ledger and the signals ``DatabaseError``, the drain transport returns an
``SSHError`` per host rather than raising.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, NamedTuple, Protocol

from vultrscale.core.clock import Clock as Clock  # the clock port (re-exported)
from vultrscale.core.model import (
    FleetState,
    HostTarget,
    LedgerRow,
    PassEvent,
    Plan,
    ServiceState,
    Signals,
    StoredReads,
    WorkerView,
)

if TYPE_CHECKING:
    from vultrscale.config import Config
    from vultrscale.core.forecast import Bucket, Profile
    from vultrscale.errors import SSHError
    from vultrscale.rules.decision import Adopt, Move, UpdateAddress
    from vultrscale.rules.offerings import Choice, OfferingCheck
    from vultrscale.vultr.models import VInstance, VPlan, VSnapshot


class Cloud(Protocol):
    """The part of the Vultr API a pass uses (``VultrClient`` is the real one)."""

    def list_instances(self, tag: str | None = None) -> list[VInstance]: ...
    def get_instance(self, instance_id: str) -> VInstance: ...
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
    ) -> VInstance: ...
    def delete_instance(self, instance_id: str) -> None: ...
    def get_plan(self, plan_id: str) -> VPlan: ...
    def region_availability(self, region: str) -> set[str]: ...
    def get_snapshot(self, snapshot_id: str) -> VSnapshot: ...
    def close(self) -> None:
        """Release connections; the pass's owner calls it (the CLI, the demo), never a pass."""
        ...


class AccountLedger(Protocol):
    """What every fleet of the account shares in the database: the other fleets' ledger rows
    (their spend, for ``account.monthly_ceiling_usd``) and the account's lock, which a pass
    that creates or revives holds from reading them again until its last create intent is
    written, so that two fleets' passes (in one process or two) never spend the same
    headroom. ``db.account.PgAccount`` is the real one."""

    def others(self, since: datetime) -> list[LedgerRow]:
        """Every other fleet's rows not gone, and those gone at or after ``since``."""
        ...

    def lock(self, wait_s: float) -> bool:
        """Take the account's lock for this session, waiting at most ``wait_s``; False if
        another pass still holds it then."""
        ...

    def unlock(self) -> None:
        """Release the account's lock if this session holds it."""
        ...


class FleetLedger(Protocol):
    """The fleet's own records (``fleet_instances``, ``fleet_state``, ``fleet_events``, the
    pass lock and the workers' draining flags), bound to one fleet; and ``account``, the
    records of the account's every fleet on the same session (None: a ledger of one fleet
    alone, as the replay's)."""

    account: AccountLedger | None

    def lock(self) -> bool:
        """Take the fleet's pass lock for this session; False if another pass holds it.
        Raises ``PassStuck`` when that pass has held it past its deadline and margin."""
        ...

    def extend_lock(self, seconds: float) -> None:
        """Tell other sessions that this pass, holding the lock, may still wait ``seconds``
        from now (SSH to many hosts, which the pass's deadline does not bound), and its time
        for Vultr after that, so that they do not take it for stuck; nothing when this session
        does not hold the lock."""
        ...

    def rows(self, since: datetime) -> list[LedgerRow]:
        """Every row not gone, plus the rows gone at or after ``since``."""
        ...

    def workers(
        self, seen_within: timedelta, labels: Sequence[str] | None = None
    ) -> dict[str, WorkerView]:
        """By instance label, the workers of the fleet's instances in the ledger (not gone),
        or, given ``labels``, of the instances so labelled."""
        ...

    def fleet_state(self) -> FleetState: ...
    def reads(
        self,
        since: datetime,
        seen_within: timedelta,
        signals: QueueSignals,
        *,
        forecast: bool = False,
    ) -> StoredReads:
        """``rows(since)``, ``workers(seen_within)``, ``fleet_state()`` and ``signals.read()``
        together: what a pass observes of Postgres, in one round trip to the real one (every
        queue preset). Signals that cannot be read are the value's ``signal_error``.
        ``forecast``: the cached forecast profile too (``forecast_profile``)."""
        ...

    def forecast_profile(self) -> Profile | None:
        """The fleet's cached forecast profile, however old (its age is the caller's to judge:
        ``Profile.fresh``); None: none saved."""
        ...

    def save_forecast_profile(self, profile: Profile) -> None:
        """Replace the fleet's cached forecast profile, for every pass of every process."""
        ...

    def recorded_snapshot(self) -> str | None: ...
    def offering_checks(
        self, keys: Sequence[tuple[str, str]], now: datetime, ttl: timedelta
    ) -> dict[tuple[str, str], OfferingCheck]:
        """By (region, plan), the checks of those ``keys`` made within ``ttl`` before ``now``
        (the plan's price, whether the region lists it), shared by every pass of every
        process; one missing: ask the cloud."""
        ...

    def save_offering_check(self, check: OfferingCheck, now: datetime) -> None:
        """Remember a check that found the plan's price (listed in its region or not); an
        unknown plan, or one without a usable price, is not remembered."""
        ...

    def mark_unavailable(self, region: str, plan: str, until: datetime, reason: str) -> None:
        """Remember that Vultr refused a create on ``region``/``plan``: every pass of the fleet
        skips the offering until ``until`` (``StoredReads.marks``)."""
        ...

    def insert_intent(self, label: str, choice: Choice, host_key: str, now: datetime) -> None:
        """Write the create intent of a new instance on ``choice``'s offering, at its price,
        right before its POST: a crash after the POST is found by label."""
        ...

    def transition(self, move: Move, now: datetime) -> None:
        """Move the row to ``move.state`` (stamping that state's time, the first time only),
        with what the cloud showed of it (id, addresses) and its error (None clears it)."""
        ...

    def adopt(self, step: Adopt, now: datetime) -> None:
        """Record a tagged instance the ledger did not know (``lifecycle.adoption`` says
        under which label, and what becomes of a gone row holding it)."""
        ...

    def note_error(self, label: str, error: str, *, delete: bool = False) -> None: ...
    def update_address(self, step: UpdateAddress) -> None: ...
    def mark_workers_draining(self, labels: Iterable[str]) -> None: ...
    def mark_draining(self, label: str, now: datetime) -> None: ...
    def revive(self, label: str, now: datetime) -> None:
        """A draining row back to running (its ``draining_at`` cleared) and its workers'
        draining flag cleared, in one transaction, before its worker is started again."""
        ...

    def start_refused(self, label: str, now: datetime, error: str) -> None:
        """A revived instance whose worker refused to start: its row and workers back to
        draining, the row never to be revived again (``LedgerRow.never_revive``), with the
        error, in one transaction."""
        ...

    def save_fleet_state(
        self,
        now: datetime,
        *,
        last_scale_up: datetime | None,
        last_scale_down: datetime | None,
        idle_since: datetime | None,
    ) -> None: ...
    def record_event(self, event: PassEvent) -> int:
        """Write the pass's ``fleet_events`` row; its id (the pass id `events` shows)."""
        ...


class QueueSignals(Protocol):
    """The queue's numbers; raises ``DatabaseError`` when they cannot be read (never guesses)."""

    def read(self) -> Signals: ...


class JobHistory(Protocol):
    """The queue's own history, for the floor forecast: the jobs that became due in
    [since, until), bucketed by ``width`` from ``forecast.WEEK_ORIGIN`` (arrivals, and the
    finished ones with their run time). Raises ``DatabaseError`` when it cannot be read.
    In a replay it sees only the replayed past."""

    def buckets(self, since: datetime, until: datetime, width: timedelta) -> list[Bucket]: ...


class Session(NamedTuple):
    """What a pass holds open while it runs: the ledger and the queue signals."""

    ledger: FleetLedger
    signals: QueueSignals


class Store(Protocol):
    """Opens one session per pass (one Postgres connection for the real store)."""

    def session(self, cfg: Config) -> AbstractContextManager[Session]: ...
    def close(self) -> None:
        """Release what the store keeps between sessions; the pass's owner calls it."""
        ...


def read_apart(
    ledger: FleetLedger,
    since: datetime,
    seen_within: timedelta,
    signals: QueueSignals,
    *,
    forecast: bool = False,
) -> StoredReads:
    """``FleetLedger.reads`` one read at a time, the signals first: for a ledger with no round
    trips to save (``memory.MemoryLedger``)."""
    from vultrscale.errors import DatabaseError

    read, error = None, None
    try:
        read = signals.read()
    except DatabaseError as exc:
        error = exc
    return StoredReads(
        ledger.rows(since),
        ledger.workers(seen_within),
        ledger.fleet_state(),
        read,
        error,
        forecast=ledger.forecast_profile() if forecast else None,
    )


class DrainTransport(Protocol):
    """The SSH side of scale-in (``vultrscale.ssh.SSHDrain`` is the real one). A failure on one
    host is that host's value in the answer, never an exception."""

    def stop_many(self, targets: list[HostTarget]) -> dict[str, SSHError | None]: ...

    def start_many(self, targets: list[HostTarget]) -> dict[str, SSHError | None]:
        """`systemctl start --no-block` on each target (a revive); per label None or the error."""
        ...

    def is_active_many(self, targets: list[HostTarget]) -> dict[str, ServiceState | SSHError]: ...

    def close(self) -> None: ...


class UserDataRenderer(Protocol):
    """The user-data of a new instance: its label, its host key pair (private, public) and the
    jobs its worker runs at once (its offering's ``jobs_per_instance``; None: the config's)."""

    def __call__(
        self, label: str, private: str, public: str, concurrency: int | None = None
    ) -> str: ...


@dataclass(frozen=True, slots=True)
class PriceCheck:
    """The offering checks this process made and saved in the ledger, and when."""

    checks: tuple[OfferingCheck, ...]
    at: datetime


@dataclass(slots=True)
class PassCache:
    """What one process's passes keep for the next one: the offering checks it made (fresh as long
    as its copy in the ledger, ``read.PRICE_TTL``) and the snapshot it found complete.
    The only state a pass leaves in its parts; a new process starts with an empty one."""

    price_check: PriceCheck | None = None
    snapshot: str | None = None
    # The forecast profile this process computed last: a dry run (`status --watch`) saves
    # none in the ledger, and must not scan the queue's history on every refresh.
    profile: Profile | None = None


@dataclass(frozen=True)
class Parts:
    """The ports a pass works through, and the local checks it makes before acting."""

    cloud: Cloud
    store: Store
    drain: DrainTransport
    clock: Clock
    keygen: Callable[[], tuple[str, str]]  # -> (private OpenSSH PEM, public line)
    render_user_data: UserDataRenderer
    # Local preconditions, each raising UsageError: run before anything is changed.
    preflight: Sequence[Callable[[], object]] = ()
    # Local checks that depend on the plan (the scaler's key, loaded only by a pass that drains
    # or creates), raising UsageError: run after deciding, before the first change.
    before_changes: Callable[[Plan], object] = lambda plan: None
    rng: random.Random = field(default_factory=random.Random)
    # What this process's passes keep for the next one (a pass updates it; see PassCache).
    cache: PassCache = field(default_factory=PassCache)
    # List the cloud in a thread while the ledger and the queue are read: for the real parts
    # both wait on the network, and the pass takes the longer of the two, not their sum. Off
    # for the in-memory ports, where a thread is pure cost.
    overlap_reads: bool = False
    # The queue's history for the floor forecast; None: none to read (a foreign preset).
    history: JobHistory | None = None

    def close(self) -> None:
        """Release the cloud's and the store's connections; the parts' owner calls it once,
        after the last pass."""
        try:
            self.cloud.close()
        finally:
            self.store.close()
