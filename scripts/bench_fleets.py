#!/usr/bin/env python3
"""Benchmark `vultrscale reconcile --loop` over a directory of fleets against one fleet.

Runs the real loop (a child process, `--log-format json`) on a directory of N fleet files
(default 10), each on a queue of its own, against the Vultr simulator over loopback HTTP and a
real Postgres (a scratch database on DATABASE_URL's server, else a throwaway server), then the
same loop on a directory of one fleet. Each fleet's queue is empty and its fleet at zero: every
pass after the first is a steady one (the offering checks are cached for 10 minutes; the list at
Vultr is all it asks). After every fleet's first pass, for --passes passes of each fleet:

- pass time: the median wall time of the fleets' steady passes (`duration_s` of their lines);
- CPU: the loop process's CPU time (user + system) over the steady window, per fleet-pass and
  per interval, and its ratio to one fleet's (linear: N times one fleet's per interval);
- requests per steady pass per fleet: the requests the simulator answered in the window over
  the passes the lines show;
- a slow fleet: the N-fleet run again with one fleet whose queue read sleeps --slow-seconds
  (a custom preset's SQL: `SELECT 0 FROM pg_sleep(S)`); the other fleets' pass times and the
  gaps between their passes, against the run without it (a slow fleet must not delay them).

Usage: python scripts/bench_fleets.py [--fleets 10] [--passes 10] [--interval 5]
                                      [--slow-seconds 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psutil

from vultrscale.core.clock import SystemClock
from vultrscale.db import schema, throwaway
from vultrscale.fake_vultr.app import Simulator, Timings
from vultrscale.fake_vultr.server import ServerHandle, start_server
from vultrscale.ssh import generate_host_key

API_KEY = "VKEY-bench-fleets-0123456789abcdefgh"


@dataclass
class Run:
    """One loop's figures over its steady window."""

    fleets: int
    slow: bool
    passes: int  # steady passes in the window, every fleet's
    window_s: float
    pass_median_s: float  # the fleets' steady passes (the slow fleet's left out)
    cpu_s: float  # the loop process's CPU over the window
    cpu_per_pass_ms: float
    cpu_per_interval_ms: float
    requests_per_pass: float
    gap_median_s: float  # between one fleet's passes (the slow fleet's left out)
    gap_max_s: float


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench_fleets.py",
        description=__doc__.split("\n\n", 1)[1].rsplit("\n\nUsage:", 1)[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--fleets", type=int, default=10, help="fleets in the directory (10)")
    p.add_argument("--passes", type=int, default=10, help="steady passes of each fleet (10)")
    p.add_argument("--interval", type=float, default=5.0, help="--interval of the loop (5 s)")
    p.add_argument(
        "--slow-seconds", type=float, default=3.0, help="the slow fleet's queue read (3 s)"
    )
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    return p.parse_args()


def _simulator() -> tuple[Simulator, ServerHandle, str]:
    sim = Simulator(
        API_KEY,
        clock=SystemClock(),
        seed=10,
        rate_limit=None,
        timings=Timings(boot_pending=1, boot_ready=1, visible_after=0, snapshot_complete=0),
    )
    server = start_server(sim)
    base = sim.create_instance(region="ewr", plan="vc2-1c-2gb", os_id=2136, label="base")
    snap = httpx.post(
        f"{server.url}/v2/snapshots",
        json={"instance_id": base["id"]},
        headers={"Authorization": f"Bearer {API_KEY}"},
    ).json()["snapshot"]["id"]
    return sim, server, str(snap)


def _directory(root: Path, n: int, snapshot: str, key: Path, slow: float | None) -> Path:
    folder = root / f"fleets-{n}{'-slow' if slow else ''}"
    folder.mkdir()
    for i in range(n):
        name = f"f{i:02d}"
        queue = f'[queue]\nqueue = "{name}"\n'
        if slow and i == 0:  # its queue read sleeps: a slow fleet
            queue = (
                f'[queue]\npreset = "custom"\nready_sql = "SELECT 0 FROM pg_sleep({slow:g})"\n'
                'in_flight_sql = "SELECT 0"\noldest_ready_seconds_sql = "SELECT 0"\n'
            )
        (folder / f"{name}.toml").write_text(
            f'[fleet]\nname = "{name}"\ntag = "vs-{name}"\nsnapshot_id = "{snapshot}"\n'
            f'ssh_key = "{key}"\n[worker]\nqueue = "{name}"\n{queue}'
            '[policy]\nforecast.mode = "off"\n'
        )
    return folder


def _lines(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("msg") == "pass" and not rec.get("lock_held"):
            out.append(rec)
    return out


def _when(rec: dict[str, Any]) -> float:
    return datetime.fromisoformat(rec["time"].replace("Z", "+00:00")).timestamp()


def _loop(
    folder: Path, env: dict[str, str], sim: Simulator, n: int, args: argparse.Namespace, slow: bool
) -> Run:
    log = folder.parent / f"{folder.name}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vultrscale", "reconcile", "--loop"]
            + ["--interval", f"{args.interval:g}s", "--log-format", "json"],
            env={**env, "VULTRSCALE_CONFIG": str(folder)},
            stdout=out,
            stderr=subprocess.DEVNULL,
        )
    me = psutil.Process(proc.pid)
    try:
        deadline = time.monotonic() + 60 + args.interval * 2
        while len({r["fleet"] for r in _lines(log)}) < n:  # every fleet's first pass
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.05)
        cpu0, requests0, t0 = sum(me.cpu_times()[:2]), len(sim.request_log), time.monotonic()
        firsts = len(_lines(log))
        want = firsts + n * args.passes
        deadline = time.monotonic() + args.interval * (args.passes + 3) + 30
        while len(_lines(log)) < want:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.05)
        cpu1, requests1, t1 = sum(me.cpu_times()[:2]), len(sim.request_log), time.monotonic()
    finally:
        proc.terminate()
        proc.wait(30)
    lines = _lines(log)
    steady = lines[firsts:want]
    fast = [r for r in steady if not (slow and r["fleet"] == "f00")]
    gaps: list[float] = []
    for fleet in {r["fleet"] for r in fast}:
        times = sorted(_when(r) for r in lines if r["fleet"] == fleet)
        gaps += [b - a for a, b in zip(times, times[1:], strict=False)]
    window = t1 - t0
    cpu = cpu1 - cpu0
    return Run(
        fleets=n,
        slow=slow,
        passes=len(steady),
        window_s=round(window, 2),
        pass_median_s=round(statistics.median(r["duration_s"] for r in fast), 4),
        cpu_s=round(cpu, 3),
        cpu_per_pass_ms=round(1000 * cpu / len(steady), 2),
        cpu_per_interval_ms=round(1000 * cpu / (window / args.interval), 2),
        requests_per_pass=round((requests1 - requests0) / len(steady), 3),
        gap_median_s=round(statistics.median(gaps), 3) if gaps else 0.0,
        gap_max_s=round(max(gaps), 3) if gaps else 0.0,
    )


