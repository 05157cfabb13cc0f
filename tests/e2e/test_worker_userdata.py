"""User-data carries the workers' credentials, never the scaler's unless the user opts in:
`cloud-init render` and a real create at the simulator, with and without a worker address."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest

from tests.e2e.reconcile_world import API_KEY, World
from vultrscale import cloudinit
from vultrscale import config as config_mod
from vultrscale.cli import main
from vultrscale.errors import UsageError
from vultrscale.ssh import generate_host_key

pytestmark = pytest.mark.e2e

SCALER_PW = "sc4ler-0wner-pw"
WORKER_PW = "w0rker-only-pw"
SCALER_URL = f"postgresql://owner:{SCALER_PW}@10.0.0.5:5432/jobs"
WORKER_URL = f"postgresql://vultrscale_worker:{WORKER_PW}@10.1.0.5:5432/jobs"
START = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)

# Which password the user-data carries, for each way of configuring the workers' address.
CASES = {
    "no-worker-address": ({}, None),
    "worker-address": ({"WORKER_DATABASE_URL": WORKER_URL}, WORKER_PW),
    "scaler-url-opted-in": ({"VULTRSCALE_WORKER_USE_SCALER_DATABASE_URL": "true"}, SCALER_PW),
}


# --- cloud-init render -------------------------------------------------------------------------


@pytest.fixture
def render_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    private, public = generate_host_key()
    key = tmp_path / "scaler_key"
    key.write_text(private)
    key.chmod(0o600)
    (tmp_path / "scaler_key.pub").write_text(public + "\n")
    monkeypatch.chdir(tmp_path)
    for name in ("VULTRSCALE_CONFIG", "WORKER_DATABASE_URL", "DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("VULTRSCALE_FLEET_SSH_KEY", str(key))
    monkeypatch.setenv("DATABASE_URL", SCALER_URL)
    return tmp_path


@pytest.mark.parametrize("case", CASES)
def test_render_puts_only_the_workers_credentials_in_user_data(
    case: str,
    render_env: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    env, carried = CASES[case]
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code = main(["cloud-init", "render", "--show-secrets"])
    out = capsys.readouterr()
    if carried is None:
        assert code == 2
        assert "WORKER_DATABASE_URL is not set" in out.err
        assert "use_scaler_database_url = true" in out.err and "vultrscale db init" in out.err
        assert SCALER_PW not in out.out + out.err and out.out == ""
        return
    assert code == 0, out.err
    assert carried in out.out
    if carried != SCALER_PW:
        assert SCALER_PW not in out.out + out.err
    assert main(["cloud-init", "render"]) == 0  # masked by default, whichever URL it is
    masked = capsys.readouterr()
    assert carried not in masked.out + masked.err


# --- a create at the simulator -----------------------------------------------------------------


@pytest.fixture
def world(db_url: str, tmp_path: Path) -> Iterator[World]:
    w = World(db_url, tmp_path, START)
    try:
        yield w
    finally:
        w.close()


def _config(world: World, env: dict[str, str]) -> config_mod.Config:
    world.config()  # writes this world's vultrscale.toml
    base = {"VULTR_API_KEY": API_KEY, "DATABASE_URL": SCALER_URL}
    return config_mod.load(world.tmp_path / "vultrscale.toml", env={**base, **env})


@pytest.mark.parametrize("case", CASES)
def test_a_create_sends_only_the_workers_credentials_unless_opted_in(
    case: str, world: World
) -> None:
    env, carried = CASES[case]
    cfg = _config(world, env)
    _, scaler_public = generate_host_key()
    world.parts = world.make_parts(
        keygen=generate_host_key,
        render_user_data=lambda label, private, public: cloudinit.render_user_data(
            cfg, label, private, public, scaler_public, show_secrets=True
        ),
    )
    world.enqueue(8)
    if carried is None:
        with pytest.raises(UsageError, match="WORKER_DATABASE_URL is not set") as refused:
            world.run(cfg)
        assert SCALER_PW not in str(refused.value) + (refused.value.hint or "")
        # Refused before any change: no request to create, no intent in the ledger; the
        # refused pass's own event, with the reason and no password, is its only write.
        assert world.sim.count("POST", "/v2/instances") == 0 and world.fleet() == []
        assert world.ledger() == {}
        with psycopg.connect(world.db_url) as conn:
            events = conn.execute("SELECT exit_code, errors::text FROM fleet_events").fetchall()
        assert len(events) == 1 and events[0][0] == 2, events
        assert "WORKER_DATABASE_URL" in events[0][1] and SCALER_PW not in events[0][1]
        return
    result = world.run(cfg)
    assert result.exit_code == 0, result.errors
    made = world.fleet()
    assert len(made) == 2
    for inst in made:
        user_data = world.sim.user_data(inst["id"])
        doc = cloudinit.check_user_data(user_data)
        env_file = {f["path"]: f["content"] for f in doc["write_files"]}[cloudinit.WORKER_ENV_PATH]
        assert carried in env_file
        if carried != SCALER_PW:
            assert SCALER_PW not in user_data
