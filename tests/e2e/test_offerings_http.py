"""Offerings as a user meets them (docs/offerings.md): the real CLI and Vultr client over the
simulator's HTTP, real Postgres. The first offering runs out after its availability was
cached: the create is refused in the simulator's words, the same pass creates on the second,
the next processes skip the first without asking, and `status`, `events` and the metrics say
so."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.e2e.cli_world import scaler_key, simulator_with_snapshot
from vultrscale.cli import main
from vultrscale.db import queue
from vultrscale.fake_vultr.app import Simulator

API_KEY = "VKEY-offerings-0123456789abcdefghijk"
PLAN = "vc2-1c-2gb"


@pytest.fixture
def sim(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Simulator]:
    sim, server, snapshot_id = simulator_with_snapshot(API_KEY, seed=3)
    key = scaler_key(tmp_path)
    cfg = tmp_path / "vultrscale.toml"
    cfg.write_text(
        f'[fleet]\nsnapshot_id = "{snapshot_id}"\nssh_key = "{key}"\n'
        f'[[fleet.offerings]]\nregion = "ewr"\nplan = "{PLAN}"\n'
        f'[[fleet.offerings]]\nregion = "ams"\nplan = "{PLAN}"\n'
        '[policy]\nmax_instances = 8\nscale_up_cooldown = "0s"\n'
        "[budget]\nmonthly_ceiling_usd = 200.0\n"
    )
    monkeypatch.setenv("VULTRSCALE_CONFIG", str(cfg))
    monkeypatch.setenv("VULTR_API_KEY", API_KEY)
    monkeypatch.setenv("VULTR_API_URL", server.url)
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setenv("WORKER_DATABASE_URL", db_url)
    monkeypatch.chdir(tmp_path)
    try:
        yield sim
    finally:
        server.stop()


def _enqueue(n: int) -> None:
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        queue.enqueue(conn, [{}] * n)


def _run(capsys: pytest.CaptureFixture[str], sim: Simulator, *args: str) -> tuple[int, str, list]:
    before = len(sim.request_log)
    code = main(list(args))
    out = capsys.readouterr().out
    return code, out, [(r.method, r.path, r.status) for r in sim.request_log[before:]]


def _regions(sim: Simulator) -> list[str]:
    return sorted(v["region"] for v in sim.instances.values() if v["label"] != "base")


def test_a_sold_out_first_offering_is_skipped_in_the_same_pass_and_remembered(
    sim: Simulator, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _enqueue(12)
    code, _, requests = _run(capsys, sim, "reconcile")
    assert code == 0 and _regions(sim) == ["ewr", "ewr", "ewr"]
    # Sold out in ewr: the plan leaves the region, while the cached availability still lists it.
    (plan,) = [p for p in sim.plans if p["id"] == PLAN]
    plan["locations"] = [r for r in plan["locations"] if r != "ewr"]
    _enqueue(8)
    metrics = tmp_path / "vultrscale.prom"
    code, out, requests = _run(capsys, sim, "reconcile", "--json", "--metrics-file", str(metrics))
    assert code == 0, out
    assert _regions(sim) == ["ams", "ams", "ewr", "ewr", "ewr"]
    posts = [
        status for method, path, status in requests if (method, path) == ("POST", "/v2/instances")
    ]
    assert posts == [400, 202, 202]  # one refusal, then the next offering in the same pass
    assert len(requests) == 5  # the list, the snapshot, three POSTs: no check asked again
    results = [r["result"] for r in json.loads(out)["results"]]
    assert any(r.startswith("create refused on ewr/vc2-1c-2gb (unavailable: ") for r in results)
    assert sum(r.endswith(" on ams/vc2-1c-2gb") for r in results) == 2
    prom = metrics.read_text()
    refused = (
        'vultrscale_create_refusals_total{fleet="workers",kind="unavailable",'
        'offering="ewr/vc2-1c-2gb"} 1.0'
    )
    assert refused in prom
    assert 'vultrscale_offering_usable{fleet="workers",offering="ams/vc2-1c-2gb"} 1.0' in prom

    _enqueue(4)
    code, out, requests = _run(capsys, sim, "reconcile", "--json")  # another process: cron
    assert code == 0 and _regions(sim) == ["ams", "ams", "ams", "ewr", "ewr", "ewr"]
    assert [(m, p) for m, p, _ in requests if m == "POST"] == [("POST", "/v2/instances")]
    skipped = [r for r in json.loads(out)["results"] if r["label"] == "offering ewr/vc2-1c-2gb"]
    assert skipped and "skipped" in skipped[0]["result"] and "s more" in skipped[0]["result"]

    code, out, requests = _run(capsys, sim, "status", "--json")
    assert code == 0 and len(requests) == 1  # the list: offerings from the ledger
    first, second = json.loads(out)["offerings"]
    assert (first["offering"], first["usable"], first["refusals"]) == ("ewr/vc2-1c-2gb", False, 1)
    assert 0 < first["unavailable_for_s"] <= 180
    assert (second["offering"], second["usable"]) == ("ams/vc2-1c-2gb", True)
    code, out, _ = _run(capsys, sim, "events", "--since", "10m", "--json")
    assert code == 0 and "create refused on ewr/vc2-1c-2gb" in out
