"""`vultrscale instances`: the fleet's tagged instances, driven through the real CLI entry point
against a respx-mocked Vultr API (no database)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx

from vultrscale.cli import main

API = "https://api.vultr.com"
KEY = "CLIKEY0123456789ABCDEFGHIJKLMNOPQRSTU"
TAG = "acme-workers"


def _instance(i: int, **over: Any) -> dict[str, Any]:
    data = {
        "id": f"4f0f12e5-1f84-404f-aa84-{i:012d}",
        "label": f"worker-1764470000-ab{i:02d}",
        "status": "active",
        "power_status": "running",
        "server_status": "ok",
        "main_ip": f"203.0.113.{i}",
        "internal_ip": "",
        "region": "ewr",
        "plan": "vc2-1c-2gb",
        "date_created": f"2026-11-30T0{i}:00:00+00:00",
        "tags": [TAG, "team-data"],
    }
    data.update(over)
    return data


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory with a config that names the fleet's tag, and a clean environment."""
    (tmp_path / "vultrscale.toml").write_text(f'[fleet]\nname = "acme"\ntag = "{TAG}"\n')
    monkeypatch.chdir(tmp_path)
    for name in ("VULTRSCALE_CONFIG", "VULTR_API_URL", "DATABASE_URL", "WORKER_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("VULTR_API_KEY", KEY)
    monkeypatch.setenv("COLUMNS", "80")
    return tmp_path


@pytest.fixture
def api() -> Iterator[respx.MockRouter]:
    with respx.mock(base_url=API, assert_all_called=False) as router:
        yield router


def _two_pages(api: respx.MockRouter) -> respx.Route:
    pages = {
        None: {
            "instances": [_instance(2), _instance(1, status="pending", main_ip="0.0.0.0")],
            "meta": {"total": 3, "links": {"next": "bmV4dF9fMg==", "prev": ""}},
        },
        "bmV4dF9fMg==": {
            "instances": [_instance(3, server_status="installingbooting")],
            "meta": {"total": 3, "links": {"next": "", "prev": "cHJldl9fMw=="}},
        },
    }
    return api.get("/v2/instances").mock(
        side_effect=lambda request: httpx.Response(
            200, json=pages[request.url.params.get("cursor")]
        )
    )


def test_json_lists_every_tagged_instance_over_all_pages(
    env: Path, api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
):
    route = _two_pages(api)

    assert main(["instances", "--json"]) == 0

    out = capsys.readouterr().out
    doc = json.loads(out)
    assert doc["fleet"] == "acme" and doc["tag"] == TAG and doc["count"] == 3
    assert [i["label"] for i in doc["instances"]] == [
        "worker-1764470000-ab01",
        "worker-1764470000-ab02",
        "worker-1764470000-ab03",
    ]  # oldest first
    first = doc["instances"][0]
    assert first["status"] == "pending" and first["date_created"] == "2026-11-30T01:00:00+00:00"
    assert first["tags"] == [TAG, "team-data"]
    assert route.call_count == 2
    assert all(c.request.url.params["tag"] == TAG for c in route.calls)
    assert route.calls[0].request.headers["Authorization"] == f"Bearer {KEY}"
    assert KEY not in out


def test_table_fits_80_columns(
    env: Path, api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
):
    _two_pages(api)

    assert main(["instances"]) == 0

    out = capsys.readouterr().out
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80
    for i in (1, 2, 3):
        inst = _instance(i)
        assert inst["id"] in out and inst["label"] in out  # whole, not folded
    assert "203.0.113.2" in out and "0.0.0.0" not in out  # pending: no address yet
    assert "installingbooting" in out and "pending" in out
    assert "ewr vc2-1c-2gb" in out and "2026-11-30 03:00" in out
    assert "3 instance(s)" in out and TAG in out and API in out


def test_wide_terminal_gets_one_column_per_field(
    env: Path,
    api: respx.MockRouter,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setenv("COLUMNS", "200")
    _two_pages(api)

    assert main(["instances"]) == 0

    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if "label" in line)
    for name in ("id", "status", "power", "server", "main IP", "region", "plan", "created"):
        assert name in header
    row = next(line for line in lines if _instance(3)["id"] in line)
    assert "worker-1764470000-ab03" in row and "203.0.113.3" in row and "installingbooting" in row


def test_no_instances_says_so(env: Path, api: respx.MockRouter, capsys: pytest.CaptureFixture[str]):
    api.get("/v2/instances").mock(
        return_value=httpx.Response(
            200, json={"instances": [], "meta": {"total": 0, "links": {"next": "", "prev": ""}}}
        )
    )
    assert main(["instances"]) == 0
    out = capsys.readouterr().out
    assert "No instances carry the tag" in out and TAG in out


def test_missing_key_exits_2_without_a_request(
    env: Path,
    api: respx.MockRouter,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.delenv("VULTR_API_KEY")
    route = api.get("/v2/instances")

    assert main(["instances", "--json"]) == 2

    err = capsys.readouterr().err
    assert "VULTR_API_KEY is not set" in err
    assert "Fix:" in err and "Set VULTR_API_KEY" in err
    assert not route.called and not api.calls


def test_refused_key_exits_2_with_the_fix(
    env: Path, api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
):
    api.get("/v2/instances").mock(
        return_value=httpx.Response(401, json={"error": "Invalid API token.", "status": 401})
    )
    assert main(["instances"]) == 2
    captured = capsys.readouterr()
    assert "refused the API key" in captured.err and "allow-list" in captured.err
    assert KEY not in captured.err + captured.out


def test_api_url_from_the_environment(
    env: Path,
    api: respx.MockRouter,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setenv("VULTR_API_URL", "http://127.0.0.1:8765")
    route = api.get("http://127.0.0.1:8765/v2/instances").mock(
        return_value=httpx.Response(
            200, json={"instances": [_instance(1)], "meta": {"links": {"next": ""}}}
        )
    )
    assert main(["instances", "--json"]) == 0
    assert route.call_count == 1
    assert json.loads(capsys.readouterr().out)["api_url"] == "http://127.0.0.1:8765"
