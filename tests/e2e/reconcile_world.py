"""A small world for reconcile tests: the simulator over HTTP, a real Postgres, fake time, and
simulated hosts whose workers hold real leases in the real queue.

The hosts stand in for the SSH side (the reconcile's DrainTransport): `stop` makes the worker
give its jobs back and stop, as `systemctl stop` does to `vultrscale worker`.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

from vultrscale import config as config_mod
from vultrscale.core.clock import FakeClock
from vultrscale.core.model import HostTarget, ServiceState
from vultrscale.db import queue
from vultrscale.db.store import PgStore
from vultrscale.errors import SSHError
from vultrscale.fake_vultr.app import Simulator, Timings
from vultrscale.fake_vultr.server import ServerHandle, start_server
from vultrscale.reconcile import Parts, PassResult, run_pass
from vultrscale.vultr.client import VultrClient

API_KEY = "sim-key-0123456789abcdef0123456789abcdef"
PLAN = "vc2-1c-2gb"  # $10/month in the simulator's catalogue


@dataclass
class Host:
    label: str
    service: ServiceState = ServiceState.ACTIVE
    jobs: list[queue.Claimed] = field(default_factory=list)
    stops: int = 0
    reachable: bool = True
    # Registered draining: the real worker keeps that mark for the life of its process and
    # claims nothing (set by a start, from what the registration read).
    marked_draining: bool = False


class FakeHosts:
    """Simulated instances' worker services, keyed by label (implements DrainTransport)."""

    def __init__(self, db_url: str) -> None:
        self.db_url = db_url
        self.hosts: dict[str, Host] = {}
        self.calls: list[tuple[str, str]] = []

    def boot(self, label: str) -> None:
        """The instance's worker starts and reports in."""
        self.hosts[label] = Host(label)
        with psycopg.connect(self.db_url, autocommit=True) as conn:
            queue.register_worker(conn, label, label)

    def claim(self, label: str, n: int, lease_seconds: float = 600) -> int:
        host = self.hosts[label]
        if host.marked_draining:
            return 0
        with psycopg.connect(self.db_url, autocommit=True) as conn:
            got = queue.claim(conn, label, "default", n, lease_seconds)
        host.jobs.extend(got)
        return len(got)

    def finish(self, label: str) -> None:
        host = self.hosts[label]
        with psycopg.connect(self.db_url, autocommit=True) as conn:
            for job in host.jobs:
                queue.complete(conn, job.id, label, job.token)
        host.jobs.clear()

    # DrainTransport
    def stop_many(self, targets: list[HostTarget]) -> dict[str, SSHError | None]:
        out: dict[str, SSHError | None] = {}
        for t in targets:
            self.calls.append(("stop", t.label))
            host = self.hosts.get(t.label)
            if host is None or not host.reachable:
                out[t.label] = SSHError(f"{t.label}: unreachable")
                continue
            host.stops += 1
            host.service = ServiceState.DEACTIVATING
            out[t.label] = None
        return out

    def start_many(self, targets: list[HostTarget]) -> dict[str, SSHError | None]:
        """`systemctl start`: a new worker process registers, as `vultrscale worker` does."""
        out: dict[str, SSHError | None] = {}
        for t in targets:
            self.calls.append(("start", t.label))
            host = self.hosts.get(t.label)
            if host is None or not host.reachable:
                out[t.label] = SSHError(f"{t.label}: unreachable")
                continue
            host.service = ServiceState.ACTIVE
            with psycopg.connect(self.db_url, autocommit=True) as conn:
                queue.register_worker(conn, t.label, t.label)
                row = conn.execute(
                    "SELECT draining FROM workers WHERE worker_id = %s", (t.label,)
                ).fetchone()
            host.marked_draining = bool(row and row[0])
            out[t.label] = None
        return out

    def is_active_many(self, targets: list[HostTarget]) -> dict[str, ServiceState | SSHError]:
        out: dict[str, ServiceState | SSHError] = {}
        for t in targets:
            self.calls.append(("is-active", t.label))
            host = self.hosts.get(t.label)
            if host is None or not host.reachable:
                out[t.label] = SSHError(f"{t.label}: unreachable")
                continue
            if host.service is ServiceState.DEACTIVATING:
                # The drain finishes: unfinished work is given back, the worker exits.
                with psycopg.connect(self.db_url, autocommit=True) as conn:
                    for job in host.jobs:
                        queue.give_back(conn, job.id, t.label, job.token)
                    queue.mark_stopped(conn, t.label)
                host.jobs.clear()
                host.service = ServiceState.INACTIVE
            out[t.label] = host.service
        return out

    def close(self) -> None:
        pass


