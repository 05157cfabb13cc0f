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
