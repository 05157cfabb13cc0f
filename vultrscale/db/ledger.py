"""The scaler's own tables: the fleet ledger, the pass lock, the fleet state and the events.

Times written here come from the caller's clock (so a pass is testable with a fake clock);
lease liveness is always judged by the database's ``now()`` in the signals query.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import dict_row

from vultrscale.config import format_duration
from vultrscale.core import boottime
from vultrscale.core.clock import PASS_DEADLINE_S, Deadline
from vultrscale.core.model import (
    STATE_STAMPS,
    FleetState,
    InstanceState,
    LedgerRow,
    PassEvent,
    Signals,
    StoredReads,
    WorkerView,
    posts_intent,
    retired_label,
)
from vultrscale.db import pg, plan_checks
from vultrscale.db.account import PgAccount
from vultrscale.db.locks import lock_key as lock_key  # re-exported: the pass lock's key
from vultrscale.db.rows import COLUMNS as _COLUMNS
from vultrscale.db.rows import ledger_rows
from vultrscale.db.snapshots import recorded_snapshot
from vultrscale.errors import DatabaseError, PassStuck
from vultrscale.ports import AccountLedger, QueueSignals, Session
from vultrscale.rules.lifecycle import LabelHolder, adoption
from vultrscale.rules.offerings import OfferingCheck

if TYPE_CHECKING:
    from vultrscale.config import Config, QueueConfig
    from vultrscale.core.forecast import Profile
    from vultrscale.rules.decision import Adopt, Move, UpdateAddress
    from vultrscale.rules.offerings import Choice


_LOCK_NAMESPACE = 0x56534C  # "VSL": keeps our advisory locks apart from an app's own


def try_lock(conn: psycopg.Connection[Any], fleet: str) -> bool:
    """Take the fleet's session advisory lock; False if another pass holds it."""
    row = conn.execute(
        "SELECT pg_try_advisory_lock(%s, %s)", (_LOCK_NAMESPACE, lock_key(fleet))
    ).fetchone()
    return bool(row and row[0])


# What a pass may still do past the time it shows (its deadline, moved by ``extend_lock``
# before each SSH fan-out by that fan-out's bound): its few database statements and the
# scheduler's delays. A holder past that and this margin is stuck (a process frozen, a hang
# no bound covers).
LOCK_MARGIN_S = 60.0
# While it holds the lock, a pass shows other sessions when it took it and its deadline, in
# pg_stat_activity.application_name (ASCII, under 64 bytes), so a pass that finds the lock
# held can tell a slow holder from a stuck one, whatever that holder's deadline.
_HOLDER = "vultrscale pass: deadline {deadline:g}s, since "
_HOLDER_RE = re.compile(r"vultrscale pass: deadline (\d+(?:\.\d+)?)s, since (\d+)")


def take_pass_lock(conn: psycopg.Connection[Any], fleet: str, deadline_s: float) -> bool:
    """Take the fleet's lock as a pass with a deadline of ``deadline_s``, and say so in the
    session's application_name (``release_pass_lock`` puts it back); False if another session
    holds it."""
    row = conn.execute(
        "SELECT CASE WHEN pg_try_advisory_lock(%s, %s) THEN set_config('application_name', "
        "%s || floor(extract(epoch FROM now()))::bigint, false) END",
        (_LOCK_NAMESPACE, lock_key(fleet), _HOLDER.format(deadline=deadline_s)),
    ).fetchone()
    return bool(row and row[0] is not None)


def extend_pass_lock(conn: psycopg.Connection[Any], seconds: float) -> None:
    """Move the deadline this session shows as the lock's holder to ``seconds`` from now, if
    that is later (it never shortens it); nothing if the session holds no pass lock."""
    row = conn.execute(
        "SELECT current_setting('application_name'), extract(epoch FROM now())::float8"
    ).fetchone()
    m = _HOLDER_RE.fullmatch(row[0] or "") if row else None
    if row is None or m is None:
        return
    since = int(m[2])
    wanted = math.ceil(row[1] - since + seconds)
    if wanted > float(m[1]):
        conn.execute(
            "SELECT set_config('application_name', %s, false)",
            (_HOLDER.format(deadline=wanted) + str(since),),
        )


