#!/usr/bin/env python3
"""Benchmark: what each of vultrscale's reaches into a library's private parts still saves.

Each is kept only while this shows it pays; the library's public way is taken otherwise
(issue 33). Every figure is a fresh Python process, the two ways run in turn, ``--runs``
times each, medians and their ratio printed:

- lean-coercion: `vultrscale status --help` as the CLI runs it (``cli._lean_coercion``
  replaces Typer's private ``_TyperParameter.get_runtime_param`` so a plain flag is not
  coerced through pydantic), against the same with Typer's own method put back;
- httpx-without-cli: ``import vultrscale.vultr._http`` (httpx imported without its private
  ``httpx._main`` command-line module) against a plain ``import httpx``;
- pguri: masking a ``postgresql://`` URL's password on an error path with ``vultrscale.pguri``
  (libpq's URI grammar in Python) against psycopg's public ``conninfo_to_dict``.

Example: python scripts/bench_library_patches.py --runs 15
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

URL = "postgresql://scaler:s3cret@db.internal:5432/jobs?sslmode=require"

CASES: dict[str, tuple[str, str]] = {
    "lean-coercion": (
        "import sys; sys.argv = ['vultrscale', 'status', '--help']\n"
        "from vultrscale.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n",
        "import sys; sys.argv = ['vultrscale', 'status', '--help']\n"
        "import typer.core\n"
        "own = typer.core._TyperParameter.get_runtime_param\n"
        "from vultrscale.cli import main\n"
        "typer.core._TyperParameter.get_runtime_param = own\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n",
    ),
    "httpx-without-cli": (
        "import vultrscale.vultr._http\n",
        "import httpx\n",
    ),
    "pguri": (
        f"from vultrscale import pguri\npguri.read_uri({URL!r})\n",
        f"from psycopg.conninfo import conninfo_to_dict\nconninfo_to_dict({URL!r})\n",
    ),
}


def _time(code: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, stdout=subprocess.DEVNULL, timeout=120)
    return time.perf_counter() - started


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--runs", type=int, default=11, help="processes per way (default 11)")
    ap.add_argument("--only", choices=sorted(CASES), help="one case")
    args = ap.parse_args()
    print(
        f"{'patch':20s} {'with (ms)':>10s} {'without (ms)':>13s} {'saves (ms)':>11s} {'ratio':>6s}"
    )
    for name, (with_patch, public_way) in CASES.items():
        if args.only and name != args.only:
            continue
        _time(with_patch), _time(public_way)  # warm the file cache
        a, b = [], []
        for _ in range(args.runs):
            a.append(_time(with_patch))
            b.append(_time(public_way))
        ma, mb = statistics.median(a) * 1000, statistics.median(b) * 1000
        print(f"{name:20s} {ma:10.0f} {mb:13.0f} {mb - ma:11.0f} {ma / mb:6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
