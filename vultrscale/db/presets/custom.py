"""The ``custom`` preset: the user's own queries, for a queue no preset reads.

``ready_sql``, ``in_flight_sql`` and ``oldest_ready_seconds_sql`` each return one number (one
row, one column, not NULL). Optional, for the wait rule: ``recent_jobs_sql`` returns one row of
two columns, how many of the ``waits.RECENT_JOBS`` newest jobs finished within
``waits.RECENT_WINDOW`` and their mean run time in seconds (NULL only when none finished);
``recent_arrivals_sql`` returns the jobs enqueued within ``waits.ARRIVAL_WINDOW``. Without both,
the depth rule decides. ``%(queue)s`` in any of them is bound to ``queue.queue`` (NULL when
empty); a query that uses it must write a literal ``%`` as ``%%``. No per-worker leases,
``expired_leases`` 0.

Each runs on the extended protocol (binary results ask for it): exactly one statement, so no
``...; COMMIT; DELETE ...`` can leave the read-only transaction.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, LiteralString, cast

from vultrscale.config import QueueConfig
from vultrscale.core.model import Signals
from vultrscale.db.presets.base import Preset, Read, Rows, Statement, recent
from vultrscale.errors import ConfigError, DatabaseError

REQUIRED = ("ready_sql", "in_flight_sql", "oldest_ready_seconds_sql")
HISTORY = ("recent_jobs_sql", "recent_arrivals_sql")


def read(queue: str | None, cfg: QueueConfig, stale: timedelta | None) -> Read:
    missing = [
        f"queue.{key}: required by preset 'custom'"
        for key in REQUIRED
        if not getattr(cfg, key).strip()
    ]
    history = [key for key in HISTORY if getattr(cfg, key).strip()]
    if len(history) == 1:
        (other,) = set(HISTORY) - set(history)
        missing.append(
            f"queue.{other}: required with queue.{history[0]} (the wait rule reads both)"
        )
    if missing:
        raise ConfigError(missing)
    keys = (*REQUIRED, *history)
    statements = tuple(_statement(getattr(cfg, key), queue) for key in keys)
    return Read(statements, lambda answers: _signals(keys, answers))


def _statement(text: str, queue: str | None) -> Statement:
    query = cast(LiteralString, text)
    if "%(queue)s" in text:
        return Statement(query, {"queue": queue}, binary=True)
    return Statement(query, binary=True)


def _signals(keys: Sequence[str], answers: Sequence[Rows]) -> Signals:
    got = dict(zip(keys, answers, strict=True))
    jobs, mean, arrivals = None, None, None
    if "recent_jobs_sql" in got:
        rows = got["recent_jobs_sql"]
        if len(rows) != 1 or len(rows[0]) != 2:
            raise DatabaseError(
                f"queue.recent_jobs_sql: expected one row with two columns, got {len(rows)} row(s)",
                hint="Return the finished jobs' count and their mean run time in seconds.",
            )
        jobs, mean = recent(rows, "queue.recent_jobs_sql")
        arrivals = int(one_number(got["recent_arrivals_sql"], "queue.recent_arrivals_sql"))
    return Signals(
        ready=int(one_number(got["ready_sql"], "queue.ready_sql")),
        in_flight=int(one_number(got["in_flight_sql"], "queue.in_flight_sql")),
        expired_leases=0,
        oldest_ready_seconds=one_number(
            got["oldest_ready_seconds_sql"], "queue.oldest_ready_seconds_sql"
        ),
        leases_by_worker={},
        recent_jobs=jobs,
        recent_job_seconds=mean,
        recent_arrivals=arrivals,
    )


def one_number(rows: Rows, what: str) -> float:
    """The single value of a query; missing row, NULL or non-number raises."""
    if len(rows) != 1 or len(rows[0]) != 1:
        raise DatabaseError(
            f"{what}: expected one row with one column, got {len(rows)} row(s)",
            hint="Each signal query must return exactly one number.",
        )
    value: Any = rows[0][0]
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


PRESET = Preset(
    name="custom",
    library="your own queries",
    versions="in queue.*_sql",
    tables={},
    read=read,
    no_history=(
        "the custom preset reads numbers, not jobs: export your queue's jobs to a CSV of "
        "arrival_seconds,duration_seconds and replay it with --workload PATH.csv"
    ),
)
