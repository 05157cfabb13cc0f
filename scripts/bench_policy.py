#!/usr/bin/env python3
"""Benchmark: the policy's defaults on the workload suite, against the depth rule, KEDA-style,
hindsight and one always-on instance (vultrscale/replay/suite.py says what a cell is).

Prints one line per cell (cost in dollars and p50/p95 wait of each row, jobs lost) and then,
for each candidate, the summary the defaults are chosen by (docs/policy.md "How the defaults
were chosen"): the cells where it is dominated by the depth rule or by KEDA-style (the other
both cheaper and quicker at p95), the cells where it is dearer than the depth rule or its
p95 is past 1.25x (or 60 s above) the depth rule's, its median cost and worst p95 against the
depth rule, its median cost against hindsight, the jobs it lost and the share of jobs that
waited past target_wait plus the boot time (the median cell's, and the largest where no cap
or budget held the fleet back).

The candidate is the defaults; --set changes one of its settings, --candidates names several
(a TOML file of tables of dotted keys, as `simulate --variants` reads). Candidates of one run
differ in their policy only: the baselines replay one fleet. The whole suite (10
workloads x 3 seeds x boots of 1, 4 and 12 minutes, 14 days each) takes about 10 minutes on
2 cores; --seeds 0 --boots 12m runs a corner of it.

Examples:
  python scripts/bench_policy.py
  python scripts/bench_policy.py --set policy.target_wait=0s --seeds 0 --quiet
  python scripts/bench_policy.py --candidates scripts/variants/defaults.toml --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import tomllib
from dataclasses import asdict
from pathlib import Path

from vultrscale import config as config_mod
from vultrscale.replay import suite


def _settings(items: list[str]) -> dict[str, object]:
    out: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set {item!r}: write KEY=VALUE, e.g. policy.target_wait=0s")
        out[key.strip()] = tomllib.loads(f"v = {value}")["v"] if value[:1] in "[{" else value
    return out


def _candidates(path: Path) -> dict[str, dict[str, object]]:
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    out: dict[str, dict[str, object]] = {}
    for name, table in data.items():
        flat: dict[str, object] = {}

        def walk(prefix: str, t: dict[str, object], flat: dict[str, object] = flat) -> None:
            for k, v in t.items():
                full = f"{prefix}.{k}" if prefix else k
                if isinstance(v, dict) and full not in config_mod.setting_keys():
                    walk(full, v)
                else:
                    flat[full] = v

        walk("", table)
        out[name] = flat
    return out


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--days", type=int, default=suite.DAYS)
    ap.add_argument("--seeds", default=",".join(map(str, suite.SEEDS)))
    ap.add_argument("--boots", default="1m,4m,12m", help="boot times (create to worker up)")
    ap.add_argument(
        "--workloads", default="", help="comma-separated names (default: all of the suite)"
    )
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--candidates", type=Path, help="TOML: one table of settings per candidate")
    ap.add_argument("--workers", type=int, default=2, help="processes (default 2)")
    ap.add_argument("--json", type=Path, help="also write every cell and summary here")
    ap.add_argument(
        "--plot",
        type=Path,
        metavar="PATH.png",
        help="also draw each cell's cost and p95 wait against the depth rule's (matplotlib)",
    )
    ap.add_argument("--quiet", action="store_true", help="the summary only")
    args = ap.parse_args()

    wanted = [w for w in args.workloads.split(",") if w]
    known = {w.name: w for w in suite.WORKLOADS}
    if unknown := [w for w in wanted if w not in known]:
        raise SystemExit(f"unknown workload(s) {unknown}; the suite has {sorted(known)}")
    grid = suite.cells(
        [known[w] for w in wanted] or suite.WORKLOADS,
        [int(s) for s in args.seeds.split(",")],
        [config_mod.parse_duration(b, "--boots").total_seconds() for b in args.boots.split(",")],
    )
    candidates = {"default": _settings(args.set)}
    if args.candidates:
        candidates = _candidates(args.candidates)
    started = time.perf_counter()

    def progress(done: int, total: int) -> None:
        if sys.stderr.isatty():
            print(f"\r{done}/{total} replays", end="", file=sys.stderr, flush=True)

    results = suite.run(candidates, grid, days=args.days, workers=args.workers, progress=progress)
    took = time.perf_counter() - started
    if sys.stderr.isatty():
        print(file=sys.stderr)
    rows = [*candidates, *suite.BASELINES]
    if not args.quiet:
        head = f"{'cell':22s}" + "".join(f"{r[:16]:>22s}" for r in rows)
        print(head)
        print(f"{'':22s}" + "".join(f"{'$  p50/p95 s':>22s}" for _ in rows))
        for res in results:
            line = f"{res.cell.name:22s}"
            for r in rows:
                o = res.rows[r]
                cell = f"{o.cost:.2f} {o.p50:.0f}/{o.p95:.0f}" + (f" L{o.lost}" if o.lost else "")
                line += f"{cell:>22s}"
            print(line)
        print()
    summaries = [suite.summarize(results, name) for name in candidates]
    for summary in summaries:
        print(f"{summary.name}: {len(results)} cells, {len(rows)} rows each")
        for line in _summary_lines(summary):
            print(f"  {line}")
    print(f"{len(results) * len(rows)} replays in {took:.0f} s")
    if args.plot:
        _plot(results, [*candidates, "keda", "hindsight"], args.plot)
        print(f"plot written to {args.plot}")
    if args.json:
        doc = {
            "cells": [
                {"cell": r.cell.name, "rows": {k: asdict(v) for k, v in r.rows.items()}}
                for r in results
            ],
            "summaries": [asdict(s) for s in summaries],
            "candidates": candidates,
            "seconds": round(took, 1),
        }
        args.json.write_text(json.dumps(doc, indent=1, default=str), encoding="utf-8")
    return 0


def _plot(results: list[suite.CellResult], rows: list[str], path: Path) -> None:
    """Each cell of each row as a point: its cost over the depth rule's (x) and its p95 wait
    over the depth rule's (y, waits under a minute counted as one), on log axes; the
    depth rule is (1, 1), and the bound of issue 32 the box left of 1 and under 1.25."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5), dpi=120)
    markers = "os^Dv<>"
    for k, row in enumerate(rows):
        xs = [r.rows[row].cost / max(r.rows["depth"].cost, 1e-9) for r in results]
        ys = [suite.p95_vs(r.rows[row], r.rows["depth"]) for r in results]
        ax.scatter(xs, ys, s=18, marker=markers[k % len(markers)], alpha=0.7, label=row)
    ax.axvline(1.0, color="grey", lw=0.8)
    ax.axhline(suite.WAIT_FACTOR, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("cost / the depth rule's")
    ax.set_ylabel("p95 wait / the depth rule's (under 60 s counted as 60 s)")
    ax.set_title(f"the workload suite: {len(results)} cells (workload x seed x boot time)")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


def _summary_lines(s: suite.Summary) -> list[str]:
    boots = ", ".join(f"{b} {v:.2f}" for b, v in s.by_boot.items())
    counted = (
        ("dominated by the depth rule", s.dominated_by_depth),
        ("dominated by KEDA-style", s.dominated_by_keda),
        ("dearer than the depth rule", s.dearer_than_depth),
        ("p95 past 1.25x or +60 s of the depth rule's", s.wait_not_close),
    )
    return [
        *(f"{what}: {len(cells)} {_few(cells)}".rstrip() for what, cells in counted),
        f"median cost vs the depth rule: {s.median_cost_vs_depth:.2f} (by boot: {boots})",
        f"worst p95 vs the depth rule: {s.worst_p95_vs_depth:.2f} ({s.worst_p95_cell})",
        f"median cost vs hindsight: {s.median_cost_vs_hindsight:.2f}",
        f"jobs lost: {s.lost}",
        f"jobs past target_wait + boot: median {s.median_over_target:.1%} a cell, "
        + (
            f"at most {s.worst_over_target:.1%} where no cap or budget held ({s.worst_over_cell})"
            if s.worst_over_cell
            else "none where no cap or budget held"
        ),
        f"holds (none of the above, nothing lost): {'yes' if s.holds else 'no'}",
    ]


def _few(cells: tuple[str, ...]) -> str:
    if not cells:
        return ""
    return "(" + ", ".join(cells[:4]) + (", ..." if len(cells) > 4 else "") + ")"


if __name__ == "__main__":
    raise SystemExit(main())
