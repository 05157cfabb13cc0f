#!/usr/bin/env python3
"""Benchmark a steady-state reconcile pass and the CLI's start-up.

1. A fleet of N (default 500) running instances on the simulator over loopback HTTP (served
   from a child process once set up, as Vultr is another machine), a real
   Postgres (a scratch database on DATABASE_URL's server, else on a throwaway server; analyzed
   once set up, as autovacuum keeps a live one), and a queue whose demand asks for exactly N
   instances: a pass that changes nothing. Prints HTTP
   requests per pass and the median wall time of the parts `vultrscale reconcile --loop` builds
   (wiring.build_parts: one kept Postgres connection, the list asked in a thread while Postgres
   is read), against one bare paginated list of the same
   instances with a warm httpx client (connection open, as the pass's client is), timed
   alternately with the passes in the same run.
   The pass is timed as `reconcile` runs it: with its preflight (the scaler's key checked
   before anything changes), once with an ed25519 key and once with an RSA-4096 key (paramiko
   parses RSA keys slowly), CPU time per pass beside the wall time.
   Then the same pass one-shot, as cron runs it (`vultrscale reconcile` in a fresh process,
   each key), its CPU against `python -c "import httpx, psycopg"` (--oneshots rounds); then an
   hour of cron passes a minute apart, each a fresh client and cache, the clock moving past the
   plan check's time-to-live: HTTP requests per pass averaged over the hour.
   Every round runs its steps in a rotated order, so none always runs first or last.
   The fresh processes run on vultrscale's compiled bytecode (written first, as installing
   the wheel writes it), whatever PYTHONDONTWRITEBYTECODE says.
2. Start-up of `vultrscale --version`, `status --help`, `reconcile --help` and a
   `reconcile --dry-run` that fails on a missing config, each against
   `python -c "import typer"`, alternated in the same run.

--memory times the same steady pass on the in-memory ports (vultrscale.memory: no Postgres, no
HTTP), for each fleet size in --instances (default 3,50): the pure core's own cost per pass, as
the what-if simulator replays it. Batches of passes, the median batch's time per pass.

--floor adds a diagnostic, not a figure of the product: the same pass, timed alternately with
the bare list again, first with the pure core's decision replayed (``reconcile.decide`` answers
what it answered the pass before, at no cost), then with the list's 500 objects also replayed
(``VInstance.from_api`` looks the instance up instead of parsing it; the request and its JSON
still happen). It says how much of the gap to the bare list the core and the parse make, and
what is left without them: the I/O itself, on 2 cores shared with the simulator and Postgres.
And it times the bound, the other way round: only what no pass can skip beyond the bare list
(its own client's list, parse included, and the pure core on that listing), with none of the
pass's Postgres I/O, against the bare list: the least any pass that lists and decides costs here.

--profile FILE writes a cProfile of the timed passes (read it with `python -m pstats FILE`)
and prints the top functions by cumulative time. --json prints the figures as one JSON object
(for scripts/bench).

Usage: python scripts/bench_reconcile.py [--instances 500] [--passes 15] [--startups 15]
                                        [--oneshots 5] [--floor]
       python scripts/bench_reconcile.py --memory [--instances 3,50] [--passes 2000]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import dataclasses
import json
import multiprocessing
import os
import pstats
import random
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from unittest import mock

import httpx
import psycopg

from vultrscale import config as config_mod
from vultrscale import read, reconcile
from vultrscale.config import Offering
from vultrscale.core.clock import FakeClock
from vultrscale.core.model import InstanceState, PlanPrice, Signals, WorkerView
from vultrscale.db import ledger, queue, schema, throwaway
from vultrscale.fake_vultr.app import Simulator, Timings
from vultrscale.fake_vultr.server import start_server
from vultrscale.memory import (
    SNAPSHOT,
    MemoryCloud,
    MemoryDrain,
    MemoryLedger,
    MemorySignals,
    memory_parts,
)
from vultrscale.ports import PassCache
from vultrscale.reconcile import Parts, run_pass
from vultrscale.rules import lifecycle
from vultrscale.rules.offerings import Choice
from vultrscale.rules.readings import Readings
from vultrscale.vultr.client import VultrClient
from vultrscale.wiring import build_parts

KEY = "bench-key-0123456789abcdef"


class NoDrain:
    def stop_many(self, targets):  # type: ignore[no-untyped-def]
        raise AssertionError("a steady-state pass must not drain")

    def is_active_many(self, targets):  # type: ignore[no-untyped-def]
        raise AssertionError("a steady-state pass must not poll drains")

    def close(self) -> None:
        pass


def bare_list(http: httpx.Client) -> int:
    """Every tagged instance with a plain httpx loop on a warm client; returns the requests."""
    n = 0
    cursor = ""
    while True:
        params: dict[str, str | int] = {"tag": "vultrscale-workers", "per_page": 500}
        if cursor:
            params["cursor"] = cursor
        body = http.get("/v2/instances", params=params).json()
        n += 1
        cursor = body["meta"]["links"]["next"]
        if not cursor:
            return n


class Served:
    """The simulator served from a child process, as Vultr is another machine: in this
    process its request handling would hold the interpreter lock the pass needs, and a pass
    that waits on the network for one thing while it reads another would be timed as if the
    server ran on its own CPU time. ``requests`` counts what it answered (shared memory)."""

    def __init__(self, sim: Simulator, port: int) -> None:
        self._count = multiprocessing.Value("q", 0, lock=False)
        self.pid = os.fork()
        if self.pid == 0:  # the child: serve until killed, never return into the bench
            try:
                handle, count = sim.handle, self._count

                def counted(req):  # type: ignore[no-untyped-def]
                    count.value += 1
                    return handle(req)

                sim.handle = counted  # type: ignore[method-assign]
                start_server(sim, port=port)
                while True:
                    time.sleep(3600)
            finally:
                os._exit(0)

    @property
    def requests(self) -> int:
        return int(self._count.value)

    def stop(self) -> None:
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--instances", default=None, help="fleet size(s), comma-separated")
    ap.add_argument("--passes", type=int, default=None, help="timed passes (per size)")
    ap.add_argument("--memory", action="store_true", help="time the pass on in-memory ports")
    ap.add_argument("--startups", type=int, default=15, help="0 skips the start-up figure")
    ap.add_argument("--oneshots", type=int, default=5, help="0 skips the one-shot CPU figure")
    ap.add_argument(
        "--cron-minutes", type=int, default=60, help="minutes of cron passes (0 skips them)"
    )
    ap.add_argument("--profile", type=Path, default=None, help="write a cProfile of the passes")
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    ap.add_argument("--floor", action="store_true", help="also time the pass without core/parse")
    args = ap.parse_args()
    sizes = [int(n) for n in (args.instances or ("3,50" if args.memory else "500")).split(",")]
    if args.memory:
        bench_memory(sizes, args.passes or 2000, args.profile, as_json=args.json)
        return
    args.instances, args.passes = sizes[0], args.passes or 15
    with (
        throwaway.given_or_throwaway(os.environ.get("DATABASE_URL")) as admin,
        throwaway.scratch_database(admin, prefix="vs_bench_") as db_url,
    ):
        bench(args, db_url)


def bench(args: argparse.Namespace, db_url: str) -> None:
    n = args.instances
    tmp = Path(tempfile.mkdtemp(prefix="vs-bench-"))
    # Today's time, so that the one-shot processes (on the system clock) find the fleet as the
    # timed passes do; whole seconds, as the ledger keeps them.
    clock = FakeClock(datetime.now(UTC).replace(microsecond=0))
    sim = Simulator(
        KEY,
        clock=clock,
        seed=1,
        rate_limit=None,
        timings=Timings(boot_pending=1, boot_ready=1, visible_after=0, snapshot_complete=1),
    )
    http_server = start_server(sim)
    stop_server = http_server.stop
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
        price = PlanPrice("vc2-1c-2gb", 10.0, 0.0149)
        choice, now = Choice(Offering("ewr", "vc2-1c-2gb"), price, n), clock.now()
        with psycopg.connect(db_url, autocommit=True) as conn:
            for label in labels:
                ledger.insert_intent(conn, "workers", label, choice, "ssh-ed25519 AAAAbench", now)
                queue.register_worker(conn, label, label)
            queue.enqueue(conn, [{}] * (4 * n))
        env = {
            "VULTR_API_KEY": KEY,
            "VULTR_API_URL": http_server.url,
            "DATABASE_URL": db_url,
            "WORKER_DATABASE_URL": db_url,
        }
        keys = scaler_keys(tmp)
        tomls, cfgs = {}, {}
        for kind, key in keys.items():
            tomls[kind] = tmp / f"vultrscale-{kind}.toml"
            tomls[kind].write_text(
                f'[fleet]\nsnapshot_id = "{snap.id}"\nssh_key = "{key}"\n'
                f"[policy]\nmax_instances = {n}\n[budget]\nmonthly_ceiling_usd = {20.0 * n}\n"
            )
            cfgs[kind] = config_mod.load(tomls[kind], env)
        http_server.stop()  # set up; from now on the simulator answers from its own process
        served = Served(sim, http_server.port)
        stop_server = served.stop
        # The parts `vultrscale reconcile` builds (its client, its store, its preflight: the
        # scaler's key checked before each pass changes anything), with the bench's clock and no
        # SSH: a steady pass drains nothing.
        by_key = {
            kind: dataclasses.replace(
                build_parts(c),
                drain=NoDrain(),
                clock=clock,
                keygen=lambda: ("", ""),
                render_user_data=lambda *a: "",
                rng=random.Random(1),
            )
            for kind, c in cfgs.items()
        }
        cfg, parts = cfgs["ed25519"], by_key["ed25519"]
        run_pass(cfg, parts)  # adopt nothing, move ledger rows to running, cache the price
        with psycopg.connect(db_url, autocommit=True) as conn:
            states = {r.state for r in ledger.rows(conn, "workers")}
            # A fleet that has been running: autovacuum has analyzed its tables (it does within
            # a minute of this many changes). Never analyzed, the planner takes each table for
            # one row and nests loops: the workers' read costs 5-10 ms instead of 2.
            conn.execute("ANALYZE")
        assert states == {InstanceState.RUNNING}, states

        http = httpx.Client(base_url=http_server.url, headers={"Authorization": f"Bearer {KEY}"})
        bare_list(http)  # warm: the connection is open, as the pass's client's is
        least = bound(cfg, parts) if args.floor else None
        profiler = cProfile.Profile() if args.profile else None
        pass_requests: list[int] = []
        bare_requests = 0

        def steady(kind: str) -> Callable[[], object]:
            def one() -> None:
                before = served.requests
                if profiler is not None and kind == "ed25519":
                    profiler.enable()
                result = run_pass(cfgs[kind], by_key[kind])
                if profiler is not None:
                    profiler.disable()
                pass_requests.append(served.requests - before)
                assert result.exit_code == 0 and result.plan is not None, result.errors
                assert not result.plan.actions, result.plan.actions

            return one

        def bare() -> None:
            nonlocal bare_requests
            bare_requests = bare_list(http)

        steps: dict[str, Callable[[], object]] = {f"pass {k}": steady(k) for k in keys}
        steps["bare"] = bare
        if least is not None:  # same moments, same baseline
            steps["bound"] = least
        walls, cpus = rotated(steps, args.passes)
        pass_times, bare_times, bound_times = (
            walls["pass ed25519"],
            walls["bare"],
            walls.get("bound", []),
        )
        if profiler is not None:
            profiler.dump_stats(args.profile)
            pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(40)

        floors: dict[str, tuple[float, float]] = {}
        if bound_times:
            floors["bound"] = (statistics.median(bound_times), statistics.median(bare_times))
        if args.floor:
            for name, replays in (("core", ("decide",)), ("core+parse", ("decide", "parse"))):
                with replayed(replays):
                    run_pass(cfg, parts)  # the replays learn their answers
                    times = [
                        (timed(lambda: run_pass(cfg, parts)), timed(lambda: bare_list(http)))
                        for _ in range(args.passes)
                    ]
                floors[name] = (
                    statistics.median(t[0] for t in times),
                    statistics.median(t[1] for t in times),
                )
        http.close()

        # One-shot passes, as cron runs `vultrscale reconcile`: a fresh process each, on the
        # system clock, with each key; against importing the two libraries no pass can do
        # without. CPU is the children's, as the kernel accounts it.
        oneshot_env = dict(
            os.environ,
            **env,
        )
        compiled_as_installed()
        oneshot: dict[str, Callable[[], object]] = {
            f"one-shot {kind}": command(
                [sys.executable, "-m", "vultrscale.cli", "--config", str(path), "reconcile"],
                oneshot_env,
            )
            for kind, path in tomls.items()
        }
        oneshot["import httpx, psycopg"] = command(
            [sys.executable, "-c", "import httpx, psycopg"], oneshot_env
        )
        shot_walls, shot_cpus = rotated(oneshot, args.oneshots, children=True)

        # An hour of cron passes a minute apart: a fresh process each (new client, empty
        # cache), the clock moving past the plan check's time-to-live, so the re-checks count.
        cron: list[int] = []
        for _ in range(args.cron_minutes):
            clock.advance(60)
            with VultrClient(KEY, http_server.url, sleep=clock.sleep) as fresh:
                before = served.requests
                result = run_pass(cfg, dataclasses.replace(parts, cloud=fresh, cache=PassCache()))
                cron.append(served.requests - before)
            assert result.exit_code == 0 and result.plan is not None, result.errors
            assert not result.plan.actions, result.plan.actions
        cron_requests = statistics.mean(cron) if cron else float("nan")
        for p in by_key.values():
            p.close()

        cli = [sys.executable, "-m", "vultrscale.cli"]
        missing = str(tmp / "no-such-dir" / "vultrscale.toml")
        starts: dict[str, Callable[[], object]] = {
            name: command(argv, oneshot_env, codes=codes)
            for name, argv, codes in (
                ("--version", [*cli, "--version"], (0,)),
                ("status --help", [*cli, "status", "--help"], (0,)),
                ("reconcile --help", [*cli, "reconcile", "--help"], (0,)),
                ("reconcile --dry-run, no config", [*cli, "--config", missing, "reconcile",
                                                    "--dry-run"], (2,)),
            )
        }  # fmt: skip
        starts["import typer"] = command([sys.executable, "-c", "import typer"], oneshot_env)
        start_walls, start_cpus = rotated(starts, args.startups, children=True)
        startup, baseline = start_walls["--version"], start_walls["import typer"]

        mp, mb = statistics.median(pass_times), statistics.median(bare_times)
        figures: dict[str, float] = {
            "pass_ms": mp * 1000,
            "bare_ms": mb * 1000,
            "pass_requests": statistics.median(pass_requests),
            "bare_requests": bare_requests,
        }
        if cron:
            figures.update(cron_requests=cron_requests, cron_requests_max=max(cron))
        for kind in keys:
            figures[f"pass_ms_{kind}"] = statistics.median(walls[f"pass {kind}"]) * 1000
            figures[f"pass_cpu_ms_{kind}"] = statistics.median(cpus[f"pass {kind}"]) * 1000
        if args.oneshots:
            for kind in keys:
                figures[f"oneshot_cpu_ms_{kind}"] = (
                    statistics.median(shot_cpus[f"one-shot {kind}"]) * 1000
                )
            figures["imports_cpu_ms"] = statistics.median(shot_cpus["import httpx, psycopg"]) * 1000
        print(
            f"compares: a steady reconcile pass over {n} instances (the parts `reconcile --loop` "
            "builds) against one bare paginated list of them on a warm httpx client, "
            f"{args.passes} passes each, alternated; the simulator serves from its own process"
        )
        print(
            f"  reconcile pass : {statistics.median(pass_requests)} HTTP request(s)/pass, "
            f"median {mp * 1000:.1f} ms"
        )
        print(f"  bare list      : {bare_requests} HTTP request(s), median {mb * 1000:.1f} ms")
        print(f"  ratio pass/bare: {mp / mb:.2f}x (target 1.5x)")
        for kind in keys:
            print(
                f"  pass, {kind} key: median {figures[f'pass_ms_{kind}']:.1f} ms, "
                f"CPU {figures[f'pass_cpu_ms_{kind}']:.1f} ms"
            )
        ratio = figures["pass_cpu_ms_rsa4096"] / figures["pass_cpu_ms_ed25519"]
        print(f"  CPU per pass, RSA-4096 key / ed25519 key: {ratio:.2f}x (target 1.1x)")
        if args.oneshots:
            mi = figures["imports_cpu_ms"]
            print(
                f"compares: a one-shot `vultrscale reconcile` (a fresh process, as cron runs it) "
                f"against `python -c 'import httpx, psycopg'`, CPU, {args.oneshots} rounds rotated"
            )
            print(f"  import httpx, psycopg: median {mi:.0f} ms CPU")
            for kind in keys:
                mo = figures[f"oneshot_cpu_ms_{kind}"]
                print(
                    f"  one-shot, {kind} key: median {mo:.0f} ms CPU, {mo / mi:.2f}x (target 1.3x)"
                )
        if cron:
            print(
                f"  {len(cron)} cron passes a minute apart (fresh process each, clock past the "
                f"plan check's {read.PRICE_TTL.total_seconds() / 60:g} min TTL): "
                f"{cron_requests:.2f} HTTP request(s)/pass on average, at most {max(cron)}"
            )
        for name, (fp, fb) in floors.items():
            key = name.replace("+", "_")
            figures.update({f"floor_{key}_ms": fp * 1000, f"floor_{key}_bare_ms": fb * 1000})
            what = (
                "the bound, the client's list + the pure core alone (no Postgres, no lock, "
                "no record)"
                if name == "bound"
                else f"{name} replayed at no cost"
            )
            print(
                f"  diagnostic, {what}: median {fp * 1000:.1f} ms, "
                f"bare {fb * 1000:.1f} ms, {fp / fb:.2f}x"
            )
        if startup:
            ms, mt = statistics.median(startup), statistics.median(baseline)
            figures.update(startup_ms=ms * 1000, typer_ms=mt * 1000)
            print(
                "compares: start-up of commands against `python -c 'import typer'`, wall time, "
                f"{args.startups} rounds rotated"
            )
            print(f"  python -c 'import typer': median {mt * 1000:.0f} ms")
            for name, times in start_walls.items():
                if name == "import typer":
                    continue
                mc = statistics.median(times)
                slug = name.split(",")[0].strip("-").replace(" --", "_").replace(" ", "_")
                figures[f"startup_ms_{slug}"] = mc * 1000
                target = "1.1x" if name == "--version" else "1.3x"
                print(
                    f"  vultrscale {name}: median {mc * 1000:.0f} ms, {mc / mt:.2f}x "
                    f"(target {target})"
                )
        if args.json:
            print(json.dumps(figures))
    finally:
        stop_server()


def scaler_keys(folder: Path) -> dict[str, Path]:
    """The scaler's private key of each kind the pass is timed with (0600, OpenSSH format)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

    made = {
        "ed25519": ed25519.Ed25519PrivateKey.generate(),
        "rsa4096": rsa.generate_private_key(public_exponent=65537, key_size=4096),
    }
    paths = {}
    for kind, key in made.items():
        path = folder / f"scaler_{kind}"
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.OpenSSH,
                serialization.NoEncryption(),
            )
        )
        path.chmod(0o600)
        paths[kind] = path
    return paths