def release_pass_lock(conn: psycopg.Connection[Any]) -> None:
    """Release every lock of the session and give it back its own application_name."""
    conn.execute("SELECT pg_advisory_unlock_all()")
    conn.execute("RESET application_name")


@dataclass(frozen=True)
class LockHolder:
    """The session that holds a fleet's lock, as pg_stat_activity shows it."""

    pid: int
    held_s: float | None  # since it took the lock (or, for a session of another kind, went idle)
    deadline_s: float | None  # the holder's own deadline, when it is a pass that says it


def lock_holder(conn: psycopg.Connection[Any], fleet: str) -> LockHolder | None:
    """Who holds the fleet's lock and for how long; None if nobody does now."""
    row = conn.execute(
        "SELECT a.pid, a.application_name, extract(epoch FROM now())::float8, "
        "extract(epoch FROM CASE WHEN a.state = 'idle' THEN a.state_change "
        "ELSE coalesce(a.xact_start, a.query_start) END)::float8 "
        "FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 "
        # pg_locks is the whole server's; an advisory key is per database (another database
        # may run a fleet of the same name: staging beside production).
        "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
        "AND l.classid = %s::oid AND l.objid = %s::oid",
        (_LOCK_NAMESPACE, lock_key(fleet)),
    ).fetchone()
    if row is None:
        return None
    pid, name, now, idle_since = row
    m = _HOLDER_RE.fullmatch(name or "")
    if m:
        return LockHolder(pid, now - float(m[2]), float(m[1]))
    # Not a pass that says when it began (a session of an older version, a hand-held lock):
    # how long it has done nothing, or run one statement, is the best measure there is.
    return LockHolder(pid, None if idle_since is None else now - idle_since, None)




_ROWS = (
    f"SELECT {_COLUMNS} FROM fleet_instances WHERE fleet = %s "
    "AND (state <> 'gone' OR (%s::timestamptz IS NOT NULL AND gone_at >= %s)) "
    "ORDER BY created_at, label"
)


# The fleet's newest boots (boottime.is_boot: created here, its worker seen), gone ones of
# earlier months too, within boottime.WINDOW: what the boot time is learned from. Served by
# fleet_instances_boots_idx (schema v7): a few index rows, whatever the ledger's length.
_BOOTS = (
    f"SELECT {_COLUMNS} FROM fleet_instances WHERE fleet = %s "
    "AND posted_at IS NOT NULL AND running_at IS NOT NULL AND created_at >= now() - %s "
    "ORDER BY created_at DESC LIMIT %s"
)


def boot_rows(
    conn: psycopg.Connection[Any], fleet: str, *, within: timedelta, limit: int | None
) -> list[LedgerRow]:
    """The fleet's boots (``boottime.is_boot``) created within ``within``, newest first, the
    ``limit`` newest (None: all of them)."""
    with conn.cursor(binary=True) as cur:
        return ledger_rows(cur.execute(_BOOTS, (fleet, within, limit)))


def rows(
    conn: psycopg.Connection[Any], fleet: str, *, since: datetime | None = None
) -> list[LedgerRow]:
    """The fleet's ledger: every row not gone, plus gone rows that ended after ``since``."""
    # Binary results: nine timestamps a row arrive as numbers, not text to parse.
    with conn.cursor(binary=True) as cur:
        return ledger_rows(cur.execute(_ROWS, (fleet, since, since)))


_PROFILE = "SELECT profile FROM forecast_profiles WHERE fleet = %s"


def forecast_profile(conn: psycopg.Connection[Any], fleet: str) -> Profile | None:
    """The fleet's cached forecast profile, however old; None: none saved."""
    return _profile(conn.execute(_PROFILE, (fleet,)).fetchone())


