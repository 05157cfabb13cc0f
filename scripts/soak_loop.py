#!/usr/bin/env python3
"""Soak `reconcile --loop`: does the scaler's memory grow with the fleet's history?

Runs the loop's own code (``reconcile.run_forever``) pass after pass with the parts
`reconcile --loop --metrics-file` builds (the Vultr client over loopback HTTP, one kept
Postgres connection, real host keys and cloud-init user-data, the metrics written after every
pass, each pass's log line formatted as the loop prints it), against:

- the Vultr simulator in a child process on loopback (so its own state, which keeps every
  deleted instance's bill and a request log, is not in this process's memory), on a fake
  clock that moves in lockstep with the loop's: a lifecycle takes no wall time waiting;
- a real Postgres: a scratch database on DATABASE_URL's server, else on a throwaway server;
- a workload that fills and empties the queue: ``--per-cycle`` instances are created, boot,
  their workers report in and finish the jobs, the queue stays empty, and the loop drains
  (`systemctl stop`, then `systemctl is-active`: see --ssh below) and deletes them; then it
  fills again.

It prints this process's RSS, glibc's heap and (with --tracemalloc) the memory tracemalloc
traces every --report lifecycles; at the end, RSS after the warm-up and at the end, the growth
per lifecycle after the warm-up (the least-squares slope over the samples, and end against
start), the same for the traced total, and the allocations that grew most since the warm-up,
by traceback (--frames deep). Traced total flat while RSS grows: the allocators' fragmentation,
not objects kept. Bounded: it stops after --lifecycles lifecycles or --max-seconds of wall
time, whichever comes first. Loopback only.

The drain (--ssh):

- ``stand-in`` (the default): answered in memory, no SSH at all;
- ``real``: the drain `reconcile --loop` builds (an ``SSHDrain`` made on first use in a pass
  and closed after it: paramiko, the host key pinned per instance, the scaler's key from a
  0600 file), against the demo's simulated hosts' SSH servers
  (``vultrscale.fake_vultr.hosts``) in the
  simulator's child process: each instance of the fleet gets one on its own 127.0.0.x address,
  all on one port, presenting the host key from its user-data, letting in only the scaler's
  key, and answering `systemctl is-active` "active" until `systemctl stop`, then "inactive"
  (no worker process: the worker's side stays the harness's). Every drain is a real SSH
  handshake, login, exec channels and close in this process. A lifecycle takes up to 0.2 s
  more of wall time; any SSH error is counted and makes the run exit 1, as does any failed
  pass (a soak whose passes fail measures something else than the loop's steady work).

Usage: python scripts/soak_loop.py [--lifecycles 500] [--per-cycle 4] [--report 50]
                                   [--warmup 100] [--ssh {stand-in,real}]
                                   [--tracemalloc [--frames 8]] [--max-seconds 900]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import logging
import multiprocessing
import os
import socket
import sys
import tempfile
import threading
import time
import tracemalloc
from datetime import UTC, datetime, timedelta
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import psycopg

from vultrscale import config as config_mod
from vultrscale import metrics as metrics_mod
from vultrscale.cli import passlog
from vultrscale.core.model import HostTarget, ServiceState
from vultrscale.db import queue, schema, throwaway
from vultrscale.db.store import PgStore
from vultrscale.errors import SSHError
from vultrscale.reconcile import Parts, PassResult, run_forever
from vultrscale.ssh import generate_host_key
from vultrscale.vultr.client import VultrClient
from vultrscale.wiring import user_data_renderer

KEY = "soak-key-0123456789abcdef0123456789abcdef"
PLAN = "vc2-1c-2gb"
START = datetime(2026, 3, 2, 0, 0, tzinfo=UTC)
TAG = config_mod.FleetConfig().tag  # the fleet's tag: the default the soak's config keeps
INTERVAL = timedelta(seconds=30)


# --- the simulator, in a child process on a clock the loop moves ------------------------------


def _serve(conn: Connection, real_ssh: bool = False) -> None:
    """The child: the simulator on loopback with a fake clock; commands come over ``conn``.
    With ``real_ssh``, each instance also gets an SSH server on its own 127.0.0.x address
    (``SSHServers``), all on one port: sent with the simulator's URL."""
    from vultrscale.core.clock import FakeClock
    from vultrscale.fake_vultr.app import Simulator, Timings
    from vultrscale.fake_vultr.hosts import LoopbackIps
    from vultrscale.fake_vultr.server import start_server

    clock = FakeClock(START)
    # The servers' paramiko logs a peer that closed with data unread ("Socket exception:
    # Connection reset by peer"): the scaler closing its connections at a pass's end.
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)
    servers = SSHServers(_free_port()) if real_ssh else None
    sim = Simulator(
        KEY,
        clock=clock,
        seed=11,
        rate_limit=None,
        timings=Timings(boot_pending=30, boot_ready=30, visible_after=0, snapshot_complete=1),
        ip_allocator=LoopbackIps() if real_ssh else None,
        on_instance_ready=servers.on_instance_ready if servers else None,
    )
    server = start_server(sim, tick_interval=3600)  # lifecycles move when the clock does
    sim.create_instance(region="ewr", plan=PLAN, os_id=2136, label="base")
    conn.send((server.url, servers.port if servers else None))
    while True:
        what, arg = conn.recv()
        if what == "advance":
            clock.advance(arg)
            sim.tick()
            if servers:
                servers.power_off_gone(set(sim.instances))
            conn.send(None)
        elif what == "active":  # labels of tagged instances that are up
            conn.send(
                [
                    i["label"]
                    for i in sim.instances.values()
                    if TAG in i["tags"] and i["status"] == "active"
                ]
            )
        elif what == "ssh":  # what the SSH servers saw
            c = servers.counters if servers else None
            conn.send(
                f"{c.stop} stops, {c.is_active} is-active, {c.refused_logins} refused logins, "
                f"{c.refused_commands} refused commands"
                if c
                else None
            )
        else:
            server.stop()
            if servers:
                servers.power_off_gone(set())
            conn.send(None)
            return


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class StandInUnit:
    """worker.service as a host's SSH server reports it, without a worker process: "active"
    from boot until `systemctl stop`, then "inactive" (the worker's side is the harness's)."""

    def __init__(self) -> None:
        self.state = "active"

    def start(self) -> None:
        self.state = "active"

    def start_again(self) -> None:
        self.state = "active"

    def stop(self) -> None:
        self.state = "inactive"

    def power_off(self, grace: float = 0.0) -> bool:
        return False


