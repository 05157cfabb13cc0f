"""The queue signals the scaler reads, for our own queue and for three foreign ones (presets).

``read_signals`` runs every query of a preset in ONE read-only REPEATABLE READ transaction, so the
numbers come from one snapshot and one ``now()`` (the database clock; no client clock is used).

What each number means, per preset (README "Queue signals and presets"):

``vultrscale`` (our schema)
    ready           jobs ``state='ready'`` and due (``run_at <= now()``)
    in_flight       leases with ``expires_at > now()``
    expired_leases  leases with ``expires_at <= now()`` that no reaper has removed yet: those
                    jobs will run again, so they are demand
    oldest_ready    ``now() - min(run_at)`` over the ready, due jobs
    per worker      live leases grouped by ``job_leases.worker_id``

``procrastinate`` (Procrastinate >= 3.1: ``procrastinate_jobs``, ``procrastinate_workers``)
    ready           ``status='todo'`` and ``scheduled_at`` NULL or due
    in_flight       ``status='doing'`` jobs whose worker row has a heartbeat newer than
                    ``stale_after`` (default 30 s: Procrastinate's own ``stalled_worker_timeout``
                    and the default of ``JobManager.get_stalled_jobs``)
    expired_leases  ``status='doing'`` jobs whose worker is stale, pruned (``worker_id`` NULL) or
                    missing: exactly what ``get_stalled_jobs()`` returns. Procrastinate does not
                    requeue them by itself; count them as demand only if you run the documented
                    ``retry_stalled_jobs`` periodic task (otherwise they are stuck forever)
    oldest_ready    the job row has no enqueue time: "ready since" is ``scheduled_at`` when set,
                    else the job's latest ``deferred``/``deferred_for_retry``/``retried`` event.
                    Unscheduled jobs are looked at in id order, the first 1000 only (ids grow
                    with deferral time), so the query stays cheap with a deep backlog
    per worker      live ``doing`` jobs by ``procrastinate_workers.id``
    queue filter    ``queue_name``
    Not modelled: ``todo`` jobs waiting behind a ``lock`` held by a ``doing`` job count as ready,
    although one worker at a time runs them.

``pgqueuer`` (PgQueuer >= 1.0, default table names: ``pgqueuer``)
    ready           ``status='queued'`` and ``execute_after <= now()``
    in_flight       ``status='picked'`` with ``heartbeat >= now() - stale_after`` (default 30 s,
                    PgQueuer's default ``heartbeat_timeout``)
    expired_leases  ``status='picked'`` with an older heartbeat: PgQueuer's dequeue re-picks them,
                    so they are demand
    oldest_ready    ``now() - min(execute_after)`` over the ready jobs (``created`` would
                    overstate retried jobs)
    per worker      live picked jobs by ``queue_manager_id``
    queue filter    PgQueuer has no queue name; ``queue.queue`` matches the ``entrypoint``
    Finished jobs leave the ``pgqueuer`` table; ``failed`` rows held there are terminal.

``custom``
    ``ready_sql``, ``in_flight_sql`` and ``oldest_ready_seconds_sql`` each return one number
    (one row, one column, not NULL). ``%(queue)s`` in them is bound to ``queue.queue`` (NULL when
    empty); a query that uses it must write a literal ``%`` as ``%%``. No per-worker leases,
    ``expired_leases`` 0.

"No data" is never read as zero: a failing query, a missing row or a NULL raises
``DatabaseError``; the scaler then holds the fleet.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, LiteralString, cast

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql

from vultrscale import waits
from vultrscale.config import PRESETS, QueueConfig
from vultrscale.db import pg
from vultrscale.errors import ConfigError, DatabaseError
from vultrscale.model import Signals
from vultrscale.redaction import first_line

#: Liveness window of the foreign presets: the libraries' own defaults.
PROCRASTINATE_STALE_AFTER = timedelta(seconds=30)
PGQUEUER_STALE_AFTER = timedelta(seconds=30)
#: How many of the oldest unscheduled Procrastinate jobs the oldest-age query looks at.
PROCRASTINATE_OLDEST_SCAN = 1000
#: A signal read that takes longer than this is cancelled (and raises): the scaler holds.
STATEMENT_TIMEOUT_MS = 10_000

_TABLE_HINTS = {
    "vultrscale": "Run `vultrscale db init`, or set queue.preset to the queue you use.",
    "procrastinate": "Is queue.preset right? The procrastinate preset needs Procrastinate >= 3.1 "
    "tables (procrastinate_jobs, procrastinate_workers) in this database.",
    "pgqueuer": "Is queue.preset right? The pgqueuer preset needs PgQueuer >= 1.0 installed "
    "(`pgq install`) with the default table names in this database.",
    "custom": "Check queue.ready_sql, queue.in_flight_sql and queue.oldest_ready_seconds_sql.",
}


def read_signals(
    conn_or_url: psycopg.Connection[Any] | str,
    queue_cfg: QueueConfig,
    *,
    stale_after: timedelta | None = None,
) -> Signals:
    """Read ready, in-flight, expired, oldest-ready age and leases per worker in one snapshot.

    ``conn_or_url`` is a database URL (a connection is opened and closed here) or an open
    connection with no transaction in progress. ``stale_after`` overrides the liveness window
    of the procrastinate and pgqueuer presets. Raises DatabaseError (never returns a guess) and
    ConfigError for an unknown preset or a custom preset without its SQL.
    """
    preset = queue_cfg.preset
    if preset not in PRESETS:
        raise ConfigError(
            [f"queue.preset: unknown preset {preset!r} (one of {', '.join(PRESETS)})"]
        )
    if preset == "custom":
        missing = [
            f"queue.{key}: required by preset 'custom'"
            for key in ("ready_sql", "in_flight_sql", "oldest_ready_seconds_sql")
            if not getattr(queue_cfg, key).strip()
        ]
        if missing:
            raise ConfigError(missing)
    reader = _READERS[preset]
    queue = queue_cfg.queue or None
    with _connection(conn_or_url) as conn, _translated(conn_or_url, preset):
        if conn.closed:
            raise DatabaseError(
                "read_signals got a closed connection", hint="Reconnect, or pass a database URL."
            )
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            raise DatabaseError(
                "read_signals needs a connection with no transaction in progress",
                hint="Commit or roll back first, or pass a database URL.",
            )
        with conn.transaction(), conn.cursor() as cur:
            # SET TRANSACTION must be the first statement of the transaction. Both in one
            # round trip: on a busy database server every round trip waits its turn.
            cur.execute(
                sql.SQL(
                    "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY; "
                    "SET LOCAL statement_timeout = {}"
                ).format(sql.Literal(STATEMENT_TIMEOUT_MS))
            )
            return reader(cur, queue, queue_cfg, stale_after)


# --- connection and error translation ----------------------------------------------------------


@contextmanager
def _connection(conn_or_url: psycopg.Connection[Any] | str) -> Iterator[psycopg.Connection[Any]]:
    if not isinstance(conn_or_url, str):
        yield conn_or_url
        return
    conn = pg.connect(conn_or_url)
    try:
        yield conn
    finally:
        conn.close()


@contextmanager
def _translated(conn_or_url: psycopg.Connection[Any] | str, preset: str) -> Iterator[None]:
    """Turn psycopg errors into DatabaseError with a hint, password removed."""
    url = conn_or_url if isinstance(conn_or_url, str) else ""
    try:
        yield
    except pg_errors.UndefinedTable as exc:
        raise DatabaseError(
            f"reading queue signals (preset {preset}): {_primary(exc, url)}",
            hint=_TABLE_HINTS[preset],
        ) from exc
    except (
        pg_errors.UndefinedColumn,
        pg_errors.UndefinedObject,
        pg_errors.UndefinedFunction,
    ) as exc:
        raise DatabaseError(
            f"reading queue signals (preset {preset}): {_primary(exc, url)}",
            hint=_TABLE_HINTS[preset] + " The tables exist but not in the expected version.",
        ) from exc
    except pg_errors.QueryCanceled as exc:
        raise DatabaseError(
            f"reading queue signals (preset {preset}) took longer than "
            f"{STATEMENT_TIMEOUT_MS / 1000:g} s and was cancelled",
            hint="Check the queue table's indexes and bloat (VACUUM), or the database load.",
        ) from exc
    except psycopg.Error as exc:
        raise DatabaseError(
            f"reading queue signals (preset {preset}): {_primary(exc, url)}",
            hint=pg.HINT_UNREACHABLE
            if isinstance(exc, psycopg.OperationalError)
            else _TABLE_HINTS[preset],
        ) from exc


def _primary(exc: psycopg.Error, url: str) -> str:
    diag = getattr(exc, "diag", None)
    return first_line((diag.message_primary if diag is not None else None) or exc, [url])


# --- helpers ---------------------------------------------------------------------------------


def _one_number(cur: psycopg.Cursor[Any], what: str) -> float:
    """The single value of the last query; missing row, NULL or non-number raises."""
    rows = cur.fetchall()
    if len(rows) != 1 or len(rows[0]) != 1:
        raise DatabaseError(
            f"{what}: expected one row with one column, got {len(rows)} row(s)",
            hint="Each signal query must return exactly one number.",
        )
    value = rows[0][0]
    if value is None:
        raise DatabaseError(
            f"{what}: the query returned NULL (no data is not zero)",
            hint="Wrap aggregates in COALESCE(..., 0) only where zero is the true answer.",
        )
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise DatabaseError(
            f"{what}: expected a number, got a {type(value).__name__}",
            hint="Each signal query must return exactly one number.",
        ) from None
    if not math.isfinite(number) or number < 0:  # NaN, infinity: no count, no age
        raise DatabaseError(f"{what}: got {number}, expected a finite number >= 0")
    return number


def _count(cur: psycopg.Cursor[Any], what: str) -> int:
    return int(_one_number(cur, what))


def _oldest(row: tuple[Any, ...] | None, ready: int, what: str) -> float:
    """Oldest ready age from a query's one row: 0 when nothing is ready; NULL while jobs are
    ready is an error."""
    value = row[0] if row else None
    if value is None:
        if ready == 0:
            return 0.0
        raise DatabaseError(
            f"{what}: no age found although {ready} job(s) are ready",
            hint="The queue tables look inconsistent; check them by hand.",
        )
    return max(0.0, float(value))


def _and_queue(column: LiteralString, queue: str | None) -> sql.Composable:
    if queue is None:
        return sql.SQL("")
    return sql.SQL(" AND {} = {}").format(sql.SQL(column), sql.Literal(queue))


# --- presets ---------------------------------------------------------------------------------


#: The vultrscale preset counts its ready jobs with a bitmap scan. An index scan of a partial
#: ready index visits the heap once per row while the rows are not yet all-visible (fresh,
#: unvacuumed ready jobs: the usual case for a backlog), about 20,000 buffer visits for 20k
#: rows; a bitmap scan visits each heap page once (about 250), twice as fast, vacuumed or not.
#: The planner, trusting the visibility map of a mostly finished table, picks the index scan
#: unless told. Transaction-local, so it runs last: the lease query wants its index scans.
_COUNT_PLANNER = (
    "SELECT set_config('enable_indexscan', 'off', true),"
    " set_config('enable_indexonlyscan', 'off', true)"
)


def _ready_count_query(queue: str | None) -> sql.Composed:
    """The ready jobs' count and the oldest one's age in seconds, in one scan: the bitmap scan
    visits every ready row anyway, so the age costs nothing more."""
    # Positive equality on state, as in the partial indexes' predicates (jobs_ready_*).
    return sql.SQL(
        "SELECT count(*), EXTRACT(EPOCH FROM now() - min(run_at))::float8 FROM jobs "
        "WHERE state = 'ready' AND run_at <= now(){}"
    ).format(_and_queue("queue", queue))


def explain_ready_count(conn: psycopg.Connection[Any], queue_cfg: QueueConfig) -> list[str]:
    """The plan (EXPLAIN, not run) of the vultrscale preset's ready count as read_signals runs
    it: which index serves it. ``conn`` must have no transaction in progress."""
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(_COUNT_PLANNER)
        cur.execute(sql.SQL("EXPLAIN ") + _ready_count_query(queue_cfg.queue or None))
        return [str(row[0]) for row in cur.fetchall()]


def _recent_query(queue: str | None) -> sql.Composed:
    """How many of the newest finished jobs (``waits.RECENT_JOBS`` within
    ``waits.RECENT_WINDOW``) and their mean run time: a backward scan of jobs_finished_at_idx
    that stops at the limit. Before the planner settings: it wants that index scan."""
    return sql.SQL(
        "SELECT count(*), avg(EXTRACT(EPOCH FROM finished_at - started_at))::float8 FROM ("
        "SELECT finished_at, started_at FROM jobs WHERE finished_at IS NOT NULL "
        "AND finished_at >= now() - {window} AND started_at IS NOT NULL{q} "
        "ORDER BY finished_at DESC LIMIT {limit}) r"
    ).format(
        window=sql.Literal(waits.RECENT_WINDOW),
        q=_and_queue("queue", queue),
        limit=sql.Literal(waits.RECENT_JOBS),
    )


def _arrivals_query(queue: str | None) -> sql.Composed:
    """How many jobs were enqueued within ``waits.ARRIVAL_WINDOW``: the recent arrival rate of
    the wait rule. jobs_created_at_brin narrows it to the newest pages of the table."""
    return sql.SQL(
        "SELECT count(*) FROM jobs WHERE created_at > now() - {window} "
        "AND created_at <= now(){q}"
    ).format(window=sql.Literal(waits.ARRIVAL_WINDOW), q=_and_queue("queue", queue))


def _leases_query(queue: str | None) -> sql.Composed:
    """Live and expired leases per worker (of the queue's jobs, with a queue)."""
    leases: sql.Composable
    if queue is None:
        leases = sql.SQL("FROM job_leases l")
    else:
        leases = sql.SQL("FROM job_leases l JOIN jobs j ON j.id = l.job_id WHERE TRUE{}").format(
            _and_queue("j.queue", queue)
        )
    return sql.SQL(
        "SELECT l.worker_id, count(*) FILTER (WHERE l.expires_at > now()), "
        "count(*) FILTER (WHERE l.expires_at <= now()) {} GROUP BY l.worker_id"
    ).format(leases)


def _vultrscale(
    cur: psycopg.Cursor[Any], queue: str | None, cfg: QueueConfig, stale: timedelta | None
) -> Signals:
    # The leases (live and expired, per worker), the planner setting and the ready jobs in one
    # round trip: literals only, so the statements go together as one simple query.
    cur.execute(
        sql.SQL("{}; {}; {}; {}; {}").format(
            _leases_query(queue),
            _recent_query(queue),
            _arrivals_query(queue),
            sql.SQL(_COUNT_PLANNER),
            _ready_count_query(queue),
        )
    )
    leases = cur.fetchall()
    cur.nextset()  # the recent finished jobs
    recent = cur.fetchone()
    cur.nextset()  # the recent arrivals
    arrived = cur.fetchone()
    cur.nextset()  # the planner settings
    cur.nextset()  # the ready jobs
    return _vultrscale_signals(leases, cur.fetchone(), recent, arrived)


def _vultrscale_signals(
    leases: list[Any],
    counted: tuple[Any, ...] | None,
    recent: tuple[Any, ...] | None = None,
    arrived: tuple[Any, ...] | None = None,
) -> Signals:
    by_worker: dict[str, int] = {}
    expired = 0
    for worker, live, gone in leases:
        if live:
            by_worker[str(worker)] = int(live)
        expired += int(gone)
    if counted is None or counted[0] is None:
        raise DatabaseError(
            "ready jobs: the count returned no row (no data is not zero)",
            hint="The queue tables look inconsistent; check them by hand.",
        )
    ready = int(counted[0])
    oldest = _oldest(counted[1:], ready, "oldest ready job")
    return Signals(
        ready=ready,
        in_flight=sum(by_worker.values()),
        expired_leases=expired,
        oldest_ready_seconds=oldest,
        leases_by_worker=by_worker,
        recent_jobs=None if recent is None else int(recent[0]),
        recent_job_seconds=None if recent is None or recent[1] is None else float(recent[1]),
        recent_arrivals=None if arrived is None or arrived[0] is None else int(arrived[0]),
    )


class SentSignals:
    """The vultrscale preset's signal read, sent on a connection in pipeline mode and not yet
    answered (``send_signals``). ``answered``: its statements' answers are in, so an error of
    the pipeline is another statement's; ``result()`` reads them (DatabaseError as
    ``read_signals`` raises it)."""

    def __init__(self, conn: psycopg.Connection[Any], queue_cfg: QueueConfig) -> None:
        queue = queue_cfg.queue or None
        self.preset = queue_cfg.preset
        # One read-only REPEATABLE READ transaction, as read_signals runs it: BEGIN and COMMIT
        # as statements, since psycopg's transaction() in a pipeline syncs (a round trip) on
        # entry and exit. Each statement alone: a pipeline takes no multi-statement string.
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        conn.execute(
            sql.SQL("SET LOCAL statement_timeout = {}").format(sql.Literal(STATEMENT_TIMEOUT_MS))
        )
        self._leases = conn.execute(_leases_query(queue))
        self._recent = conn.execute(_recent_query(queue))
        self._arrived = conn.execute(_arrivals_query(queue))
        conn.execute(_COUNT_PLANNER)
        self._ready = conn.execute(_ready_count_query(queue))
        self._commit = conn.execute("COMMIT")

    @property
    def answered(self) -> bool:
        done = self._commit.pgresult
        return done is not None and done.status == psycopg.pq.ExecStatus.COMMAND_OK

    def result(self) -> Signals:
        with _translated("", self.preset):
            return _vultrscale_signals(
                self._leases.fetchall(),
                self._ready.fetchone(),
                self._recent.fetchone(),
                self._arrived.fetchone(),
            )

    def error(self, exc: psycopg.Error) -> DatabaseError:
        """``exc``, raised by the pipeline before this read was answered, as read_signals would
        have raised it."""
        try:
            with _translated("", self.preset):
                raise exc
        except DatabaseError as translated:
            return translated
        raise AssertionError("unreachable: _translated turns every psycopg.Error")


def send_signals(conn: psycopg.Connection[Any], queue_cfg: QueueConfig) -> SentSignals | None:
    """Send the signal read on ``conn``, which is in pipeline mode with no transaction in
    progress, to be answered with the other statements of the pipeline (one round trip). Only
    the vultrscale preset: the others run statements that depend on earlier answers, so None
    (read them with ``read_signals``)."""
    if queue_cfg.preset != "vultrscale":
        return None
    return SentSignals(conn, queue_cfg)


def _procrastinate(
    cur: psycopg.Cursor[Any], queue: str | None, cfg: QueueConfig, stale: timedelta | None
) -> Signals:
    window = stale if stale is not None else PROCRASTINATE_STALE_AFTER
    q = _and_queue("queue_name", queue)
    cur.execute(
        sql.SQL(
            "SELECT count(*) FROM procrastinate_jobs WHERE status = 'todo' "
            "AND (scheduled_at IS NULL OR scheduled_at <= now()){}"
        ).format(q)
    )
    ready = _count(cur, "ready jobs (procrastinate_jobs todo)")
    cur.execute(
        sql.SQL(
            """
            SELECT EXTRACT(EPOCH FROM now() - min(since))::float8 FROM (
                SELECT scheduled_at AS since FROM procrastinate_jobs
                 WHERE status = 'todo' AND scheduled_at <= now(){q}
                UNION ALL
                SELECT (SELECT max(e.at) FROM procrastinate_events e
                         WHERE e.job_id = u.id
                           AND e.type::text IN ('deferred', 'deferred_for_retry', 'retried'))
                  FROM (SELECT id FROM procrastinate_jobs
                         WHERE status = 'todo' AND scheduled_at IS NULL{q}
                         ORDER BY id LIMIT {scan}) u
            ) s
            """
        ).format(q=q, scan=sql.Literal(PROCRASTINATE_OLDEST_SCAN))
    )
    oldest = _oldest(cur.fetchone(), ready, "oldest ready job (procrastinate)")
    # 'doing' jobs of a worker with a fresh heartbeat are in flight; of a stale, pruned or
    # missing worker they are stalled (what JobManager.get_stalled_jobs() returns).
    cur.execute(
        sql.SQL(
            """
            SELECT w.id, count(*) FROM procrastinate_jobs j
              LEFT JOIN procrastinate_workers w
                ON w.id = j.worker_id AND w.last_heartbeat >= now() - {window}
             WHERE j.status = 'doing'{q}
             GROUP BY w.id
            """
        ).format(q=_and_queue("j.queue_name", queue), window=sql.Literal(window))
    )
    by_worker: dict[str, int] = {}
    stalled = 0
    for worker_id, n in cur.fetchall():
        if worker_id is None:
            stalled += int(n)
        else:
            by_worker[str(worker_id)] = int(n)
    return Signals(
        ready=ready,
        in_flight=sum(by_worker.values()),
        expired_leases=stalled,
        oldest_ready_seconds=oldest,
        leases_by_worker=by_worker,
    )


def _pgqueuer(
    cur: psycopg.Cursor[Any], queue: str | None, cfg: QueueConfig, stale: timedelta | None
) -> Signals:
    window = stale if stale is not None else PGQUEUER_STALE_AFTER
    q = _and_queue("entrypoint", queue)
    cur.execute(
        sql.SQL(
            "SELECT count(*), EXTRACT(EPOCH FROM now() - min(execute_after))::float8 "
            "FROM pgqueuer WHERE status = 'queued' AND execute_after <= now(){}"
        ).format(q)
    )
    row = cur.fetchone()
    if row is None or row[0] is None:
        raise DatabaseError("ready jobs (pgqueuer): the count returned no row")
    ready = int(row[0])
    if row[1] is None and ready > 0:
        raise DatabaseError(f"oldest ready job (pgqueuer): no age although {ready} are ready")
    oldest = max(0.0, float(row[1])) if row[1] is not None else 0.0
    cur.execute(
        sql.SQL(
            """
            SELECT queue_manager_id::text, heartbeat >= now() - {window} AS live, count(*)
              FROM pgqueuer WHERE status = 'picked'{q}
             GROUP BY 1, 2
            """
        ).format(q=q, window=sql.Literal(window))
    )
    by_worker: dict[str, int] = {}
    stale_picked = 0
    for manager, live, n in cur.fetchall():
        if live and manager is not None:
            by_worker[manager] = by_worker.get(manager, 0) + int(n)
        else:
            stale_picked += int(n)
    return Signals(
        ready=ready,
        in_flight=sum(by_worker.values()),
        expired_leases=stale_picked,
        oldest_ready_seconds=oldest,
        leases_by_worker=by_worker,
    )


def _custom(
    cur: psycopg.Cursor[Any], queue: str | None, cfg: QueueConfig, stale: timedelta | None
) -> Signals:
    def run(key: str) -> float:
        text = cast(LiteralString, getattr(cfg, key))
        # Always the extended protocol (binary results ask for it, parameters or not): it runs
        # exactly one statement, so no "...; COMMIT; DELETE ..." can leave the read-only
        # transaction. The simple protocol runs every statement of the string.
        if "%(queue)s" in text:
            cur.execute(text, {"queue": queue}, binary=True)
        else:
            cur.execute(text, binary=True)
        return _one_number(cur, f"queue.{key}")

    return Signals(
        ready=int(run("ready_sql")),
        in_flight=int(run("in_flight_sql")),
        expired_leases=0,
        oldest_ready_seconds=run("oldest_ready_seconds_sql"),
        leases_by_worker={},
    )


_Reader = Callable[[psycopg.Cursor[Any], "str | None", QueueConfig, "timedelta | None"], Signals]
_READERS: dict[str, _Reader] = {
    "vultrscale": _vultrscale,
    "procrastinate": _procrastinate,
    "pgqueuer": _pgqueuer,
    "custom": _custom,
}
