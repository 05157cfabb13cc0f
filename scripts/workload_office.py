#!/usr/bin/env python3
"""Write a workload CSV for `vultrscale simulate --workload PATH.csv`: an office's week.

Not one of the built-in shapes, so a policy tuned on those is tried on something else:

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

DAY = 86_400.0
HOUR = 3_600.0


def jobs(days: int, seed: int, surge: int, trickle: int, batch: int) -> list[tuple[float, float]]:
    rng = random.Random(f"office:{seed}")
    out: list[tuple[float, float]] = []
    for day in range(days):
        start = day * DAY
        weekday = day % 7 < 5  # day 0 is a Monday
        for _ in range(batch):
            out.append((start + 2 * HOUR + rng.uniform(0, 60), rng.uniform(60, 180)))
        if not weekday:
            continue
        for _ in range(surge):
            out.append((start + 9 * HOUR + rng.uniform(0, 20 * 60), rng.uniform(120, 360)))
        t = start + 8 * HOUR
        while True:
            t += rng.expovariate(trickle / HOUR)
            if t >= start + 18 * HOUR:
                break
            out.append((t, rng.uniform(20, 120)))
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
