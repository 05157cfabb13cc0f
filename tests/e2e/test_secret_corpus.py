"""A generated corpus of awkward database passwords, in every form libpq accepts, never shows
any part of itself: not in output, events, metrics, rendered user-data or our exceptions.

Each password is made of distinctive random words joined by the characters that break
pattern-based masking (spaces, backslashes, quotes, ``#/?@:%=&``, unicode). "No part" means
neither the password nor any of its words. The database is a real Postgres with trust auth
(it ignores the password), so a command connects and runs with each form; pointed at a closed
port, the error text is libpq's own.
"""

from __future__ import annotations

import json
import random
import re
import string
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from tests.e2e.cli_world import World, cli_world
from vultrscale.cli import main
from vultrscale.db import schema
from vultrscale.errors import DatabaseError
from vultrscale.redaction import first_line, mask_url

API_KEY = "VKEY-secret-corpus-0123456789abcdefgh"
SEPARATORS = [" ", "\\", "'", '"', "#", "/", "?", "@", ":", "%", "=", "&", "ü", "€ ", "%2F", "\\ "]


def _passwords(n: int = 8, seed: int = 10) -> list[tuple[str, list[str]]]:
    """(password, its words): three or four 6-letter words joined by awkward separators."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        words = [
            "".join(rng.choice(string.ascii_letters) for _ in range(6))
            for _ in range(rng.choice((3, 4)))
        ]
        seps = [SEPARATORS[(i * 3 + k) % len(SEPARATORS)] for k in range(len(words) - 1)]
        pw = words[0] + "".join(s + w for s, w in zip(seps, words[1:], strict=True))
        out.append((pw, words))
    return out


PASSWORDS = _passwords()


def _libpq_password(url: str) -> str | None:
    try:
        return conninfo_to_dict(url).get("password")  # type: ignore[return-value]
    except psycopg.Error:
        return None


def _kv_quote(pw: str) -> str:
    return "'" + pw.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _kv_escape(pw: str) -> str:
    return re.sub(r"([\\'\s])", r"\\\1", pw)


def _forms(base: dict[str, str], pw: str) -> dict[str, str]:
    """The password in every form libpq accepts, for the database ``base`` names."""
    host, port, db = base["host"], base.get("port", "5432"), base["dbname"]
    return {
        "url": f"postgresql://postgres:{quote(pw, safe='')}@{host}:{port}/{db}",
        "url-query": f"postgres://postgres@{host}:{port}/{db}?password={quote(pw, safe='')}",
        "kv-quoted": f"host={host} port={port} user=postgres dbname={db} password={_kv_quote(pw)}",
        "kv-escaped": f"host={host} port={port} password={_kv_escape(pw)} user=postgres "
        f"dbname={db}",
    }


FORMS = ["url", "url-query", "kv-quoted", "kv-escaped"]


@pytest.fixture(scope="module")
def world(
    pg_admin_url: str, _migrated_template: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    with cli_world(
        pg_admin_url, _migrated_template, tmp_path_factory.mktemp("secrets"), API_KEY, "x"
    ) as w:
        yield w


def _leaks(text: str, pw: str, words: list[str]) -> list[str]:
    return [part for part in [pw, *words] if part in text]


def _env(monkeypatch: pytest.MonkeyPatch, world: World, tmp_path: Path, **extra: str) -> None:
    config = tmp_path / "vultrscale.toml"
    config.write_text(world.config.read_text())
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("WORKER_DATABASE_URL", raising=False)
    for name, value in {
        "VULTRSCALE_CONFIG": str(config),
        "VULTR_API_KEY": API_KEY,
        "VULTR_API_URL": world.server.url,
        "COLUMNS": "300",
        **extra,
    }.items():
        monkeypatch.setenv(name, value)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out + out.err


def test_every_form_is_read_by_libpq_as_the_password(world: World) -> None:
    base = conninfo_to_dict(world.db)
    for pw, _ in PASSWORDS:
        for form, url in _forms(base, pw).items():
            assert conninfo_to_dict(url)["password"] == pw, form


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(("pw", "words"), PASSWORDS, ids=[f"pw{i}" for i in range(len(PASSWORDS))])
def test_no_part_of_a_password_is_printed_by_any_command(
    pw: str,
    words: list[str],
    form: str,
    world: World,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = {k: str(v) for k, v in conninfo_to_dict(world.db).items()}
    url = _forms(base, pw)[form]
    closed = _forms({**base, "port": str(world.closed)}, pw)[form]
    _env(monkeypatch, world, tmp_path, DATABASE_URL=url, WORKER_DATABASE_URL=url)

    runs = {
        "config check": _run(capsys, "config", "check"),
        "config check --json": _run(capsys, "config", "check", "--json"),
        "cloud-init render": _run(capsys, "cloud-init", "render"),
        "db init": _run(capsys, "db", "init"),
        "events": _run(capsys, "events", "--json"),
    }
    monkeypatch.setenv("DATABASE_URL", closed)
    runs["db init (unreachable)"] = _run(capsys, "db", "init")
    runs["events (unreachable)"] = _run(capsys, "events")

    for what, (_, text) in runs.items():
        assert not _leaks(text, pw, words), f"{what}: {text}"
        assert "Traceback" not in text, what
    assert [code for code, _ in runs.values()] == [0, 0, 0, 0, 0, 1, 1], runs
    assert "***" in runs["cloud-init render"][1]  # the address is there, masked
    assert json.loads(runs["config check --json"][1])["environment"]["DATABASE_URL"] == mask_url(
        url
    )
    assert "cannot read the events" in runs["events (unreachable)"][1]

    # our exception for libpq's failure, and the one-line form of libpq's own error
    with pytest.raises(DatabaseError) as err:
        schema.migrate(closed)
    for text in (str(err.value), repr(err.value), err.value.hint):
        assert not _leaks(text, pw, words), text
    with pytest.raises(psycopg.Error) as failed:  # nothing listens there: it must fail
        psycopg.connect(closed, connect_timeout=5).close()
    assert not _leaks(first_line(failed.value, [closed]), pw, words)


@pytest.mark.parametrize(("pw", "words"), PASSWORDS, ids=[f"pw{i}" for i in range(len(PASSWORDS))])
def test_a_password_libpq_cannot_read_is_refused_without_showing_it(
    pw: str,
    words: list[str],
    world: World,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The password pasted into a URL without percent-encoding: libpq reads it as something
    else or quotes part of it back in its error. Refused (exit 2) where libpq cannot read it;
    no part of it is shown either way."""
    base = conninfo_to_dict(world.db)
    raw = f"postgresql://postgres:{pw}@{base['host']}:{world.closed}/{base['dbname']}"
    _env(monkeypatch, world, tmp_path, DATABASE_URL=raw)
    reads_whole = _libpq_password(raw) == pw  # then it is a valid URL after all
    for argv in (("config", "check"), ("db", "init"), ("enqueue",), ("events",)):
        code, text = _run(capsys, *argv)
        assert code in ((0, 1) if reads_whole else (2,)), text
        assert not _leaks(text, pw, words), f"{argv}: {text}"
        if code == 2:
            assert "postgresql://USER:PASSWORD@HOST" in text
    with pytest.raises(psycopg.Error) as failed:  # nothing listens there: it must fail
        psycopg.connect(raw, connect_timeout=5).close()
    assert not _leaks(first_line(failed.value, [raw]), pw, words)