def main() -> int:
    args = _args()
    with ExitStack() as stack:
        sim, server, snapshot = _simulator()
        stack.callback(server.stop)
        given = os.environ.get("DATABASE_URL")
        admin = stack.enter_context(throwaway.given_or_throwaway(given))
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench_fleets_")))
        private, public = generate_host_key()
        key = root / "scaler_key"
        key.write_text(private)
        key.chmod(0o600)
        (root / "scaler_key.pub").write_text(public + "\n")
        runs = []
        for n, slow in ((1, False), (args.fleets, False), (args.fleets, True)):
            url = stack.enter_context(throwaway.scratch_database(admin))
            schema.migrate(url)
            env = {
                **os.environ,
                "VULTR_API_KEY": API_KEY,
                "VULTR_API_URL": server.url,
                "DATABASE_URL": url,
                "WORKER_DATABASE_URL": url,
            }
            folder = _directory(root, n, snapshot, key, args.slow_seconds if slow else None)
            runs.append(_loop(folder, env, sim, n, args, slow))
    one, many, slowed = runs
    figures = {
        "runs": [asdict(r) for r in runs],
        "cpu_per_interval_ratio": round(many.cpu_per_interval_ms / one.cpu_per_interval_ms, 2),
        "pass_time_ratio": round(many.pass_median_s / one.pass_median_s, 2),
        "slow_fleet_pass_time_ratio": round(slowed.pass_median_s / many.pass_median_s, 2),
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    print(f"reconcile --loop --interval {args.interval:g}s, {args.passes} steady passes a fleet")
    head = (
        f"{'run':<22}{'passes':>7}{'pass med s':>11}{'CPU/pass ms':>12}"
        f"{'CPU/interval ms':>16}{'req/pass':>9}{'gap med s':>10}{'gap max s':>10}"
    )
    print(head)
    for r in runs:
        name = f"{r.fleets} fleet(s){', one slow' if r.slow else ''}"
        print(
            f"{name:<22}{r.passes:>7}{r.pass_median_s:>11.4f}{r.cpu_per_pass_ms:>12.2f}"
            f"{r.cpu_per_interval_ms:>16.2f}{r.requests_per_pass:>9.3f}{r.gap_median_s:>10.3f}"
            f"{r.gap_max_s:>10.3f}"
        )
    print(
        f"{args.fleets} fleets against 1: CPU per interval x{figures['cpu_per_interval_ratio']} "
        f"(linear: x{args.fleets}), median pass time x{figures['pass_time_ratio']}; with one "
        f"fleet's queue read {args.slow_seconds:g}s slow, the others' median pass time "
        f"x{figures['slow_fleet_pass_time_ratio']} and their gaps {slowed.gap_median_s:g}s "
        f"(max {slowed.gap_max_s:g}s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