class SSHServers:
    """In the child: the demo's simulated hosts' SSH side (``vultrscale.fake_vultr.hosts``): each
    booted instance of the fleet gets an SSH server on its 127.0.0.x address that presents the
    host key from its user-data, lets in only the scaler's key and answers the scaler's three
    commands from a ``StandInUnit``; deleted instances are powered off."""

    def __init__(self, port: int) -> None:
        from vultrscale.fake_vultr.hosts import SSHCounters

        self.port = port
        self.counters = SSHCounters()
        self.hosts: dict[str, Any] = {}  # instance id -> SimulatedHost

    def on_instance_ready(self, instance: dict[str, Any], user_data: str) -> None:
        from vultrscale.fake_vultr.hosts import SimulatedHost, parse_user_data

        if TAG not in (instance.get("tags") or []):
            return
        iid = str(instance["id"])
        spec = parse_user_data(user_data)
        host = SimulatedHost(
            iid,
            str(instance["main_ip"]),
            spec,
            StandInUnit(),
            self.port,
            self.counters,  # type: ignore[arg-type]
        )
        host.start()  # listening before the simulator answers that the instance is active
        self.hosts[iid] = host

    def power_off_gone(self, alive: set[str]) -> None:
        for iid in [i for i in self.hosts if i not in alive]:
            host = self.hosts.pop(iid)
            # Closing a server waits for its accept loop (up to 0.2 s): not on the clock's step.
            threading.Thread(target=host.power_off, daemon=True).start()


