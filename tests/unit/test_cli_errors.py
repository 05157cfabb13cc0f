"""The one guard at the top: every failure is an exit code and one or two lines, a JSON
document on stdout with --json, a traceback only with --debug."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from vultrscale import cli, config


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("DATABASE_URL", "VULTR_API_KEY", "VULTRSCALE_CONFIG", "VULTR_API_URL"):
        monkeypatch.delenv(name, raising=False)


def _json_doc(out: str) -> dict[str, object]:
    doc = json.loads(out)
    assert set(doc) == {"error", "hint", "exit_code"}
    return doc


def test_json_reports_a_bad_config_as_one_document_on_stdout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "vultrscale.toml").write_text("[fleet]\nmax_instances = -3\n")
    assert cli.main(["status", "--json"]) == 2
    doc = _json_doc(capsys.readouterr().out)
    assert doc["exit_code"] == 2 and "max_instances" in str(doc["error"])
    assert "config check" in str(doc["hint"])


def test_json_reports_a_missing_secret_and_a_usage_error_as_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["instances", "--json"]) == 2
    doc = _json_doc(capsys.readouterr().out)
    assert "VULTR_API_KEY" in str(doc["error"]) and doc["hint"]
    assert cli.main(["reconcile", "--json", "--no-such-flag"]) == 2
    doc = _json_doc(capsys.readouterr().out)
    assert "--no-such-flag" in str(doc["error"]) and doc["exit_code"] == 2


def test_without_json_stdout_stays_empty_on_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["instances"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "Error: VULTR_API_KEY is not set." in err


def _explode(*args: object, **kwargs: object) -> None:
    raise RuntimeError("boom at the edge\nsecond line")


def test_an_unexpected_error_is_one_line_and_asks_for_debug(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(config, "load", _explode)
    assert cli.main(["config", "check"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "second line" not in err
    assert err.splitlines() == [
        "Error: unexpected RuntimeError: boom at the edge",
        "Fix: Run again with --debug and report it.",
    ]


def test_debug_shows_the_traceback_of_an_unexpected_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(config, "load", _explode)
    assert cli.main(["config", "check", "--debug", "--json"]) == 1
    out, err = capsys.readouterr()
    assert "Traceback" in err and "_explode" in err
    assert _json_doc(out)["exit_code"] == 1


@pytest.mark.parametrize(
    ("source", "names"),
    [
        ("def handle(job:\n", ["syntax error", "line 1"]),
        ("x = 1\nraise KeyError('no settings')\n", ["KeyError", "line 2", "no settings"]),
        ("import no_such_dependency_xyz\n", ["no_such_dependency_xyz"]),
    ],
    ids=["syntax-error", "raises-at-import", "missing-dependency"],
)
def test_a_worker_app_that_fails_to_import_is_exit_2_naming_module_and_line(
    source: str, names: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "brokenjobs_cli.py").write_text(source)
    assert cli.main(["worker", "--app", "brokenjobs_cli:handle"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "brokenjobs_cli" in err
    for name in names:
        assert name in err


def test_third_party_logs_reach_the_log_handlers_only_with_debug(tmp_path: Path) -> None:
    import logging

    class Collect(logging.Handler):
        def __init__(self) -> None:
            super().__init__()
            self.lines: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.lines.append(record.getMessage())

    (tmp_path / "vultrscale.toml").write_text("")
    noise = "Exception (client): Error reading SSH protocol banner"
    root, collect = logging.getLogger(), Collect()
    root.addHandler(collect)
    try:
        for debug in (False, True, False):
            collect.lines.clear()
            assert cli.main(["config", "check", *(["--debug"] if debug else [])]) == 0
            logging.getLogger("paramiko.transport").error(noise)
            assert (noise in collect.lines) is debug
    finally:
        root.removeHandler(collect)


def test_an_error_is_redacted_with_the_secrets_of_the_env_file_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The secret lives only in .env beside the config (config.load reads it there), not in
    # the process environment: the guard must still know it.
    (tmp_path / ".env").write_text("DATABASE_URL=postgresql://u:Dot3nvSecret@db.example/q\n")
    assert cli.fail("boom near Dot3nvSecret", "retry", 1) == 1
    err = capsys.readouterr().err
    assert "Dot3nvSecret" not in err and "boom near" in err


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ("NaN", "NaN and infinite numbers"),
        ('{"n": 1e999}', "NaN and infinite numbers"),
        ('{"s": "a\\u0000b"}', "cannot store the character"),
        ('{"k\\u0000": 1}', "cannot store the character"),
        ('["\\ud800"]', "holds a lone surrogate"),
        ('{"\\udfff": 1}', "holds a lone surrogate"),
        ('"\udcff"', "holds a lone surrogate"),  # the byte 0xff, as Python reads it from argv
        ("[" * 3000 + "]" * 3000, "nested too deeply"),
        ("9" * 5000, "Send long numbers as strings"),
    ],
    ids=[
        "nan",
        "infinity",
        "nul",
        "nul-in-key",
        "lone-surrogate",
        "surrogate-key",
        "raw-byte",
        "deep",
        "digits",
    ],
)
def test_an_enqueue_payload_postgres_cannot_store_is_exit_2_before_connecting(
    payload: str, message: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://nobody@127.0.0.1:1/none")
    assert cli.main(["enqueue", "--payload", payload]) == 2
    err = capsys.readouterr().err
    assert message in err and "cannot reach the database" not in err
    assert "unexpected" not in err and "Fix:" in err


def _ctrl_c(*_args: object, **_kwargs: object) -> None:
    import signal

    # A real SIGINT, as a terminal's Ctrl-C sends, raised in this (the main) thread: with
    # os.kill the kernel may hand it to another thread of the process (one an earlier test
    # left), and the main thread then reached the line below before Python ran its handler.
    signal.raise_signal(signal.SIGINT)
    raise AssertionError("the SIGINT was not delivered")  # pragma: no cover


@pytest.mark.parametrize("as_json", [False, True])
def test_ctrl_c_in_a_command_is_exit_130_and_says_interrupted(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], as_json: bool
) -> None:
    """Typer turned it into a silent exit 130: no line, and no document for --json."""
    monkeypatch.setattr(config, "load", _ctrl_c)
    assert cli.main(["config", "check", *(["--json"] if as_json else [])]) == 130
    out = capsys.readouterr()
    assert out.err.splitlines() == ["Error: interrupted."]
    if as_json:
        assert json.loads(out.out) == {"error": "interrupted.", "hint": None, "exit_code": 130}
    else:
        assert out.out == ""


class _CtrlCAtImport:
    """A finder that Ctrl-Cs (a real SIGINT) when the command line's package is imported: the
    start-up of a process, before the command's guard is set."""

    def find_spec(self, name: str, *_args: object) -> None:
        if name == "vultrscale.cli":
            _ctrl_c()


