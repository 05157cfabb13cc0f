#!/usr/bin/env python3
"""Replace a worker while it works: a graceful stop (SIGTERM) and a kill (SIGKILL).

Each round queues 12 jobs of three saved steps, starts a real `vultrscale worker` process
(concurrency 4), stops it after 3 s, prints its exit code, the job states right after, the
attempts and step results per job, then times a new worker finishing the queue. Every step
appends a line to an execution log when its work is done (a side effect, outside the
database): a step that ran twice would show twice, so "0 duplicate executions" is a check
that can fail (saved results cannot show it: the schema keeps one result per step).

Uses DATABASE_URL if set (on a queue of its own, `demo-<random>`; other jobs are not touched),
else a throwaway Postgres that is removed afterwards.

    python scripts/demo_shutdown.py [--passes 3]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg

from vultrscale.db import queue, schema, throwaway
from vultrscale.worker.examples import STEPS

APP = "vultrscale.worker.examples:three_steps"


class Worker:
    """A `vultrscale worker` subprocess whose output lines are collected."""

    def __init__(self, url: str, queue_name: str, lease: float, drain: float, name: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("VULTRSCALE_")}
        env.update(DATABASE_URL=url, PYTHONUNBUFFERED="1", VULTRSCALE_WORKER_ID=name)
        cmd = [sys.executable, "-m", "vultrscale.cli", "worker", "--app", APP]
        cmd += ["--concurrency", "4", "--queue", queue_name]
        cmd += ["--lease-seconds", f"{lease:g}", "--drain-seconds", f"{drain:g}"]
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_started(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not any(" started: " in line for line in self.lines):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the worker did not start:\n" + "\n".join(self.lines))
            time.sleep(0.02)

    def stop(self, signum: int, timeout: float = 60) -> tuple[int, float]:
        t0 = time.monotonic()
        self.proc.send_signal(signum)
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=5)
        return code, time.monotonic() - t0


def snapshot(conn: psycopg.Connection, ids: list[int]) -> dict[str, Any]:
    rows = conn.execute(
        "SELECT j.id, j.state, j.attempts, count(s.name) FROM jobs j"
        " LEFT JOIN job_steps s ON s.job_id = j.id WHERE j.id = ANY(%s) GROUP BY j.id",
        (ids,),
    ).fetchall()
    return {
        "states": dict(sorted(Counter(r[1] for r in rows).items())),
        "attempts": sorted({r[2] for r in rows}),
        "steps": sorted({r[3] for r in rows}),
    }


def executions(log: Path) -> Counter[str]:
    """How many times each ``<job id> <step>`` ran to completion, from the execution log."""
    return Counter(log.read_text().splitlines()) if log.exists() else Counter()


def describe(s: dict[str, Any]) -> str:
    return (
        f"states {s['states']}; attempts per job {s['attempts']}; step results per job {s['steps']}"
    )


def run_round(
    url: str, name: str, signum: int, stop_after: float, lease: float, step_seconds: float
) -> tuple[float, int]:
    """The new worker's seconds to finish, and how many steps ran more than once."""
    qname = f"demo-{uuid.uuid4().hex[:8]}"
    log = Path(tempfile.mkdtemp(prefix="vultrscale-demo-")) / "executions.log"
    payload = {"step_seconds": step_seconds, "execution_log": str(log)}
    with psycopg.connect(url, autocommit=True) as conn:
        ids = queue.enqueue(conn, [payload] * 12, queue=qname)
        first = Worker(url, qname, lease, 20, f"demo-{name}-1")
        first.wait_started()
        time.sleep(stop_after)  # the scenario: stop the worker 3 s into its work
        code, took = first.stop(signum)
        sig = signal.Signals(signum).name
        print(
            f"Round {name!r}: stopped after {stop_after:g} s with {sig}; the process ended "
            f"{took:.1f} s later (exit code {code})"
        )
        for line in first.lines:
            if line.startswith(("Stopping:", "Done in", "job ")):
                print(f"  worker said: {line}")
        print(f"  right after: {describe(snapshot(conn, ids))}")

        t0 = time.monotonic()
        second = Worker(url, qname, lease, 20, f"demo-{name}-2")
        deadline = t0 + lease * 3 + 60
        while snapshot(conn, ids)["states"] != {"succeeded": 12}:
            if second.proc.poll() is not None or time.monotonic() > deadline:
                second.stop(signal.SIGKILL) if second.proc.poll() is None else None
                raise SystemExit("the new worker did not finish:\n" + "\n".join(second.lines))
            time.sleep(0.05)
        finished = time.monotonic() - t0
        second.stop(signal.SIGTERM)
        after = snapshot(conn, ids)
        print(f"  a new worker finished the queue in {finished:.1f} s: {describe(after)}")
        ran = executions(log)
        expected = {f"{i} {step}" for i in ids for step in STEPS}
        twice = sorted(k for k, n in ran.items() if n > 1)
        print(
            f"  executions (side-effect log): {sum(ran.values())} for {len(expected)} steps, "
            f"{len(twice)} ran more than once{': ' + ', '.join(twice) if twice else ''}"
        )
        if after["steps"] != [len(STEPS)] or set(ran) != expected:
            raise SystemExit("a step result or a step's execution is missing")
    return finished, len(twice)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Figures printed: per round, the exit code, states, attempts and step results "
        "per job, the new worker's time to finish and the step executions counted; with "
        "--passes > 1, the medians. Exit code 1 if any step ran more than once.",
    )
    parser.add_argument("--passes", type=int, default=1, help="repeat both rounds (default 1)")
    parser.add_argument("--stop-after", type=float, default=3.0, help="seconds (default 3)")
    parser.add_argument("--lease-seconds", type=float, default=10.0, help="default 10")
    parser.add_argument("--step-seconds", type=float, default=0.5, help="per step (default 0.5)")
    parser.add_argument("--json", action="store_true", help="end with the figures as JSON")
    args = parser.parse_args(argv)

    given = os.environ.get("DATABASE_URL", "").strip()
    if not given:
        print("DATABASE_URL is not set: starting a throwaway Postgres.")
    with throwaway.given_or_throwaway(given) as url:
        schema.migrate(url)
        print(
            "compares: a new worker's time to finish the queue after the first was stopped "
            "gracefully (SIGTERM) and killed (SIGKILL); duplicate step executions counted from "
            "a side-effect log (target 0)"
        )
        times: dict[str, list[float]] = {"graceful": [], "killed": []}
        duplicates = 0
        for n in range(args.passes):
            if args.passes > 1:
                print(f"--- pass {n + 1} of {args.passes}")
            for name, signum in (("graceful", signal.SIGTERM), ("killed", signal.SIGKILL)):
                took, twice = run_round(
                    url, name, signum, args.stop_after, args.lease_seconds, args.step_seconds
                )
                times[name].append(took)
                duplicates += twice
        if args.passes > 1:
            for name, values in times.items():
                print(
                    f"Median over {args.passes} passes, {name}: a new worker finished in "
                    f"{statistics.median(values):.1f} s ({min(values):.1f} to {max(values):.1f})"
                )
        print(f"steps that ran more than once, all rounds: {duplicates}")
        if args.json:
            figures = {f"{k}_finish_s": statistics.median(v) for k, v in times.items()}
            print(json.dumps({**figures, "duplicate_executions": duplicates}))
    return 1 if duplicates else 0


if __name__ == "__main__":
    sys.exit(main())
