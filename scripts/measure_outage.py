#!/usr/bin/env python3
"""Measure: a worker fleet under load riding out database outages.

Starts a throwaway Postgres of its own, enqueues ``--jobs`` jobs of three steps each (every step
sleeps ``--step-seconds`` and appends one line to an execution log), and runs ``--workers`` real
``vultrscale worker`` processes of ``--concurrency`` each. Like systemd with Restart=always it
starts a replacement ``--restart-seconds`` after any worker ends, and every ``--kill-every``
seconds it sends SIGKILL or SIGTERM (at random) to one worker. After ``--warmup`` seconds it
stops Postgres (data kept, same port) for each of ``--outages`` seconds in turn, with
``--recovery`` seconds between them, then waits for the queue to empty (at most
``--max-seconds`` in all).

It prints, per outage: worker exits while it lasted and until the next one (an exit code
above 0: not a drain, not one of our signals), and the seconds from the database's return (the
server's start time) until completions in a sliding 2 s window reach 80% of the normal rate
(measured on the database's clock over the warm-up). And for the whole run: steps executed
more than once (from the execution log, not from saved rows), jobs by state at the end (none
is lost: every job is succeeded, or still ready or leased when the time bound cut the run),
kills sent.

Example: python scripts/measure_outage.py --jobs 3000 --workers 8 --concurrency 4 --outages 5,30
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg  # noqa: E402

from vultrscale.db import queue as q  # noqa: E402
from vultrscale.db import schema, throwaway  # noqa: E402

HANDLER = """
import os
import time

LOG = os.environ["OUTAGE_LOG"]
STEP = float(os.environ["OUTAGE_STEP_SECONDS"])


def handle(job):
    for name in ("fetch", "render", "store"):
        def run(name=name):
            with open(LOG, "a") as f:  # one short line: an atomic append
                f.write(f"{job.id} {name}\\n")
            time.sleep(STEP)
            return name

        job.step(name, run)
