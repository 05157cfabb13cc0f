"""Example handlers, used by ``scripts/demo_shutdown.py``, the tests and the benchmarks.

Run one with ``vultrscale worker --app vultrscale.worker.examples:three_steps``.
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

from vultrscale.worker.job import Job, PermanentError

STEPS = ("classify", "draft", "embed")


def _step_result(job: Job, name: str) -> dict[str, Any]:
    return {"step": name, "attempt": job.attempt}


def _pause(seconds: float) -> None:
    # Event.wait rather than time.sleep: the clock-skew test runs this under libfaketime,
    # whose clock_nanosleep fails with EINVAL when only the wall clock is shifted.
    threading.Event().wait(seconds)


def _append_line(path: str, line: str) -> None:
    # One write() on an O_APPEND descriptor: concurrent workers' lines never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def three_steps(job: Job) -> None:
    """Three saved steps, each sleeping ``payload["step_seconds"]`` (default 0.5 s).

    ``payload["fail"]`` raises an ordinary error (retried), ``payload["permanent"]`` a
    PermanentError (failed at once). ``payload["execution_log"]``, a file path: each step
    appends ``<job id> <step>`` to it when its work is done, before its result is saved, so a
    step that ran twice shows twice (the side effect a duplicate execution would repeat).
    """
    delay = float(job.payload.get("step_seconds", 0.5))
    log = job.payload.get("execution_log")
    for name in STEPS:

        def work(name: str = name) -> dict[str, Any]:
            _pause(delay)
            if log:
                _append_line(str(log), f"{job.id} {name}")
            return _step_result(job, name)

        job.step(name, work)
    if job.payload.get("permanent"):
        raise PermanentError("payload asked for a permanent failure")
    if job.payload.get("fail"):
        raise RuntimeError("payload asked for a failure")


async def three_steps_async(job: Job) -> None:
    """The async twin of ``three_steps``: each step is an ``async`` function saved with
    ``await job.astep`` (``job.step`` would block the event loop on the database)."""
    delay = float(job.payload.get("step_seconds", 0.5))
    for name in STEPS:

        async def work(name: str = name) -> dict[str, Any]:
            await asyncio.sleep(delay)
            return _step_result(job, name)

        await job.astep(name, work)
    if job.payload.get("fail"):
        raise RuntimeError("payload asked for a failure")


def noop(job: Job) -> None:
    """Does nothing: for throughput benchmarks."""


async def noop_async(job: Job) -> None:
    """Does nothing, asynchronously."""