@pytest.fixture
def _sigint_restored() -> Iterator[None]:
    import signal

    before = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, before)


def _console_script(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> int | str:
    """The `vultrscale` command as pip installs it (pyproject's entry point: import its module,
    call it); its exit status, or what escaped it (a process would die of it: status -2)."""
    import importlib
    import sys
    import tomllib

    pyproject = Path(__file__).parents[2] / "pyproject.toml"
    target = tomllib.loads(pyproject.read_text())["project"]["scripts"]["vultrscale"]
    module, _, name = target.partition(":")
    monkeypatch.setattr(sys, "argv", ["vultrscale", *argv])
    try:
        getattr(importlib.import_module(module), name)()
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    except BaseException as exc:  # noqa: BLE001 - what escaped is the finding
        return f"raised {type(exc).__name__}"
    return 0


@pytest.mark.parametrize("as_json", [False, True])
@pytest.mark.usefixtures("_sigint_restored")
def test_ctrl_c_while_the_command_starts_up_is_exit_130_not_death_by_the_signal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], as_json: bool
) -> None:
    """Issue 36: a Ctrl-C in the first fraction of a second (Typer and the rest still being
    imported) escaped as a KeyboardInterrupt: a traceback, and the process killed by the
    signal (status -2)."""
    import sys

    monkeypatch.delitem(sys.modules, "vultrscale.cli")  # imported again, as by a new process
    monkeypatch.setattr(sys, "meta_path", [_CtrlCAtImport(), *sys.meta_path])
    argv = ["reconcile", *(["--json"] if as_json else [])]
    assert _console_script(argv, monkeypatch) == 130
    out = capsys.readouterr()
    assert out.err == "Error: interrupted.\n"
    if as_json:
        assert json.loads(out.out) == {"error": "interrupted.", "hint": None, "exit_code": 130}


