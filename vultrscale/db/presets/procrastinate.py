"""The ``procrastinate`` preset: Procrastinate 3.1 and later (``procrastinate_jobs``,
``procrastinate_workers``, ``procrastinate_events``), read from the tables its own migrations
create, in the search path.

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
    recent          the newest ``succeeded``/``failed`` events within the window, run time from
                    the job's last ``started`` event before it
    arrivals        ``deferred`` events within the window
    queue filter    ``queue_name``
    Not modelled: ``todo`` jobs waiting behind a ``lock`` held by a ``doing`` job count as ready,
    although one worker at a time runs them.

Procrastinate keeps no index on an event's time (``at``), only on its id and job: the history
queries go by id, which grows with time (every event but ``scheduled`` is written at its
transaction's ``now()``). The newest finished jobs are looked for among the newest
``RECENT_SCAN`` events, a backward scan of the primary key that stops at ``waits.RECENT_JOBS``
of them; the arrivals are counted from the newest event older than the window on, so the cost
follows the last minutes' events, not the table. ``simulate --from-db`` and the forecast find
the first event of their window by bisection over the id (``first_event_id``).
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

#: Liveness window: the library's own default.
STALE_AFTER = timedelta(seconds=30)
#: How many of the oldest unscheduled jobs the oldest-age query looks at.
OLDEST_SCAN = 1000
#: How many of the newest events the recent finished jobs are looked for in (a backlog deferred
#: in a burst pushes the last finished jobs back by one event per job).
RECENT_SCAN = 100_000


def read(queue: str | None, cfg: QueueConfig, stale: timedelta | None) -> Read:
    window = stale if stale is not None else STALE_AFTER
    q = and_queue("queue_name", queue)
    only = (
        sql.SQL("")
        if queue is None
        else sql.SQL(" JOIN procrastinate_jobs j ON j.id = e.job_id AND j.queue_name = {}").format(
            sql.Literal(queue)
        )
    )
    ready = sql.SQL(
        "SELECT count(*) FROM procrastinate_jobs WHERE status = 'todo' "
        "AND (scheduled_at IS NULL OR scheduled_at <= now()){}"
    ).format(q)
    oldest_age = sql.SQL(
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
    ).format(q=q, scan=sql.Literal(OLDEST_SCAN))
    # 'doing' jobs of a worker with a fresh heartbeat are in flight; of a stale, pruned or
    # missing worker they are stalled (what JobManager.get_stalled_jobs() returns).
    doing = sql.SQL(
        """
        SELECT w.id, count(*) FROM procrastinate_jobs j
          LEFT JOIN procrastinate_workers w
            ON w.id = j.worker_id AND w.last_heartbeat >= now() - {window}
         WHERE j.status = 'doing'{q}
         GROUP BY w.id
        """
    ).format(q=and_queue("j.queue_name", queue), window=sql.Literal(window))
    finished = sql.SQL(
        """
        SELECT count(*), avg(EXTRACT(EPOCH FROM f.at - s.at))::float8 FROM (
            SELECT e.job_id, e.at FROM (
                SELECT id, job_id, type, at FROM procrastinate_events
                 ORDER BY id DESC LIMIT {scan}) e{only}
             WHERE e.type IN ('succeeded', 'failed') AND e.at >= now() - {window}
             ORDER BY e.id DESC LIMIT {jobs}
        ) f
        CROSS JOIN LATERAL (
            SELECT max(s.at) AS at FROM procrastinate_events s
             WHERE s.job_id = f.job_id AND s.type = 'started' AND s.at <= f.at) s
        WHERE s.at IS NOT NULL
        """
    ).format(
        scan=sql.Literal(RECENT_SCAN),
        only=only,
        window=sql.Literal(waits.RECENT_WINDOW),
        jobs=sql.Literal(waits.RECENT_JOBS),
    )
    # From the newest event older than the window on (a backward scan that stops there), up
    # to the newest: a range the planner reads by the primary key.
    arrivals = sql.SQL(
        """
        SELECT count(*) FROM procrastinate_events e{only}
         WHERE e.type = 'deferred' AND e.at > now() - {window}
           AND e.id > COALESCE((SELECT b.id FROM procrastinate_events b
                                 WHERE b.type <> 'scheduled' AND b.at <= now() - {window}
                                 ORDER BY b.id DESC LIMIT 1), 0)
           AND e.id <= (SELECT max(id) FROM procrastinate_events)
        """
    ).format(only=only, window=sql.Literal(waits.ARRIVAL_WINDOW))
    statements = (ready, oldest_age, doing, finished, arrivals)
    return Read(tuple(Statement(s) for s in statements), _signals)


def _signals(answers: Sequence[Rows]) -> Signals:
    ready_rows, oldest_rows, doing, finished, arrived = answers
    ready = count(one_row(ready_rows, "ready jobs (procrastinate_jobs todo)")[0], "ready jobs")
    age = oldest(one_row(oldest_rows, "oldest ready job")[0], ready, "oldest ready job")
    by_worker: dict[str, int] = {}
    stalled = 0
    for worker_id, n in doing:
        if worker_id is None:
            stalled += int(n)
        else:
            by_worker[str(worker_id)] = int(n)
    jobs, mean = recent(finished, "recent finished jobs (procrastinate_events)")
    return Signals(
        ready=ready,
        in_flight=sum(by_worker.values()),
        expired_leases=stalled,
        oldest_ready_seconds=age,
        leases_by_worker=by_worker,
        recent_jobs=jobs,
        recent_job_seconds=mean,
        recent_arrivals=count(one_row(arrived, "recent arrivals")[0], "recent arrivals"),
    )


# --- history -----------------------------------------------------------------------------------


def first_event_id(conn: psycopg.Connection[Any], at: datetime) -> int | None:
    """The id of the first event written at or after ``at``, None if none was: a bisection
    over the primary key (ids grow with ``at``; ``scheduled`` events, which carry the time
    they are scheduled for, are stepped over), some 30 index lookups where a scan of the
    events would read them all."""
    row = conn.execute("SELECT min(id), max(id) FROM procrastinate_events").fetchone()
    if row is None or row[0] is None:
        return None
    lo, hi = int(row[0]), int(row[1]) + 1
    while lo < hi:
        mid = (lo + hi) // 2
        found = conn.execute(
            "SELECT id, at FROM procrastinate_events WHERE id >= %s "
            "AND type <> 'scheduled' AND at IS NOT NULL ORDER BY id LIMIT 1",
            (mid,),
        ).fetchone()
        if found is None or found[1] >= at:
            hi = mid
        else:
            lo = int(found[0]) + 1
    return lo if lo <= int(row[1]) else None


# Per job of the window: its first deferral, last start and last finish. Jobs deferred before
# the window (their deferral is not in it) are left out.
_PER_JOB = """
SELECT e.job_id, greatest(e.deferred, j.scheduled_at) AS due, e.started, e.finished,
       j.status IN ('succeeded', 'failed') AS done