def _profile(row: tuple[Any, ...] | None) -> Profile | None:
    from vultrscale.core.forecast import Profile

    return None if row is None else Profile.from_json(row[0])


def save_forecast_profile(conn: psycopg.Connection[Any], fleet: str, profile: Profile) -> None:
    conn.execute(
        "INSERT INTO forecast_profiles (fleet, computed_at, profile) VALUES (%s, %s, %s) "
        "ON CONFLICT (fleet) DO UPDATE SET computed_at = excluded.computed_at, "
        "profile = excluded.profile",
        (fleet, profile.computed_at, json.dumps(profile.to_json())),
    )


def reads(
    conn: psycopg.Connection[Any],
    fleet: str,
    *,
    since: datetime,
    seen_within: timedelta,
    queue: QueueConfig | None = None,
    forecast: bool = False,
) -> StoredReads:
    """``rows``, ``workers_by_label`` and ``fleet_state`` of the fleet, and with ``queue`` the
    queue's signals (any preset), in one round trip: the statements go out together (psycopg's
    pipeline mode), and the answers are read once the block's end has sent its Sync (a fetch
    inside it would wait for its answer first). Signals that cannot be read are the value's
    ``signal_error``; without ``queue`` its ``signals`` are None."""
    from vultrscale.db.signals import SentSignals

    with (
        conn.cursor(binary=True) as in_rows,
        conn.cursor() as in_workers,
        conn.cursor() as in_state,
        conn.cursor() as in_marks,
        conn.cursor() as in_profile,
        conn.cursor(binary=True) as in_boots,
    ):
        # Held before it is sent: an error of its statements may come while they are sent.
        sent = SentSignals(queue) if queue is not None else None
        try:
            with conn.pipeline():
                # The signals first: their BEGIN must open the transaction, not follow
                # statements of the same Sync (which share an implicit one).
                if sent is not None:
                    sent.send(conn)
                in_rows.execute(_ROWS, (fleet, since, since))
                in_workers.execute(_workers_query(None), _workers_params(fleet, seen_within, None))
                in_state.execute(_FLEET_STATE, (fleet,))
                in_marks.execute(plan_checks.MARKS, (fleet,))
                if forecast:
                    in_profile.execute(_PROFILE, (fleet,))
                in_boots.execute(_BOOTS, (fleet, boottime.WINDOW, boottime.LAST_BOOTS))
        except psycopg.Error as exc:
            if sent is None or sent.answered:
                raise  # the ledger's own error
            # The signal read failed, and the server skipped what followed it: its
            # transaction is rolled back and the ledger read again (a second round trip, on
            # this path only). The pass goes on without signals, as it always has.
            conn.rollback()
            ledger = reads(conn, fleet, since=since, seen_within=seen_within, forecast=forecast)
            return replace(ledger, signal_error=sent.error(exc))
        signals, signal_error = None, None
        if sent is not None:
            try:
                signals = sent.result()
            except DatabaseError as exc:
                signal_error = exc
        return StoredReads(
            ledger_rows(in_rows),
            _workers(in_workers),
            _fleet_state(in_state.fetchone()),
            signals,
            signal_error,
            marks=plan_checks.marks(in_marks.fetchall()),
            forecast=_profile(in_profile.fetchone()) if forecast else None,
            boots=ledger_rows(in_boots),
        )


def insert_intent(
    conn: psycopg.Connection[Any],
    fleet: str,
    label: str,
    choice: Choice,
    host_key: str,
    now: datetime,
) -> None:
    """Write the create intent before the POST, so a crash after it is found by label."""
    o, price = choice.offering, choice.price
    conn.execute(
        "INSERT INTO fleet_instances (label, fleet, state, plan, region, hourly_rate, "
        "monthly_cost, host_key, created_at, state_since) "
        "VALUES (%s, %s, 'creating', %s, %s, %s, %s, %s, %s, %s)",
        (label, fleet, o.plan, o.region, price.hourly, price.monthly, host_key, now, now),
    )


