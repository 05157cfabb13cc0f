"""The ``pgqueuer`` preset: PgQueuer 1.0 and later, default table names (``pgqueuer``,
``pgqueuer_log``), as ``pgq install`` creates them.

    ready           ``status='queued'`` and ``execute_after <= now()``
    in_flight       ``status='picked'`` with ``heartbeat >= now() - stale_after`` (default 30 s,
                    PgQueuer's default ``heartbeat_timeout``)
    expired_leases  ``status='picked'`` with an older heartbeat: PgQueuer's dequeue re-picks them,
                    so they are demand
    oldest_ready    ``now() - min(execute_after)`` over the ready jobs (``created`` would
                    overstate retried jobs)
    per worker      live picked jobs by ``queue_manager_id``
    recent          finished jobs leave ``pgqueuer`` for ``pgqueuer_log``: the newest
                    ``successful``/``exception``/``failed`` log rows within the window, run time
                    from the job's last ``picked`` row (PgQueuer writes the terminal row when it
                    flushes its status buffer, a fraction of a second late)
    arrivals        ``queued`` log rows within the window (a retry logs one too: work arriving)
    queue filter    PgQueuer has no queue name; ``queue.queue`` matches the ``entrypoint``
    Finished jobs leave the ``pgqueuer`` table; ``failed`` rows held there are terminal.

The log's index on ``created`` serves the history: the newest finished rows are looked for
among the newest ``RECENT_SCAN`` log rows of the window (a backward scan of it that stops at
``waits.RECENT_JOBS`` finished ones), the arrivals are an index range of the window.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql

from vultrscale.config import QueueConfig
from vultrscale.core.forecast import Bucket
from vultrscale.core.model import Signals
from vultrscale.db.presets.base import (
    FinishedJob,
    History,
    Preset,
    Read,
    Rows,
    Statement,
    and_queue,
    binned,
    count,
    oldest,
    one_row,
    recent,
)
from vultrscale.rules import waits

#: Liveness window: the library's own default ``heartbeat_timeout``.
STALE_AFTER = timedelta(seconds=30)
#: How many of the window's newest log rows the recent finished jobs are looked for in.
RECENT_SCAN = 100_000


def read(queue: str | None, cfg: QueueConfig, stale: timedelta | None) -> Read:
    window = stale if stale is not None else STALE_AFTER
    q = and_queue("entrypoint", queue)
    ready = sql.SQL(
        "SELECT count(*), EXTRACT(EPOCH FROM now() - min(execute_after))::float8 "
        "FROM pgqueuer WHERE status = 'queued' AND execute_after <= now(){}"
    ).format(q)
    picked = sql.SQL(
        """
        SELECT queue_manager_id::text, heartbeat >= now() - {window} AS live, count(*)
          FROM pgqueuer WHERE status = 'picked'{q}
         GROUP BY 1, 2
        """
    ).format(q=q, window=sql.Literal(window))
    finished = sql.SQL(
        """
        SELECT count(*), avg(EXTRACT(EPOCH FROM t.created - p.created))::float8 FROM (
            SELECT l.job_id, l.created FROM (
                SELECT job_id, status, entrypoint, created FROM pgqueuer_log
                 WHERE created >= now() - {window}
                 ORDER BY created DESC LIMIT {scan}) l
             WHERE l.status IN ('successful', 'exception', 'failed'){q}
             ORDER BY l.created DESC LIMIT {jobs}
        ) t
        CROSS JOIN LATERAL (
            SELECT p.created FROM pgqueuer_log p
             WHERE p.job_id = t.job_id AND p.status = 'picked' AND p.created <= t.created
             ORDER BY p.created DESC LIMIT 1) p
        """
    ).format(
        window=sql.Literal(waits.RECENT_WINDOW),
        scan=sql.Literal(RECENT_SCAN),
        q=and_queue("l.entrypoint", queue),
        jobs=sql.Literal(waits.RECENT_JOBS),
    )
    arrivals = sql.SQL(
        "SELECT count(*) FROM pgqueuer_log WHERE created > now() - {window} "
        "AND created <= now() AND status = 'queued'{q}"
    ).format(window=sql.Literal(waits.ARRIVAL_WINDOW), q=q)
    return Read(tuple(Statement(s) for s in (ready, picked, finished, arrivals)), _signals)


def _signals(answers: Sequence[Rows]) -> Signals:
    ready_rows, picked, finished, arrived = answers
    n, age = one_row(ready_rows, "ready jobs (pgqueuer queued)")
    ready = count(n, "ready jobs (pgqueuer queued)")
    by_worker: dict[str, int] = {}
    stale_picked = 0
    for manager, live, k in picked:
        if live and manager is not None:
            by_worker[manager] = by_worker.get(manager, 0) + int(k)
        else:
            stale_picked += int(k)
    jobs, mean = recent(finished, "recent finished jobs (pgqueuer_log)")
    return Signals(
        ready=ready,
        in_flight=sum(by_worker.values()),
        expired_leases=stale_picked,
        oldest_ready_seconds=oldest(age, ready, "oldest ready job (pgqueuer)"),
        leases_by_worker=by_worker,
        recent_jobs=jobs,
        recent_job_seconds=mean,
        recent_arrivals=count(one_row(arrived, "recent arrivals")[0], "recent arrivals"),
    )


# --- history -----------------------------------------------------------------------------------

# Per job of the window, from its log rows: when it was last queued (the log keeps no
# execute_after: a job enqueued for later is due, here, when it was enqueued), last picked and
# finished. Jobs queued before the window (no 'queued' row in it) are left out.
_PER_JOB = """
SELECT job_id,
       max(created) FILTER (WHERE status = 'queued') AS due,
       max(created) FILTER (WHERE status = 'picked') AS started,
       max(created) FILTER (WHERE status IN ('successful', 'exception', 'failed')) AS finished