FROM (SELECT job_id,
             min(at) FILTER (WHERE type = 'deferred') AS deferred,
             max(at) FILTER (WHERE type = 'started') AS started,
             max(at) FILTER (WHERE type IN ('succeeded', 'failed')) AS finished
        FROM procrastinate_events WHERE id >= %(first)s GROUP BY job_id) e
JOIN procrastinate_jobs j ON j.id = e.job_id
WHERE e.deferred >= %(since)s
  AND (%(queue)s::text IS NULL OR j.queue_name = %(queue)s)
"""


def _now(conn: psycopg.Connection[Any]) -> datetime:
    row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def _finished(
    conn: psycopg.Connection[Any], since: timedelta, queue: str | None, limit: int
) -> list[FinishedJob]:
    start = _now(conn) - since
    first = first_event_id(conn, start)
    if first is None:
        return []
    rows = conn.execute(
        f"SELECT due, started, finished FROM ({_PER_JOB}) p "
        "WHERE done AND finished IS NOT NULL ORDER BY due, job_id LIMIT %(limit)s",
        {"first": first, "since": start, "queue": queue, "limit": limit},
    ).fetchall()
    return [(due, started, fin) for due, started, fin in rows]


def _buckets(
    conn: psycopg.Connection[Any],
    since: datetime,
    until: datetime,
    width: timedelta,
    queue: str | None,
) -> list[Bucket]:
    first = first_event_id(conn, since)
    if first is None:
        return []
    return binned(
        conn,
        _PER_JOB,
        "done AND finished IS NOT NULL AND started IS NOT NULL AND started <= finished",
        run_seconds="extract(epoch FROM finished - started)",
        since=since,
        until=until,
        width=width,
        queue=queue,
        first=first,
    )


PRESET = Preset(
    name="procrastinate",
    library="Procrastinate",
    versions="3.1 to 3.10",
    tables={
        "procrastinate_jobs": ("id", "queue_name", "status", "scheduled_at", "worker_id"),
        "procrastinate_workers": ("id", "last_heartbeat"),
        "procrastinate_events": ("id", "job_id", "type", "at"),
    },
    read=read,
    history=History(_finished, _buckets),
    meaning={
        "ready": "status 'todo', scheduled_at NULL or due",
        "in flight": "status 'doing', its worker's heartbeat within 30 s",
        "expired": "status 'doing' of a stale or pruned worker (get_stalled_jobs)",
        "finished": "'succeeded'/'failed' events, run time from the last 'started'",
        "arrivals": "'deferred' events within the window",
    },
)
