"""docs/reference/cli.md, written from the command tree itself: every command and group in the
order ``vultrscale --help`` lists them, each with its help, its usage line, its options as
``--help`` prints them (defaults included) and its examples. scripts/gen_reference.py writes
the page; tests/unit/test_reference.py fails when it is stale.

The page's opening (global options, exit codes, how errors read) is the one part written by
hand, here, beside the code that makes those promises true (``vultrscale.cli.main``)."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from typer import _click

INTRO = """\
# CLI reference

<!-- Generated from the command tree (vultrscale/cli) by scripts/gen_reference.py. Edit the
commands' help, then run it. -->

Every command, its options and its examples, as `vultrscale COMMAND --help` prints them.

## Global options

`--config PATH` and `--debug` (tracebacks and library logs) go before or after the command
(`vultrscale status --debug` works). `--version` goes before it. `-h` is `--help` everywhere,
and every command's help ends with examples.

## Exit codes

- **0**: success. Also: another pass holds the fleet's lock, so there is nothing to do.
- **1**: a runtime failure (the API, the database, SSH, a pass that ran out of its deadline,
  or another pass stuck holding the lock), after which nothing unsafe was done.
- **2**: a usage or configuration error; nothing was done. One exception: a reconcile pass
  whose plan or price check fails while the fleet has instances creates nothing, but still
  drains and deletes, then exits 2.
- **130**: Ctrl-C (`Error: interrupted.`), at any instant from the command's start-up on. The
  demo prints its summary first, `snapshot` says how to resume, and a reconcile pass cut short
  is recorded as such. A Ctrl-C that lands once the command is done is ignored: its exit code
  stands. Only within Python's own start-up (the first few hundredths of a second) does Python
  itself end the process.

A failed pass (exit 1 or 2) writes its row in `fleet_events` and the steps it carried out (the
ledger, the fleet's state), never the forecast's cache. The one cache it may refresh is the
plan check (`plan_checks`): Vultr's answer stamped with its time and trusted for 10 minutes
whatever the pass then did, so a failing cron pass still asks Vultr once, not every minute.

## Errors

An error is one or two lines: what is wrong, then `Fix:` and how. Anything unexpected is exit 1
with one line asking to run again with `--debug` and report it; there is no traceback without
`--debug`. With `--json`, a failure also prints one JSON document on stdout,
`{"error": ..., "hint": ..., "exit_code": ...}`, so a script never parses an empty stdout.
Text that comes from outside (labels, tags, API and database messages) is printed as text:
never read as markup, control characters dropped.
"""


def cli_page() -> str:
    """The text of docs/reference/cli.md."""
    from vultrscale.cli import app

    root = typer.main.get_command(app)
    ctx = root.make_context("vultrscale", [], resilient_parsing=True)
    out = [INTRO]
    _command(root, ctx, 2, out)
    return "\n".join(out).rstrip() + "\n"


def _command(cmd: _click.Command, ctx: _click.Context, level: int, out: list[str]) -> None:
    out.append(f"{'#' * level} `{ctx.command_path}`\n")
    if cmd.help:
        out.append(inspect.cleandoc(cmd.help).replace("\b\n", "") + "\n")
    out.append("```text\n" + " ".join([ctx.command_path, *cmd.collect_usage_pieces(ctx)]))
    out.append("```\n")
    rows = [r for p in cmd.get_params(ctx) if (r := p.get_help_record(ctx))]
    if rows:
        out.append("| option | what it does |\n|---|---|")
        out.extend(f"| {_code(opts)} | {_cell(text)} |" for opts, text in rows)
        out.append("")
    if cmd.epilog:
        out.extend(_epilog(cmd.epilog))
    if isinstance(cmd, typer.core.TyperGroup):
        names = cmd.list_commands(ctx)
        for name in names:
            sub = cmd.get_command(ctx, name)
            assert sub is not None, name
            sub_ctx = sub.make_context(name, [], parent=ctx, resilient_parsing=True)
            _command(sub, sub_ctx, 2 if ctx.parent is None else 3, out)


def _epilog(text: str) -> list[str]:
    """An epilog's paragraphs: a ``\\b`` one (click's "do not re-wrap") is a block of
    commands, the others are prose."""
    parts: list[str] = []
    for para in inspect.cleandoc(text).split("\n\n"):
        if para.startswith("\b\n"):
            lines = [ln[2:] if ln.startswith("  ") else ln for ln in para[2:].splitlines()]
            parts.append("```text\n" + "\n".join(lines) + "\n```\n")
        else:
            parts.append(" ".join(para.split()) + "\n")
    return parts


def _code(text: str) -> str:
    """Options as code in a table cell that both GitHub and Python-Markdown read alike (a pipe
    inside backticks splits a GitHub table; escaped, Python-Markdown shows the backslash)."""
    text = " ".join(text.split()).replace("&", "&amp;").replace("<", "&lt;")
    return "<code>" + text.replace("|", "&#124;") + "</code>"


def _cell(text: str) -> str:
    """Text as one Markdown table cell: one line, its pipes and angle brackets escaped."""
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;")