@pytest.mark.usefixtures("_sigint_restored")
def test_ctrl_c_as_the_command_exits_cannot_kill_the_process_by_the_signal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 36: a Ctrl-C after the command's end (the pass done and recorded, Python shutting
    down) killed the process by the signal: status -2, no line. SIGINT is ignored from the
    command's end to the process's, so its exit status is the command's."""
    import signal

    assert _console_script(["--version"], monkeypatch) == 0
    try:
        signal.raise_signal(signal.SIGINT)  # the Ctrl-C, as the process exits
    except KeyboardInterrupt:
        pytest.fail("a Ctrl-C after the command still raises: the process dies of it (-2)")
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    ("key", "code", "said"),
    [("ctrl-c", 130, "interrupted."), ("ctrl-d", 1, "aborted: the input ended before an answer.")],
)
def test_ctrl_c_at_an_init_prompt_is_exit_130_and_writes_nothing(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    key: str,
    code: int,
    said: str,
) -> None:
    """click turns a Ctrl-C at a prompt into Abort, which said 'aborted.', exit 1."""
    import sys

    try:
        from typer._click import termui  # typer's own copy of click's prompt (typer >= 0.16)
    except ImportError:  # pragma: no cover - an older typer prompts through click itself
        from click import termui  # type: ignore[no-redef]

    def eof(*_args: object, **_kwargs: object) -> str:
        raise EOFError

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("VULTR_API_KEY", raising=False)
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    monkeypatch.setattr(termui, "visible_prompt_func", _ctrl_c if key == "ctrl-c" else eof)
    assert cli.main(["init"]) == code
    assert capsys.readouterr().err.splitlines()[-1] == f"Error: {said}"
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("postgresql://u:pa/ss?wd@127.0.0.1:1/db", "not a Postgres connection string"),
        ("postgresql://u:p\udcffword@127.0.0.1:1/db", "not UTF-8 text"),
    ],
)
def test_the_demo_refuses_a_database_url_it_cannot_use_before_it_starts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], url: str, said: str
) -> None:
    """It read DATABASE_URL as it was: exit 1 ('cannot reach the database'), or 'unexpected
    UnicodeEncodeError', where every other command says exit 2."""
    monkeypatch.setenv("DATABASE_URL", url)
    assert cli.main(["demo", "--duration", "10s", "--no-live"]) == 2
    err = capsys.readouterr().err
    assert said in err and "pa/ss" not in err and "pword" not in err


def test_a_huge_word_of_outside_text_is_cut_in_the_middle_and_a_path_is_not(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from vultrscale.cli import fail

    path = "/srv/" + "/".join(["folder"] * 40) + "/vultrscale.toml"  # 300 characters
    name = "d" * 100_000
    fail(f"cannot read {path}", "", 2)
    fail(f"database {name}x does not exist", "", 1)
    err = capsys.readouterr().err
    assert path in err
    assert len(err) < 1000 and "(99721 characters cut)" in err and "dddx does not exist" in err
