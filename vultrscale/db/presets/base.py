"""What every queue preset is made of, and the checks their answers share.

A preset says, for one job-queue library: the tables and columns it reads (``tables``; `queue
detect` and the errors name what is missing), the library versions it reads them in, the
statements of one signal read (``read``: sent together, in one snapshot) and how their answers
become ``Signals``, and where the library keeps finished jobs (``history``), or why it keeps
none (``no_history``).

"No data" is never read as zero: a missing row or a NULL where a number must be raises
``DatabaseError``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, LiteralString

from psycopg import sql

from vultrscale.core import forecast
from vultrscale.core.forecast import Bucket
from vultrscale.errors import DatabaseError

if TYPE_CHECKING:
    import psycopg

    from vultrscale.config import QueueConfig
    from vultrscale.core.model import Signals

Rows = list[tuple[Any, ...]]


@dataclass(frozen=True)
class Statement:
    """One statement of a signal read: literals only (``params`` None), or a custom query with
    its ``%(queue)s`` bound; ``binary``: ask for binary results (the custom queries do, which
    keeps them to the extended protocol: one statement each)."""

    query: sql.SQL | sql.Composed | LiteralString
    params: Mapping[str, Any] | None = None
    binary: bool = False


@dataclass(frozen=True)
class Read:
    """The statements of one signal read, in order, and ``signals``: their answers (each
    statement's rows, in the same order) as ``Signals``."""

    statements: tuple[Statement, ...]
    signals: Callable[[Sequence[Rows]], Signals]


# (due, started or None, finished) of one finished job, as `simulate --from-db` replays it.
FinishedJob = tuple[datetime, "datetime | None", datetime]


@dataclass(frozen=True)
class History:
    """Where a library keeps its finished jobs: ``finished(conn, since, queue, limit)`` for
    `simulate --from-db` (jobs enqueued within ``since`` that finished, the earliest due
    first, at most ``limit``), ``buckets(conn, since, until, width, queue)`` for the floor
    forecast. ``queue`` None: every queue."""

    finished: Callable[[psycopg.Connection[Any], timedelta, str | None, int], list[FinishedJob]]
    buckets: Callable[
        [psycopg.Connection[Any], datetime, datetime, timedelta, str | None], list[Bucket]
    ]


@dataclass(frozen=True)
class Preset:
    """One queue library as the scaler reads it (module docstring)."""

    name: str
    library: str  # as its users name it
    versions: str  # the versions whose schema the preset reads, e.g. "3.1 to 3.10"
    # Table (schema-qualified where the library uses a schema of its own) -> columns read.
    tables: Mapping[str, tuple[str, ...]]
    read: Callable[[str | None, QueueConfig, timedelta | None], Read]
    history: History | None = None
    no_history: str = ""  # why ``history`` is None, for the refusal and `queue detect`
    # The library's own record of its schema version (one row, one value), or None.
    version_sql: LiteralString | None = None
    # What is counted where: `queue detect` shows it, docs/queues.md's table says the same.
    meaning: Mapping[str, str] = field(default_factory=dict)

    @property
    def supported(self) -> str:
        return f"{self.library} {self.versions}"


# --- checks on answers ---------------------------------------------------------------------------


def one_row(rows: Rows, what: str) -> tuple[Any, ...]:
    """The one row an aggregate returns; none or several is an error."""
    if len(rows) != 1:
        raise DatabaseError(
            f"{what}: expected one row, got {len(rows)} (no data is not zero)",
            hint="The queue tables look inconsistent; check them by hand.",
        )
    return rows[0]


def count(value: Any, what: str) -> int:
    """A count from an aggregate: NULL is an error, never zero."""
    if value is None:
        raise DatabaseError(
            f"{what}: the count returned NULL (no data is not zero)",
            hint="The queue tables look inconsistent; check them by hand.",
        )
    return int(value)


def oldest(value: Any, ready: int, what: str) -> float:
    """Oldest ready age in seconds: 0 when nothing is ready; NULL while jobs are ready is an
    error."""
    if value is None:
        if ready == 0:
            return 0.0
        raise DatabaseError(
            f"{what}: no age found although {ready} job(s) are ready",
            hint="The queue tables look inconsistent; check them by hand.",
        )
    return max(0.0, float(value))


def recent(rows: Rows, what: str) -> tuple[int, float | None]:
    """(count, mean run time) of the newest finished jobs: the mean is None only when no job
    finished; a NULL count, or no mean for jobs that finished, is an error."""
    n, mean = one_row(rows, what)
    jobs = count(n, what)
    if mean is None:
        if jobs:
            raise DatabaseError(f"{what}: no mean run time for {jobs} finished job(s)")
        return 0, None
    seconds = float(mean)
    if not math.isfinite(seconds):
        raise DatabaseError(f"{what}: mean run time {seconds}, expected a finite number")
    return jobs, max(0.0, seconds)


def and_queue(column: LiteralString, queue: str | None) -> sql.Composable:
    """`` AND column = 'queue'`` (a literal), or nothing for every queue."""
    if queue is None:
        return sql.SQL("")
    return sql.SQL(" AND {} = {}").format(sql.SQL(column), sql.Literal(queue))


def binned(
    conn: psycopg.Connection[Any],
    per_job: str,
    ran: str,
    *,
    run_seconds: str,
    since: datetime,
    until: datetime,
    width: timedelta,
    queue: str | None,
    where: str = "due < %(until)s",
    **params: Any,
) -> list[Bucket]:
    """The forecast's buckets (``forecast.Tally``'s, in SQL) from ``per_job``, a query of one
    row per job with its ``due`` time in the window (it may use ``%(since)s``, ``%(until)s``,
    ``%(queue)s`` and ``params``): jobs due per ``width`` from the week's origin, those that
    ``ran`` (a condition), and their ``run_seconds`` summed."""
    rows = conn.execute(
        f"SELECT date_bin(%(width)s, due, %(origin)s), count(*), count(*) FILTER (WHERE {ran}),"
        f" coalesce(sum({run_seconds}) FILTER (WHERE {ran}), 0)::float8"
        f" FROM ({per_job}) p WHERE {where} GROUP BY 1 ORDER BY 1",
        {
            "since": since,
            "until": until,
            "queue": queue,
            "width": width,
            "origin": forecast.WEEK_ORIGIN,
            **params,
        },
    ).fetchall()
    return [Bucket(start, int(a), int(f), float(r)) for start, a, f, r in rows]
