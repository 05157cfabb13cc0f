"""One reconcile pass: lock -> observe -> progress drains -> decide -> act -> record.

The pass is level-triggered and safe to kill at any point: every irreversible step is preceded
by a database write that lets the next pass find it (the create intent before the POST, the
draining mark before the SSH stop), and a pass never waits for a drain to finish.
"""

from __future__ import annotations

import logging
import random
import string
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from vultrscale import budget, policy
from vultrscale.clock import Clock
from vultrscale.config import Config
from vultrscale.errors import (
    EXIT_OK,
    EXIT_RUNTIME,
    DatabaseError,
    RuntimeFailure,
    SSHError,
    UsageError,
    VultrscaleError,
    first_line,
    redact,
)
from vultrscale.model import (
    ActionKind,
    HostTarget,
    Instance,
    InstanceState,
    Observation,
    Plan,
    PlanPrice,
    ServiceState,
    Signals,
)

if TYPE_CHECKING:
    import psycopg

    from vultrscale.db.ledger import LedgerRow, WorkerView
    from vultrscale.vultr.client import VultrClient
    from vultrscale.vultr.models import VInstance

log = logging.getLogger("vultrscale.reconcile")

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
# How long a process trusts the plan's price and region check before asking again.
PRICE_TTL = timedelta(minutes=10)


class DrainTransport(Protocol):
    """The SSH side of scale-in (vultrscale.ssh.SSHDrain is the real one)."""

    def stop_many(self, targets: list[HostTarget]) -> dict[str, SSHError | None]: ...

    def is_active_many(self, targets: list[HostTarget]) -> dict[str, ServiceState | SSHError]: ...

    def close(self) -> None: ...


class CrashInjected(BaseException):
    """Raised by a test's fault hook to stop a pass dead, like a kill -9 would."""


@dataclass
class Parts:
    """The real (or test) parts a pass works with."""

    client: VultrClient
    db_url: str
    drain: DrainTransport
    clock: Clock
    keygen: Callable[[], tuple[str, str]]  # -> (private OpenSSH PEM, public line)
    render_user_data: Callable[[str, str, str], str]  # (label, host private, host public)
    signals_reader: Callable[[Any], Signals] | None = None  # default: db.signals preset
    rng: random.Random = field(default_factory=random.Random)
    fault: Callable[[str], None] = lambda point: None  # test hook at named points
    cache: dict[str, Any] = field(default_factory=dict)  # per-process: plan price, snapshot


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
            "inputs": observation_summary(obs) if obs else None,
            "plan": self.plan.summary() if self.plan else None,
            "actions": self.actions,
            "results": self.results,
            "errors": self.errors,
            "duration_s": round(self.duration_s, 3),
        }


def observation_summary(obs: Observation) -> dict[str, Any]:
    sig = obs.signals
    return {
        "signals": None if sig is None else sig.summary(),
        "signal_error": obs.signal_error,
        "api_error": obs.api_error,
        "instances": {
            s.value: sum(1 for i in obs.instances if i.state is s)
            for s in InstanceState
            if any(i.state is s for i in obs.instances)
        },
        "month_to_date_usd": round(obs.month_to_date_usd, 4),
        "price": None
        if obs.price is None
        else {
            "plan": obs.price.plan,
            "monthly": obs.price.monthly,
            "hourly": round(obs.price.hourly, 5),
        },
    }


# --- the pass ----------------------------------------------------------------------------------


