"""Parsers for command-line flags, so flags obey the same rules as the config file.

Each function here is a Typer ``parser=``: it takes the text given on the command line (or the
default, already parsed) and returns the value, or raises ``typer.BadParameter`` with what is
allowed; Typer prints it as ``Invalid value for '--flag': ...`` and exits 2 before anything runs.
Durations use config's syntax and bounds, queue names config's rule: one definition each.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import typer

# vultrscale.config is imported inside the parsers: a command's --help must not load it.

# `reconcile --loop` passes closer than this would list the fleet faster than Vultr's rate limit
# allows for anything else and fill the ledger (a pass every 0 s wrote 100,000 rows an hour).
MIN_RECONCILE_INTERVAL = timedelta(seconds=5)
# `status --watch` makes one API listing per refresh; once a second is plenty for a person.
MIN_WATCH_EVERY = timedelta(seconds=1)
# The demo needs time to boot an instance and run a job; shorter runs prove nothing.
MIN_DEMO_DURATION = timedelta(seconds=10)
# `enqueue --count`: the jobs are inserted from one list held in memory.
MAX_ENQUEUE_COUNT = 100_000
# Attempts per job and snapshots kept: far above any real use, below int overflow in Postgres.
MAX_SMALL_COUNT = 1000
# `simulate` replays a year at most, and holds every job of a replay in memory: a built-in
# shape's days times jobs per day stay under MAX_REPLAY_JOBS (ten times the 30-day benchmark,
# which replays 232k jobs in about 5 s).
MAX_SIMULATE_DAYS = 366
MAX_JOBS_PER_DAY = 100_000
MAX_REPLAY_JOBS = 2_500_000


def duration(minimum: timedelta = timedelta(0)) -> Callable[[object], timedelta]:
    """A DURATION flag (``90s``, ``5m``, ``1h``, bare seconds) of at least ``minimum``."""

    def parse(value: object) -> timedelta:
        if isinstance(value, timedelta):
            return value
        from vultrscale.config import to_duration

        try:
            td = to_duration(value)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
        if td < minimum:
            raise typer.BadParameter(
                f"{value!r} is too short: at least {minimum.total_seconds():g}s"
            )
        return td

    return parse


def seconds(value: timedelta | None) -> float | None:
    """A DURATION flag as the seconds a config key in seconds takes (None: not given)."""
    return None if value is None else value.total_seconds()


def _whole(value: object, low: int, high: int, what: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        try:
            number = int(str(value).strip())
        except ValueError:
            raise typer.BadParameter(f"{value!r} is not a whole number ({what})") from None
    if not low <= number <= high:
        raise typer.BadParameter(f"{number} is out of range ({what})")
    return number


def count(maximum: int = MAX_SMALL_COUNT) -> Callable[[object], int]:
    """An N flag: a whole number from 1 to ``maximum``."""
    return lambda value: _whole(value, 1, maximum, f"allowed 1 to {maximum}")


def count_or_zero(maximum: int) -> Callable[[object], int]:
    """An N flag that may be 0: a whole number from 0 to ``maximum``."""
    return lambda value: _whole(value, 0, maximum, f"allowed 0 to {maximum}")


def port(value: object) -> int:
    """A PORT flag: 1-65535."""
    return _whole(value, 1, 65535, "a TCP port from 1 to 65535")


def port_or_zero(value: object) -> int:
    """A PORT flag where 0 asks the system for a free port."""
    return _whole(value, 0, 65535, "a TCP port from 1 to 65535, or 0 for a free one")


def _vultr_id(value: object, where: str) -> str:
    """A Vultr id: a UUID, as config's ids (it goes into a URL path: "../account" or a
    trailing newline must not); ``where`` says where the user finds the id."""
    from vultrscale.config import VULTR_ID, VULTR_ID_FORM, shown

    text = str(value)
    if not VULTR_ID.fullmatch(text):
        raise typer.BadParameter(f"{shown(text)} is not {VULTR_ID_FORM} ({where})")
    return text


def instance_id(value: object) -> str:
    """An ID flag naming a Vultr instance."""
    return _vultr_id(value, "`vultrscale instances` lists the ids")


def snapshot_id(value: object) -> str:
    """An ID flag naming a snapshot being made (`vultrscale instances` does not list those)."""
    return _vultr_id(value, "the id `vultrscale snapshot` printed after --no-wait or a timeout")


def queue_name(value: object) -> str:
    """A queue name, by the rule the worker applies to its own queue."""
    from vultrscale.config import queue_name_problem

    text = str(value)
    problem = queue_name_problem(text)
    if problem:
        raise typer.BadParameter(problem)
    return text