def adopt(conn: psycopg.Connection[Any], fleet: str, step: Adopt, now: datetime) -> None:
    """Record a tagged instance the ledger did not know (made by hand, or a lost intent),
    where ``lifecycle.adoption`` says: its own gone row revived, another instance's gone row
    under ``label`` kept under its retired label, a live row of another fleet left alone."""
    note = "adopted: tagged at Vultr but missing from the ledger"
    label, instance_id, state, price = step.label, step.instance_id, step.state, step.price
    with conn.transaction():
        held = conn.execute(
            "SELECT state, instance_id, gone_at FROM fleet_instances WHERE label = %s FOR UPDATE",
            (label,),
        ).fetchone()
        own = conn.execute(
            "SELECT 1 FROM fleet_instances WHERE instance_id = %s AND state = 'gone' FOR UPDATE",
            (instance_id,),
        ).fetchone()
        holder = None if held is None else LabelHolder(InstanceState(held[0]), held[1], held[2])
        where = adoption(label, instance_id, holder, own_gone=own is not None)
        if where.retire_as is not None:
            conn.execute(
                "UPDATE fleet_instances SET label = %s WHERE label = %s", (where.retire_as, label)
            )
        if where.revive:
            conn.execute(
                "UPDATE fleet_instances SET label = %(label)s, fleet = %(fleet)s, "
                "state = %(state)s, state_since = %(now)s, gone_at = NULL, draining_at = NULL, "
                "deleting_at = NULL, running_at = COALESCE(running_at, CASE WHEN "
                "%(state)s = 'running' THEN %(now)s::timestamptz END), "
                "last_error = %(note)s WHERE instance_id = %(iid)s AND state = 'gone'",
                {
                    "label": where.label,
                    "fleet": fleet,
                    "state": state.value,
                    "now": now,
                    "note": note,
                    "iid": instance_id,
                },
            )
            return
        # Another fleet's pass may take the label between the read and the insert: then the
        # instance goes by its shared-label name, as ``adoption`` would have said.
        for name in dict.fromkeys((where.label, retired_label(label, instance_id))):
            inserted = conn.execute(
                "INSERT INTO fleet_instances (label, fleet, state, instance_id, plan, region, "
                "hourly_rate, monthly_cost, created_at, posted_at, running_at, state_since, "
                "last_error) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
                "ON CONFLICT (label) DO NOTHING",
                (
                    name,
                    fleet,
                    state.value,
                    instance_id,
                    step.plan,
                    step.region,
                    price.hourly if price else None,
                    price.monthly if price else None,
                    step.created_at,
                    None,  # posted_at: never POSTed by this scaler (LedgerRow.boot_since)
                    now if state is InstanceState.RUNNING else None,
                    now,
                    note,
                ),
            )
            if inserted.rowcount:
                return


def transition(
    conn: psycopg.Connection[Any],
    label: str,
    state: InstanceState,
    now: datetime,
    *,
    fleet: str,
    instance_id: str | None = None,
    main_ip: str | None = None,
    internal_ip: str | None = None,
    last_error: str | None = None,
) -> None:
    """Move ``fleet``'s row ``label`` to ``state`` and stamp that state's transition time
    (first time only). Every write names the fleet: a label is unique in the table, but
    another fleet's row must never move because this fleet's pass met the same name."""
    column = STATE_STAMPS.get(state)
    stamp = f", {column} = COALESCE({column}, %(now)s)" if column else ""
    if posts_intent(InstanceState.CREATING, state):  # from a create intent (SET reads the old row)
        stamp += (
            ", posted_at = CASE WHEN state = 'creating' THEN COALESCE(posted_at, %(now)s) "
            "ELSE posted_at END"
        )
    conn.execute(
        "UPDATE fleet_instances SET state = %(state)s, state_since = CASE WHEN state = "
        "%(state)s THEN state_since ELSE %(now)s END"
        f"{stamp}, instance_id = COALESCE(%(iid)s, instance_id), "
        "main_ip = COALESCE(%(ip)s, main_ip), internal_ip = COALESCE(%(iip)s, internal_ip), "
        "last_error = %(err)s WHERE label = %(label)s AND fleet = %(fleet)s",
        {
            "fleet": fleet,
            "state": state.value,
            "now": now,
            "iid": instance_id,
            "ip": main_ip,
            "iip": internal_ip,
            "err": last_error,
            "label": label,
        },
    )


