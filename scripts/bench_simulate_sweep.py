#!/usr/bin/env python3
"""Benchmark: how long a `vultrscale simulate --sweep` of 24 variants takes over a month.

Generates the workload once (default: 30 days of ``bursty-day`` at 10,000 jobs per weekday,
seed 0), then replays vultrscale once per variant of a 24-variant grid
(policy.idle_before_scale_down 90s,5m,15m,30m x policy.scale_down_cooldown 2m,5m,10m x
policy.billing_hour_aware true,false), ``--workers`` processes side by side, as the command
does. Prints the sweep's wall time, the CPU time of its processes, and the slowest and median
single replay (each timed in the process that ran it, alongside the others). Targets: the
sweep under 60 s, one 30-day replay under 10 s, on a 2-core machine. On a machine others
share, the CPU time is the fairer number: divided by the cores, it is what the wall time would
be with the cores to itself.

Example: python scripts/bench_simulate_sweep.py --workers 2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time

from vultrscale.config import Config
from vultrscale.replay import compare, workload

GRID = (
    ("policy.idle_before_scale_down", ["90s", "5m", "15m", "30m"]),
    ("policy.scale_down_cooldown", ["2m", "5m", "10m"]),
    ("policy.billing_hour_aware", ["true", "false"]),
)


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(
        prog="bench_simulate_sweep.py", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--workload", default="bursty-day", choices=workload.SHAPES)
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--jobs-per-day", type=int, default=10_000)
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="end with the figures as one JSON line")
    args = ap.parse_args()

    cfg = Config()
    trace = workload.shape(
        args.workload, days=args.days, seed=args.seed, jobs_per_day=args.jobs_per_day
    )
    variants = compare.sweep_configs(
        [(k, v) for k, v in GRID], None, {}, current=cfg
    )  # the defaults, varied: no config file is read
    setup = compare.Setup(seed=args.seed, workers=args.workers)
    started, cpu_started = time.perf_counter(), _cpu()
    result = compare.compare(
        trace,
        cfg,
        setup,
        ("vultrscale",),
        price=compare.plan_price(cfg),
        variants=variants,
    )
    wall = time.perf_counter() - started
    cpu = _cpu() - cpu_started
    single = [r.replay_seconds for r in result.results]
    doc = {
        "workload": trace.note,
        "jobs": len(trace),
        "variants": len(variants),
        "workers": args.workers,
        "cores": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "sweep_wall_s": round(wall, 2),
        "sweep_cpu_s": round(cpu, 2),
        "replay_wall_s_median": round(statistics.median(single), 2) if single else None,
        "replay_wall_s_max": round(max(single), 2) if single else None,
        "lost": sum(r.lost for r in result.results),
    }
    print(
        f"{doc['workload']}: {doc['jobs']} jobs, {doc['variants']} variants on "
        f"{doc['workers']} process(es): {doc['sweep_wall_s']} s wall, {doc['sweep_cpu_s']} s "
        f"CPU (target: 60 s wall); load average {doc['load_average']} on {doc['cores']} cores"
    )
    if single:
        print(
            f"one replay, as the sweep ran it: median {doc['replay_wall_s_median']} s, slowest "
            f"{doc['replay_wall_s_max']} s wall (target: 10 s)"
        )
    if args.json:
        print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
