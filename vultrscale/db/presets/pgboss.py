"""The ``pg-boss`` preset: pg-boss 12.19 to 12.38 (Node; schema versions 31 to 46), schema
``pgboss`` (its default), read from the ``job`` table (partitioned by queue name) and the
``queue`` table its migrations create.

    ready           ``state`` ``created`` or ``retry``, ``start_after <= now()``, not
                    ``blocked`` (waiting on a job it depends on)
    in_flight       ``state='active'`` within its ``expire_seconds`` of ``started_on``, and, for
                    a job with a heartbeat (``heartbeat_seconds``), within that of its last beat
    expired_leases  ``active`` jobs past either: pg-boss's supervisor fails them, to ``retry``
                    while attempts remain (they run again: demand)
    oldest_ready    ``now() - min(start_after)`` over the ready jobs (a retry moves it)
    per worker      not told: a job row does not name the worker that holds it
    recent          the newest ``completed``/``failed`` jobs within the window by
                    ``completed_on`` (index ``job_common_i16`` per queue), run time
                    ``completed_on - started_on``
    arrivals        jobs ``created_on`` within the window (index ``job_common_i15`` per queue)
    queue filter    ``queue.queue`` matches the queue ``name``

The history indexes lead with the queue's name, so the history queries go queue by queue
(``pgboss.queue``), each an index range. pg-boss deletes finished jobs after their
``deletion_seconds`` (7 days by default): the forecast sees at most that much history.
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

SCHEMA = "pgboss"


def read(queue: str | None, cfg: QueueConfig, stale: timedelta | None) -> Read:
    q = and_queue("name", queue)
    ready = sql.SQL(
        "SELECT count(*), EXTRACT(EPOCH FROM now() - min(start_after))::float8 FROM pgboss.job "
        "WHERE state IN ('created', 'retry') AND blocked = false AND start_after <= now(){}"
    ).format(q)
    active = sql.SQL(
        """
        SELECT count(*) FILTER (WHERE lost IS NOT TRUE), count(*) FILTER (WHERE lost) FROM (
            SELECT started_on + expire_seconds * interval '1 second' < now()
                   OR (heartbeat_seconds IS NOT NULL
                       AND heartbeat_on + heartbeat_seconds * interval '1 second' < now())
                   AS lost
              FROM pgboss.job WHERE state = 'active'{q}) a
        """
    ).format(q=q)
    finished = sql.SQL(
        """
        SELECT count(*), avg(EXTRACT(EPOCH FROM r.completed_on - r.started_on))::float8 FROM (
            SELECT r.completed_on, r.started_on FROM pgboss.queue qu
            CROSS JOIN LATERAL (
                SELECT j.completed_on, j.started_on FROM pgboss.job j
                 WHERE j.name = qu.name AND j.completed_on IS NOT NULL
                   AND j.completed_on >= now() - {window}
                   AND j.state IN ('completed', 'failed') AND j.started_on IS NOT NULL
                 ORDER BY j.completed_on DESC LIMIT {jobs}) r
             WHERE TRUE{qu}
             ORDER BY r.completed_on DESC LIMIT {jobs}
        ) r
        """
    ).format(
        window=sql.Literal(waits.RECENT_WINDOW),
        jobs=sql.Literal(waits.RECENT_JOBS),
        qu=and_queue("qu.name", queue),
    )
    arrivals = sql.SQL(
        """
        SELECT count(*) FROM pgboss.queue qu
        CROSS JOIN LATERAL (
            SELECT 1 FROM pgboss.job j
             WHERE j.name = qu.name AND j.created_on > now() - {window}
               AND j.created_on <= now()) a
         WHERE TRUE{qu}
        """
    ).format(window=sql.Literal(waits.ARRIVAL_WINDOW), qu=and_queue("qu.name", queue))
    return Read(tuple(Statement(s) for s in (ready, active, finished, arrivals)), _signals)


def _signals(answers: Sequence[Rows]) -> Signals:
    ready_rows, active, finished, arrived = answers
    n, age = one_row(ready_rows, "ready jobs (pgboss.job)")
    ready = count(n, "ready jobs (pgboss.job)")
    live, lost = one_row(active, "active jobs (pgboss.job)")
    jobs, mean = recent(finished, "recent finished jobs (pgboss.job)")
    return Signals(
        ready=ready,
        in_flight=count(live, "active jobs (pgboss.job)"),
        expired_leases=count(lost, "expired jobs (pgboss.job)"),
        oldest_ready_seconds=oldest(age, ready, "oldest ready job (pg-boss)"),
        leases_by_worker={},
        recent_jobs=jobs,
        recent_job_seconds=mean,
        recent_arrivals=count(one_row(arrived, "recent arrivals")[0], "recent arrivals"),
    )


# --- history -----------------------------------------------------------------------------------

# Jobs created in the window, queue by queue (the created_on index leads with the name).
_IN_WINDOW = """
SELECT j.id, greatest(j.created_on, j.start_after) AS due, j.started_on, j.completed_on,
       j.state IN ('completed', 'failed') AND j.completed_on IS NOT NULL AS done
FROM pgboss.queue qu
CROSS JOIN LATERAL (
    SELECT id, created_on, start_after, started_on, completed_on, state FROM pgboss.job j
     WHERE j.name = qu.name AND j.created_on >= %(since)s
       AND (%(until)s::timestamptz IS NULL OR j.created_on < %(until)s)) j
WHERE (%(queue)s::text IS NULL OR qu.name = %(queue)s)
"""


def _finished(
    conn: psycopg.Connection[Any], since: timedelta, queue: str | None, limit: int
) -> list[FinishedJob]:
    row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    rows = conn.execute(
        f"SELECT due, started_on, completed_on FROM ({_IN_WINDOW}) p "
        "WHERE done ORDER BY due, id LIMIT %(limit)s",
        {"since": row[0] - since, "until": None, "queue": queue, "limit": limit},
    ).fetchall()
    return [(due, started, fin) for due, started, fin in rows]


def _buckets(
    conn: psycopg.Connection[Any],
    since: datetime,
    until: datetime,
    width: timedelta,
    queue: str | None,
) -> list[Bucket]:
    return binned(
        conn,
        _IN_WINDOW,
        "done AND started_on IS NOT NULL",
        run_seconds="extract(epoch FROM completed_on - started_on)",
        since=since,
        until=until,
        width=width,
        queue=queue,
    )


PRESET = Preset(
    name="pg-boss",
    library="pg-boss",
    versions="12.19 to 12.38, schema pgboss, schema versions 31 to 46",
    tables={
        "pgboss.job": (
            "id",
            "name",
            "state",
            "start_after",
            "blocked",
            "created_on",
            "started_on",
            "completed_on",
            "expire_seconds",
            "heartbeat_on",
            "heartbeat_seconds",
        ),
        "pgboss.queue": ("name",),
    },
    read=read,
    history=History(_finished, _buckets),
    version_sql="SELECT 'schema version ' || version FROM pgboss.version",
    meaning={
        "ready": "state 'created'/'retry', start_after due, not blocked",
        "in flight": "state 'active' within expire_seconds (and its heartbeat)",
        "expired": "'active' past either (the supervisor retries them)",
        "finished": "completed_on - started_on of the newest 'completed'/'failed'",
        "arrivals": "jobs created_on within the window",
    },
)