"""

WINDOW_SECONDS = 2.0  # sliding window for the completion rate after a return
RECOVERED_SHARE = 0.8  # "recovered": this share of the normal completion rate
LINES = ("database unreachable", "database back after", "Waiting up to", "lease lost")


@dataclass
class Fleet:
    """The worker processes, replaced like systemd would; exits counted by code."""

    url: str
    args: list[str]
    env: dict[str, str]
    logs: Path
    restart_seconds: float
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    pending: list[float] = field(default_factory=list)  # restart times
    exits: list[tuple[float, int]] = field(default_factory=list)  # (monotonic, code)
    started: int = 0

    def spawn(self) -> None:
        self.started += 1
        out = open(self.logs / f"worker-{self.started}.log", "wb")  # noqa: SIM115 - the child owns it
        cmd = [sys.executable, "-m", "vultrscale.cli", "worker", *self.args]
        env = {**self.env, "VULTRSCALE_WORKER_ID": f"measure-{self.started}"}
        self.procs.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT))
        out.close()

    def tend(self, now: float) -> None:
        for p in list(self.procs):
            code = p.poll()
            if code is not None:
                self.procs.remove(p)
                self.exits.append((now, code))
                self.pending.append(now + self.restart_seconds)
        for due in [t for t in self.pending if t <= now]:
            self.pending.remove(due)
            self.spawn()

    def stop(self) -> None:
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=3000, help="jobs enqueued (default 3000)")
    parser.add_argument("--workers", type=int, default=8, help="worker processes (default 8)")
    parser.add_argument("--concurrency", type=int, default=4, help="per worker (default 4)")
    parser.add_argument("--lease-seconds", type=float, default=60.0, help="default 60")
    parser.add_argument(
        "--outage-seconds", type=float, default=0.0, help="outage budget (default 0: the lease)"
    )
    parser.add_argument("--drain-seconds", type=float, default=5.0, help="default 5")
    parser.add_argument("--step-seconds", type=float, default=0.2, help="per step (default 0.2)")
    parser.add_argument(
        "--kill-every", type=float, default=3.0, help="seconds between kills (0: none; default 3)"
    )
    parser.add_argument(
        "--restart-seconds", type=float, default=1.0, help="replacement delay (default 1)"
    )
    parser.add_argument("--outages", default="5,30", help="outage lengths, s (default 5,30)")
    parser.add_argument("--warmup", type=float, default=30.0, help="before the first (default 30)")
    parser.add_argument("--recovery", type=float, default=20.0, help="after each (default 20)")
    parser.add_argument("--max-seconds", type=float, default=300.0, help="hard bound (default 300)")
    parser.add_argument("--seed", type=int, default=1, help="random seed for the kills")
    args = parser.parse_args()
    outages = [float(x) for x in args.outages.split(",") if x.strip()]
    rng = random.Random(args.seed)

    tmp = Path(tempfile.mkdtemp(prefix="vultrscale-outage-"))
    (tmp / "outage_handlers.py").write_text(HANDLER)
    log = tmp / "executions.log"
    log.touch()
    server = throwaway.start()
    fleet: Fleet | None = None
    try:
        url = server.url
        schema.migrate(url)
        with psycopg.connect(url, autocommit=True) as conn:
            q.enqueue(conn, [{}] * args.jobs)
        env = {k: v for k, v in os.environ.items() if not k.startswith("VULTRSCALE_")}
        env.update(
            DATABASE_URL=url,
            PYTHONPATH=os.pathsep.join([str(tmp), str(Path(__file__).resolve().parents[1])]),
            OUTAGE_LOG=str(log),
            OUTAGE_STEP_SECONDS=str(args.step_seconds),
        )
        worker_args = [
            "--app", "outage_handlers:handle",
            "--concurrency", str(args.concurrency),
            "--lease-seconds", f"{args.lease_seconds:g}",
            "--outage-seconds", f"{args.outage_seconds:g}",
            "--drain-seconds", f"{args.drain_seconds:g}",
        ]  # fmt: skip
        fleet = Fleet(url, worker_args, env, tmp, args.restart_seconds)
        for _ in range(args.workers):
            fleet.spawn()

        t0 = time.monotonic()
        deadline = t0 + args.max_seconds
        kills = 0
        next_kill = t0 + args.kill_every if args.kill_every > 0 else float("inf")
        plan = []  # (monotonic start, seconds)
        at = t0 + args.warmup
        for seconds in outages:
            plan.append((at, seconds))
            at += seconds + args.recovery
        phases: list[dict[str, float]] = []
        down_until: float | None = None
        normal_end_db = 0.0

        def db_now() -> float:
            with psycopg.connect(url, autocommit=True) as c:
                row = c.execute("SELECT extract(epoch FROM now())").fetchone()
            return float(row[0]) if row else 0.0

        def remaining() -> int:
            with psycopg.connect(url, autocommit=True) as c:
                row = c.execute("SELECT count(*) FROM jobs WHERE state <> 'succeeded'").fetchone()
            return int(row[0]) if row else -1

        start_db = db_now()
        next_check = t0

        while time.monotonic() < deadline:
            now = time.monotonic()
            fleet.tend(now)
            if now >= next_kill and fleet.procs:
                victim = rng.choice(fleet.procs)
                victim.send_signal(rng.choice([signal.SIGKILL, signal.SIGTERM]))
                kills += 1
                next_kill = now + args.kill_every
            if plan and down_until is None and now >= plan[0][0]:
                start, seconds = plan.pop(0)
                before = db_now()
                if not phases:
                    normal_end_db = before
                server.pause()
                down_until = time.monotonic() + seconds
                phases.append({"seconds": seconds, "down_at": time.monotonic(), "down_db": before})
            if down_until is not None and now >= down_until:
                server.resume()
                with psycopg.connect(url, autocommit=True) as c:
                    row = c.execute(
                        "SELECT extract(epoch FROM pg_postmaster_start_time())"
                    ).fetchone()
                phases[-1]["up_at"] = time.monotonic()
                phases[-1]["up_db"] = float(row[0]) if row else 0.0
                down_until = None
            if not plan and down_until is None and now >= next_check:
                next_check = now + 1.0
                if remaining() == 0:
                    break
            time.sleep(0.1)
        if down_until is not None:
            server.resume()
        elapsed = time.monotonic() - t0
        fleet.stop()

        with psycopg.connect(url, autocommit=True) as conn:
            finished = [
                float(r[0])
                for r in conn.execute(
                    "SELECT extract(epoch FROM finished_at) FROM jobs"
                    " WHERE state = 'succeeded' ORDER BY finished_at"
                )
            ]
            by_state = dict(
                conn.execute("SELECT state, count(*) FROM jobs GROUP BY state").fetchall()
            )
        runs = Counter(tuple(line.split()) for line in log.read_text().splitlines() if line)
        again = sum(n - 1 for n in runs.values() if n > 1)

        ramp = start_db + args.warmup / 2  # every worker has started and got going
        normal = [t for t in finished if ramp <= t < normal_end_db]
        rate = len(normal) / max(1e-9, normal_end_db - ramp)
        print(
            f"{args.jobs} jobs, {args.workers} workers x {args.concurrency}, lease "
            f"{args.lease_seconds:g} s, budget {args.outage_seconds or args.lease_seconds:g} s, "
            f"{kills} kills (every {args.kill_every:g} s), run {elapsed:.0f} s"
        )
        print(f"normal completion rate: {rate:.1f} jobs/s (warm-up, database clock)")
        bounds = [p["down_at"] for p in phases[1:]] + [float("inf")]
        for p, until in zip(phases, bounds, strict=True):
            exits = [c for t, c in fleet.exits if p["down_at"] <= t < until and c > 0]
            up = p.get("up_db", 0.0)
            recovered = _recovery_seconds(finished, up, rate)
            shown = f"{recovered:.1f} s" if recovered is not None else "not reached"
            print(
                f"outage {p['seconds']:g} s: {len(exits)} worker exit(s) with an error "
                f"(codes {sorted(Counter(exits).items())}), back to 80% of the normal rate "
                f"{shown} after the database returned"
            )
        all_errors = [c for _, c in fleet.exits if c > 0]
        print(
            f"whole run: {len(all_errors)} worker exit(s) with an error, {again} step execution(s) "
            f"repeated, jobs by state at the end {by_state}, {fleet.started} worker processes "
            "started"
        )
        lines = Counter(
            key
            for f in sorted(tmp.glob("worker-*.log"))
            for line in f.read_text(errors="replace").splitlines()
            for key in LINES
            if key in line
        )
        print(f"worker lines: {dict(lines)}; logs in {tmp}")
        return 0 if set(by_state) <= {"succeeded", "ready", "leased"} else 1
    finally:
        if fleet is not None:
            fleet.stop()
        server.stop()


def _recovery_seconds(finished: list[float], up: float, rate: float) -> float | None:
    """Seconds from ``up`` until a WINDOW_SECONDS window holds RECOVERED_SHARE of the rate."""
    need = RECOVERED_SHARE * rate * WINDOW_SECONDS
    after = [t for t in finished if t >= up]
    for i, start in enumerate(after):
        in_window = sum(1 for t in after[i:] if t < start + WINDOW_SECONDS)
        if in_window >= need:
            return start - up
    return None


if __name__ == "__main__":
    raise SystemExit(main())
