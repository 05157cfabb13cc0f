"""The built-in queue's own history, for `vultrscale simulate --from-db` and the floor
forecast. Read-only.

The queue keeps, per job, when it was created, when it became due (``run_at``), when its last
attempt started (``started_at``, written at claim since schema v6; NULL on older rows) and
when it finished. The rows are returned as (due, started, finished).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import psycopg

from vultrscale import forecast, params
from vultrscale.db import ledger, pg
from vultrscale.forecast import Bucket
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


def forecast_buckets(
    conn: psycopg.Connection[Any],
    since: datetime,
    until: datetime,
    width: timedelta,
    queue: str = "",
) -> list[Bucket]:
    """The jobs of ``queue`` (empty: every queue) created in [since, until), in buckets of
    ``width`` by due time: one scan, aggregated in the database."""
    rows = conn.execute(
        _BUCKETS,
        {
            "width": width,
            "origin": forecast.WEEK_ORIGIN,
            "since": since,
            "until": until,
            "queue": queue or None,
        },
    ).fetchall()
    return [Bucket(start, int(a), int(f), float(r)) for start, a, f, r in rows]


class PgHistory:
    """The JobHistory port over the built-in queue's ``jobs`` table, on a connection of its
    own (asked once per ``policy.forecast.refresh``, not every pass)."""

    def __init__(self, url: str, queue: str = "") -> None:
        self.url, self.queue = url, queue

    def buckets(self, since: datetime, until: datetime, width: timedelta) -> list[Bucket]:
        doing = "cannot read the queue's history for the forecast"
        # A pass waits on this scan holding the fleet's lock: a stalled statement or network
        # is an error within PASS_STALL_S (the pass goes on with the profile it had), as the
        # pass's own connection's are, never a pass held for TCP's 15 minutes.
        conn = pg.connect(
            self.url,
            doing=doing,
            statement_timeout_s=pg.PASS_STALL_S,
            **pg.keepalives(pg.PASS_STALL_S),
        )
        try:
            with pg.translated(doing, self.url), conn:
                return forecast_buckets(conn, since, until, width, self.queue)
        finally:
            conn.close()