class Lockstep:
    """The loop's clock: a fake one whose every step moves the simulator's clock too."""

    def __init__(self, sim: Connection) -> None:
        self._sim = sim
        self._now = START
        self._mono = 1000.0
        self._lock = threading.Lock()  # the pass's overlapped reads may wait for the pace

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            return
        with self._lock:
            self._now += timedelta(seconds=seconds)
            self._mono += seconds
            self._sim.send(("advance", seconds))
            self._sim.recv()

    def active(self) -> list[str]:
        """The simulator's active tagged instances, asked on the same pipe under the same lock
        (a pass that ended on an error may leave a read thread pacing on it)."""
        with self._lock:
            self._sim.send(("active", None))
            return list(self._sim.recv())


# --- the hosts: workers that report in, finish their jobs and stop when told -----------------


class Hosts:
    """The instances' side. Implements the DrainTransport port; keeps a label only while its
    instance lives (it is forgotten once its worker has stopped), so it does not grow."""

    def __init__(self, db_url: str) -> None:
        self.db = psycopg.connect(db_url, autocommit=True)
        self.up: set[str] = set()
        self.stopping: set[str] = set()
        self.gone: set[str] = set()  # stopped, until Vultr no longer lists them
        self.stopped = 0

    def work(self, active: list[str]) -> None:
        """Workers on newly active instances report in; every running one finishes what it
        can claim (a job takes no time here)."""
        for label in active:
            if label not in self.up and label not in self.gone:
                self.up.add(label)
                queue.register_worker(self.db, label, label)
        for label in self.up - self.stopping:
            jobs = queue.claim(self.db, label, "default", 4, 600)
            queue.complete_many(self.db, label, [(j.id, j.token) for j in jobs])

    def stop_many(self, targets: list[HostTarget]) -> dict[str, Any]:
        for t in targets:
            self.stopping.add(t.label)
        return {t.label: None for t in targets}

    def is_active_many(self, targets: list[HostTarget]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for t in targets:
            if t.label in self.stopping:
                self.worker_stopped(t.label)
                out[t.label] = ServiceState.INACTIVE
            else:
                up = t.label in self.up
                out[t.label] = ServiceState.ACTIVE if up else ServiceState.INACTIVE
        return out

    def worker_stopped(self, label: str) -> None:
        """The worker drained and exited: its row says so, and the label is forgotten once
        its instance is deleted."""
        queue.mark_stopped(self.db, label)
        self.stopping.discard(label)
        self.up.discard(label)
        self.gone.add(label)
        self.stopped += 1

    def close(self) -> None:  # the pass's end; the transport keeps nothing across passes
        pass


class RealSSH:
    """--ssh real: the drain `reconcile --loop` builds (``wiring._LazyDrain``: a
    ``vultrscale.ssh.SSHDrain`` made on first use in a pass and closed after it), with the
    worker's side recorded as the stand-in does: a host that answers "inactive" after its stop
    has a stopped worker. SSH errors are counted (a healthy soak has none)."""

    def __init__(self, hosts: Hosts, key_path: str) -> None:
        from vultrscale.wiring import _LazyDrain

        self.hosts = hosts
        self.drain = _LazyDrain(key_path)
        self.errors: list[str] = []

    def _note(self, answers: dict[str, Any]) -> None:
        self.errors += [str(a) for a in answers.values() if isinstance(a, SSHError)]

    def stop_many(self, targets: list[HostTarget]) -> dict[str, Any]:
        out: dict[str, Any] = self.drain.stop_many(targets)
        self._note(out)
        self.hosts.stopping |= {label for label, err in out.items() if err is None}
        return out

    def start_many(self, targets: list[HostTarget]) -> dict[str, Any]:
        out: dict[str, Any] = self.drain.start_many(targets)
        self._note(out)
        return out

    def is_active_many(self, targets: list[HostTarget]) -> dict[str, Any]:
        out: dict[str, Any] = self.drain.is_active_many(targets)
        self._note(out)
        for label, state in out.items():
            if label in self.hosts.stopping and state == ServiceState.INACTIVE:
                self.hosts.worker_stopped(label)
        return out

    def close(self) -> None:
        self.drain.close()


# --- memory -------------------------------------------------------------------------------------


def rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
            "fordblks", "keepcost",
        )
    ]  # fmt: skip


