"""The account's ceiling across fleets against a real Postgres: two fleets' ledgers in one
database, their passes in two threads, the account's advisory lock between them."""

from __future__ import annotations

import dataclasses
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from vultrscale import config as config_mod
from vultrscale.core.clock import FakeClock
from vultrscale.core.limits import Limit
from vultrscale.core.model import Signals
from vultrscale.db import account as account_db
from vultrscale.db.store import PgStore
from vultrscale.memory import SNAPSHOT, MemoryCloud, MemoryDrain, host_keys
from vultrscale.ports import Parts
from vultrscale.reconcile import PassResult, run_pass

START = datetime(2026, 5, 10, 9, 0, tzinfo=UTC)
ENV = {
    "VULTR_API_KEY": "k" * 32,
    "DATABASE_URL": "postgresql://unused@nowhere/db",
    "WORKER_DATABASE_URL": "postgresql://worker@nowhere/db",
}


class _GatedCloud(MemoryCloud):
    """Creates wait at ``gate`` once it is cleared, saying so at ``entered``."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def create_instance(self, **kw: Any) -> Any:
        self.entered.set()
        assert self.gate.wait(20), "the test never opened the gate"
        return super().create_instance(**kw)


class _Fleet:
    """One fleet of the account: the account's one cloud (Vultr lists each fleet's instances by
    its tag), the fleet's own ledger in the shared database."""

    def __init__(
        self, folder: Path, name: str, db_url: str, ceiling: float, cloud: _GatedCloud
    ) -> None:
        self.clock = cloud.clock
        self.cloud = cloud
        self.ready = 0
        path = folder / f"{name}.toml"
        path.write_text(
            f'[fleet]\nname = "{name}"\ntag = "vs-{name}"\nsnapshot_id = "{SNAPSHOT}"\n'
            '[policy]\nmax_instances = 5\nbilling_hour_aware = false\nscale_up_cooldown = "0s"\n'
            'target_wait = "0s"\n[budget]\nmonthly_ceiling_usd = 500.0\n'
            f"[account]\nmonthly_ceiling_usd = {ceiling}\n"
        )
        self.cfg = config_mod.load(path, env=ENV)
        self.parts = Parts(
            cloud=self.cloud,
            store=PgStore(db_url, lambda conn: Signals(ready=self.ready, in_flight=0)),
            drain=MemoryDrain(),
            clock=cloud.clock,
            keygen=host_keys(),
            render_user_data=lambda label, priv, pub, jobs=None: f"#cloud-config\n# {label}\n",
        )

    def run(self) -> PassResult:
        return run_pass(self.cfg, self.parts)


def _two(folder: Path, db_url: str, ceiling: float) -> tuple[_Fleet, _Fleet]:
    cloud = _GatedCloud(FakeClock(START))
    return _Fleet(folder, "web", db_url, ceiling, cloud), _Fleet(
        folder, "gpu", db_url, ceiling, cloud
    )


def _live(db_url: str) -> dict[str, int]:
    with psycopg.connect(db_url) as conn:
        rows = conn.execute(
            "SELECT fleet, count(*) FROM fleet_instances WHERE state <> 'gone' GROUP BY fleet"
        ).fetchall()
    return {r[0]: int(r[1]) for r in rows}


def test_the_account_ceiling_holds_across_two_fleets(db_url: str, tmp_path: Path) -> None:
    """Room for 3 instances of $10 in the account: web takes 2, gpu the 1 left."""
    web, gpu = _two(tmp_path, db_url, ceiling=30.0)
    web.ready, gpu.ready = 8, 12
    assert web.run().exit_code == 0
    result = gpu.run()
    assert result.exit_code == 0
    assert _live(db_url) == {"web": 2, "gpu": 1}
    assert result.plan is not None
    (clamp,) = [c for c in result.plan.clamps if c.kind is Limit.BUDGET_ACCOUNT]
    assert (clamp.asked, clamp.allowed) == (3, 1)
    assert "other fleets (web)" in clamp.describe()


