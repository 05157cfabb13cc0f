"""The adapters of the pass's ports (``vultrscale.ports``) on Postgres: ``PgLedger`` (the
FleetLedger port, on ``db.ledger``'s statements), ``PgSignals`` (QueueSignals) and ``PgStore``
(Store: one connection a pass, kept from pass to pass by ``reconcile --loop``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import psycopg

from vultrscale.config import format_duration
from vultrscale.core.clock import PASS_DEADLINE_S, Deadline
from vultrscale.core.model import FleetState, LedgerRow, PassEvent, Signals, StoredReads, WorkerView
from vultrscale.db import ledger, pg, plan_checks
from vultrscale.db.account import PgAccount
from vultrscale.db.snapshots import recorded_snapshot
from vultrscale.errors import DatabaseError, PassStuck
from vultrscale.ports import AccountLedger, QueueSignals, Session
from vultrscale.rules.offerings import OfferingCheck

if TYPE_CHECKING:
    from vultrscale.config import Config, QueueConfig
    from vultrscale.core.forecast import Profile
    from vultrscale.rules.decision import Adopt, Move, UpdateAddress
    from vultrscale.rules.offerings import Choice


# Left open by a pass cut short inside a transaction (PgLedger.record_event).
_IN_TRANSACTION = (psycopg.pq.TransactionStatus.INTRANS, psycopg.pq.TransactionStatus.INERROR)


class PgLedger:
    """The FleetLedger port on one Postgres connection; psycopg errors leave as DatabaseError."""

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        fleet: str,
        url: str = "",
        *,
        deadline_s: float = PASS_DEADLINE_S,
    ) -> None:
        self.conn, self.fleet, self.url = conn, fleet, url
        self.deadline_s = deadline_s
        self.account: AccountLedger | None = PgAccount(conn, fleet, url)

    def _t(self, doing: str) -> AbstractContextManager[None]:
        return pg.translated(f"fleet ledger: {doing}", self.url)

    def lock(self) -> bool:
        """Take the fleet's pass lock; False if a pass holds it that may still be working,
        ``PassStuck`` (exit 1, so cron alerts) if it has held it past its deadline and
        ``ledger.LOCK_MARGIN_S``: that pass will not end by itself, and no pass scales the fleet
        until it does."""
        with self._t("taking the pass lock"):
            if ledger.take_pass_lock(self.conn, self.fleet, self.deadline_s):
                return True
            holder = ledger.lock_holder(self.conn, self.fleet)
        if holder is None or holder.held_s is None:
            return False  # released meanwhile, or nothing to tell its age by
        allowed = (holder.deadline_s or self.deadline_s) + ledger.LOCK_MARGIN_S
        if holder.held_s <= allowed:
            return False
        raise PassStuck(
            f"Another reconcile pass has held the lock of fleet {self.fleet!r} for "
            f"{format_duration(timedelta(seconds=round(holder.held_s)))}, past the "
            f"{format_duration(timedelta(seconds=round(allowed)))} a pass may take: it is stuck, "
            "and nothing scales this fleet until it ends",
            hint=f"Its database session is pid {holder.pid}: pg_stat_activity shows its client; "
            "stop that process, or end the session with "
            f"SELECT pg_terminate_backend({holder.pid}); the next pass takes over.",
        )

    def extend_lock(self, seconds: float) -> None:
        # And its deadline again: the time it has for Vultr does not run while it waits on SSH.
        with self._t("showing how long the pass may still take"):
            ledger.extend_pass_lock(self.conn, seconds + self.deadline_s)

    def rows(self, since: datetime) -> list[LedgerRow]:
        with self._t("reading the instances"):
            return ledger.rows(self.conn, self.fleet, since=since)

    def workers(
        self, seen_within: timedelta, labels: Sequence[str] | None = None
    ) -> dict[str, WorkerView]:
        with self._t("reading the workers"):
            return ledger.workers_by_label(
                self.conn,
                self.fleet,
                seen_within=seen_within,
                labels=None if labels is None else list(labels),
            )

    def fleet_state(self) -> FleetState:
        with self._t("reading the fleet state"):
            return ledger.fleet_state(self.conn, self.fleet)

    def reads(
        self,
        since: datetime,
        seen_within: timedelta,
        signals: QueueSignals,
        *,
        forecast: bool = False,
    ) -> StoredReads:
        # The signals go in the same round trip when they are this connection's own reader.
        together = (
            isinstance(signals, PgSignals) and signals.conn is self.conn and signals.reader is None
        )
        queue = signals.queue if isinstance(signals, PgSignals) and together else None
        with self._t("reading the instances, workers and fleet state"):
            got = ledger.reads(
                self.conn,
                self.fleet,
                since=since,
                seen_within=seen_within,
                queue=queue,
                forecast=forecast,
            )
        if got.signals is not None or got.signal_error is not None:
            return got
        try:  # a reader of the caller's, or another connection's: read on their own
            return replace(got, signals=signals.read())
        except DatabaseError as exc:
            return replace(got, signal_error=exc)

    def recorded_snapshot(self) -> str | None:
        return recorded_snapshot(self.conn, self.fleet)

    def offering_checks(
        self, keys: Sequence[tuple[str, str]], now: datetime, ttl: timedelta
    ) -> dict[tuple[str, str], OfferingCheck]:
        with self._t("reading the offering checks"):
            got = plan_checks.get_many(self.conn, list(keys), now, ttl)
        return {
            key: OfferingCheck.of(key[0], key[1], price, listed)
            for key, (price, listed) in got.items()
        }

    def save_offering_check(self, check: OfferingCheck, now: datetime) -> None:
        if check.price is None:
            return  # an unknown plan, or one without a price: asked again next pass
        with self._t("saving the offering check"):
            plan_checks.put(self.conn, check.price, check.region, now, listed=check.listed)

    def mark_unavailable(self, region: str, plan: str, until: datetime, reason: str) -> None:
        with self._t(f"remembering the refusal of {region}/{plan}"):
            plan_checks.mark(self.conn, self.fleet, region, plan, until, reason)

    def forecast_profile(self) -> Profile | None:
        with self._t("reading the forecast profile"):
            return ledger.forecast_profile(self.conn, self.fleet)

    def save_forecast_profile(self, profile: Profile) -> None:
        with self._t("saving the forecast profile"):
            ledger.save_forecast_profile(self.conn, self.fleet, profile)

    def insert_intent(self, label: str, choice: Choice, host_key: str, now: datetime) -> None:
        with self._t(f"writing the create intent of {label}"):
            ledger.insert_intent(self.conn, self.fleet, label, choice, host_key, now)

    def transition(self, move: Move, now: datetime) -> None:
        with self._t(f"moving {move.label} to {move.state.value}"):
            ledger.transition(
                self.conn,
                move.label,
                move.state,
                now,
                fleet=self.fleet,
                instance_id=move.instance_id,
                main_ip=move.main_ip,
                internal_ip=move.internal_ip,
                last_error=move.error,
            )

    def adopt(self, step: Adopt, now: datetime) -> None:
        with self._t(f"adopting {step.label}"):
            ledger.adopt(self.conn, self.fleet, step, now)

    def note_error(self, label: str, error: str, *, delete: bool = False) -> None:
        with self._t(f"noting an error of {label}"):
            ledger.note_error(self.conn, label, error, fleet=self.fleet, delete=delete)

    def update_address(self, step: UpdateAddress) -> None:
        with self._t(f"updating the address of {step.label}"):
            ledger.update_address(
                self.conn, step.label, step.main_ip, step.internal_ip, fleet=self.fleet
            )

    def mark_workers_draining(self, labels: Iterable[str]) -> None:
        with self._t("marking workers draining"):
            ledger.mark_workers_draining(self.conn, list(labels))

    def mark_draining(self, label: str, now: datetime) -> None:
        with self._t(f"marking {label} draining"):
            ledger.mark_draining(self.conn, label, now, fleet=self.fleet)

    def revive(self, label: str, now: datetime) -> None:
        with self._t(f"reviving {label}"):
            ledger.revive(self.conn, label, now, fleet=self.fleet)

    def start_refused(self, label: str, now: datetime, error: str) -> None:
        with self._t(f"marking {label} never to be revived"):
            ledger.start_refused(self.conn, label, now, error, fleet=self.fleet)

    def save_fleet_state(self, now: datetime, **kw: Any) -> None:
        with self._t("saving the fleet state"):
            ledger.save_fleet_state(self.conn, self.fleet, now, **kw)

    def record_event(self, event: PassEvent) -> int:
        with self._t("recording the pass"):
            # A pass cut short (Ctrl-C) inside its read left that read-only transaction open,
            # and its row was refused as a write in it: the row goes in outside it.
            if self.conn.info.transaction_status in _IN_TRANSACTION:
                self.conn.rollback()
            return ledger.record_event(self.conn, fleet=self.fleet, **event)


class PgSignals:
    """The QueueSignals port: ``db.signals.read_signals`` on the pass's connection, or a
    reader of the caller's (given the connection)."""

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        queue: QueueConfig,
        reader: Callable[[psycopg.Connection[Any]], Signals] | None = None,
    ) -> None:
        self.conn, self.queue, self.reader = conn, queue, reader

    def read(self) -> Signals:
        if self.reader is not None:
            return self.reader(self.conn)
        from vultrscale.db.signals import read_signals

        return read_signals(self.conn, self.queue)