FROM pgqueuer_log
WHERE created >= %(since)s AND (%(until)s::timestamptz IS NULL OR created < %(until)s)
  AND (%(queue)s::text IS NULL OR entrypoint = %(queue)s)
GROUP BY job_id
"""


def _finished(
    conn: psycopg.Connection[Any], since: timedelta, queue: str | None, limit: int
) -> list[FinishedJob]:
    rows = conn.execute(
        f"SELECT due, started, finished FROM ({_PER_JOB}) p "
        "WHERE due IS NOT NULL AND finished IS NOT NULL ORDER BY due, job_id LIMIT %(limit)s",
        {
            "since": _now(conn) - since,
            "until": None,
            "queue": queue,
            "limit": limit,
        },
    ).fetchall()
    return [(due, started, fin) for due, started, fin in rows]


def _now(conn: psycopg.Connection[Any]) -> datetime:
    row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def _buckets(
    conn: psycopg.Connection[Any],
    since: datetime,
    until: datetime,
    width: timedelta,
    queue: str | None,
) -> list[Bucket]:
    return binned(
        conn,
        _PER_JOB,
        "finished IS NOT NULL AND started IS NOT NULL AND started <= finished",
        run_seconds="extract(epoch FROM finished - started)",
        since=since,
        until=until,
        width=width,
        queue=queue,
        where="due IS NOT NULL",
    )


PRESET = Preset(
    name="pgqueuer",
    library="PgQueuer",
    versions="1.0 to 1.6, default table names",
    tables={
        "pgqueuer": (
            "id",
            "entrypoint",
            "status",
            "execute_after",
            "heartbeat",
            "queue_manager_id",
        ),
        "pgqueuer_log": ("id", "job_id", "status", "entrypoint", "created"),
    },
    read=read,
    history=History(_finished, _buckets),
    meaning={
        "ready": "status 'queued', execute_after due",
        "in flight": "status 'picked', heartbeat within 30 s",
        "expired": "status 'picked', heartbeat older (PgQueuer picks them again)",
        "finished": "pgqueuer_log terminal rows, run time from the last 'picked' row",
        "arrivals": "pgqueuer_log 'queued' rows within the window",
    },
)