def malloc_kb() -> tuple[int, int] | None:
    """glibc's heap: (bytes in use, bytes held free) in KB; None where there is no mallinfo2.
    In use growing is memory kept; only free growing is the heap's high-water mark."""
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except AttributeError:
        return None
    fn.restype = _MallInfo2
    info = fn()
    return (info.uordblks + info.hblkhd) // 1024, info.fordblks // 1024


def heap_kb(snapshot: tracemalloc.Snapshot) -> int:
    return sum(s.size for s in snapshot.statistics("filename")) // 1024


def traced() -> tracemalloc.Snapshot:
    # What the harness's own lines allocate (and the snapshot it keeps to compare with) is not
    # the scaler's memory; only the innermost frame is looked at: every allocation of the loop
    # has the harness further up its stack.
    return tracemalloc.take_snapshot().filter_traces(
        [
            tracemalloc.Filter(False, __file__),
            tracemalloc.Filter(False, tracemalloc.__file__),
            tracemalloc.Filter(False, "<*"),
        ]
    )


def slope(points: list[tuple[int, int]]) -> float:
    """Least-squares growth of y per x (KB per lifecycle): less moved by one sample than the
    last sample against the first."""
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / var if var else 0.0


# --- the soak -----------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--lifecycles", type=int, default=500, help="instances created and deleted")
    ap.add_argument("--per-cycle", type=int, default=4, help="instances per fill of the queue")
    ap.add_argument("--report", type=int, default=50, help="print memory every N lifecycles")
    ap.add_argument("--warmup", type=int, default=100, help="lifecycles before the baseline")
    ap.add_argument("--max-seconds", type=float, default=900, help="wall-time bound")
    ap.add_argument(
        "--ssh",
        choices=("stand-in", "real"),
        default="stand-in",
        help="the drain: in memory, or the real SSHDrain (see above)",
    )
    ap.add_argument("--verbose", action="store_true", help="print every pass's plan and results")
    ap.add_argument("--no-print", action="store_true", help="do not format the passes' log lines")
    ap.add_argument(
        "--tracemalloc", action="store_true", help="also trace the heap (slower; top growth)"
    )
    ap.add_argument(
        "--frames", type=int, default=8, help="with --tracemalloc, frames kept per allocation"
    )
    args = ap.parse_args()
    if args.lifecycles < 1 or args.per_cycle < 1 or args.report < 1 or args.warmup < 0:
        ap.error("--lifecycles, --per-cycle and --report must be positive, --warmup >= 0")
    with (
        throwaway.given_or_throwaway(os.environ.get("DATABASE_URL")) as admin,
        throwaway.scratch_database(admin, prefix="vs_soak_") as db_url,
    ):
        schema.migrate(db_url)
        return soak(args, db_url)


