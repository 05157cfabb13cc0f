"""Real `vultrscale worker` processes for the e2e tests, and waiting on conditions."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg

T = TypeVar("T")

EXAMPLES = "vultrscale.worker.examples"


def wait_for(check: Callable[[], T], what: str, timeout: float = 20.0, interval: float = 0.05) -> T:
    """Poll ``check`` until it returns something truthy; fail with ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


class WorkerProcess:
    """A worker subprocess whose stdout and stderr lines are collected as they arrive."""

    def __init__(
        self,
        db_url: str,
        app: str,
        *args: str,
        env: dict[str, str] | None = None,
    ) -> None:
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("VULTRSCALE_")}
        full_env.update({"DATABASE_URL": db_url, "PYTHONUNBUFFERED": "1"})
        full_env.update(env or {})
        cmd = [sys.executable, "-m", "vultrscale.cli", "worker", "--app", app, *args]
        self.proc = subprocess.Popen(
            cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self.out), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, self.err), daemon=True),
        ]
        for r in self._readers:
            r.start()

    @staticmethod
    def _read(stream: Any, into: list[str]) -> None:
        for line in stream:
            into.append(line.rstrip("\n"))

    def wait_started(self, timeout: float = 20.0) -> None:
        wait_for(
            lambda: any("started" in line for line in self.out) or self.proc.poll() is not None,
            "the worker to start",
            timeout,
        )
        assert self.proc.poll() is None, self.text()

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float = 30.0) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"worker did not exit in {timeout:g} s:\n{self.text()}") from None
        for r in self._readers:
            r.join(timeout=5)
        return code

    def stop(self) -> None:
        """Cleanup for a test that failed half-way: never leave a process behind."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def text(self) -> str:
        return "\n".join(["stdout:", *self.out, "stderr:", *self.err])


def states(conn: psycopg.Connection) -> dict[str, int]:
    return dict(conn.execute("SELECT state, count(*) FROM jobs GROUP BY state").fetchall())


def jobs(conn: psycopg.Connection) -> dict[int, tuple[str, int]]:
    rows = conn.execute("SELECT id, state, attempts FROM jobs ORDER BY id").fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


def steps(conn: psycopg.Connection) -> dict[int, dict[str, Any]]:
    """Saved step results by job id, then step name."""
    out: dict[int, dict[str, Any]] = {}
    for job_id, name, result in conn.execute(
        "SELECT job_id, name, result FROM job_steps ORDER BY job_id, name"
    ):
        out.setdefault(job_id, {})[name] = result
    return out


def leases(conn: psycopg.Connection) -> int:
    row = conn.execute("SELECT count(*) FROM job_leases").fetchone()
    return int(row[0]) if row else 0