class World:
    def __init__(self, db_url: str, tmp_path: Path, start: datetime, **timings: float) -> None:
        self.db_url = db_url
        self.tmp_path = tmp_path
        self.clock = FakeClock(start)
        t = {
            "boot_pending": 60.0,
            "boot_ready": 60.0,
            "visible_after": 0.0,
            "snapshot_complete": 30.0,
            **timings,
        }
        self.sim = Simulator(
            API_KEY, clock=self.clock, seed=7, timings=Timings(**t), rate_limit=None
        )
        self.server: ServerHandle = start_server(self.sim)
        self.client = VultrClient(API_KEY, self.server.url, sleep=self.clock.sleep, timeout=5)
        self.hosts = FakeHosts(db_url)
        self.snapshot_id = self._bake()
        self.parts = self.make_parts()
        self._keys = itertools.count()

    def make_parts(self, **overrides: Any) -> Parts:
        signals_reader = overrides.pop("signals_reader", None)
        db_url = overrides.pop("db_url", self.db_url)
        values: dict[str, Any] = dict(
            cloud=self.client,
            store=PgStore(db_url, signals_reader),
            drain=self.hosts,
            clock=self.clock,
            keygen=lambda: ("PRIVATE-KEY", f"ssh-ed25519 AAAAtest{next(self._keys)}"),
            render_user_data=lambda label, priv, pub: f"#cloud-config\nhostname: {label}\n",
            rng=random.Random(3),
        )
        values.update(overrides)
        return Parts(**values)

    def _bake(self) -> str:
        base = self.sim.create_instance(region="ewr", plan=PLAN, os_id=2136, label="base")
        snap = self.client.create_snapshot(base["id"], "base image")
        self.clock.advance(31)
        assert self.client.get_snapshot(snap.id).status == "complete"
        return snap.id

    def config(self, **sections: dict[str, Any]) -> config_mod.Config:
        """A config with this world's snapshot; sections override keys ({"policy": {...}})."""
        body = {
            "fleet": {"snapshot_id": self.snapshot_id, "plan": PLAN, "region": "ewr"},
            "policy": {"max_instances": 5, "billing_hour_aware": False},
            "budget": {"monthly_ceiling_usd": 200.0},
        }
        for name, values in sections.items():
            body.setdefault(name, {}).update(values)
        path = self.tmp_path / "vultrscale.toml"
        path.write_text(_toml(body))
        env = {"VULTR_API_KEY": API_KEY, "DATABASE_URL": self.db_url}
        return config_mod.load(path, env={**env, "WORKER_DATABASE_URL": self.db_url})

    def run(self, cfg: config_mod.Config, **kw: Any) -> PassResult:
        return run_pass(cfg, self.parts, **kw)

    def fleet(self) -> list[dict[str, Any]]:
        """Tagged instances at the simulator (the fleet as Vultr sees it)."""
        return [i for i in self.sim.instances.values() if "vultrscale-workers" in i["tags"]]

    def enqueue(self, n: int) -> list[int]:
        with psycopg.connect(self.db_url, autocommit=True) as conn:
            return queue.enqueue(conn, [{"n": i} for i in range(n)])

    def boot_ready(self) -> list[str]:
        """Start a worker on every fleet instance that is active and has none yet."""
        booted = []
        for inst in self.fleet():
            if inst["status"] == "active" and inst["label"] not in self.hosts.hosts:
                self.hosts.boot(inst["label"])
                booted.append(inst["label"])
        return booted

    def bring_up(self, cfg: config_mod.Config, jobs: int) -> list[str]:
        """Enqueue ``jobs``, run a pass (it creates instances), let them boot (121 s), run
        again, and start a worker on each active instance; return the labels booted."""
        self.enqueue(jobs)
        self.run(cfg)
        self.clock.advance(121)
        self.run(cfg)
        return self.boot_ready()

    def ledger(self) -> dict[str, str]:
        with psycopg.connect(self.db_url) as conn:
            return dict(conn.execute("SELECT label, state FROM fleet_instances").fetchall())

    def close(self) -> None:
        self.client.close()
        self.server.stop()


def _toml(body: dict[str, Any]) -> str:
    lines = []
    for section, values in body.items():
        lines.append(f"[{section}]")
        for key, value in values.items():
            if isinstance(value, bool):
                lines.append(f"{key} = {'true' if value else 'false'}")
            elif isinstance(value, int | float):
                lines.append(f"{key} = {value}")
            elif isinstance(value, list):
                lines.append(f"{key} = {value!r}".replace("'", '"'))
            else:
                lines.append(f'{key} = "{value}"')
    return "\n".join(lines) + "\n"
