"""Usage errors from the command line parser: one message, exit 2, no traceback."""

from __future__ import annotations

import pytest

from vultrscale.cli import main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["reconcile", "--bogus"], "No such option"),
        (["nosuchcmd"], "No such command"),
        (["events", "--since"], "requires an argument"),
    ],
    ids=["unknown-option", "unknown-command", "missing-value"],
)
def test_usage_errors_exit_2_with_one_message(argv: list[str], message: str, capsys) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_version_exits_0(capsys) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("vultrscale ")


@pytest.mark.parametrize(
    ("argv", "points_to"),
    [
        (["snapshot", "--from-instance", "web-1"], "`vultrscale instances` lists"),
        (["snapshot", "--resume", "snap-1"], "the id `vultrscale snapshot` printed"),
    ],
    ids=["instance", "snapshot"],
)
def test_an_id_flag_says_where_its_id_is_found(argv: list[str], points_to: str, capsys) -> None:
    # `vultrscale instances` lists instances, not the snapshot a --no-wait bake left pending.
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert points_to in err, err
