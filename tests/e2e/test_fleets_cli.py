"""`reconcile`, `status`, `events` and the metrics of a directory of fleets as a user runs
them: the real CLI in this process, the simulator over HTTP, a real Postgres."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.cli_world import scaler_key, simulator_with_snapshot
from vultrscale.cli import main
from vultrscale.db import queue
from vultrscale.fake_vultr.app import Simulator

pytestmark = pytest.mark.e2e

API_KEY = "VKEY-fleets-test-0123456789abcdefghij"


@pytest.fixture
def world(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Simulator, Path, str]]:
    """Two fleets on two queues of one database (web: 6 jobs, reports: 2), and a third file
    that cannot run."""
    sim, server, snapshot_id = simulator_with_snapshot(API_KEY, seed=4)
    key = scaler_key(tmp_path)
    folder = tmp_path / "fleets"
    folder.mkdir()
    for name in ("web", "reports"):
        (folder / f"{name}.toml").write_text(
            f'[fleet]\nname = "{name}"\ntag = "vs-{name}"\nlabel_prefix = "{name}"\n'
            f'snapshot_id = "{snapshot_id}"\nssh_key = "{key}"\n[worker]\nqueue = "{name}"\n'
            f'[queue]\nqueue = "{name}"\n[policy]\nmax_instances = 3\n'
        )
    (folder / "gpu.toml").write_text('[fleet]\nname = "gpu"\n[policy]\nmax_instances = -1\n')
    with psycopg.connect(db_url, autocommit=True) as conn:
        queue.enqueue(conn, [{}] * 6, queue="web")
        queue.enqueue(conn, [{}] * 2, queue="reports")
    monkeypatch.setenv("VULTRSCALE_CONFIG", str(folder))
    monkeypatch.setenv("VULTR_API_KEY", API_KEY)
    monkeypatch.setenv("VULTR_API_URL", server.url)
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setenv("WORKER_DATABASE_URL", db_url)
    monkeypatch.chdir(tmp_path)
    try:
        yield sim, folder, db_url
    finally:
        server.stop()


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    assert API_KEY not in out.out + out.err
    return code, out.out, out.err


def _created(sim: Simulator) -> dict[str, int]:
    """Instances at the simulator by fleet tag."""
    by_tag: dict[str, int] = {}
    for inst in sim.instances.values():
        for tag in inst["tags"]:
            by_tag[tag] = by_tag.get(tag, 0) + 1
    return by_tag


def test_one_pass_acts_on_every_fleet_and_exits_2_naming_the_invalid_file(
    world: tuple[Simulator, Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    sim, _, _ = world
    code, out, err = _run(capsys, "reconcile")
    assert code == 2
    assert "fleet reports:" in out and "fleet web:" in out
    assert "gpu.toml: policy.max_instances" in err
    assert "1 of 3 fleet(s) failed: gpu.toml (invalid, not run)" in err
    assert _created(sim) == {"vs-web": 2, "vs-reports": 1}  # what each queue asks, no more
    code, out, _ = _run(capsys, "--fleet", "web", "reconcile", "--json")
    (web,) = json.loads(out)["fleets"]  # one fleet of the directory, the others left alone
    assert code == 0 and web["fleet"] == "web" and web["actions"] == []


def test_status_shows_every_fleet_the_account_and_orphans_of_a_removed_file(
    world: tuple[Simulator, Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    _, folder, _ = world
    _run(capsys, "reconcile")
    (folder / "gpu.toml").unlink()
    (folder / "reports.toml").rename(folder.parent / "reports.toml.off")  # removed while it runs
    code, out, _ = _run(capsys, "status", "--json")
    doc = json.loads(out)
    assert code == 0
    assert [f["fleet"] for f in doc["fleets"]] == ["web"]
    assert len(doc["fleets"][0]["instances"]) == 2
    account = doc["account"]
    assert account["fleets"] == ["reports", "web"] and account["instances"] == 3
    assert account["committed_usd"] > account["month_to_date_usd"] > 0
    (orphan,) = account["orphans"]
    assert orphan["fleet"] == "reports" and orphan["instances"] == 1
    code, out, _ = _run(capsys, "status")
    assert "instances of fleets no config file describes" in out and "reports" in out
    assert "account: $" in out


def test_events_list_every_fleets_passes_with_their_fleet(
    world: tuple[Simulator, Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    _run(capsys, "reconcile")
    code, out, _ = _run(capsys, "events", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["fleets"] == ["reports", "web"]
    assert sorted(e["fleet"] for e in doc["events"]) == ["reports", "web"]
    code, out, _ = _run(capsys, "--fleet", "reports", "events", "--json")
    assert [e.get("fleet", "reports") for e in json.loads(out)["events"]] == ["reports"]


def test_one_metrics_file_holds_every_fleet_the_account_and_the_invalid_file(
    world: tuple[Simulator, Path, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    prom = tmp_path / "vultrscale.prom"
    code, _, _ = _run(capsys, "reconcile", "--metrics-file", str(prom))
    assert code == 2
    samples = _samples(prom.read_text())
    assert samples[("vultrscale_target_instances", (("fleet", "web"),))] == 2
    assert samples[("vultrscale_target_instances", (("fleet", "reports"),))] == 1
    assert samples[("vultrscale_fleet_files_invalid", ())] == 1
    assert samples[("vultrscale_orphan_instances", ())] == 0
    assert samples[("vultrscale_account_month_to_date_usd", ())] > 0


def test_the_account_ceiling_holds_across_the_fleets(
    world: tuple[Simulator, Path, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Room for two $10 instances in the account: the fleets' passes (at once, in two threads)
    create two in all, not the three their queues ask."""
    sim, _, _ = world
    monkeypatch.setenv("VULTRSCALE_ACCOUNT_MONTHLY_CEILING_USD", "20")
    code, out, _ = _run(capsys, "reconcile", "--json")
    assert sum(_created(sim).values()) == 2
    doc = json.loads(out)
    clamps = [c for f in doc["fleets"] for c in (f.get("plan") or {}).get("clamps", [])]
    assert any("account's ceiling $20.00" in c for c in clamps), clamps


def _samples(text: str) -> dict[tuple[str, tuple[Any, ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
