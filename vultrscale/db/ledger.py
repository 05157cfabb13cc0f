"""The scaler's own tables: the fleet ledger, the pass lock, the fleet state and the events
(their statements; ``db.store`` adapts them to the pass's ports).

Times written here come from the caller's clock (so a pass is testable with a fake clock);
lease liveness is always judged by the database's ``now()`` in the signals query.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import dict_row

from vultrscale.core import boottime
from vultrscale.core.model import (
    STATE_STAMPS,
    FleetState,
    InstanceState,
    LedgerRow,
    StoredReads,
    WorkerView,
    posts_intent,
    retired_label,
)
from vultrscale.db import plan_checks
from vultrscale.db.locks import lock_key as lock_key  # re-exported: the pass lock's key
from vultrscale.db.rows import COLUMNS as _COLUMNS
from vultrscale.db.rows import ledger_rows
from vultrscale.errors import DatabaseError
from vultrscale.rules.lifecycle import LabelHolder, adoption

if TYPE_CHECKING:
    from vultrscale.config import QueueConfig
    from vultrscale.core.forecast import Profile
    from vultrscale.rules.decision import Adopt
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
