"""The help reads like a good CLI's: no type metavars, an example on every command, `-h`,
the commands in the order a user meets them, global options anywhere. Driven through the
real entry point in this process (the commands' help needs no outside part)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import typer

from vultrscale import cli


def _help(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert cli.main([*args, "--help"]) == 0
    return capsys.readouterr().out


def _leaf_commands() -> list[tuple[str, ...]]:
    """Every runnable command as its argv prefix, e.g. ("db", "init"), built from the modules."""
    found: list[tuple[str, ...]] = []
    for entry in cli.COMMANDS:
        command = typer.main.get_group(importlib.import_module(entry.module).app).commands[
            entry.name
        ]
        subcommands = getattr(command, "commands", None)
        if subcommands:
            found += [(entry.name, sub) for sub in subcommands]
        else:
            found.append((entry.name,))
    return found


LEAVES = _leaf_commands()


def test_every_registered_command_exists_and_every_command_is_registered() -> None:
    registered = {e.name for e in cli.COMMANDS}
    for module in {e.module for e in cli.COMMANDS}:
        defined = set(typer.main.get_group(importlib.import_module(module).app).commands)
        assert defined == {e.name for e in cli.COMMANDS if e.module == module}
    assert len(registered) == len(cli.COMMANDS)
    assert len(LEAVES) >= 12


@pytest.mark.parametrize("argv", [(), *LEAVES], ids=lambda a: " ".join(a) or "root")
def test_help_shows_no_type_metavar_and_ends_with_examples(
    argv: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    text = _help(capsys, *argv)
    for metavar in ("<bool>", "<str>", "<int>", "<float>", "<path>", "INTEGER", "FLOAT", "BOOLEAN"):
        assert metavar not in text, f"{metavar!r} in the help of {argv}"
    assert "[default: (" not in text  # defaults one way: [default: X]
    assert "Examples:" in text
    examples = text.split("Examples:", 1)[1]
    assert "vultrscale " + " ".join(argv) in examples


@pytest.mark.parametrize("argv", [(), ("status",), ("db", "init"), ("sim", "serve")])
def test_dash_h_is_help(argv: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    long = _help(capsys, *argv)
    assert cli.main([*argv, "-h"]) == 0
    assert capsys.readouterr().out == long


def test_commands_are_listed_in_the_order_a_user_meets_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = _help(capsys).split("Commands:", 1)[1]
    listed = [
        line.split()[0] for line in text.splitlines() if line.startswith("  ") and line[2] != " "
    ]
    listed = [name for name in listed if name in {e.name for e in cli.COMMANDS}]
    assert listed[:5] == ["demo", "reconcile", "status", "events", "instances"]
    assert listed.index("snapshot") < listed.index("db") < listed.index("sim")


def test_global_options_work_after_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("VULTRSCALE_CONFIG", raising=False)
    conf = tmp_path / "other.toml"
    conf.write_text('[fleet]\nname = "after-the-command"\n')
    assert cli.main(["config", "check", "--json", "--config", str(conf), "--debug"]) == 0
    assert '"after-the-command"' in capsys.readouterr().out
    assert cli.main(["config", "check", f"--config={conf}"]) == 0
    assert "after-the-command" in capsys.readouterr().out


GROUPS = [argv[0] for argv in LEAVES if len(argv) == 2]


def test_every_group_with_subcommands_is_checked() -> None:
    assert set(GROUPS) >= {"cloud-init", "db", "sim", "config"}


@pytest.mark.parametrize("group", sorted(set(GROUPS)))
def test_a_group_help_has_examples_and_each_subcommand_line_whole(
    group: str, capsys: pytest.CaptureFixture[str]
) -> None:
    text = _help(capsys, group)
    assert "Examples:" in text
    assert f"vultrscale {group}" in text.split("Examples:", 1)[1]
    listing = text.split("Commands:", 1)[1].split("Examples:", 1)[0]
    subcommands = [argv[1] for argv in LEAVES if argv[0] == group]
    module = importlib.import_module(next(e.module for e in cli.COMMANDS if e.name == group))
    commands = typer.main.get_group(module.app).commands[group].commands  # type: ignore[attr-defined]
    for sub in subcommands:
        line = " ".join(next(x for x in listing.splitlines() if x.split()[:1] == [sub]).split())
        assert line == f"{sub} {commands[sub].short_help}", line
        assert not line.endswith("...")
