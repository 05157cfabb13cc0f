"""A world for driving the CLI in-process: the Vultr simulator over loopback HTTP with a
snapshot to create from, a migrated database (its URL carrying a password that trust auth
ignores), an empty database, a config with the scaler's SSH key, a closed and a busy port."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from vultrscale.core.clock import SystemClock
from vultrscale.db import throwaway
from vultrscale.fake_vultr.app import Simulator, Timings
from vultrscale.fake_vultr.server import ServerHandle, start_server
from vultrscale.ssh import generate_host_key


@dataclass
class World:
    sim: Simulator
    server: ServerHandle
    db: str  # the database URL, with a password (trust auth ignores it)
    empty_db: str
    config: Path  # a valid config whose last table is [fleet]
    closed: int
    busy: socket.socket


def _refusing_socket() -> socket.socket:
    """A port bound and never listened on: connections to it are refused, and no other
    process (another test run on this machine) can take it while the world lives. A port
    found free and let go could be handed to someone's server a moment later."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    return s


def simulator_with_snapshot(api_key: str, seed: int) -> tuple[Simulator, ServerHandle, str]:
    """The simulator serving on loopback, with a complete snapshot to create instances from
    (the caller stops the server)."""
    sim = Simulator(
        api_key,
        clock=SystemClock(),
        seed=seed,
        rate_limit=None,
        timings=Timings(boot_pending=30, boot_ready=30, visible_after=0, snapshot_complete=0),
    )
    server = start_server(sim)
    base = sim.create_instance(region="ewr", plan="vc2-1c-2gb", os_id=2136, label="base")
    snapshot_id = httpx.post(
        f"{server.url}/v2/snapshots",
        json={"instance_id": base["id"]},
        headers={"Authorization": f"Bearer {api_key}"},
    ).json()["snapshot"]["id"]
    return sim, server, str(snapshot_id)


def scaler_key(folder: Path) -> Path:
    """The scaler's SSH key pair in ``folder`` (private 0600), as `fleet.ssh_key` names it."""
    private, public = generate_host_key()
    key = folder / "scaler_key"
    key.write_text(private)
    key.chmod(0o600)
    (folder / "scaler_key.pub").write_text(public + "\n")
    return key


@contextmanager
def cli_world(
    pg_admin_url: str, template: str, tmp: Path, api_key: str, db_password: str
) -> Iterator[World]:
    sim, server, snapshot_id = simulator_with_snapshot(api_key, seed=5)
    key = scaler_key(tmp)
    config = tmp / "base.toml"
    config.write_text(f'[fleet]\nsnapshot_id = "{snapshot_id}"\nssh_key = "{key}"\n')
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    closed = _refusing_socket()
    try:
        with (
            throwaway.scratch_database(pg_admin_url, template=template) as db,
            throwaway.scratch_database(pg_admin_url) as empty_db,
        ):
            yield World(
                sim,
                server,
                db.replace("postgres@", f"postgres:{db_password}@"),
                empty_db,
                config,
                int(closed.getsockname()[1]),
                busy,
            )
    finally:
        busy.close()
        closed.close()
        server.stop()