def note_error(
    conn: psycopg.Connection[Any], label: str, error: str, *, fleet: str, delete: bool = False
) -> None:
    extra = ", delete_attempts = delete_attempts + 1" if delete else ""
    conn.execute(
        f"UPDATE fleet_instances SET last_error = %s{extra} WHERE label = %s AND fleet = %s",
        (error, label, fleet),
    )


def update_address(
    conn: psycopg.Connection[Any],
    label: str,
    main_ip: str | None,
    internal_ip: str | None,
    *,
    fleet: str,
) -> None:
    conn.execute(
        "UPDATE fleet_instances SET main_ip = COALESCE(%s, main_ip), "
        "internal_ip = COALESCE(%s, internal_ip) WHERE label = %s AND fleet = %s",
        (main_ip or None, internal_ip or None, label, fleet),
    )


def workers_by_label(
    conn: psycopg.Connection[Any],
    fleet: str,
    *,
    seen_within: timedelta,
    labels: list[str] | None = None,
) -> dict[str, WorkerView]:
    """Per instance label: the newest heartbeat of its running workers, whether it is recent on
    the database's clock, the draining flag and the live leases they hold. For the fleet's
    instances in the ledger (not gone), or for ``labels``."""
    if labels is not None and not labels:
        return {}
    with conn.cursor() as cur:
        cur.execute(_workers_query(labels), _workers_params(fleet, seen_within, labels))
        return _workers(cur)


def _workers_query(labels: list[str] | None) -> str:
    # The fleet's labels come from the ledger in the query itself: sent as an array, 500 labels
    # cost more to send and match than the whole read.
    which = (
        "IN (SELECT label FROM fleet_instances WHERE fleet = %(fleet)s AND state <> 'gone')"
        if labels is None
        else "= ANY(%(labels)s)"
    )
    return f"""
        SELECT w.instance_label, max(w.last_seen) AS last_seen,
               bool_or(w.draining) AS draining,
               coalesce(sum(l.live), 0)::int AS live_leases,
               max(w.last_seen) > now() - %(within)s AS seen
        FROM workers w
        LEFT JOIN LATERAL (
            SELECT count(*) AS live FROM job_leases
            WHERE worker_id = w.worker_id AND expires_at > now()
        ) l ON true
        WHERE w.instance_label {which} AND w.stopped_at IS NULL
        GROUP BY w.instance_label
        """


def _workers_params(fleet: str, seen_within: timedelta, labels: list[str] | None) -> dict[str, Any]:
    return {"fleet": fleet, "labels": labels, "within": seen_within}


def _workers(cur: psycopg.Cursor[Any]) -> dict[str, WorkerView]:
    return {r[0]: WorkerView(*r) for r in cur.fetchall()}  # the columns in WorkerView's order


def mark_workers_draining(conn: psycopg.Connection[Any], labels: list[str]) -> None:
    """Keep the workers of draining instances marked draining (a restarted one too)."""
    conn.execute(
        "UPDATE workers SET draining = true WHERE instance_label = ANY(%s) AND NOT draining",
        (labels,),
    )


def mark_draining(conn: psycopg.Connection[Any], label: str, now: datetime, *, fleet: str) -> None:
    """Mark the instance and its workers draining in one transaction, before the SSH stop."""
    with conn.transaction():
        transition(conn, label, InstanceState.DRAINING, now, fleet=fleet)
        conn.execute("UPDATE workers SET draining = true WHERE instance_label = %s", (label,))


