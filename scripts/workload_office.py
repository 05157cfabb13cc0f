#!/usr/bin/env python3
"""Write a workload CSV for `vultrscale simulate --workload PATH.csv`: an office's week.

The built-in shape `office` (`vultrscale simulate --workload office`), with the sizes of its
parts yours to set:

- a weekday surge at 09:00 UTC: reports everyone asks for when they sit down (``--surge``
  jobs arriving over 20 minutes, 2 to 6 minutes each);
- a working-day trickle from 08:00 to 18:00 (``--trickle`` jobs an hour, 20 s to 2 min);
- a nightly batch at 02:00 every day, weekends too (``--batch`` jobs at once, 1 to 3 min);
- nothing else: evenings and weekends are quiet but for the batch.

Columns: arrival_seconds,duration_seconds from Monday 00:00 UTC (the CSV's epoch in
`simulate`). Seeded: the same arguments give the same file.

Example: python scripts/workload_office.py --days 21 > office.csv
         vultrscale simulate --workload office.csv --boot-time 12m
"""

from __future__ import annotations

import argparse
import random
import sys

from vultrscale.replay import workload


def jobs(days: int, seed: int, surge: int, trickle: int, batch: int) -> list[tuple[float, float]]:
    """The office week as ``vultrscale simulate --workload office`` builds it, with its
    three parts' sizes of your choosing."""
    rng = random.Random(f"office:{seed}")
    out: list[tuple[float, float]] = []
    for day in range(days):
        out += workload.office_jobs(rng, day, surge=surge, trickle_per_hour=trickle, batch=batch)
    out.sort()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--days", type=int, default=21)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--surge", type=int, default=150, help="jobs in the 09:00 weekday surge")
    ap.add_argument("--trickle", type=int, default=12, help="jobs an hour, 08:00-18:00 weekdays")
    ap.add_argument("--batch", type=int, default=60, help="jobs in the 02:00 nightly batch")
    args = ap.parse_args()
    w = sys.stdout
    w.write("arrival_seconds,duration_seconds\n")
    for arrival, duration in jobs(args.days, args.seed, args.surge, args.trickle, args.batch):
        w.write(f"{arrival:.1f},{duration:.1f}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