def run_pass(
    cfg: Config, parts: Parts, *, dry_run: bool = False, take_lock: bool = True
) -> PassResult:
    """One reconcile pass. Raises UsageError (exit 2) for bad input before touching anything,
    DatabaseError (exit 1) when Postgres is unreachable; other failures are in the result.

    ``take_lock=False`` is for read-only views (``status``): they must work while a pass runs,
    and only a dry run may skip the lock."""
    if not take_lock and not dry_run:
        raise ValueError("only a dry run may skip the fleet lock")
    import psycopg

    started = time.monotonic()
    now = parts.clock.now()
    try:
        conn = psycopg.connect(parts.db_url, autocommit=True, connect_timeout=10)
    except psycopg.Error as exc:
        raise DatabaseError(
            f"cannot connect to the database: {first_line(exc, [parts.db_url])}"
        ) from None
    try:
        with conn:
            from vultrscale.db import ledger

            if take_lock and not ledger.try_lock(conn, cfg.fleet.name):
                return PassResult(EXIT_OK, now, lock_held=True, dry_run=dry_run)
            result = _Pass(cfg, parts, conn, now, dry_run).run()
    except psycopg.Error as exc:
        raise DatabaseError(
            f"database error during the pass: {first_line(exc, [parts.db_url])}"
        ) from None
    finally:
        parts.drain.close()  # connections are reused within a pass, not across passes
    result.duration_s = time.monotonic() - started
    return result