def soak(args: argparse.Namespace, db_url: str) -> int:
    real = args.ssh == "real"
    mine, theirs = multiprocessing.get_context("fork").Pipe()
    child = multiprocessing.get_context("fork").Process(target=_serve, args=(theirs, real))
    child.start()
    tmp = Path(tempfile.mkdtemp(prefix="vs-soak-"))
    try:
        url, ssh_port = mine.recv()
        clock = Lockstep(mine)
        # Paced on the loop's clock: on the real one, the soak's passes (hundreds a second of
        # wall time) ran ahead of the pace's 25 requests/s until every call was refused.
        client = VultrClient(KEY, url, sleep=clock.sleep, monotonic=clock.monotonic, timeout=10)
        base = [i for i in client.list_instances() if i.label == "base"][0]
        snap = client.create_snapshot(base.id, "soak")
        clock.sleep(2)
        # The scaler's key, as `reconcile` reads it: a 0600 file (fleet.ssh_key).
        key_path = tmp / "scaler_ed25519"
        scaler_private, scaler_public = generate_host_key()
        key_path.touch(mode=0o600)
        key_path.write_text(scaler_private)
        cfg = _config(tmp, db_url, snap.id, args.per_cycle, key_path, ssh_port)
        hosts = Hosts(db_url)
        drain = RealSSH(hosts, str(key_path)) if real else hosts
        parts = Parts(
            cloud=client,
            store=PgStore(db_url, keep=True),
            drain=drain,  # type: ignore[arg-type]
            clock=clock,
            keygen=generate_host_key,
            render_user_data=user_data_renderer(cfg, scaler_public),
            overlap_reads=True,
        )
        code = _loop(args, cfg, parts, hosts, tmp)
        if isinstance(drain, RealSSH):
            mine.send(("ssh", None))
            seen = mine.recv()
            first = f" (first: {drain.errors[0]})" if drain.errors else ""
            print(
                f"SSH servers answered: {seen}; SSH errors seen by the scaler: "
                f"{len(drain.errors)}{first}"
            )
            code = code or int(bool(drain.errors))
        return code
    finally:
        with contextlib.suppress(Exception):
            mine.send(("stop", None))
            mine.recv()
        child.join(10)


def _loop(
    args: argparse.Namespace,
    cfg: config_mod.Config,
    parts: Parts,
    hosts: Hosts,
    tmp: Path,
) -> int:
    metrics = metrics_mod.Metrics(cfg.fleet.name)
    lockstep = parts.clock
    assert isinstance(lockstep, Lockstep)
    secrets = cfg.secrets.values()
    metrics_file = str(tmp / "vultrscale.prom")
    devnull = open(os.devnull, "w")  # noqa: SIM115 - open for the whole soak
    began = time.monotonic()
    state: dict[str, Any] = {"passes": 0, "failed": 0, "filled": False, "next_report": 0}
    rows: list[tuple[int, int, int | None]] = []  # (lifecycles, rss KB, traced KB)
    base_snap: list[tracemalloc.Snapshot] = []
    if args.tracemalloc:
        tracemalloc.start(max(1, args.frames))  # the top growth is shown by traceback

    def measure() -> None:
        gc.collect()
        heap = None
        if args.tracemalloc:
            snap = traced()
            heap = heap_kb(snap)
            if hosts.stopped >= args.warmup and not base_snap:
                base_snap.append(snap)
        rows.append((hosts.stopped, rss_kb(), heap))
        peak = state.pop("peak", 0)
        c = malloc_kb()
        print(
            f"lifecycles {hosts.stopped:5d}  passes {state['passes']:6d}  "
            f"rss {rows[-1][1] / 1024:7.1f} MB"
            + (f"  malloc in use {c[0] / 1024:6.2f} MB, free {c[1] / 1024:6.2f} MB" if c else "")
            + (f"  heap {heap / 1024:7.2f} MB" if heap is not None else "")
            + (f"  a pass's peak {peak / 1024:7.1f} KB" if heap is not None else "")
            + f"  wall {time.monotonic() - began:6.1f} s",
            flush=True,
        )

    def on_result(result: PassResult) -> None:
        state["passes"] += 1
        if args.tracemalloc:  # what one pass held at most beyond what stays
            current, peak = tracemalloc.get_traced_memory()
            state["peak"] = max(state.get("peak", 0), peak - current)
            tracemalloc.reset_peak()
        if result.exit_code != 0:
            state["failed"] += 1
            print(f"pass {state['passes']}: exit {result.exit_code}: {result.errors}", flush=True)
        metrics.observe(result)
        metrics.write_textfile(metrics_file)
        if not args.no_print:  # as `reconcile --loop` prints a pass: one log line
            line = passlog.pass_line(result, cfg.fleet.name, passlog.LogFormat.HUMAN, secrets)
            print(line, file=sys.stdout if args.verbose else devnull)
        # The world moves: the queue fills when the fleet is gone, instances boot.
        active = lockstep.active()
        hosts.gone &= set(active)  # deleted: forgotten
        if not active and not hosts.up and not state["filled"]:
            queue.enqueue(hosts.db, [{} for _ in range(4 * args.per_cycle)])
            state["filled"] = True
        elif active:
            state["filled"] = False
        hosts.work(active)
        if hosts.stopped >= state["next_report"]:
            state["next_report"] = hosts.stopped + args.report
            measure()
        if hosts.stopped >= args.lifecycles or time.monotonic() - began > args.max_seconds:
            stop.set()

    stop = threading.Event()
    try:
        run_forever(cfg, parts, interval=INTERVAL, stop=stop, on_result=on_result)
    finally:
        parts.close()
        hosts.db.close()
    measure()
    return _summary(args, rows, base_snap, state)