class PgStore:
    """The Store port: each pass gets one autocommit connection (its session lock with it).

    ``keep``: one connection serves pass after pass (``reconcile --loop``, ``status --watch``):
    a new one costs a TCP and authentication handshake, a fifth of a steady pass over 500
    instances. Between passes it holds no lock (released at the end of each session) and no
    transaction; one found broken is replaced before the pass uses it. ``close()`` ends it.
    Without ``keep`` (one-shot commands, tests), every session connects and closes."""

    def __init__(
        self,
        url: str,
        signals_reader: Callable[[psycopg.Connection[Any]], Signals] | None = None,
        *,
        keep: bool = False,
        deadline: Deadline | None = None,
    ) -> None:
        self.url = url
        self.signals_reader = signals_reader
        self.keep = keep
        self.deadline = deadline
        self._kept: psycopg.Connection[Any] | None = None

    @contextmanager
    def session(self, cfg: Config) -> Iterator[Session]:
        """One pass's session; ``deadline`` (shared with the pass's Vultr client) runs from
        before its connect until its end."""
        running = self.deadline.running() if self.deadline is not None else nullcontext()
        with running:
            yield from self._session(cfg)

    def _session(self, cfg: Config) -> Iterator[Session]:
        conn = self._connection()
        seconds = self.deadline.seconds if self.deadline is not None else PASS_DEADLINE_S
        try:
            yield Session(
                PgLedger(conn, cfg.fleet.name, self.url, deadline_s=seconds),
                PgSignals(conn, cfg.queue, self.signals_reader),
            )
        finally:
            self._release(conn)

    def close(self) -> None:
        """Close the kept connection, if any."""
        conn, self._kept = self._kept, None
        if conn is not None:
            conn.close()

    def _connection(self) -> psycopg.Connection[Any]:
        conn, self._kept = self._kept, None
        if conn is not None:
            try:
                conn.execute("SELECT 1")  # the server may have restarted since the last pass
                return conn
            except psycopg.Error:
                conn.close()
        # Its times in UTC, the tzinfo the pass computes in; a stalled statement or network
        # an error within PASS_STALL_S, not a pass (and its lock) held for TCP's 15 minutes.
        conn = pg.connect(
            self.url, statement_timeout_s=pg.PASS_STALL_S, **pg.keepalives(pg.PASS_STALL_S)
        )
        try:
            with pg.translated("setting up the pass's session", self.url):
                # A scaler host that vanishes mid-pass frees its locks for the other's passes.
                pg.server_keepalives(conn, pg.PASS_STALL_S)
        except BaseException:
            conn.close()
            raise
        return conn

    def _release(self, conn: psycopg.Connection[Any]) -> None:
        """Free the session's locks, then keep ``conn`` for the next session if asked and it
        was idle; anything else is closed.

        The locks are freed by a statement, not left to the close: closing only asks the
        server process to end, and it dropped the lock some milliseconds after the pass had
        returned, so a pass run right after (the loop's, or cron's on a busy server) found
        "lock held" and did nothing."""
        status, states = conn.info.transaction_status, psycopg.pq.TransactionStatus
        # Not mid-statement (ACTIVE) and not broken (UNKNOWN): closing is all that is left.
        usable = not conn.closed and status in (states.IDLE, states.INTRANS, states.INERROR)
        clean = usable and status == states.IDLE
        if usable:
            try:
                if status != states.IDLE:
                    conn.rollback()  # a pass that died inside a transaction
                ledger.release_pass_lock(conn)  # its locks, and its application_name back
            except psycopg.Error:
                clean = False
        if self.keep and clean:
            self._kept = conn
            return
        conn.close()
