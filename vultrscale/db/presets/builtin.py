"""The ``vultrscale`` preset: the built-in queue (``vultrscale db init``, ``vultrscale worker``).

ready           jobs ``state='ready'`` and due (``run_at <= now()``)
in_flight       leases with ``expires_at > now()``
expired_leases  leases with ``expires_at <= now()`` that no reaper has removed yet: those
                jobs will run again, so they are demand
oldest_ready    ``now() - min(run_at)`` over the ready, due jobs
per worker      live leases grouped by ``job_leases.worker_id``
recent          the ``waits.RECENT_JOBS`` newest jobs finished within ``waits.RECENT_WINDOW``
                (``finished_at - started_at``), from ``jobs_finished_at_idx``
arrivals        jobs created within ``waits.ARRIVAL_WINDOW`` (``jobs_created_at_brin``)
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql

from vultrscale.config import QueueConfig
from vultrscale.core import forecast
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
    count,
    oldest,
    one_row,
    recent,
)
from vultrscale.rules import waits

#: The ready count goes by a bitmap scan. An index scan of a partial ready index visits the
#: heap once per row while the rows are not yet all-visible (fresh, unvacuumed ready jobs: the
#: usual case for a backlog), about 20,000 buffer visits for 20k rows; a bitmap scan visits
#: each heap page once (about 250), twice as fast, vacuumed or not. The planner, trusting the
#: visibility map of a mostly finished table, picks the index scan unless told.
#: Transaction-local, so it runs last: the lease and history queries want their index scans.
COUNT_PLANNER = (
    "SELECT set_config('enable_indexscan', 'off', true),"
    " set_config('enable_indexonlyscan', 'off', true)"
)


def ready_count_query(queue: str | None) -> sql.Composed:
    """The ready jobs' count and the oldest one's age in seconds, in one scan: the bitmap scan
    visits every ready row anyway, so the age costs nothing more."""
    # Positive equality on state, as in the partial indexes' predicates (jobs_ready_*).
    return sql.SQL(
        "SELECT count(*), EXTRACT(EPOCH FROM now() - min(run_at))::float8 FROM jobs "
        "WHERE state = 'ready' AND run_at <= now(){}"
    ).format(and_queue("queue", queue))


def explain_ready_count(conn: psycopg.Connection[Any], queue_cfg: QueueConfig) -> list[str]:
    """The plan (EXPLAIN, not run) of the ready count as a signal read runs it: which index
    serves it. ``conn`` must have no transaction in progress."""
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(COUNT_PLANNER)
        cur.execute(sql.SQL("EXPLAIN ") + ready_count_query(queue_cfg.queue or None))
        return [str(row[0]) for row in cur.fetchall()]


def recent_query(queue: str | None) -> sql.Composed:
    """How many of the newest finished jobs (``waits.RECENT_JOBS`` within
    ``waits.RECENT_WINDOW``) and their mean run time: a backward scan of jobs_finished_at_idx
    that stops at the limit."""
    return sql.SQL(
        "SELECT count(*), avg(EXTRACT(EPOCH FROM finished_at - started_at))::float8 FROM ("
        "SELECT finished_at, started_at FROM jobs WHERE finished_at IS NOT NULL "
        "AND finished_at >= now() - {window} AND started_at IS NOT NULL{q} "
        "ORDER BY finished_at DESC LIMIT {limit}) r"
    ).format(
        window=sql.Literal(waits.RECENT_WINDOW),
        q=and_queue("queue", queue),
        limit=sql.Literal(waits.RECENT_JOBS),
    )


def arrivals_query(queue: str | None) -> sql.Composed:
    """How many jobs were enqueued within ``waits.ARRIVAL_WINDOW``: the recent arrival rate of
    the wait rule. jobs_created_at_brin narrows it to the newest pages of the table."""
    return sql.SQL(
        "SELECT count(*) FROM jobs WHERE created_at > now() - {window} AND created_at <= now(){q}"
    ).format(window=sql.Literal(waits.ARRIVAL_WINDOW), q=and_queue("queue", queue))


def leases_query(queue: str | None) -> sql.Composed:
    """Live and expired leases per worker (of the queue's jobs, with a queue)."""
    leases: sql.Composable
    if queue is None:
        leases = sql.SQL("FROM job_leases l")
    else:
        leases = sql.SQL("FROM job_leases l JOIN jobs j ON j.id = l.job_id WHERE TRUE{}").format(
            and_queue("j.queue", queue)
        )
    return sql.SQL(
        "SELECT l.worker_id, count(*) FILTER (WHERE l.expires_at > now()), "
        "count(*) FILTER (WHERE l.expires_at <= now()) {} GROUP BY l.worker_id"
    ).format(leases)


def read(queue: str | None, cfg: QueueConfig, stale: timedelta | None) -> Read:
    # Literals only: the statements go together, in the pass's pipeline or one of their own.
    return Read(
        (
            Statement(leases_query(queue)),
            Statement(recent_query(queue)),
            Statement(arrivals_query(queue)),
            Statement(COUNT_PLANNER),
            Statement(ready_count_query(queue)),
        ),
        _signals,
    )


def _signals(answers: Sequence[Rows]) -> Signals:
    leases, recent_rows, arrived, _planner, counted = answers
    by_worker: dict[str, int] = {}
    expired = 0
    for worker, live, gone in leases:
        if live:
            by_worker[str(worker)] = int(live)
        expired += int(gone)
    ready_n, age = one_row(counted, "ready jobs")
    ready = count(ready_n, "ready jobs")
    jobs, mean = recent(recent_rows, "recent finished jobs")
    return Signals(
        ready=ready,
        in_flight=sum(by_worker.values()),
        expired_leases=expired,
        oldest_ready_seconds=oldest(age, ready, "oldest ready job"),
        leases_by_worker=by_worker,
        recent_jobs=jobs,
        recent_job_seconds=mean,
        recent_arrivals=count(one_row(arrived, "recent arrivals")[0], "recent arrivals"),
    )


# --- history -----------------------------------------------------------------------------------

_FINISHED = """
SELECT greatest(created_at, run_at) AS due, started_at, finished_at
FROM jobs
WHERE finished_at IS NOT NULL
  AND state IN ('succeeded', 'failed', 'dead')
  AND created_at >= now() - %(since)s
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
ORDER BY due, id
LIMIT %(limit)s
"""


def _finished(
    conn: psycopg.Connection[Any], since: timedelta, queue: str | None, limit: int
) -> list[FinishedJob]:
    rows = conn.execute(_FINISHED, {"since": since, "queue": queue, "limit": limit}).fetchall()
    return [(due, started, fin) for due, started, fin in rows]


# The forecast's buckets: jobs created in [since, until) and due before until, by the bucket
# of their due time (date_bin from forecast.WEEK_ORIGIN, as forecast.buckets bins); a job's
# run time is its last attempt's (finished - started; rows from before schema v6 have no
# start and count as arrivals only).
_BUCKETS = """
SELECT date_bin(%(width)s, greatest(created_at, run_at), %(origin)s) AS start,
       count(*) AS arrivals,
       count(*) FILTER (WHERE finished_at IS NOT NULL AND started_at IS NOT NULL) AS finished,
       coalesce(sum(extract(epoch FROM finished_at - started_at))
           FILTER (WHERE finished_at IS NOT NULL AND started_at IS NOT NULL), 0)::float8
FROM jobs
WHERE created_at >= %(since)s AND created_at < %(until)s
  AND greatest(created_at, run_at) < %(until)s
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
GROUP BY 1
ORDER BY 1
"""


def _buckets(
    conn: psycopg.Connection[Any],
    since: datetime,
    until: datetime,
    width: timedelta,
    queue: str | None,
) -> list[Bucket]:
    rows = conn.execute(
        _BUCKETS,
        {
            "width": width,
            "origin": forecast.WEEK_ORIGIN,
            "since": since,
            "until": until,
            "queue": queue,
        },
    ).fetchall()
    return [Bucket(start, int(a), int(f), float(r)) for start, a, f, r in rows]


PRESET = Preset(
    name="vultrscale",
    library="vultrscale",
    versions="this version's schema (`vultrscale db init`)",
    tables={
        "jobs": ("id", "queue", "state", "run_at", "created_at", "started_at", "finished_at"),
        "job_leases": ("job_id", "worker_id", "expires_at"),
    },
    read=read,
    history=History(_finished, _buckets),
    meaning={
        "ready": "state 'ready', run_at due",
        "in flight": "live leases (expires_at in the future)",
        "expired": "expired leases not yet reaped (the jobs run again)",
        "finished": "finished_at - started_at of the newest finished jobs",
        "arrivals": "jobs created_at within the window",
    },
)
