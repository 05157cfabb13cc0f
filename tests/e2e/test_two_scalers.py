"""Two scalers for availability: two real `vultrscale reconcile --loop` processes on one
directory of two fleets and one database (the simulator over HTTP, a real Postgres). The one
holding a fleet's lock is SIGKILLed while a create of that fleet is in flight; the other runs
the fleet's next pass within one interval, finds the instance by its label (no second POST),
brings each fleet to what its queue asks, then drains both fleets to zero (no drain left
stuck), all the while serving both fleets on one metrics endpoint."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psutil
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.cli_world import scaler_key
from vultrscale.core.clock import SystemClock
from vultrscale.db import queue
from vultrscale.db.ledger import _LOCK_NAMESPACE, lock_key
from vultrscale.fake_vultr.app import SequentialIps, Simulator, Timings
from vultrscale.fake_vultr.server import ServerHandle, start_server

pytestmark = pytest.mark.e2e

API_KEY = "VKEY-two-scalers-0123456789abcdefgh"
INTERVAL = 5.0  # the loop's --interval (its least)
WANT = {"web": 2, "reports": 1}  # 8 and 4 jobs, 4 jobs an instance
T = TypeVar("T")


@dataclass
class Scaler:
    name: str
    proc: subprocess.Popen[str]
    out: Path
    err: Path

    def metrics_url(self) -> str | None:
        m = re.search(r"serves metrics at (http://\S+/metrics)", self.err.read_text())
        return m[1] if m else None


def _until(what: str, check: Callable[[], T | None], within: float) -> T:
    """``check()`` polled until it gives something, under a deadline (never a fixed sleep)."""
    deadline = time.monotonic() + within
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"not within {within:.0f}s: {what}"
        time.sleep(0.05)


@pytest.fixture
def sim() -> Iterator[tuple[Simulator, ServerHandle, str]]:
    """The simulator: instances boot in a second, at 127.0.0.x (where no sshd answers the
    fleets' port: every drain finds its host unreachable, and ends by its grace)."""
    sim = Simulator(
        API_KEY,
        clock=SystemClock(),
        seed=34,
        rate_limit=None,
        timings=Timings(boot_pending=1, boot_ready=1, visible_after=0, snapshot_complete=0),
        ip_allocator=SequentialIps("127.0.0.0/24", first=60),
    )
    server = start_server(sim)
    base = sim.create_instance(region="ewr", plan="vc2-1c-2gb", os_id=2136, label="base")
    snapshot = httpx.post(
        f"{server.url}/v2/snapshots",
        json={"instance_id": base["id"]},
        headers={"Authorization": f"Bearer {API_KEY}"},
    ).json()["snapshot"]["id"]
    try:
        yield sim, server, str(snapshot)
    finally:
        server.stop()


@pytest.fixture
def closed_port() -> Iterator[int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    try:
        yield int(s.getsockname()[1])
    finally:
        s.close()


def _fleet_file(name: str, snapshot: str, key: Path, port: int) -> str:
    return (
        f'[fleet]\nname = "{name}"\ntag = "vs-{name}"\nlabel_prefix = "{name}"\n'
        f'snapshot_id = "{snapshot}"\nssh_key = "{key}"\nssh_port = {port}\n'
        f'[worker]\nqueue = "{name}"\ndrain_seconds = 1\n[queue]\nqueue = "{name}"\n'
        '[policy]\nmax_instances = 3\nscale_up_cooldown = "0s"\nscale_down_cooldown = "0s"\n'
        'idle_before_scale_down = "0s"\nbilling_hour_aware = false\ntarget_wait = "0s"\n'
        '[drain]\ntimeout = "30s"\nunreachable_grace = "2s"\n'
    )


def _start(name: str, tmp: Path, env: dict[str, str]) -> Scaler:
    exe = shutil.which("vultrscale")
    assert exe, "vultrscale is not on PATH (run with the project's .venv/bin on PATH)"
    out, err = tmp / f"{name}.out", tmp / f"{name}.err"
    with out.open("w") as o, err.open("w") as e:  # the child keeps its own descriptors
        proc = subprocess.Popen(
            [exe, "reconcile", "--loop", "--interval", f"{INTERVAL:g}s", "--metrics-port", "0"],
            env=env,
            stdout=o,
            stderr=e,
            text=True,
            cwd=tmp,
        )
    return Scaler(name, proc, out, err)


def _holder_port(conn: psycopg.Connection[Any], fleet: str) -> int | None:
    """The client port of the session holding ``fleet``'s pass lock."""
    row = conn.execute(
        "SELECT a.client_port FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE l.locktype = 'advisory' AND l.granted AND l.classid = %s::oid "
        "AND l.objid = %s::oid AND l.database = (SELECT oid FROM pg_database "
        "WHERE datname = current_database())",
        (_LOCK_NAMESPACE, lock_key(fleet)),
    ).fetchone()
    return None if row is None else int(row[0])


def _owner(scalers: list[Scaler], port: int) -> Scaler | None:
    for s in scalers:
        conns = psutil.Process(s.proc.pid).net_connections(kind="tcp")
        if any(c.laddr and c.laddr.port == port for c in conns):
            return s
    return None


def _in_flight(conn: psycopg.Connection[Any], sim: Simulator) -> tuple[str, str] | None:
    """A create intent (fleet, label) whose POST the simulator has taken and not answered."""
    row = conn.execute(
        "SELECT fleet, label FROM fleet_instances WHERE state = 'creating' LIMIT 1"
    ).fetchone()
    if row is None:
        return None
    labels = {i["label"] for i in sim.instances.values()}
    return (row[0], row[1]) if row[1] in labels else None


def _live_at_sim(sim: Simulator) -> dict[str, list[str]]:
    by_fleet: dict[str, list[str]] = {}
    for inst in sim.instances.values():
        for tag in inst["tags"]:
            if tag.startswith("vs-"):
                by_fleet.setdefault(tag[3:], []).append(inst["label"])
    return by_fleet


def test_the_survivor_of_a_sigkill_takes_the_fleets_next_pass_with_no_double_create(
    sim: tuple[Simulator, ServerHandle, str], closed_port: int, db_url: str, tmp_path: Path
) -> None:
    simulator, server, snapshot = sim
    key = scaler_key(tmp_path)
    folder = tmp_path / "fleets"
    folder.mkdir()
    for name in WANT:
        (folder / f"{name}.toml").write_text(_fleet_file(name, snapshot, key, closed_port))
    with psycopg.connect(db_url, autocommit=True) as conn:
        queue.enqueue(conn, [{}] * 8, queue="web")
        queue.enqueue(conn, [{}] * 4, queue="reports")
    env = {
        **os.environ,
        "VULTRSCALE_CONFIG": str(folder),
        "VULTRSCALE_ACCOUNT_SCALERS": "2",
        "VULTR_API_KEY": API_KEY,
        "VULTR_API_URL": server.url,
        "DATABASE_URL": db_url,
        "WORKER_DATABASE_URL": db_url,
    }
    simulator.latency = 1.5  # every answer late: a create's POST is in flight for 1.5 s
    scalers = [_start(name, tmp_path, env) for name in ("host-a", "host-b")]
    try:
        with psycopg.connect(db_url, autocommit=True) as conn:
            # 1. A create in flight: its intent written, its POST taken, no answer yet. The
            #    process holding that fleet's lock dies at once (SIGKILL: its socket closes).
            fleet, label = _until(
                "a create in flight", lambda: _in_flight(conn, simulator), within=30
            )
            port = _holder_port(conn, fleet)
            holder = _owner(scalers, port) if port is not None else None
            assert holder is not None, "the fleet's lock is held by neither scaler"
            holder.proc.send_signal(signal.SIGKILL)
            killed_at = datetime.now(UTC)
            holder.proc.wait(10)
            simulator.latency = 0.0
            survivor = next(s for s in scalers if s is not holder)
            row = conn.execute(
                "SELECT state FROM fleet_instances WHERE label = %s", (label,)
            ).fetchone()
            assert row == ("creating",), "the kill came after the create's answer"

            # 2. The survivor takes the fleet's next pass within one interval.
            first = _until(
                f"a pass of {fleet} after the kill",
                lambda: conn.execute(
                    "SELECT min(at) FROM fleet_events WHERE fleet = %s AND at > %s",
                    (fleet, killed_at),
                ).fetchone()[0],
                within=INTERVAL + 10,
            )
            assert (first - killed_at).total_seconds() <= INTERVAL + 2

            # 3. Each fleet gets what its queue asks, and no create is made twice: the intent
            #    in flight is found by its label, never POSTed again.
            _until(
                "each fleet at what its queue asks",
                lambda: (
                    {f: len(v) for f, v in _live_at_sim(simulator).items()} == WANT
                    and not conn.execute(
                        "SELECT 1 FROM fleet_instances WHERE state = 'creating'"
                    ).fetchone()
                ),
                within=20,
            )
            labels = [lb for v in _live_at_sim(simulator).values() for lb in v]
            assert label in labels and len(labels) == len(set(labels)) == 3
            assert simulator.count("POST", "/v2/instances", 202) == 3  # one POST each
            adopted = conn.execute(
                "SELECT state, instance_id IS NOT NULL FROM fleet_instances WHERE label = %s",
                (label,),
            ).fetchone()
            assert adopted is not None and adopted[0] != "creating" and adopted[1]

            # 4. One endpoint serves both fleets.
            url = survivor.metrics_url()
            assert url is not None
            text = httpx.get(url, timeout=5).text
            fleets = {
                s.labels.get("fleet")
                for fam in text_string_to_metric_families(text)
                for s in fam.samples
                if s.name == "vultrscale_last_pass_timestamp_seconds"
            }
            assert fleets == set(WANT)

            # 5. The work done, both fleets drain to zero: no drain is left stuck, though
            #    every host is unreachable (deleted once its grace ends, no lease live).
            for lb in labels:
                queue.register_worker(conn, lb, lb)  # each worker reports in: running
            conn.execute("UPDATE jobs SET state = 'succeeded', finished_at = now()")
            _until(
                "every instance drained and deleted",
                lambda: (
                    not _live_at_sim(simulator)
                    and not conn.execute(
                        "SELECT 1 FROM fleet_instances WHERE state <> 'gone'"
                    ).fetchone()
                ),
                within=30,
            )
            assert simulator.count("POST", "/v2/instances", 202) == 3  # none since
        assert survivor.proc.poll() is None, survivor.err.read_text()[-3000:]
        survivor.proc.send_signal(signal.SIGINT)
        assert survivor.proc.wait(30) == 130
    finally:
        for s in scalers:
            if s.proc.poll() is None:
                s.proc.kill()
                s.proc.wait(10)