@pytest.mark.parametrize("form", FORMS)
def test_no_part_of_a_password_reaches_events_metrics_or_user_data(
    form: str,
    world: World,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pw, words = PASSWORDS[FORMS.index(form)]
    url = _forms({k: str(v) for k, v in conninfo_to_dict(world.db).items()}, pw)[form]
    fleet = f"secrets-{form}"  # a fleet (and tag) of its own: passes do not meet
    _env(
        monkeypatch,
        world,
        tmp_path,
        DATABASE_URL=url,
        WORKER_DATABASE_URL=url,
        VULTRSCALE_POLICY_MIN_INSTANCES="1",
        VULTRSCALE_FLEET_NAME=fleet,
        VULTRSCALE_FLEET_TAG=fleet,
    )
    metrics = tmp_path / "metrics.prom"
    code, text = _run(capsys, "reconcile", "--json", "--metrics-file", str(metrics))
    assert code == 0, text
    assert any(fleet in i.get("tags", []) for i in world.sim.instances.values()), "one created"
    with psycopg.connect(url, autocommit=True) as conn:
        events = json.dumps(
            [list(r) for r in conn.execute("SELECT * FROM fleet_events")], default=str
        )
        rows = json.dumps(
            [list(r) for r in conn.execute("SELECT * FROM fleet_instances")], default=str
        )
    for what, blob in {
        "output": text,
        "metrics": metrics.read_text(),
        "events": events,
        "instances": rows,
    }.items():
        assert not _leaks(blob, pw, words), f"{what}: {blob[:2000]}"
