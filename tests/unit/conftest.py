"""The unit tier starts no process: a test that tries fails, and says where it belongs.

A fresh interpreter costs about a second on a loaded machine, so a handful of such tests made
this tier slow enough that nobody ran it before a commit. Tests that need a process live in
tests/e2e (or tests/db when they need Postgres only).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from typing import Any, NoReturn

# croniter runs `file -b` on the interpreter when first imported (platform.architecture(), to
# tell a 32-bit build); the package imports it lazily (only a fleet with floors pays for it),
# so a unit test would be the first importer. Import it here, before any test is guarded.
import croniter  # noqa: F401
import pytest


class ProcessStarted(BaseException):
    """Raised where a unit test starts a process (a BaseException: code under test that
    catches ``Exception`` to carry on cannot hide it)."""


# Every way the stdlib starts a program or forks: subprocess (and asyncio's subprocesses,
# which go through it), os.fork (multiprocessing's default), posix_spawn, system, exec*.
_STARTERS = (
    "fork",
    "forkpty",
    "posix_spawn",
    "posix_spawnp",
    "system",
    "popen",
    "execv",
    "execve",
    "execvp",
    "execvpe",
    "spawnv",
    "spawnve",
    "spawnvp",
    "spawnvpe",
)


@pytest.fixture(autouse=True)
def _no_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    tried: list[str] = []

    def refuse(what: str) -> Any:
        def started(*args: Any, **kwargs: Any) -> NoReturn:
            tried.append(what)
            raise ProcessStarted(
                f"a unit test started a process ({what}): move it to tests/e2e, or to tests/db "
                "if it needs Postgres only"
            )

        return started

    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse("subprocess.Popen"))
    for name in _STARTERS:
        if hasattr(os, name):
            monkeypatch.setattr(os, name, refuse(f"os.{name}"))
    yield
    if tried:  # caught and swallowed by the code under test: still a process it tried to start
        pytest.fail(f"this unit test tried to start a process ({', '.join(tried)})")


@pytest.fixture
def one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """`vultrscale simulate` replays a sweep's rows on one process per core: here on this one
    (tests/e2e/test_simulate_parallel.py checks the pool gives the same rows)."""
    monkeypatch.setattr("vultrscale.replay.command.os.cpu_count", lambda: 1)