class _Pass:
    def __init__(
        self, cfg: Config, parts: Parts, conn: psycopg.Connection[Any], now: datetime, dry: bool
    ) -> None:
        self.cfg = cfg
        self.parts = parts
        self.conn = conn
        self.now = now
        self.dry = dry
        self.result = PassResult(EXIT_OK, now, dry_run=dry)
        self.rows: dict[str, LedgerRow] = {}
        self.vultr: dict[str, VInstance] = {}
        self.workers: dict[str, WorkerView] = {}
        self.signals: Signals | None = None
        self.created = 0

    # The pass, in order. ------------------------------------------------------------------
    def run(self) -> PassResult:
        from vultrscale.db import ledger
        from vultrscale.vultr.errors import AuthError, VultrError

        res = self.result
        api_error = None
        price = None
        try:
            price = self.price()
            self.vultr = {
                v.label: v for v in self.parts.client.list_instances(tag=self.cfg.fleet.tag)
            }
        except AuthError:
            raise
        except VultrError as exc:
            api_error = f"Vultr API: {exc}"
            res.errors.append(api_error)

        signal_error = None
        try:
            self.signals = self.read_signals()
        except DatabaseError as exc:
            signal_error = f"queue signals: {exc}"
            res.errors.append(signal_error)
        month_start = budget.month_bounds(self.now)[0]
        ledger_rows = ledger.rows(self.conn, self.cfg.fleet.name, since=month_start)
        self.rows = {r.label: r for r in ledger_rows if r.state is not InstanceState.GONE}
        gone_this_month = [r for r in ledger_rows if r.state is InstanceState.GONE]
        labels = sorted({*self.rows, *self.vultr})
        self.workers = ledger.workers_by_label(self.conn, labels, seen_within=WORKER_SEEN_WITHIN)

        if api_error is None:
            try:
                self.sync_ledger()
            except AuthError:
                raise
            except VultrError as exc:  # a GET that would confirm a missing instance failed
                api_error = f"Vultr API: {exc}"
                res.errors.append(api_error)
        if api_error is None and not self.dry:
            self.progress_drains()

        state = ledger.fleet_state(self.conn, self.cfg.fleet.name)
        obs = Observation(
            instances=tuple(
                self.instance(r) for r in self.rows.values() if r.state is not InstanceState.GONE
            ),
            signals=self.signals,
            price=price,
            signal_error=signal_error,
            api_error=api_error,
            month_to_date_usd=sum(
                self.billed(r, price) for r in [*self.rows.values(), *gone_this_month]
            ),
            last_scale_up=self.not_after_now(state.last_scale_up),
            last_scale_down=self.not_after_now(state.last_scale_down),
            idle_since=self.not_after_now(state.idle_since),
        )
        res.observation = obs
        plan = policy.decide(obs, self.cfg, self.now)
        res.plan = plan
        res.actions = [
            {"kind": a.kind.value, "label": a.label, "reason": a.reason} for a in plan.actions
        ]

        if not self.dry:
            # Bad input (no snapshot, or one that is not complete) stops the pass before it
            # touches any instance, drains included.
            if plan.creates:  # exit 2 now, not a user-data with the scaler's credentials later
                self.cfg.worker_database_url()
            snapshot = self.snapshot_id() if plan.creates and price is not None else ""
            self.act(plan, price, snapshot)
            ledger.save_fleet_state(
                self.conn,
                self.cfg.fleet.name,
                self.now,
                last_scale_up=self.now if self.created else state.last_scale_up,
                last_scale_down=self.now if plan.drains else state.last_scale_down,
                idle_since=plan.idle_since,
            )
        res.exit_code = EXIT_RUNTIME if res.errors else EXIT_OK
        # Belt and braces: whatever an adapter put in an error, no secret reaches the ledger.
        secrets = self.cfg.secrets.values()
        res.errors = [redact(e, secrets) for e in res.errors]
        if not self.dry:
            ledger.record_event(
                self.conn,
                fleet=self.cfg.fleet.name,
                at=self.now,
                dry_run=False,
                inputs=observation_summary(obs),
                plan=plan.summary(),
                actions=res.actions,
                results=res.results,
                errors=res.errors,
                exit_code=res.exit_code,
            )
        return res

    # Observe. -------------------------------------------------------------------------------
    def not_after_now(self, when: datetime | None) -> datetime | None:
        """A stored time later than now (written while a clock ran ahead) is read as now."""
        return None if when is None else min(when, self.now)

    def price(self) -> PlanPrice:
        """The plan's price, checked at most every PRICE_TTL per process: an unknown plan, a plan
        not in the region and a ceiling below one instance-month are refused (exit 2) before
        anything is touched. A loop sees a price change within PRICE_TTL."""
        cached = self.parts.cache.get("price")
        if cached is not None and self.parts.clock.monotonic() < cached[1]:
            return cached[0]  # type: ignore[no-any-return]
        from vultrscale.vultr.errors import NotFound, unknown_region

        client, fleet = self.parts.client, self.cfg.fleet
        try:
            plan = client.get_plan(fleet.plan)
        except NotFound:
            raise UsageError(
                f"fleet.plan {fleet.plan!r} is not a Vultr plan",
                hint="Pick a plan id from https://api.vultr.com/v2/plans (e.g. vc2-1c-2gb).",
            ) from None
        try:
            available = client.region_availability(fleet.region)
        except NotFound:
            raise unknown_region(fleet.region) from None
        if fleet.plan not in available:
            raise UsageError(
                f"plan {fleet.plan!r} is not offered in region {fleet.region!r}",
                hint="Choose another plan or region; GET /v2/regions/<id>/availability lists them.",
            )
        price = PlanPrice(plan.id, float(plan.monthly_cost), plan.hourly_cost)
        ceiling = self.cfg.budget.monthly_ceiling_usd
        if self.cfg.policy.max_instances > 0 and ceiling < price.monthly:
            raise UsageError(
                f"budget.monthly_ceiling_usd ({ceiling:g}) is lower than one instance-month of "
                f"{fleet.plan} (${price.monthly:g})",
                hint="Raise the ceiling or pick a cheaper plan.",
            )
        expires = self.parts.clock.monotonic() + PRICE_TTL.total_seconds()
        self.parts.cache["price"] = (price, expires)
        return price

    def read_signals(self) -> Signals:
        if self.parts.signals_reader is not None:
            return self.parts.signals_reader(self.conn)
        from vultrscale.db.signals import read_signals

        return read_signals(self.conn, self.cfg.queue)

    def billed(self, row: LedgerRow, price: PlanPrice | None) -> float:
        monthly = (
            row.monthly_cost if row.monthly_cost is not None else (price.monthly if price else 0.0)
        )
        hourly = row.hourly_rate if row.hourly_rate else None
        p = PlanPrice(row.plan or "", monthly, hourly)
        end = row.gone_at or self.now
        return budget.billed(row.created_at, end, p, *budget.month_bounds(self.now))

    def cached_price(self) -> PlanPrice | None:
        cached = self.parts.cache.get("price")
        return None if cached is None else cached[0]  # type: ignore[no-any-return]

    def worker_seen(self, label: str) -> bool:
        """The instance's worker heartbeated recently, judged on the database's clock."""
        w = self.workers.get(label)
        return w is not None and w.seen

    def instance(self, row: LedgerRow) -> Instance:
        v = self.vultr.get(row.label)
        w = self.workers.get(row.label)
        live = 0
        if self.signals is not None and w is not None:
            live = w.live_leases
        return Instance(
            label=row.label,
            state=row.state,
            id=row.instance_id,
            created_at=row.created_at,
            state_since=row.state_since,
            vultr_status=v.status if v else "",
            power_status=v.power_status if v else "",
            server_status=v.server_status if v else "",
            main_ip=(v.main_ip if v else row.main_ip) or "",
            internal_ip=(v.internal_ip if v else row.internal_ip) or "",
            live_leases=live,
            worker_last_seen=w.last_seen if w else None,
            draining_since=row.draining_at,
            hourly_rate=row.hourly_rate or 0.0,
            monthly_cost=row.monthly_cost or 0.0,
            billed_usd=self.billed(row, self.cached_price()),
        )

    def sync_ledger(self) -> None:
        """Bring the ledger in line with what Vultr lists: adopt, mark gone, follow boots.
        In a dry run the changes are made in memory only."""
        from vultrscale.db import ledger

        by_id = {v.id: v for v in self.vultr.values()}
        known = set()
        for label, row in list(self.rows.items()):
            v = by_id.get(row.instance_id) if row.instance_id else self.vultr.get(label)
            if v is not None:
                known.add(v.id)
            ip = v.main_ip if v is not None and v.main_ip not in ("", "0.0.0.0") else None
            internal = (v.internal_ip or None) if v is not None else None
            new_state, iid, error = self.next_state(row, v)
            if new_state is row.state and iid is None and error is None:
                if ip and ip != row.main_ip:
                    if not self.dry:
                        ledger.update_address(self.conn, label, ip, internal)
                    self.rows[label] = _replace(row, main_ip=ip, internal_ip=internal)
                continue
            self.note(
                label, f"{row.state.value} -> {new_state.value}" + (f" ({error})" if error else "")
            )
            if not self.dry:
                ledger.transition(
                    self.conn,
                    label,
                    new_state,
                    self.now,
                    instance_id=iid,
                    main_ip=ip,
                    internal_ip=internal,
                    last_error=error,
                )
            self.rows[label] = _replace(
                row, state=new_state, instance_id=iid or row.instance_id, main_ip=ip or row.main_ip
            )
        price = self.cached_price()
        for v in self.vultr.values():
            if v.id in known or v.label in self.rows:
                continue
            state = self.boot_state(v, v.label)
            created = v.date_created or self.now
            self.note(v.label, f"adopted ({state.value}): tagged at Vultr, missing from the ledger")
            if not self.dry:
                ledger.adopt(
                    self.conn,
                    fleet=self.cfg.fleet.name,
                    label=v.label,
                    instance_id=v.id,
                    state=state,
                    plan=v.plan,
                    region=v.region,
                    created_at=created,
                    now=self.now,
                    hourly_rate=price.hourly if price else None,
                    monthly_cost=price.monthly if price else None,
                )
            self.rows[v.label] = _adopted_row(self.cfg.fleet.name, v, state, created, self.now)

    @property
    def own_workers(self) -> bool:
        """Workers report in the `workers` table (the built-in queue); foreign presets' don't."""
        return self.cfg.queue.preset == "vultrscale"

    def boot_state(self, v: VInstance, label: str) -> InstanceState:
        if self.worker_seen(label):
            return InstanceState.RUNNING
        if not self.own_workers and v.status == "active" and v.server_status == "ok":
            return InstanceState.RUNNING  # no worker table to watch: the instance is up
        return InstanceState.BOOTING if v.status == "active" else InstanceState.PENDING

    def next_state(
        self, row: LedgerRow, v: VInstance | None
    ) -> tuple[InstanceState, str | None, str | None]:
        """(new state, instance id learnt, error note) for one ledger row."""
        s = row.state
        if v is None:
            if s is InstanceState.CREATING:
                if self.now - row.created_at > CREATE_VISIBILITY_GRACE:
                    return InstanceState.GONE, None, "create never became an instance"
                return s, None, None
            posted = row.posted_at or row.created_at
            if s is InstanceState.PENDING and self.now - posted < POST_VISIBILITY_GRACE:
                return s, None, None  # 404 just after create: not visible yet
            if row.instance_id and not self.confirmed_gone(row.instance_id):
                return s, None, None  # the list missed it, but it is there: keep it
            return InstanceState.GONE, None, None
        iid = v.id if row.instance_id != v.id else None
        if s is InstanceState.RUNNING and self.own_workers and not self.worker_seen(row.label):
            # Its worker stopped heartbeating: it is no longer capacity. Back to booting, where
            # boot_timeout replaces it if the worker does not come back (and holds no lease).
            return InstanceState.BOOTING, iid, "worker not seen; waiting for it to come back"
        if s in (InstanceState.CREATING, InstanceState.PENDING, InstanceState.BOOTING):
            new = self.boot_state(v, row.label)
            order = [
                InstanceState.CREATING,
                InstanceState.PENDING,
                InstanceState.BOOTING,
                InstanceState.RUNNING,
            ]
            if order.index(new) < order.index(s):
                new = s
            return new, iid, None
        return s, iid, None

    def confirmed_gone(self, instance_id: str) -> bool:
        """GET the instance the list did not show. Only "not found" means gone; another error
        is an API error (the pass holds), never a reason to forget a paid instance."""
        from vultrscale.vultr.errors import NotFound

        try:
            v = self.parts.client.get_instance(instance_id)
        except NotFound:
            return True
        self.vultr[v.label] = v
        return False

    def note(self, label: str, what: str) -> None:
        self.result.results.append({"label": label, "result": what})

    # Drains. --------------------------------------------------------------------------------
    def target(self, row: LedgerRow) -> HostTarget | None:
        f = self.cfg.fleet
        v = self.vultr.get(row.label)
        if f.ssh_address == "internal_ip":
            address = (v.internal_ip if v else row.internal_ip) or ""
        else:
            address = (v.main_ip if v else row.main_ip) or ""
        if not row.host_key or address in ("", "0.0.0.0"):
            return None
        return HostTarget(row.label, address, f.ssh_port, f.ssh_user, row.host_key, f.service)

    def live_leases(self, label: str) -> int | None:
        """Live leases of the instance's worker; None when the queue could not be read."""
        if self.signals is None:
            return None
        w = self.workers.get(label)
        return w.live_leases if w else 0

    def progress_drains(self) -> None:
        """For each draining instance: is the worker stopped? Then DELETE. Never blocks."""
        draining = [r for r in self.rows.values() if r.state is InstanceState.DRAINING]
        deleting = [r for r in self.rows.values() if r.state is InstanceState.DELETING]
        from vultrscale.db import ledger

        if draining:
            # A worker restarted (or first started) after the drain began must claim nothing.
            ledger.mark_workers_draining(self.conn, [r.label for r in draining])
        targets = {r.label: t for r in draining if (t := self.target(r)) is not None}
        states: dict[str, ServiceState | SSHError] = {}
        if targets:
            states = self.parts.drain.is_active_many(list(targets.values()))
        restop = []
        for row in draining:
            st = states.get(row.label)
            since = row.draining_at or row.state_since
            waited = self.now - since
            live = self.live_leases(row.label)
            if isinstance(st, ServiceState) and st.stopped:
                if live is None:
                    self.note(row.label, f"worker {st.value}; queue unreadable, not deleting yet")
                    continue
                if live:
                    self.note(
                        row.label, f"worker {st.value}; waiting for {live} live lease(s) to expire"
                    )
                    continue
                self.start_delete(row, f"worker {st.value}")
            elif isinstance(st, ServiceState):
                if st is ServiceState.ACTIVE:
                    restop.append(targets[row.label])  # the stop never arrived: send it again
                if waited > self.cfg.drain.timeout + DRAIN_MARGIN:
                    self.delete_past_deadline(
                        row, live, f"drain past its deadline (worker {st.value})"
                    )
                else:
                    self.note(row.label, f"draining: worker {st.value}")
            else:
                why = str(st) if st is not None else "no address or pinned host key"
                if (
                    waited > self.cfg.drain.unreachable_grace
                    or waited > self.cfg.drain.timeout + DRAIN_MARGIN
                ):
                    self.delete_past_deadline(row, live, f"unreachable past its grace ({why})")
                else:
                    self.result.errors.append(f"{row.label}: drain check failed: {why}")
        if restop:
            for label, err in self.parts.drain.stop_many(restop).items():
                if err is not None:
                    self.result.errors.append(f"{label}: systemctl stop failed: {err}")
        for row in deleting:
            self.delete(row)

    def delete_past_deadline(self, row: LedgerRow, live: int | None, why: str) -> None:
        if live is None:
            self.note(row.label, f"{why}; queue unreadable, not deleting")
        elif live > 0:
            # Past the deadline the promise allows a delete; the lease will be recovered by
            # expiry. We still wait for the lease to lapse: a live lease means a worker that
            # heartbeats, and an instance that heartbeats is not dead.
            self.note(row.label, f"{why}; worker still holds {live} live lease(s), waiting")
        else:
            self.start_delete(row, why)

    def start_delete(self, row: LedgerRow, why: str) -> None:
        from vultrscale.db import ledger

        ledger.transition(self.conn, row.label, InstanceState.DELETING, self.now)
        row = _replace(row, state=InstanceState.DELETING)
        self.rows[row.label] = row
        self.note(row.label, f"delete: {why}")
        self.delete(row)

    def delete(self, row: LedgerRow) -> None:
        """DELETE and verify it is gone; a locked instance is retried on a later pass."""
        from vultrscale.db import ledger
        from vultrscale.vultr.errors import InstanceLocked, NotFound, VultrError

        if not row.instance_id:
            ledger.transition(self.conn, row.label, InstanceState.GONE, self.now)
            return
        try:
            self.parts.client.delete_instance(row.instance_id)
        except NotFound:
            pass
        except InstanceLocked as exc:
            ledger.note_error(self.conn, row.label, str(exc), delete=True)
            self.note(row.label, "delete refused: instance locked at Vultr; retrying next pass")
            return
        except VultrError as exc:
            ledger.note_error(self.conn, row.label, str(exc), delete=True)
            self.result.errors.append(f"{row.label}: delete failed: {exc}")
            return
        try:
            self.parts.client.get_instance(row.instance_id)
        except NotFound:
            ledger.transition(self.conn, row.label, InstanceState.GONE, self.now)
            self.rows[row.label] = _replace(row, state=InstanceState.GONE)
            self.note(row.label, "deleted")
            return
        except VultrError as exc:
            self.note(row.label, f"deleted; verification deferred ({exc})")
            return
        self.note(row.label, "delete accepted; still listed, verifying next pass")

    # Act. -----------------------------------------------------------------------------------
    def act(self, plan: Plan, price: PlanPrice | None, snapshot: str) -> None:
        from vultrscale.db import ledger

        drain_targets: list[HostTarget] = []
        for action in plan.actions:
            row = self.rows.get(action.label or "")
            if action.kind is ActionKind.REPLACE and row is not None:
                if self.live_leases(row.label):
                    self.note(row.label, "replace skipped: its worker holds a live lease")
                    continue
                self.start_delete(row, action.reason)
            elif action.kind is ActionKind.DRAIN and row is not None:
                ledger.mark_draining(self.conn, row.label, self.now)
                self.rows[row.label] = _replace(
                    row, state=InstanceState.DRAINING, draining_at=self.now
                )
                t = self.target(self.rows[row.label])
                if t is None:
                    self.note(
                        row.label,
                        "draining: no address or pinned host key; the drain deadline applies",
                    )
                else:
                    drain_targets.append(t)
        if drain_targets:
            for label, err in self.parts.drain.stop_many(drain_targets).items():
                if err is None:
                    self.note(label, "drain started: systemctl stop --no-block sent")
                else:
                    self.result.errors.append(f"{label}: systemctl stop failed: {err}")
        if plan.creates and price is not None:
            self.create(plan.creates, price, snapshot)

    def snapshot_id(self) -> str:
        """The snapshot to boot from: fleet.snapshot_id, else the recorded one; must be complete."""
        from vultrscale.vultr.errors import NotFound

        sid = self.cfg.fleet.snapshot_id
        if not sid:
            from vultrscale.db.snapshots import recorded_snapshot

            sid = recorded_snapshot(self.conn, self.cfg.fleet.name) or ""
        if sid and self.parts.cache.get("snapshot") == sid:
            return sid  # checked complete before; a newly baked one is picked up next pass
        if not sid:
            raise UsageError(
                "no snapshot to create instances from",
                hint="Run `vultrscale snapshot --from-instance ID` or set fleet.snapshot_id.",
            )
        try:
            snap = self.parts.client.get_snapshot(sid)
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
        self.parts.cache["snapshot"] = sid
        return sid

    def create(self, count: int, price: PlanPrice, snapshot: str) -> None:
        """Create ``count`` instances: intent in the ledger first, then one POST each."""
        from vultrscale.db import ledger
        from vultrscale.vultr.errors import AmbiguousCreate, VultrError

        f = self.cfg.fleet
        for _ in range(count):
            label = self.new_label()
            private, public = self.parts.keygen()
            ledger.insert_intent(
                self.conn,
                fleet=f.name,
                label=label,
                plan=f.plan,
                region=f.region,
                hourly_rate=price.hourly,
                monthly_cost=price.monthly,
                host_key=public,
                now=self.now,
            )
            user_data = self.parts.render_user_data(label, private, public)
            self.parts.fault("before_post")
            try:
                inst = self.parts.client.create_instance(
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
                self.result.errors.append(
                    f"{label}: create outcome unknown ({exc}); the next pass looks it up by label"
                )
                return
            except VultrError as exc:
                ledger.transition(
                    self.conn, label, InstanceState.GONE, self.now, last_error=str(exc)
                )
                self.result.errors.append(f"{label}: create refused: {exc}")
                return
            self.created += 1
            self.parts.fault("after_post")
            ledger.transition(
                self.conn, label, InstanceState.PENDING, self.now, instance_id=inst.id
            )
            self.note(label, f"created {inst.id}")

    def new_label(self) -> str:
        suffix = "".join(self.parts.rng.choices(string.ascii_lowercase + string.digits, k=4))
        return f"{self.cfg.fleet.label_prefix}-{int(self.now.timestamp())}-{suffix}"


def _replace(row: LedgerRow, **changes: Any) -> LedgerRow:
    from dataclasses import replace

    return replace(row, **changes)


def _adopted_row(
    fleet: str, v: VInstance, state: InstanceState, created: datetime, now: datetime
) -> LedgerRow:
    from vultrscale.db.ledger import LedgerRow

    return LedgerRow(
        label=v.label,
        fleet=fleet,
        state=state,
        instance_id=v.id,
        plan=v.plan,
        region=v.region,
        hourly_rate=None,
        monthly_cost=None,
        host_key=None,
        main_ip=v.main_ip,
        internal_ip=v.internal_ip,
        created_at=created,
        posted_at=created,
        active_at=None,
        running_at=None,
        draining_at=None,
        deleting_at=None,
        gone_at=None,
        state_since=now,
        delete_attempts=0,
        last_error=None,
    )


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
    """Run passes every ``interval`` until ``stop`` is set. A runtime failure is reported and the
    loop goes on; a usage error (bad config) ends it with exit 2."""
    stop = stop or threading.Event()
    passes = 0
    last = EXIT_OK
    while not stop.is_set():
        began = parts.clock.monotonic()
        try:
            result = run_pass(cfg, parts, dry_run=dry_run)
            last = result.exit_code
            on_result(result)
        except UsageError:
            raise
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


def summary_rows(instances: Iterable[Instance]) -> list[dict[str, Any]]:
    return [asdict(i) for i in instances]
