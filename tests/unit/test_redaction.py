"""Redaction that cannot be escaped: a secret is masked before anything formats it, in every
spelling a formatter gives it, and any run of six or more characters of the API key or a
password is masked wherever it turns up."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import respx

from vultrscale import config
from vultrscale.cli import main
from vultrscale.redaction import redact
from vultrscale.vultr.client import VultrClient
from vultrscale.vultr.errors import AuthError, BadRequest

KEY = "QZ7XKWPLMV3RT8YH2NB6CJ4DFG5SA9EU"
# A quote and a backslash: repr and JSON escape both, and an escaped password was not found.
PW = "hu'nt\\er2-Pa55"
DB_URL = "postgresql://scaler:hu%27nt%5Cer2-Pa55@db.example:5432/jobs"
BASE = "https://api.vultr.test"


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    for name in (*config.SECRET_NAMES, "VULTRSCALE_CONFIG", "VULTR_API_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("VULTR_API_KEY", KEY)
    monkeypatch.setenv("DATABASE_URL", DB_URL)
    return tmp_path


def _leaks(text: str) -> list[str]:
    """Whatever of the key or the password shows in ``text``: whole, escaped, or a run of 6."""
    spelled = {KEY, PW, repr(PW)[1:-1], json.dumps(PW)[1:-1]}
    runs = {s[i : i + 6] for s in spelled for i in range(len(s) - 5)}
    return sorted(r for r in runs if r in text)


def test_config_check_masks_a_password_pasted_into_another_key(
    env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: printed as it was, in the table and in the JSON (only the secrets' own keys were
    # masked). A path is free text (ids and names are checked as Vultr's forms and refused).
    (env / "vultrscale.toml").write_text(f"[fleet]\nssh_key = {json.dumps('fw-' + PW)}\n")
    for args in (["config", "check"], ["config", "check", "--json"]):
        assert main(args) == 0
        out = capsys.readouterr()
        assert _leaks(out.out + out.err) == []
        assert "fw-***" in out.out


def test_a_refused_value_holding_a_password_is_masked_though_repr_escapes_it(
    env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: the error quoted the value with repr, whose escaped quote and backslash the
    # redaction of the finished message did not find: "fleet.name: "x-hu'nt\\er2-Pa55" must".
    (env / "vultrscale.toml").write_text(f"[fleet]\nname = {json.dumps('x-' + PW)}\n")
    for args in (["config", "check"], ["config", "check", "--json"]):
        assert main(args) == 2
        out = capsys.readouterr()
        assert _leaks(out.out + out.err) == [], out.err
        assert "fleet.name" in out.err


@pytest.fixture
def api() -> Iterator[respx.MockRouter]:
    with respx.mock(base_url=BASE, assert_all_called=False) as router:
        yield router


@pytest.mark.parametrize(
    ("status", "error"),
    [(401, AuthError), (400, BadRequest)],
    ids=["refused-key", "bad-request"],
)
def test_a_server_echoing_part_of_the_key_has_that_part_masked(
    api: respx.MockRouter, status: int, error: type[Exception]
) -> None:
    # Before: "Invalid API key: key=QZ7XKWPLMV3R..." was printed, and stored in fleet_events.
    api.get("/v2/account").mock(
        return_value=httpx.Response(status, json={"error": f"Invalid key: key={KEY[:12]}..."})
    )
    with VultrClient(KEY, BASE, sleep=lambda s: None) as client, pytest.raises(error) as info:
        client.account()
    exc = info.value
    assert isinstance(exc, AuthError | BadRequest)
    assert _leaks(exc.message + exc.api_message + repr(exc)) == []
    assert "key=***..." in exc.message


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (f"echo: {KEY[3:9]} and {KEY[-7:]}", "echo: *** and ***"),  # runs of 6 and of 7
        (f"cut: {KEY[:20]}\n{KEY[20:]}", "cut: ***\n***"),  # a line wrapped inside the key
        (f"json: {json.dumps({'v': PW})}", 'json: {"v": "***"}'),
        (f"repr: {[PW + chr(34)]!r}", "repr: ['***\"']"),
        (f"part: {PW[2:9]}!", "part: ***!"),
        (f"short: {KEY[:5]}", f"short: {KEY[:5]}"),  # five characters tell too little to mask
    ],
    ids=["fragments", "wrapped", "json", "repr", "password-run", "five-is-left"],
)
def test_a_secret_is_masked_in_every_spelling_and_by_its_runs(text: str, shown: str) -> None:
    assert redact(text, [KEY, DB_URL, PW]) == shown


def test_a_connection_strings_host_and_database_are_not_masked_as_runs() -> None:
    # Only keys and passwords are masked by their runs: a URL's host is no secret, and masking
    # it would hide where a failing database is.
    text = "cannot reach the database at postgresql://scaler:***@db.example:5432/jobs"
    assert redact(text, [DB_URL, PW]) == text
