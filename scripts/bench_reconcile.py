#!/usr/bin/env python3
"""Benchmark a steady-state reconcile pass and the CLI's start-up.

1. A fleet of N (default 500) running instances on the simulator over loopback HTTP, a real
   Postgres (a scratch database on DATABASE_URL's server, else on a throwaway server), and a
   queue whose demand asks for exactly N instances: a pass that changes nothing. Prints HTTP
   requests per pass and the median wall time, against one bare paginated list of the same
   instances with httpx in the same run.
2. `vultrscale --version` start-up against `python -c "import typer"`, in the same run.

Usage: python scripts/bench_reconcile.py [--instances 500] [--passes 15] [--startups 15]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import psycopg

from vultrscale import config as config_mod
from vultrscale.clock import FakeClock
from vultrscale.db import ledger, queue, schema, throwaway
from vultrscale.db.ledger import PgStore
from vultrscale.model import InstanceState
from vultrscale.reconcile import Parts, run_pass
from vultrscale.sim.app import Simulator, Timings
from vultrscale.sim.server import start_server
from vultrscale.vultr.client import VultrClient

KEY = "bench-key-0123456789abcdef"


class NoDrain:
    def stop_many(self, targets):  # type: ignore[no-untyped-def]
        raise AssertionError("a steady-state pass must not drain")

    def is_active_many(self, targets):  # type: ignore[no-untyped-def]
        raise AssertionError("a steady-state pass must not poll drains")

    def close(self) -> None:
        pass


def bare_list(url: str) -> int:
    """Every tagged instance with a plain httpx loop; returns the requests made."""
    n = 0
    cursor = ""
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}) as http:
        while True:
            params = {"tag": "vultrscale-workers", "per_page": 500}
            if cursor:
                params["cursor"] = cursor
            body = http.get("/v2/instances", params=params).json()
            n += 1
            cursor = body["meta"]["links"]["next"]
            if not cursor:
                return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--instances", type=int, default=500)
    ap.add_argument("--passes", type=int, default=15)
    ap.add_argument("--startups", type=int, default=15)
    args = ap.parse_args()
    with (
        throwaway.given_or_throwaway(os.environ.get("DATABASE_URL")) as admin,
        throwaway.scratch_database(admin, prefix="vs_bench_") as db_url,
    ):
        bench(args, db_url)


def bench(args: argparse.Namespace, db_url: str) -> None:
    n = args.instances
    tmp = Path(tempfile.mkdtemp(prefix="vs-bench-"))
    clock = FakeClock(datetime(2026, 3, 2, 12, 0, tzinfo=UTC))
    sim = Simulator(
        KEY,
        clock=clock,
        seed=1,
        rate_limit=None,
        timings=Timings(boot_pending=1, boot_ready=1, visible_after=0, snapshot_complete=1),
    )
    http_server = start_server(sim)
    try:
        schema.migrate(db_url)
        base = sim.create_instance(region="ewr", plan="vc2-1c-2gb", os_id=2136, label="base")
        client = VultrClient(KEY, http_server.url, sleep=clock.sleep)
        snap = client.create_snapshot(base["id"], "bench")
        clock.advance(2)
        sim.tick()
        labels = []
        for i in range(n):
            label = f"worker-bench-{i:04d}"
            sim.create_instance(
                region="ewr",
                plan="vc2-1c-2gb",
                snapshot_id=snap.id,
                label=label,
                tags=["vultrscale-workers"],
            )
            labels.append(label)
        clock.advance(5)
        sim.tick()
        with psycopg.connect(db_url, autocommit=True) as conn:
            for label in labels:
                ledger.insert_intent(
                    conn,
                    fleet="workers",
                    label=label,
                    plan="vc2-1c-2gb",
                    region="ewr",
                    hourly_rate=0.0149,
                    monthly_cost=10.0,
                    host_key="ssh-ed25519 AAAAbench",
                    now=clock.now(),
                )
                queue.register_worker(conn, label, label)
            queue.enqueue(conn, [{}] * (4 * n))
        (tmp / "vultrscale.toml").write_text(
            f'[fleet]\nsnapshot_id = "{snap.id}"\n[policy]\nmax_instances = {n}\n'
            f"[budget]\nmonthly_ceiling_usd = {20.0 * n}\n"
        )
        env = {"VULTR_API_KEY": KEY, "DATABASE_URL": db_url}
        cfg = config_mod.load(tmp / "vultrscale.toml", env)
        parts = Parts(
            cloud=client,
            store=PgStore(db_url),
            drain=NoDrain(),
            clock=clock,
            keygen=lambda: ("", ""),
            render_user_data=lambda *a: "",
            rng=random.Random(1),
        )
        run_pass(cfg, parts)  # adopt nothing, move ledger rows to running, cache the price
        with psycopg.connect(db_url) as conn:
            states = {r.state for r in ledger.rows(conn, "workers")}
        assert states == {InstanceState.RUNNING}, states

        pass_times, pass_requests = [], []
        for _ in range(args.passes):
            before = len(sim.request_log)
            t0 = time.perf_counter()
            result = run_pass(cfg, parts)
            pass_times.append(time.perf_counter() - t0)
            pass_requests.append(len(sim.request_log) - before)
            assert result.exit_code == 0 and result.plan is not None, result.errors
            assert not result.plan.actions, result.plan.actions
        bare_times, bare_requests = [], 0
        for _ in range(args.passes):
            t0 = time.perf_counter()
            bare_requests = bare_list(http_server.url)
            bare_times.append(time.perf_counter() - t0)

        startup, baseline = [], []
        for _ in range(args.startups):
            t0 = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "vultrscale.cli", "--version"],
                check=True,
                capture_output=True,
            )
            startup.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", "import typer"], check=True, capture_output=True)
            baseline.append(time.perf_counter() - t0)

        mp, mb = statistics.median(pass_times), statistics.median(bare_times)
        ms, mt = statistics.median(startup), statistics.median(baseline)
        print(f"steady-state pass, {n} instances, {args.passes} passes each:")
        print(
            f"  reconcile pass : {statistics.median(pass_requests)} HTTP request(s)/pass, "
            f"median {mp * 1000:.1f} ms"
        )
        print(f"  bare list      : {bare_requests} HTTP request(s), median {mb * 1000:.1f} ms")
        print(f"  ratio pass/bare: {mp / mb:.2f}x")
        print(f"start-up, {args.startups} runs each:")
        print(f"  vultrscale --version : median {ms * 1000:.0f} ms")
        print(f"  python -c 'import typer': median {mt * 1000:.0f} ms")
        print(f"  ratio: {ms / mt:.2f}x")
    finally:
        http_server.stop()


if __name__ == "__main__":
    main()
