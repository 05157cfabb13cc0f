"""The queue's own history of finished jobs, for `vultrscale simulate --from-db` and the floor
forecast, read from the tables of the preset's library (``db/presets/``: where each keeps its
finished jobs, or why it keeps none). Read-only.

The rows are returned as (due, started, finished): when the job became due, when its last
attempt started (None where the queue did not record it: the built-in queue's rows from
before schema v6) and when it finished.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any

import psycopg

from vultrscale import params
from vultrscale.core.forecast import Bucket
from vultrscale.core.model import LedgerRow
from vultrscale.db import ledger, pg, signals
from vultrscale.db.presets import PRESETS
from vultrscale.db.presets.base import FinishedJob, History
from vultrscale.errors import UsageError


def of_preset(preset: str) -> History:
    """The preset's history; UsageError naming why a preset has none."""
    found = PRESETS.get(preset)
    if found is None or found.history is None:
        why = found.no_history if found is not None else "it is not a preset"
        raise UsageError(
            f"queue.preset {preset!r} has no history of finished jobs to read: {why}",
            hint="Replay a workload shape (--workload bursty-day) or a CSV of "
            "arrival_seconds,duration_seconds (--workload PATH.csv) instead.",
        )
    return found.history


def finished_jobs_in(
    conn: psycopg.Connection[Any], since: timedelta, queue: str = "", preset: str = "vultrscale"
) -> list[FinishedJob]:
    """(due, started, finished) of every job of ``queue`` enqueued within ``since`` that has
    finished, up to MAX_REPLAY_JOBS + 1 of them (the earliest due). An empty ``queue`` means
    every queue, as ``queue.queue`` does for the scaler. In the session's TimeZone (UTC on
    ``pg.connect``'s connections); ``workload.from_history`` takes them to UTC whatever it is."""
    # One past what a replay holds: enough to tell "too many" without reading them all.
    limit = params.MAX_REPLAY_JOBS + 1
    return of_preset(preset).finished(conn, since, queue or None, limit)


def finished_jobs(
    url: str, since: timedelta, queue: str = "", preset: str = "vultrscale"
) -> list[FinishedJob]:
    """The same, over a connection of its own; errors become ``DatabaseError``s."""
    history = of_preset(preset)  # refused before connecting
    doing = "cannot read the queue's history"
    conn = pg.connect(url, doing=doing)
    try:
        with _translated(doing, url, preset), conn:
            return history.finished(conn, since, queue or None, params.MAX_REPLAY_JOBS + 1)
    finally:
        conn.close()


def _translated(doing: str, url: str, preset: str) -> AbstractContextManager[None]:
    """The built-in queue's errors as every vultrscale table's; a library's naming the
    preset, and what its schema lacks."""
    if preset == "vultrscale":
        return pg.translated(doing, url)
    return signals.translated(url, preset, doing)


def boot_rows(url: str, fleet: str, since: timedelta) -> list[LedgerRow]:
    """The fleet's boots created within ``since`` (``boottime.is_boot``: created by this
    scaler, its worker seen), the rows the reconcile pass learns its boot time from; errors
    become ``DatabaseError``s."""
    with pg.session(url, "cannot read the fleet's ledger") as conn:
        return ledger.boot_rows(conn, fleet, within=since, limit=None)


def forecast_buckets(
    conn: psycopg.Connection[Any],
    since: datetime,
    until: datetime,
    width: timedelta,
    queue: str = "",
    preset: str = "vultrscale",
) -> list[Bucket]:
    """The jobs of ``queue`` (empty: every queue) enqueued in [since, until), in buckets of
    ``width`` by due time (date_bin from ``forecast.WEEK_ORIGIN``, as ``forecast.buckets``
    bins), aggregated in the database. A job's run time is its last attempt's."""
    return of_preset(preset).buckets(conn, since, until, width, queue or None)


class PgHistory:
    """The JobHistory port over the preset's tables, on a connection of its own (asked once
    per ``policy.forecast.refresh``, not every pass)."""

    def __init__(self, url: str, queue: str = "", preset: str = "vultrscale") -> None:
        self.url, self.queue, self.preset = url, queue, preset

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
            with _translated(doing, self.url, self.preset), conn:
                return forecast_buckets(conn, since, until, width, self.queue, self.preset)
        finally:
            conn.close()


def has_history(preset: str) -> bool:
    """Whether the preset's library keeps finished jobs the forecast and a replay can read."""
    found = PRESETS.get(preset)
    return found is not None and found.history is not None
