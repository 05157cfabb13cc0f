"""The built-in queue's own history, for `vultrscale simulate --from-db`. Read-only.

The queue keeps, per job, when it was created, when it became due (``run_at``), when its last
attempt started (``started_at``, written at claim since schema v6; NULL on older rows) and
when it finished. The rows are returned as (due, started, finished).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import psycopg

from vultrscale import params
from vultrscale.db import ledger, pg
from vultrscale.model import LedgerRow

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


def finished_jobs_in(
    conn: psycopg.Connection[Any], since: timedelta, queue: str = ""
) -> list[tuple[datetime, datetime | None, datetime]]:
    """(due, started, finished) of every job of ``queue`` created within ``since`` that has
    finished (started None on rows from before schema v6),
    up to MAX_REPLAY_JOBS + 1 of them (the earliest due). An empty ``queue`` means every queue,
    as ``queue.queue`` does for the scaler. In the session's TimeZone (UTC on ``pg.connect``'s
    connections); ``workload.from_history`` takes them to UTC whatever it is."""
    # One past what a replay holds: enough to tell "too many" without reading them all.
    limit = params.MAX_REPLAY_JOBS + 1
    rows = conn.execute(
        _FINISHED, {"since": since, "queue": queue or None, "limit": limit}
    ).fetchall()
    return [(due, started, fin) for due, started, fin in rows]


def finished_jobs(
    url: str, since: timedelta, queue: str = ""
) -> list[tuple[datetime, datetime | None, datetime]]:
    """The same, over a connection of its own; errors become ``DatabaseError``s."""
    with pg.session(url, "cannot read the queue's history") as conn:
        return finished_jobs_in(conn, since, queue)


def boot_rows(url: str, fleet: str, since: timedelta) -> list[LedgerRow]:
    """The fleet's boots created within ``since`` (``boottime.is_boot``: created by this
    scaler, its worker seen), the rows the reconcile pass learns its boot time from; errors
    become ``DatabaseError``s."""
    with pg.session(url, "cannot read the fleet's ledger") as conn:
        return ledger.boot_rows(conn, fleet, within=since, limit=None)