def start_refused(
    conn: psycopg.Connection[Any], label: str, now: datetime, error: str, *, fleet: str
) -> None:
    """A revive whose `systemctl start` was refused: the row and its workers back to draining,
    the row never to be revived again, with the error, in one transaction."""
    with conn.transaction():
        transition(conn, label, InstanceState.DRAINING, now, fleet=fleet, last_error=error)
        conn.execute(
            "UPDATE fleet_instances SET never_revive = true WHERE label = %s AND fleet = %s",
            (label, fleet),
        )
        conn.execute("UPDATE workers SET draining = true WHERE instance_label = %s", (label,))


def revive(conn: psycopg.Connection[Any], label: str, now: datetime, *, fleet: str) -> None:
    """A draining row back to running and its workers' draining flag cleared, in one
    transaction, before the SSH start: a worker process registers with the flag its row gives
    it (``queue.register_worker``), and one still running reads its own row's flag. Only a
    row still draining moves (never one whose delete was sent); its ``draining_at`` is
    cleared: its drain is over, and a later drain stamps its own."""
    with conn.transaction():
        moved = conn.execute(
            "UPDATE fleet_instances SET state = 'running', state_since = %(now)s, "
            "draining_at = NULL, last_error = NULL "
            "WHERE label = %(label)s AND fleet = %(fleet)s AND state = 'draining'",
            {"now": now, "label": label, "fleet": fleet},
        ).rowcount
        if moved:
            conn.execute(
                "UPDATE workers SET draining = false WHERE instance_label = %s AND draining",
                (label,),
            )


_FLEET_STATE = (
    "SELECT snapshot_id, last_scale_up, last_scale_down, idle_since FROM fleet_state "
    "WHERE fleet = %s"
)


def fleet_state(conn: psycopg.Connection[Any], fleet: str) -> FleetState:
    return _fleet_state(conn.execute(_FLEET_STATE, (fleet,)).fetchone())


def _fleet_state(row: tuple[Any, ...] | None) -> FleetState:
    return FleetState(*row) if row else FleetState()


def save_fleet_state(
    conn: psycopg.Connection[Any],
    fleet: str,
    now: datetime,
    *,
    last_scale_up: datetime | None,
    last_scale_down: datetime | None,
    idle_since: datetime | None,
) -> None:
    conn.execute(
        "INSERT INTO fleet_state (fleet, last_scale_up, last_scale_down, idle_since, updated_at) "
        "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (fleet) DO UPDATE SET "
        "last_scale_up = EXCLUDED.last_scale_up, last_scale_down = EXCLUDED.last_scale_down, "
        "idle_since = EXCLUDED.idle_since, updated_at = EXCLUDED.updated_at",
        (fleet, last_scale_up, last_scale_down, idle_since, now),
    )


def record_event(
    conn: psycopg.Connection[Any],
    *,
    fleet: str,
    at: datetime,
    dry_run: bool,
    inputs: dict[str, Any],
    plan: dict[str, Any],
    actions: list[dict[str, Any]],
    results: list[dict[str, Any]],
    errors: list[str],
    exit_code: int,
) -> int:
    """One row per pass: what it saw, decided, did, and what went wrong; returns its id."""

    def js(v: Any) -> str:
        return json.dumps(v, default=str)

    row = conn.execute(
        "INSERT INTO fleet_events (fleet, at, dry_run, inputs, plan, actions, results, errors, "
        "exit_code) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id",
        (fleet, at, dry_run, js(inputs), js(plan), js(actions), js(results), js(errors), exit_code),
    ).fetchone()
    assert row is not None  # INSERT ... RETURNING returns its row
    return int(row[0])


