"""`vultrscale reconcile --loop` as a log: one line per pass, human or JSON, carrying the pass
id that `vultrscale events` shows; real CLI, simulator over HTTP, real Postgres."""

from __future__ import annotations

import functools
import json
import os

import psycopg
import pytest

from tests.e2e.test_cli_reconcile import DB_PASSWORD, cli_env, run  # noqa: F401 - the fixture
from vultrscale import reconcile
from vultrscale.db import queue

pytestmark = pytest.mark.e2e


@pytest.fixture
def two_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop stops after two passes, the second right after the first (no interval)."""
    monkeypatch.setattr(
        reconcile, "run_forever", functools.partial(reconcile.run_forever, max_passes=2)
    )
    monkeypatch.setattr(reconcile, "_wait", lambda clock, stop, seconds: None)


def _event_ids(capsys: pytest.CaptureFixture[str]) -> list[int]:
    code, out = run(capsys, "events", "--json")
    assert code == 0
    return [e["id"] for e in json.loads(out)["events"]]


def test_json_lines_carry_the_pass_ids_events_shows(cli_env, two_passes, capsys) -> None:  # noqa: F811
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        queue.enqueue(conn, [{}] * 5)
    code, out = run(capsys, "reconcile", "--loop", "--interval", "5s", "--log-format", "json")
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == 2  # one per pass, nothing else
    records = [json.loads(line) for line in lines]
    assert [r["pass_id"] for r in records] == _event_ids(capsys)
    first = records[0]
    assert first["fleet"] == "workers" and first["exit_code"] == 0 and first["level"] == "info"
    assert first["queue"]["ready"] == 5 and len(first["actions"]) == 2


def test_human_lines_name_the_pass_the_events_table_shows(cli_env, two_passes, capsys) -> None:  # noqa: F811
    code, out = run(capsys, "reconcile", "--loop", "--interval", "5s")
    assert code == 0
    lines = out.splitlines()
    ids = _event_ids(capsys)
    assert len(lines) == 2 and len(ids) == 2
    for line, pass_id in zip(lines, ids, strict=True):
        assert f" fleet workers pass {pass_id}: exit 0 in " in line
    code, table = run(capsys, "events")
    assert code == 0
    cells = [
        [c.strip() for c in row.split("┃" if "┃" in row else "│")] for row in table.splitlines()
    ]
    assert any(row[1:3] == ["pass", "at (UTC)"] for row in cells), table
    assert [row[1] for row in cells if len(row) > 2 and row[1].isdigit()] == [str(i) for i in ids]


def test_a_pass_that_cannot_reach_the_database_is_one_line_without_the_password(
    cli_env,  # noqa: F811
    two_passes,
    capsys,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(
        "DATABASE_URL", f"postgresql://u:{DB_PASSWORD}@127.0.0.1:9/x?connect_timeout=2"
    )
    code = reconcile_loop_json_err(capsys)
    assert code == 1


def reconcile_loop_json_err(capsys: pytest.CaptureFixture[str]) -> int:
    from vultrscale.cli import main

    code = main(["reconcile", "--loop", "--interval", "5s", "--log-format", "json"])
    out = capsys.readouterr()
    assert DB_PASSWORD not in out.out + out.err
    lines = out.err.splitlines()
    assert len(lines) == 2, out.err  # one per failed pass
    for line in lines:
        record = json.loads(line)
        assert record["level"] == "error" and record["exit_code"] == 1
        assert "database" in record["error"].lower()
    return code


def test_log_format_without_loop_is_a_usage_error(cli_env, capsys) -> None:  # noqa: F811
    code, _ = run(capsys, "reconcile", "--log-format", "json")
    assert code == 2