def compiled_as_installed() -> None:
    """Write vultrscale's bytecode, as installing the wheel does: in a source checkout under
    PYTHONDONTWRITEBYTECODE (or a read-only one) every fresh process compiled each of its
    modules again, about a tenth of a one-shot pass's CPU that no installed user pays."""
    import compileall

    import vultrscale

    compileall.compile_dir(Path(vultrscale.__file__).parent, quiet=1)


def command(
    argv: list[str], env: dict[str, str], codes: tuple[int, ...] = (0,)
) -> Callable[[], object]:
    """Run ``argv`` to its end; an exit code not in ``codes`` stops the benchmark."""

    def run() -> None:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True)
        assert proc.returncode in codes, (argv, proc.returncode, proc.stderr[-2000:])

    return run


def rotated(
    steps: dict[str, Callable[[], object]], rounds: int, *, children: bool = False
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Wall and CPU seconds of each step, over ``rounds`` rounds; round i starts at step i (mod
    their number), so no step always runs first or last. CPU: this process's (threads too),
    or with ``children`` the finished child processes' as the kernel accounted them."""
    names = list(steps)
    walls: dict[str, list[float]] = {n: [] for n in names}
    cpus: dict[str, list[float]] = {n: [] for n in names}

    def cpu() -> float:
        if not children:
            return time.process_time()
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        return ru.ru_utime + ru.ru_stime

    for i in range(rounds):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            c0, t0 = cpu(), time.perf_counter()
            steps[name]()
            walls[name].append(time.perf_counter() - t0)
            cpus[name].append(cpu() - c0)
    return walls, cpus


def bound(cfg: config_mod.Config, parts: Parts) -> Callable[[], object]:
    """--floor: only the work no pass can skip beyond the bare list, with none of the pass's
    Postgres I/O (no reads, no lock, no record): its own client's list (the request, the body,
    the typed values), then the pure core on what it listed and on what one steady pass read
    from Postgres (captured here, by running one)."""
    seen: list[Readings] = []
    real_decide = reconcile.decide

    def decide(obs, cfg):  # type: ignore[no-untyped-def]
        seen.append(obs)
        return real_decide(obs, cfg)

    with mock.patch.object(reconcile, "decide", decide):
        run_pass(cfg, parts)
    obs = seen[0]

    def least() -> reconcile.Decision:
        listed = lifecycle.by_label(parts.cloud.list_instances(tag=cfg.fleet.tag), obs.rows)
        decision = real_decide(dataclasses.replace(obs, listed=listed), cfg)
        assert not decision.plan.actions, decision.plan.actions
        return decision

    least()
    return least


def timed(run: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    run()
    return time.perf_counter() - t0


@contextlib.contextmanager
def replayed(what: tuple[str, ...]) -> Iterator[None]:
    """--floor: within the block, ``decide`` answers what it answered last ("decide") and the
    list's objects come from a table by id instead of being parsed ("parse")."""
    from vultrscale import reconcile
    from vultrscale.vultr import models

    with contextlib.ExitStack() as stack:
        if "decide" in what:
            real_decide, last = reconcile.decide, []

            def decide(obs, cfg):  # type: ignore[no-untyped-def]
                if not last:
                    last.append(real_decide(obs, cfg))
                return last[0]

            stack.enter_context(mock.patch.object(reconcile, "decide", decide))
        if "parse" in what:
            real_parse, parsed = models.VInstance.from_api, {}

            def from_api(data):  # type: ignore[no-untyped-def]
                v = parsed.get(data["id"])
                if v is None:
                    v = parsed[data["id"]] = real_parse(data)
                return v

            stack.enter_context(mock.patch.object(models.VInstance, "from_api", from_api))
        yield


def bench_memory(
    sizes: list[int], passes: int, profile: Path | None, *, as_json: bool = False
) -> None:
    """The steady pass on the in-memory ports, per fleet size: the core's own cost. The sizes'
    batches alternate, so a load that comes and goes touches each alike."""
    profiler = cProfile.Profile() if profile else None
    rounds = 20
    batch = max(passes // rounds, 1)
    print(
        "compares: a steady reconcile pass on the in-memory ports (no Postgres, no HTTP) "
        f"against nothing: time per pass, median of {rounds} alternated batches of {batch}"
    )
    worlds = [memory_world(n) for n in sizes]
    times: list[list[float]] = [[] for _ in sizes]
    for _ in range(rounds):
        for world, out in zip(worlds, times, strict=True):
            out.append(time_batch(*world, batch, profiler))
    figures: dict[str, float] = {}
    for n, out in zip(sizes, times, strict=True):
        figures[f"memory_pass_ms_{n}"] = statistics.median(out) * 1e3
        print(f"  {n:4d} instance(s): median {figures[f'memory_pass_ms_{n}']:.3f} ms/pass")
    if profiler is not None and profile is not None:
        profiler.dump_stats(profile)
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(40)
    if as_json:
        print(json.dumps(figures))


def memory_world(n: int) -> tuple[config_mod.Config, Parts, FakeClock]:
    """A steady fleet of ``n`` running instances on the in-memory ports."""
    tmp = Path(tempfile.mkdtemp(prefix="vs-bench-mem-"))
    (tmp / "vultrscale.toml").write_text(
        f'[fleet]\nsnapshot_id = "{SNAPSHOT}"\n[policy]\nmax_instances = {n}\n'
        f"[budget]\nmonthly_ceiling_usd = {20.0 * n}\n"
    )
    env = {"VULTR_API_KEY": KEY, "DATABASE_URL": "postgresql://unused@nowhere/db"}
    env["WORKER_DATABASE_URL"] = env["DATABASE_URL"]
    cfg = config_mod.load(tmp / "vultrscale.toml", env)
    clock = FakeClock(datetime(2026, 3, 2, 12, 0, tzinfo=UTC))
    cloud, ledger = MemoryCloud(clock), MemoryLedger("workers")
    signals = MemorySignals(Signals(ready=n * cfg.queue.jobs_per_instance, in_flight=0))
    parts = memory_parts(clock, cloud, ledger, signals, MemoryDrain())
    run_pass(cfg, parts)  # create n
    clock.advance(61)
    run_pass(cfg, parts)  # booted
    for v in cloud.list_instances():
        ledger.workers_by_label[v.label] = WorkerView(v.label, clock.now(), False, 0, True)
    clock.advance(30)
    run_pass(cfg, parts)  # running
    assert {r.state for r in ledger.instances.values()} == {InstanceState.RUNNING}
    return cfg, parts, clock


def time_batch(
    cfg: config_mod.Config,
    parts: Parts,
    clock: FakeClock,
    batch: int,
    profiler: cProfile.Profile | None,
) -> float:
    """Seconds per pass over ``batch`` steady passes, a second of fake time apart."""
    fleet = len(parts.cloud.list_instances())
    t0 = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    for _ in range(batch):
        clock.advance(1)
        result = run_pass(cfg, parts)
    if profiler is not None:
        profiler.disable()
    elapsed = (time.perf_counter() - t0) / batch
    assert result.exit_code == 0 and result.plan is not None and not result.plan.actions
    assert len(parts.cloud.list_instances()) == fleet, "a steady pass changed the fleet"
    # The simulator counts passes rather than keep their events (days of them would fill
    # memory): keep none between batches either, or their garbage is timed too.
    parts.store.ledger.events.clear()  # type: ignore[attr-defined]
    return elapsed


if __name__ == "__main__":
    main()