def events(
    conn: psycopg.Connection[Any], fleet: str, since: datetime, limit: int = 1000
) -> list[dict[str, Any]]:
    """The fleet's passes since ``since``, oldest first: the newest ``limit`` of them."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(
            "SELECT id, at, dry_run, inputs, plan, actions, results, errors, exit_code "
            "FROM fleet_events WHERE fleet = %s AND at >= %s ORDER BY at DESC, id DESC LIMIT %s",
            (fleet, since, limit),
        )
        return cur.fetchall()[::-1]


# --- the adapters of the pass's ports (vultrscale.ports) ---------------------------------------


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
        ``LOCK_MARGIN_S``: that pass will not end by itself, and no pass scales the fleet
        until it does."""
        with self._t("taking the pass lock"):
            if take_pass_lock(self.conn, self.fleet, self.deadline_s):
                return True
            holder = lock_holder(self.conn, self.fleet)
        if holder is None or holder.held_s is None:
            return False  # released meanwhile, or nothing to tell its age by
        allowed = (holder.deadline_s or self.deadline_s) + LOCK_MARGIN_S
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
            extend_pass_lock(self.conn, seconds + self.deadline_s)

    def rows(self, since: datetime) -> list[LedgerRow]:
        with self._t("reading the instances"):
            return rows(self.conn, self.fleet, since=since)

    def workers(
        self, seen_within: timedelta, labels: Sequence[str] | None = None
    ) -> dict[str, WorkerView]:
        with self._t("reading the workers"):
            return workers_by_label(
                self.conn,
                self.fleet,
                seen_within=seen_within,
                labels=None if labels is None else list(labels),
            )

    def fleet_state(self) -> FleetState:
        with self._t("reading the fleet state"):
            return fleet_state(self.conn, self.fleet)

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
            got = reads(
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
            return forecast_profile(self.conn, self.fleet)

    def save_forecast_profile(self, profile: Profile) -> None:
        with self._t("saving the forecast profile"):
            save_forecast_profile(self.conn, self.fleet, profile)

    def insert_intent(self, label: str, choice: Choice, host_key: str, now: datetime) -> None:
        with self._t(f"writing the create intent of {label}"):
            insert_intent(self.conn, self.fleet, label, choice, host_key, now)

    def transition(self, move: Move, now: datetime) -> None:
        with self._t(f"moving {move.label} to {move.state.value}"):
            transition(
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
            adopt(self.conn, self.fleet, step, now)

    def note_error(self, label: str, error: str, *, delete: bool = False) -> None:
        with self._t(f"noting an error of {label}"):
            note_error(self.conn, label, error, fleet=self.fleet, delete=delete)

    def update_address(self, step: UpdateAddress) -> None:
        with self._t(f"updating the address of {step.label}"):
            update_address(self.conn, step.label, step.main_ip, step.internal_ip, fleet=self.fleet)

    def mark_workers_draining(self, labels: Iterable[str]) -> None:
        with self._t("marking workers draining"):
            mark_workers_draining(self.conn, list(labels))

    def mark_draining(self, label: str, now: datetime) -> None:
        with self._t(f"marking {label} draining"):
            mark_draining(self.conn, label, now, fleet=self.fleet)

    def revive(self, label: str, now: datetime) -> None:
        with self._t(f"reviving {label}"):
            revive(self.conn, label, now, fleet=self.fleet)

    def start_refused(self, label: str, now: datetime, error: str) -> None:
        with self._t(f"marking {label} never to be revived"):
            start_refused(self.conn, label, now, error, fleet=self.fleet)

    def save_fleet_state(self, now: datetime, **kw: Any) -> None:
        with self._t("saving the fleet state"):
            save_fleet_state(self.conn, self.fleet, now, **kw)

    def record_event(self, event: PassEvent) -> int:
        with self._t("recording the pass"):
            # A pass cut short (Ctrl-C) inside its read left that read-only transaction open,
            # and its row was refused as a write in it: the row goes in outside it.
            if self.conn.info.transaction_status in _IN_TRANSACTION:
                self.conn.rollback()
            return record_event(self.conn, fleet=self.fleet, **event)


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
                release_pass_lock(conn)  # its locks, and its application_name back
            except psycopg.Error:
                clean = False
        if self.keep and clean:
            self._kept = conn
            return
        conn.close()
