"""`vultrscale db init` and `vultrscale enqueue` against a real Postgres."""

from __future__ import annotations

import psycopg
import pytest

from vultrscale import cli
from vultrscale.db import schema


def test_db_init_creates_the_schema_and_is_idempotent(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DATABASE_URL", pg_url)
    assert cli.main(["db", "init"]) == 0
    assert cli.main(["db", "init"]) == 0
    out = capsys.readouterr().out
    assert out.count(f"Schema is at version {schema.LATEST}.") == 2


def test_db_init_without_database_url_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    assert cli.main(["db", "init"]) == 2
    err = capsys.readouterr().err
    assert "DATABASE_URL is not set" in err and "Set DATABASE_URL=postgresql:" in err


def test_db_init_unreachable_exits_1_with_the_password_masked(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://app:hunter2-secret@127.0.0.1:9/app")
    assert cli.main(["db", "init"]) == 1
    err = capsys.readouterr().err
    assert "cannot reach the database" in err and "app:***@127.0.0.1:9" in err
    assert "hunter2-secret" not in err


def test_enqueue_inserts_jobs(
    db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DATABASE_URL", db_url)
    args = ["enqueue", "--count", "3", "--payload", '{"step_seconds": 1}', "--queue", "q1"]
    assert cli.main([*args, "--max-attempts", "5"]) == 0
    assert "Enqueued 3 job(s) on queue 'q1'" in capsys.readouterr().out
    with psycopg.connect(db_url) as conn:
        rows = conn.execute("SELECT queue, state, attempts, max_attempts, payload FROM jobs")
        assert rows.fetchall() == [("q1", "ready", 0, 5, {"step_seconds": 1})] * 3


def test_enqueue_stores_text_that_only_looks_like_an_escape_of_u0000(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backslash followed by "u0000" is six characters jsonb stores; only the character
    U+0000 itself is refused."""
    monkeypatch.setenv("DATABASE_URL", db_url)
    assert cli.main(["enqueue", "--payload", '{"s": "\\\\u0000", "\\\\u0000": 1}']) == 0
    with psycopg.connect(db_url) as conn:
        stored = conn.execute("SELECT payload FROM jobs").fetchall()
    assert stored == [({"s": "\\u0000", "\\u0000": 1},)]


def test_enqueue_bad_json_exits_2_and_inserts_nothing(
    db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DATABASE_URL", db_url)
    assert cli.main(["enqueue", "--count", "5", "--payload", "{step: 1}"]) == 2
    err = capsys.readouterr().err
    assert "--payload is not valid JSON" in err and "Fix:" in err
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT count(*) FROM jobs").fetchone() == (0,)


def test_enqueue_before_db_init_says_so(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DATABASE_URL", pg_url)
    assert cli.main(["enqueue"]) == 1
    assert "vultrscale db init" in capsys.readouterr().err


def test_queue_detect_names_the_queue_it_finds_and_counts_it_as_a_pass_would(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A newcomer's Procrastinate database, the config still at the default preset: found,
    counted, and the preset to set named."""
    import json
    from pathlib import Path

    import procrastinate

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute((Path(procrastinate.__file__).parent / "sql" / "schema.sql").read_bytes())
        conn.execute(
            "INSERT INTO procrastinate_jobs (queue_name, task_name)"
            " SELECT 'default', 'send' FROM generate_series(1, 30)"
        )
    monkeypatch.setenv("DATABASE_URL", pg_url)
    assert cli.main(["queue", "detect"]) == 0
    out, err = capsys.readouterr()
    assert "procrastinate (Procrastinate 3.1 to 3.10): found" in out
    assert "ready 30, in flight 0, stalled/expired 0" in out
    assert "finished 0 (newest within 24h, mean run -), arrived 30 within 10m" in out
    assert "pgqueuer: not here" in out and "vultrscale: not here  <- queue.preset" in out
    assert "queue.preset = 'vultrscale' is not among those found here (procrastinate)" in err
    assert cli.main(["queue", "detect", "--json"]) == 0
    doc = {p["preset"]: p for p in json.loads(capsys.readouterr().out)["presets"]}
    assert doc["procrastinate"]["found"] and doc["procrastinate"]["signals"]["ready"] == 30
    assert doc["graphile-worker"]["missing"] == [
        "table graphile_worker._private_jobs",
        "table graphile_worker._private_job_queues",
        "table graphile_worker._private_tasks",
    ]


def test_queue_detect_without_any_queue_exits_2_naming_what_it_looked_for(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DATABASE_URL", pg_url)
    assert cli.main(["queue", "detect"]) == 2
    err = capsys.readouterr().err
    assert "no queue found" in err and "procrastinate: procrastinate_jobs" in err
    assert "pg-boss: pgboss.job, pgboss.queue" in err