def test_two_fleets_passes_at_once_never_spend_the_same_headroom(
    db_url: str, tmp_path: Path
) -> None:
    """Web's pass holds the account's lock and stops in its first POST, its intent written.
    Gpu's pass reads the account then, decides on the room it sees, and waits for the lock;
    web creates its 3. Read again under the lock, the account is full: gpu creates none."""
    web, gpu = _two(tmp_path, db_url, ceiling=30.0)
    web.ready = gpu.ready = 12
    web.cloud.gate.clear()
    results: dict[str, PassResult] = {}
    first = threading.Thread(target=lambda: results.setdefault("web", web.run()))
    first.start()
    assert web.cloud.entered.wait(20)
    second = threading.Thread(target=lambda: results.setdefault("gpu", gpu.run()))
    second.start()
    with psycopg.connect(db_url, autocommit=True) as conn:
        _wait_for_a_waiter(conn)  # gpu decided to create and waits for the account's lock
    web.cloud.gate.set()
    first.join(20)
    second.join(20)
    assert web.cloud.posts == 3  # all web's: gpu created none
    assert _live(db_url) == {"web": 3}
    plan = results["gpu"].plan
    assert plan is not None and plan.creates == 0
    assert any(c.kind is Limit.BUDGET_ACCOUNT for c in plan.clamps)


def _wait_for_a_waiter(conn: psycopg.Connection[Any]) -> None:
    """Until a session waits for the account's advisory lock (ungranted), within 20 s."""
    import time

    until = time.monotonic() + 20
    while time.monotonic() < until:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            "AND classid = %s::oid",
            (account_db._NAMESPACE,),
        ).fetchone()
        if row and row[0]:
            return
        time.sleep(0.02)
    raise AssertionError("no pass came to wait for the account's lock")


def test_a_holder_whose_connection_drops_frees_the_account(db_url: str) -> None:
    """A scaler killed holding the account's lock (its session ended by the server) frees it
    at once: the next pass takes it without waiting."""
    holder = psycopg.connect(db_url, autocommit=True)
    assert account_db.lock(holder, 1.0)
    with psycopg.connect(db_url, autocommit=True) as other:
        assert not account_db.lock(other, 0.05)
        pid = holder.info.backend_pid
        other.execute("SELECT pg_terminate_backend(%s)", (pid,))
        assert account_db.lock(other, 5.0)
    holder.close()


def test_orphans_are_the_live_instances_of_fleets_no_file_describes(
    db_url: str, tmp_path: Path
) -> None:
    web, gpu = _two(tmp_path, db_url, ceiling=0.0)
    web.ready, gpu.ready = 4, 8
    web.run()
    gpu.run()
    with psycopg.connect(db_url, autocommit=True) as conn:
        found = account_db.orphans(conn, ["web"])
    assert [(o.fleet, o.instances) for o in found] == [("gpu", 2)]
    assert all(label.startswith("worker-") for label in found[0].labels)


def test_without_an_account_ceiling_each_fleet_has_its_own(db_url: str, tmp_path: Path) -> None:
    web, gpu = _two(tmp_path, db_url, ceiling=0.0)
    web.ready, gpu.ready = 20, 20
    web.run()
    gpu.run()
    assert _live(db_url) == {"web": 5, "gpu": 5}
    assert dataclasses.replace(web.cfg.account).monthly_ceiling_usd == 0.0


def test_a_pass_session_asks_the_server_to_notice_a_vanished_scaler(db_url: str) -> None:
    """Power lost on the host holding a fleet's lock: the server ends its session (and frees
    the lock) within about PASS_STALL_S / 2 of silence, not after the kernel's two hours."""
    store = PgStore(db_url, keep=True)
    try:
        cfg = config_mod.Config()
        with store.session(cfg) as (ledger, _signals):
            conn = ledger.conn  # type: ignore[attr-defined]
            shown = {
                name: conn.execute(f"SHOW {name}").fetchone()[0]
                for name in (
                    "tcp_keepalives_idle",
                    "tcp_keepalives_interval",
                    "tcp_keepalives_count",
                )
            }
    finally:
        store.close()
    assert shown == {
        "tcp_keepalives_idle": "5",
        "tcp_keepalives_interval": "2",
        "tcp_keepalives_count": "3",
    }