def _summary(
    args: argparse.Namespace,
    rows: list[tuple[int, int, int | None]],
    base_snap: list[tracemalloc.Snapshot],
    state: dict[str, Any],
) -> int:
    after = [r for r in rows if r[0] >= args.warmup]
    print(f"passes {state['passes']}, failed {state['failed']}")
    if len(after) < 2 or after[-1][0] == after[0][0]:
        print("too few lifecycles after the warm-up for a figure")
        return 1
    first, last = after[0], after[-1]
    n = last[0] - first[0]
    print(
        f"RSS after the warm-up ({first[0]} lifecycles) {first[1] / 1024:.1f} MB, at the end "
        f"({last[0]}) {last[1] / 1024:.1f} MB: {slope([(r[0], r[1]) for r in after]):+.2f} KB "
        f"per lifecycle (least squares over {len(after)} samples; end against start "
        f"{(last[1] - first[1]) / n:+.2f})"
    )
    if first[2] is not None and last[2] is not None:
        traced_rows = [(r[0], r[2]) for r in after if r[2] is not None]
        print(
            f"traced by tracemalloc (the scaler's Python objects) {first[2] / 1024:.2f} MB -> "
            f"{last[2] / 1024:.2f} MB: {slope(traced_rows):+.2f} KB per lifecycle (least "
            f"squares; end against start {(last[2] - first[2]) / n:+.2f})"
        )
    if base_snap:
        gc.collect()
        print(f"top growth since the warm-up (tracemalloc, by traceback, {args.frames} frames):")
        for stat in traced().compare_to(base_snap[0], "traceback")[:8]:
            print(f"  {stat}")
            for line in stat.traceback.format(most_recent_first=True)[: 2 * args.frames]:
                print(f"      {line.strip()}")
    # a failed pass is a soak that measured something else than the loop's steady work
    return 1 if state["failed"] else 0


def _config(
    tmp: Path, db_url: str, snapshot_id: str, per_cycle: int, key_path: Path, ssh_port: int | None
) -> config_mod.Config:
    path = tmp / "vultrscale.toml"
    path.write_text(
        f"""[fleet]
snapshot_id = "{snapshot_id}"
plan = "{PLAN}"
region = "ewr"
ssh_key = "{key_path}"
ssh_port = {ssh_port or 22}

[policy]
max_instances = {per_cycle}
billing_hour_aware = false
scale_up_cooldown = "30s"
scale_down_cooldown = "60s"
idle_before_scale_down = "60s"

[budget]
monthly_ceiling_usd = 100000.0
"""
    )
    env = {"VULTR_API_KEY": KEY, "DATABASE_URL": db_url, "WORKER_DATABASE_URL": db_url}
    return config_mod.load(path, env=env)


if __name__ == "__main__":
    sys.exit(main())
