"""The ``graphile-worker`` preset: graphile-worker 0.16 to 0.18 (Node), schema
``graphile_worker`` (its default), read from ``_private_jobs`` as its migrations 000016 to
000020 leave it. The ``jobs`` view is the library's stable interface, but it is a sequential
scan; the private table has the partial index the ready count needs (``jobs_main_index``).

    ready           ``is_available`` (not locked, attempts left) and ``run_at <= now()``, and
                    not behind a named queue that another job holds (one at a time: counted
                    when it is its turn, not all at once)
    in_flight       locked jobs (``locked_at`` set) within graphile-worker's lock timeout of
                    4 hours; this includes jobs a worker pool fetched ahead and has not started
    expired_leases  jobs locked longer than that: a crashed worker's, which graphile-worker's
                    own sweep (``resetLockedAt``, every 8-10 minutes) unlocks to run again
    oldest_ready    ``now() - min(run_at)`` over the ready jobs (a retry moves ``run_at``)
    per worker      locked jobs by ``locked_by`` (a worker pool's id)
    queue filter    ``queue.queue`` matches the task identifier (``_private_tasks``), not the
                    named queue, which serialises jobs rather than routing them to workers

graphile-worker deletes a job when it succeeds and keeps no log of it: no run times and no
arrival count to read (the wait rule's history), so the depth rule decides, and
``simulate --from-db`` and the forecast have nothing to replay. There is no index on
``locked_at``: the in-flight count scans the table, which holds only pending and permanently
failed jobs.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from psycopg import sql

from vultrscale.config import QueueConfig
from vultrscale.core.model import Signals
from vultrscale.db.presets.base import Preset, Read, Rows, Statement, count, oldest, one_row

#: graphile-worker's own lock timeout (``resetLockedAt``: not configurable in the library).
LOCK_TIMEOUT = timedelta(hours=4)
SCHEMA = "graphile_worker"

NO_HISTORY = (
    "graphile-worker deletes a job when it succeeds and keeps no log of it: there is no "
    "history of finished jobs to read"
)


def read(queue: str | None, cfg: QueueConfig, stale: timedelta | None) -> Read:
    window = stale if stale is not None else LOCK_TIMEOUT
    task = (
        sql.SQL("")
        if queue is None
        else sql.SQL(
            " JOIN graphile_worker._private_tasks t ON t.id = j.task_id AND t.identifier = {}"
        ).format(sql.Literal(queue))
    )
    ready = sql.SQL(
        """
        SELECT count(*), EXTRACT(EPOCH FROM now() - min(j.run_at))::float8
          FROM graphile_worker._private_jobs j{task}
          LEFT JOIN graphile_worker._private_job_queues q ON q.id = j.job_queue_id
         WHERE j.is_available = true AND j.run_at <= now()
           AND (j.job_queue_id IS NULL OR q.locked_at IS NULL)
        """
    ).format(task=task)
    locked = sql.SQL(
        """
        SELECT j.locked_by, j.locked_at >= now() - {window} AS live, count(*)
          FROM graphile_worker._private_jobs j{task}
         WHERE j.locked_at IS NOT NULL
         GROUP BY 1, 2
        """
    ).format(task=task, window=sql.Literal(window))
    return Read((Statement(ready), Statement(locked)), _signals)


def _signals(answers: Sequence[Rows]) -> Signals:
    ready_rows, locked = answers
    n, age = one_row(ready_rows, "ready jobs (graphile_worker._private_jobs)")
    ready = count(n, "ready jobs (graphile_worker._private_jobs)")
    by_worker: dict[str, int] = {}
    expired = 0
    for pool, live, k in locked:
        if live and pool is not None:
            by_worker[str(pool)] = by_worker.get(str(pool), 0) + int(k)
        else:
            expired += int(k)
    return Signals(
        ready=ready,
        in_flight=sum(by_worker.values()),
        expired_leases=expired,
        oldest_ready_seconds=oldest(age, ready, "oldest ready job (graphile-worker)"),
        leases_by_worker=by_worker,
    )


PRESET = Preset(
    name="graphile-worker",
    library="graphile-worker",
    versions="0.16 to 0.18, schema graphile_worker, migrations 16 to 20",
    tables={
        "graphile_worker._private_jobs": (
            "id",
            "task_id",
            "job_queue_id",
            "run_at",
            "is_available",
            "locked_at",
            "locked_by",
        ),
        "graphile_worker._private_job_queues": ("id", "locked_at"),
        "graphile_worker._private_tasks": ("id", "identifier"),
    },
    read=read,
    no_history=NO_HISTORY,
    version_sql="SELECT 'migration ' || max(id) FROM graphile_worker.migrations",
    meaning={
        "ready": "is_available, run_at due, its named queue not held",
        "in flight": "locked_at within the 4 h lock timeout",
        "expired": "locked longer (graphile-worker unlocks them to run again)",
        "finished": "none: a job is deleted when it succeeds",
        "arrivals": "none: no record of finished jobs",
    },
)
