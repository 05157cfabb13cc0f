#!/usr/bin/env python3
"""Benchmark: list a tagged fleet through VultrClient against a bare httpx loop.

Starts the Vultr simulator over HTTP on 127.0.0.1 with N tagged instances (plus some untagged
ones, rate limit off), then, in the same run and alternating the order each repetition, lists
the tagged instances (a) with ``VultrClient.list_instances(tag=...)`` and (b) with a bare
``httpx.Client`` loop that fetches the same pages (same ``per_page``, following
``meta.links.next``). Prints the requests each made, the median wall time in ms and the ratio
client/bare: the cost of retries, error mapping, redaction and model parsing. Both clients are
warm (connections open, one unmeasured listing each) before the timed repetitions. --json ends
the output with the figures as one JSON object (for scripts/bench).

Example: python scripts/bench_client.py --instances 1000 --repeat 15
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import httpx

from vultrscale.core.clock import SystemClock
from vultrscale.fake_vultr import Simulator, start_server
from vultrscale.vultr.client import PER_PAGE, VultrClient

KEY = "bench-key-0123456789abcdef"
TAG = "bench-fleet"


def bare_list(http: httpx.Client, per_page: int) -> tuple[list[str], int]:
    """Ids of the tagged instances and the number of requests, with nothing but httpx."""
    ids: list[str] = []
    requests = 0
    params: dict[str, Any] = {"tag": TAG, "per_page": per_page}
    while True:
        resp = http.get("/v2/instances", params=params)
        requests += 1
        resp.raise_for_status()
        body = resp.json()
        ids.extend(i["id"] for i in body["instances"])
        cursor = body["meta"]["links"]["next"]
        if not cursor:
            return ids, requests
        params["cursor"] = cursor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", type=int, default=1000, help="tagged instances (1000)")
    parser.add_argument("--untagged", type=int, default=100, help="other instances (100)")
    parser.add_argument("--repeat", type=int, default=15, help="timed repetitions (15)")
    parser.add_argument("--seed", type=int, default=0, help="simulator seed (0)")
    parser.add_argument("--json", action="store_true", help="end with the figures as JSON")
    args = parser.parse_args()
    if args.repeat < 1 or args.instances < 1:
        parser.error("--repeat and --instances must be at least 1")

    sim = Simulator(KEY, clock=SystemClock(), seed=args.seed, rate_limit=None)
    expected = [
        sim.create_instance(
            region="ewr", plan="vc2-1c-1gb", os_id=2284, label=f"w-{n}", tags=[TAG]
        )["id"]
        for n in range(args.instances)
    ]
    for n in range(args.untagged):
        sim.create_instance(region="ewr", plan="vc2-1c-1gb", os_id=2284, label=f"o-{n}")

    handle = start_server(sim)
    times: dict[str, list[float]] = {"client": [], "bare": []}
    requests: dict[str, int] = {}
    try:
        with (
            VultrClient(KEY, handle.url) as client,
            httpx.Client(
                base_url=handle.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=10
            ) as http,
        ):

            def run_client() -> tuple[list[str], int]:
                before = client.requests_made
                ids = [i.id for i in client.list_instances(tag=TAG)]
                return ids, client.requests_made - before

            runners = {"client": run_client, "bare": lambda: bare_list(http, PER_PAGE)}
            for name, run in runners.items():  # warm-up: connections, imports, caches
                ids, _ = run()
                assert ids == expected, f"{name} listed {len(ids)} of {len(expected)}"
            for rep in range(args.repeat):
                order = ["client", "bare"] if rep % 2 == 0 else ["bare", "client"]
                for name in order:
                    log_before = len(sim.request_log)
                    started = time.perf_counter()
                    ids, made = runners[name]()
                    times[name].append((time.perf_counter() - started) * 1000)
                    assert ids == expected
                    assert made == len(sim.request_log) - log_before  # the server agrees
                    requests[name] = made
    finally:
        handle.stop()

    med = {name: statistics.median(values) for name, values in times.items()}
    print(
        f"compares: VultrClient.list_instances against a bare httpx loop over the same pages, "
        f"both on warm clients, {args.repeat} alternated repetitions"
    )
    print(
        f"listing {args.instances} tagged of {args.instances + args.untagged} instances, "
        f"per_page={PER_PAGE}, {args.repeat} repetitions, simulator over HTTP on 127.0.0.1"
    )
    for name in ("client", "bare"):
        print(
            f"  {name:<7} requests per listing: {requests[name]}   "
            f"median {med[name]:7.1f} ms   (min {min(times[name]):.1f}, max {max(times[name]):.1f})"
        )
    print(f"  ratio client/bare (median): {med['client'] / med['bare']:.2f}")
    if args.json:
        figures = {
            "client_ms": med["client"],
            "bare_ms": med["bare"],
            "client_requests": requests["client"],
            "bare_requests": requests["bare"],
        }
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
