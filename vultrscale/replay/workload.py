"""Workloads to replay: built-in shapes, a CSV of jobs, or the built-in queue's own history.

A workload is a ``Trace``: one (arrival, duration) pair per job, in seconds from the start of
the trace, sorted by arrival. The shapes are seeded: the same name, days, rate and seed give
the same trace on every machine.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from vultrscale import params
from vultrscale.errors import UsageError
from vultrscale.rules import budget

DAY = 86_400.0
# Every built-in trace starts at midnight UTC on a Monday, at the start of a calendar month, so
# weekdays, business-hour floors and the monthly price cap fall where a reader expects them.
TRACE_EPOCH = datetime(2026, 6, 1, tzinfo=UTC)
SHAPES = (
    "bursty-day",
    "steady",
    "spiky",
    "office",
    "nightly",
    "trickle",
    "ramp",
    "long-jobs",
    "mixed",
)
# Default jobs per (week)day of each shape: a small fleet's working day.
DEFAULT_JOBS_PER_DAY = {
    "bursty-day": 600,
    "steady": 2_000,
    "spiky": 400,
    "office": 330,
    "nightly": 400,
    "trickle": 60,
    "ramp": 1_500,
    "long-jobs": 80,
    "mixed": 1_200,
}
# The shapes whose volume counts weekdays only (their weekends are quieter).
PER_WEEKDAY = ("bursty-day", "office")
# What each shape is, in one line (`simulate --help`, the workload suite's table).
SHAPE_NOTES = {
    "bursty-day": "four office bursts a weekday (09:00, 11:30, 14:00, 16:30) and a trickle",
    "steady": "a steady Poisson stream all day, every day",
    "spiky": "a quiet background and 2-3 spikes a day at random times",
    "office": "a 09:00 weekday surge of 2-6 min reports, a working-day trickle, a 02:00 batch",
    "nightly": "a 02:00 batch of 1-10 min jobs every night, almost nothing by day",
    "trickle": "a few jobs an hour, all day: every job meets a cold fleet",
    "ramp": "a rate that climbs from 06:00 to a peak at 18:00 and then stops, every day",
    "long-jobs": "jobs of about 20 min (minutes to 2 h) in groups of 1-5 through the day",
    "mixed": "seconds-long and quarter-hour jobs together, in random bursts and a background",
}
# Job durations: log-normal with a median of 40 s (mean ~55 s), clipped to 1 s .. 30 min:
# most jobs are short, a few run for many minutes, as in a typical background queue.
_MEDIAN_DURATION = 40.0
_DURATION_SIGMA = 0.8
_MIN_DURATION, _MAX_DURATION = 1.0, 1_800.0


@dataclass(frozen=True)
class Trace:
    """Jobs to replay: arrival and duration in seconds, sorted by arrival."""

    name: str
    arrivals: tuple[float, ...]
    durations: tuple[float, ...]
    span: float  # seconds the trace covers; the replay runs past it by a grace (compare.py)
    epoch: datetime = TRACE_EPOCH  # wall-clock time of second 0
    note: str = ""  # how the trace was made, shown with the results

    def __len__(self) -> int:
        return len(self.arrivals)

    @property
    def total_job_seconds(self) -> float:
        return math.fsum(self.durations)

    @property
    def longest(self) -> float:
        return max(self.durations, default=0.0)


def from_jobs(
    name: str,
    jobs: Iterable[tuple[float, float]],
    *,
    span: float | None = None,
    epoch: datetime = TRACE_EPOCH,
    note: str = "",
) -> Trace:
    """A trace from (arrival, duration) pairs; ``span`` defaults to the last job's end rounded
    up to a whole hour."""
    pairs = sorted(jobs)
    end = max((a + d for a, d in pairs), default=0.0)
    if span is None:
        span = max(3600.0, math.ceil(end / 3600.0) * 3600.0)
    return Trace(
        name,
        tuple(a for a, _ in pairs),
        tuple(d for _, d in pairs),
        float(span),
        epoch,
        note,
    )


def _duration(
    rng: random.Random,
    median: float = _MEDIAN_DURATION,
    sigma: float = _DURATION_SIGMA,
    top: float = _MAX_DURATION,
) -> float:
    d = rng.lognormvariate(math.log(median), sigma)
    return min(max(d, _MIN_DURATION), top)


def _burst(rng: random.Random, at: float, n: int, spread: float) -> list[tuple[float, float]]:
    return [(at + rng.uniform(0.0, spread), _duration(rng)) for _ in range(n)]


def _poisson(rng: random.Random, start: float, end: float, n_mean: float) -> list[float]:
    """Arrival times of a Poisson process with ``n_mean`` events expected in [start, end)."""
    out: list[float] = []
    if n_mean <= 0 or end <= start:
        return out
    rate = n_mean / (end - start)
    t = start + rng.expovariate(rate)
    while t < end:
        out.append(t)
        t += rng.expovariate(rate)
    return out


def _ramp(rng: random.Random, start: float, end: float, n_mean: float) -> list[float]:
    """Arrivals whose rate climbs linearly from 0 at ``start`` to its peak at ``end``
    (``n_mean`` expected in all): a Poisson process thinned by the rising rate."""
    return [
        t
        for t in _poisson(rng, start, end, 2 * n_mean)
        if rng.random() < (t - start) / (end - start)
    ]


def office_jobs(
    rng: random.Random, day: int, *, surge: int, trickle_per_hour: float, batch: int
) -> list[tuple[float, float]]:
    """One day of the office shape (``scripts/workload_office.py`` writes it as a CSV): the
    02:00 batch every day; on weekdays the 09:00 surge over 20 minutes and the 08:00-18:00
    trickle."""
    start = day * DAY
    out = [(start + 2 * 3600.0 + rng.uniform(0, 60), rng.uniform(60, 180)) for _ in range(batch)]
    if day % 7 >= 5:  # day 0 is a Monday
        return out
    out += [
        (start + 9 * 3600.0 + rng.uniform(0, 20 * 60), rng.uniform(120, 360)) for _ in range(surge)
    ]
    t = start + 8 * 3600.0
    while trickle_per_hour > 0:
        t += rng.expovariate(trickle_per_hour / 3600.0)
        if t >= start + 18 * 3600.0:
            break
        out.append((t, rng.uniform(20, 120)))
    return out


def shape(name: str, *, days: int, seed: int, jobs_per_day: int | None = None) -> Trace:
    """A built-in workload (one of ``SHAPES``, ``SHAPE_NOTES`` says what each is), seeded."""
    if name not in SHAPES:
        raise UsageError(
            f"unknown workload {name!r}",
            hint=f"Use one of {', '.join(SHAPES)}, or the path of a CSV file.",
        )
    if days < 1:
        raise UsageError(f"--days must be at least 1, got {days}")
    per_day = DEFAULT_JOBS_PER_DAY[name] if jobs_per_day is None else jobs_per_day
    if per_day < 0:
        raise UsageError(f"--jobs-per-day cannot be negative, got {per_day}")
    rng = random.Random(f"{name}:{seed}")
    jobs: list[tuple[float, float]] = []
    for day in range(days):
        base = day * DAY
        weekend = day % 7 >= 5
        if name == "steady":
            jobs += [(t, _duration(rng)) for t in _poisson(rng, base, base + DAY, per_day)]
        elif name == "bursty-day":
            # Office batches: four bursts on weekdays (09:00, 11:30, 14:00, 16:30, each +- about
            # 20 min) carry 90% of the day's jobs; a trickle covers 08:00-18:00. Weekends see one
            # midday burst at a fifth of the volume.
            volume = per_day * (0.2 if weekend else 1.0)
            starts = [12.0] if weekend else [9.0, 11.5, 14.0, 16.5]
            per_burst = volume * 0.9 / len(starts)
            for hour in starts:
                at = base + hour * 3600.0 + rng.gauss(0.0, 1200.0)
                n = max(0, round(rng.gauss(per_burst, per_burst * 0.2)))
                jobs += _burst(rng, at, n, spread=180.0)
            trickle = _poisson(rng, base + 8 * 3600.0, base + 18 * 3600.0, volume * 0.1)
            jobs += [(t, _duration(rng)) for t in trickle]
        elif name == "spiky":  # a quiet background and two or three sudden spikes a day
            jobs += [(t, _duration(rng)) for t in _poisson(rng, base, base + DAY, per_day * 0.1)]
            for _ in range(rng.choice((2, 3))):
                at = base + rng.uniform(0.0, DAY - 3600.0)
                # At least one job a spike, unless the day has none (--jobs-per-day 0).
                n = max(min(1, per_day), round(rng.gauss(per_day * 0.9 / 2.5, per_day * 0.1)))
                jobs += _burst(rng, at, n, spread=30.0)
        elif name == "office":  # the default day: 150 surge, 12 an hour of trickle, 60 batch
            scale = per_day / DEFAULT_JOBS_PER_DAY["office"]
            jobs += office_jobs(
                rng,
                day,
                surge=round(150 * scale),
                trickle_per_hour=12 * scale,
                batch=round(60 * scale),
            )
        elif name == "nightly":  # 95% in a batch at 02:00 (within 2 min), 1-10 min each
            at = base + 2 * 3600.0
            jobs += [
                (at + rng.uniform(0.0, 120.0), rng.uniform(60.0, 600.0))
                for _ in range(round(per_day * 0.95))
            ]
            jobs += [(t, _duration(rng)) for t in _poisson(rng, base, base + DAY, per_day * 0.05)]
        elif name == "trickle":
            jobs += [(t, _duration(rng)) for t in _poisson(rng, base, base + DAY, per_day)]
        elif name == "ramp":  # 06:00 to 18:00, the rate rising to its peak, then nothing
            ramp = _ramp(rng, base + 6 * 3600.0, base + 18 * 3600.0, per_day)
            jobs += [(t, _duration(rng)) for t in ramp]
        elif name == "long-jobs":  # groups of 1-5 jobs, 20 min median (5 min to 2 h)
            for t in _poisson(rng, base, base + DAY, per_day / 3.0):
                jobs += [
                    (t + rng.uniform(0.0, 60.0), _duration(rng, 1200.0, 0.5, 7200.0))
                    for _ in range(rng.randint(1, 5))
                ]
        else:  # mixed: 85% of ~10 s jobs, 15% of ~15 min; 70% in 6 random bursts a day

            def job(at: float) -> tuple[float, float]:
                if rng.random() < 0.85:
                    return at, _duration(rng, 10.0, 0.6)
                return at, _duration(rng, 900.0, 0.4, 3600.0)

            jobs += [job(t) for t in _poisson(rng, base, base + DAY, per_day * 0.3)]
            for _ in range(6):
                at = base + rng.uniform(0.0, DAY - 600.0)
                jobs += [job(at + rng.uniform(0.0, 300.0)) for _ in range(round(per_day * 0.7 / 6))]
    span = days * DAY
    jobs = [(a, d) for a, d in jobs if 0.0 <= a < span]
    per = "weekday" if name in PER_WEEKDAY else "day"
    note = f"{name}, {days} day(s), {per_day} jobs per {per}, seed {seed}"
    return from_jobs(name, jobs, span=span, note=note)


# A replay covers at most a year: a CSV time beyond it is a mistake, not a workload.
MAX_CSV_SECONDS = 366 * 86400.0


def load_csv(path: str | Path) -> Trace:
    """Jobs from a CSV file: ``arrival_seconds,duration_seconds`` per row, header optional.

    Read row by row, so a file too big to replay is refused at its MAX_REPLAY_JOBS + 1st job,
    not after it is all in memory. Raises UsageError naming the first bad line.
    """
    p = Path(path)
    limit = params.MAX_REPLAY_JOBS
    jobs: list[tuple[float, float]] = []
    try:
        # utf-8-sig: Excel starts its "CSV UTF-8" with a byte-order mark; it is no data.
        with p.open(encoding="utf-8-sig", newline="") as f:
            reader = csv.reader(f)
            first = True  # the header, if any, is the first row that is not a comment
            for row in reader:
                lineno = reader.line_num
                if not row or all(not c.strip() for c in row) or row[0].lstrip().startswith("#"):
                    continue
                if first and row[0].strip().lower() == "arrival_seconds":
                    first = False
                    continue
                first = False
                if len(jobs) == limit:
                    raise UsageError(
                        f"{p}: more than {limit:,} jobs, more than a replay holds",
                        hint="Replay a part of it (a shorter period): the policies compare the "
                        "same.",
                    )
                jobs.append(_csv_row(p, lineno, row))
    except OSError as exc:
        raise UsageError(
            f"cannot read the workload file {p}: {exc.strerror}",
            hint="Give a CSV file with arrival_seconds,duration_seconds per row.",
        ) from None
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"{p}: not a UTF-8 text CSV ({exc})",
            hint="Save it as CSV (UTF-8) with arrival_seconds,duration_seconds per row.",
        ) from None
    except csv.Error as exc:  # UTF-8, but not a CSV the reader takes (a field of 128 KiB+)
        raise UsageError(
            f"{p}: not a CSV of arrival_seconds,duration_seconds rows ({exc})",
            hint="Give two numbers per row: arrival_seconds,duration_seconds.",
        ) from None
    if not jobs:
        raise UsageError(
            f"{p}: no jobs found",
            hint="Each row is arrival_seconds,duration_seconds (e.g. 30,45.5).",
        )
    return from_jobs(p.stem, jobs, note=f"{len(jobs)} job(s) from {p.name}")


def _csv_row(path: Path, lineno: int, row: list[str]) -> tuple[float, float]:
    where = f"{path}, line {lineno}"
    hint = "Each row is arrival_seconds,duration_seconds: two numbers, the second above 0."
    if len(row) != 2:
        raise UsageError(
            f"{where}: expected 2 columns, found {len(row)}: {','.join(row)!r}", hint=hint
        )
    try:
        arrival, duration = float(row[0]), float(row[1])
    except ValueError:
        raise UsageError(f"{where}: not a number: {','.join(row)!r}", hint=hint) from None
    if not (math.isfinite(arrival) and math.isfinite(duration)):
        raise UsageError(f"{where}: not a finite number: {','.join(row)!r}", hint=hint)
    if arrival < 0:
        raise UsageError(f"{where}: arrival_seconds is negative ({arrival:g})", hint=hint)
    if duration <= 0:
        raise UsageError(f"{where}: duration_seconds must be above 0 ({duration:g})", hint=hint)
    if arrival > MAX_CSV_SECONDS or duration > MAX_CSV_SECONDS:
        raise UsageError(
            f"{where}: {max(arrival, duration):g} s is past a year ({MAX_CSV_SECONDS:g} s), the "
            "longest replay",
            hint=hint,
        )
    return arrival, duration


def from_history(
    rows: Iterable[tuple[datetime, datetime | None, datetime]], *, since: timedelta
) -> Trace:
    """A trace from the built-in queue's finished jobs: (due at, started at, finished at).

    A job's duration is its last attempt's own run time, finished - started. Rows from before
    the queue recorded a start (schema v6; started None) take finished - due, which holds the
    time the job waited in the original fleet too: an upper bound, and the note counts them.
    """
    # In UTC: same-zone datetimes subtract in wall time, an hour off across a DST change.
    triples = [
        (budget.utc(due), None if started is None else budget.utc(started), budget.utc(fin))
        for due, started, fin in rows
    ]
    if len(triples) > params.MAX_REPLAY_JOBS:  # the query reads one more than this at most
        raise UsageError(
            f"more than {params.MAX_REPLAY_JOBS:,} finished jobs in the queue over the last "
            f"{since}, more than a replay holds",
            hint="Replay a shorter period with --since.",
        )
    if not triples:
        raise UsageError(
            f"no finished jobs in the queue over the last {since}",
            hint="Widen --since, or replay a CSV or a built-in workload instead.",
        )
    first = min(due for due, _, _ in triples)
    epoch = first.replace(minute=0, second=0, microsecond=0)
    old = sum(started is None for _, started, _ in triples)
    jobs = [
        (
            (due - epoch).total_seconds(),
            max((fin - (due if started is None else started)).total_seconds(), 0.001),
        )
        for due, started, fin in triples
    ]
    note = f"{len(jobs)} finished job(s) from the queue; duration = finished - started"
    if old:
        note += (
            f"; {old} of them from before the queue recorded a start: finished - due (their "
            "wait in the original fleet included, an upper bound)"
        )
    return from_jobs("from-db", jobs, epoch=epoch, note=note)
