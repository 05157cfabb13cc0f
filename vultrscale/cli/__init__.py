"""The command line: ``vultrscale COMMAND``, one module per command group.

- ``fleet``: reconcile, status, events, instances (the fleet at Vultr and in the ledger)
- ``image``: snapshot, cloud-init (what new instances boot from and with)
- ``queue``: db, worker, enqueue (the built-in Postgres queue)
- ``local``: demo, init, sim, config (tools that run on this machine)
- ``views``: everything drawn on a terminal; ``vultrscale.wiring`` builds the real parts

Start-up stays at the cost of importing Typer: the root group lists the commands from
``COMMANDS`` below and imports a group's module only when one of its commands runs (or shows
its own help). Errors become one or two lines here, once: what is wrong and how to fix it;
``--debug`` adds the traceback, ``--json`` puts the same on stdout as one JSON document.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperGroup

from vultrscale import __version__
from vultrscale.cli._common import examples, shown, state

if TYPE_CHECKING:
    from typer import _click


@dataclass(frozen=True)
class Entry:
    """A command of the root group: where it lives, and its line in ``vultrscale --help``."""

    name: str
    module: str
    summary: str


# In the order a user meets them: the demo, the fleet, its image, the queue, local tools.
COMMANDS: tuple[Entry, ...] = (
    Entry("demo", "vultrscale.cli.local", "The whole system on this machine, up and back down."),
    Entry("reconcile", "vultrscale.cli.fleet", "One reconcile pass, or a loop of them."),
    Entry("status", "vultrscale.cli.fleet", "The fleet, the queue, the plan and the budget."),
    Entry("events", "vultrscale.cli.fleet", "The decision ledger: every pass and what it did."),
    Entry("instances", "vultrscale.cli.fleet", "The fleet's instances as Vultr reports them."),
    Entry("forecast", "vultrscale.cli.forecast", "The floor forecast for the next 48 hours."),
    Entry("snapshot", "vultrscale.cli.image", "Bake the base image new instances boot from."),
    Entry("cloud-init", "vultrscale.cli.image", "The user-data new instances get."),
    Entry("db", "vultrscale.cli.queue", "Create or upgrade the database schema."),
    Entry("worker", "vultrscale.cli.queue", "Run jobs from the queue; drain on SIGTERM."),
    Entry("enqueue", "vultrscale.cli.queue", "Put jobs on the queue."),
    Entry("queue", "vultrscale.cli.queue", "Find the queue in the database and count it."),
    Entry("init", "vultrscale.cli.local", "Write a vultrscale.toml and .env for a real fleet."),
    Entry("sim", "vultrscale.cli.local", "The Vultr API simulator."),
    Entry(
        "simulate",
        "vultrscale.cli.simulate",
        "Replay a workload through the real pass; compare policies and tune.",
    ),
    Entry("config", "vultrscale.cli.local", "Check the configuration."),
)

_BY_NAME = {e.name: e for e in COMMANDS}

# Root options, accepted anywhere before a bare `--` (moved in front of the command).
_GLOBAL_FLAGS = ("--debug",)
_GLOBAL_VALUED = ("--config", "--fleet")


class LazyGroup(TyperGroup):
    """The root group: lists ``COMMANDS`` without importing them; builds one group's click
    commands from its Typer app only when one of them is asked for."""

    def list_commands(self, ctx: _click.Context) -> list[str]:
        return [e.name for e in COMMANDS]

    def get_command(self, ctx: _click.Context, cmd_name: str) -> _click.Command | None:
        entry = _BY_NAME.get(cmd_name)
        if entry is None:
            return None
        group: typer.Typer = importlib.import_module(entry.module).app
        for info in group.registered_commands:
            # Only the command asked for: Typer evaluates the annotation of every parameter of
            # every command it builds (an eval of source text each, no bytecode cache: about a
            # third of the start-up of `reconcile` when the whole group was built).
            name = info.name or typer.main.get_command_name(getattr(info.callback, "__name__", ""))
            if name == cmd_name:
                return typer.main.get_command_from_info(
                    info,
                    pretty_exceptions_short=group.pretty_exceptions_short,
                    rich_markup_mode=group.rich_markup_mode,
                )
        return typer.main.get_group(group).commands.get(cmd_name)  # a group: db, sim, config

    def format_commands(self, ctx: _click.Context, formatter: _click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(e.name, e.summary) for e in COMMANDS])


app = typer.Typer(
    cls=LazyGroup,
    name="vultrscale",
    help="Scale a fleet of Vultr instances running queue workers from zero to a cap and back.",
    epilog=examples(
        "vultrscale demo                  # the whole loop on this machine",
        "vultrscale status                # the fleet and why it has that size",
        "vultrscale reconcile --loop --debug --config prod.toml",
    )
    + "\n\nGlobal options (--config, --fleet, --debug) go before or after the command.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"vultrscale {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    config: Annotated[
        str | None,
        typer.Option(
            "--config",
            metavar="PATH",
            help=shown(
                "TOML config file, or a directory of them (one fleet each).",
                "$VULTRSCALE_CONFIG, else ./vultrscale.toml",
            ),
            show_default=False,
        ),
    ] = None,
    fleet: Annotated[
        str | None,
        typer.Option(
            "--fleet",
            metavar="NAME",
            help="With a directory of fleets: act on this fleet only.",
            show_default=False,
        ),
    ] = None,
    debug: Annotated[
        bool, typer.Option("--debug", help="Show tracebacks and library logs.", show_default=False)
    ] = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_version,
            is_eager=True,
            help="Print the version.",
            show_default=False,
        ),
    ] = False,
) -> None:
    state.config_path = config
    state.fleet = fleet
    state.debug = debug
    library_logs(debug)


def _lean_coercion() -> None:
    """Typer coerces flags without pydantic where pydantic has nothing to check.

    Typer (0.29) coerces every flag whose value is not already a boolean through a pydantic
    TypeAdapter it builds when the flag is first processed, even an absent one: the help
    option and the root's ``--config`` alone imported pydantic (~150 ms, 2.5x the cost of
    importing Typer) for ``vultrscale status --help``, and every real command paid it. A
    string or boolean flag's value is already what it should be, and a flag with our own
    parser (``parser=``, ``vultrscale.params``) is checked by it, raising
    ``typer.BadParameter``
    as before: those are coerced here. Anything else (other types, lists, a parser that raises
    something else, an unexpected value) takes Typer's own way, as before.
    """
    try:
        from typer._coercion import RuntimeParam, build_runtime_param
        from typer.core import _TyperParameter
    except ImportError:  # another Typer: its own coercion, as it comes
        return

    class Lean(RuntimeParam):
        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            parser = self.parameter_info.parser
            try:
                if parser is not None:
                    return parser(value)
                if isinstance(value, self.annotation):
                    return value
            except (ValueError, TypeError, ArithmeticError):
                pass  # as Typer words it: through its own way below
            typer_own = build_runtime_param(param.type_descriptor)
            return typer_own._coerce_value(value, param=param, ctx=ctx)

    def get_runtime_param(self: Any) -> Any:
        if self._runtime_param is None:
            d = self.type_descriptor
            plain = d.parameter_info.parser is not None or d.annotation in (str, bool)
            if plain and self.nargs == 1 and not self.multiple and d.file_annotation is None:
                self._runtime_param = Lean(parameter_info=d.parameter_info, annotation=d.annotation)
            else:
                self._runtime_param = build_runtime_param(d)
        return self._runtime_param

    _TyperParameter.get_runtime_param = get_runtime_param  # type: ignore[method-assign]


_lean_coercion()


def hoist_globals(args: list[str]) -> list[str]:
    """``args`` with the root options moved in front, so `vultrscale status --debug` works."""
    front: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            rest += args[i:]
            break
        if arg in _GLOBAL_FLAGS or any(arg.startswith(f"{o}=") for o in _GLOBAL_VALUED):
            front.append(arg)
        elif arg in _GLOBAL_VALUED and i + 1 < len(args):
            front += args[i : i + 2]
            i += 1
        else:
            rest.append(arg)
        i += 1
    return front + rest


def _env_with_dotenv() -> dict[str, str]:
    """The environment as ``config.load`` sees it: a ``.env`` beside the config file (or in the
    working directory) under the real environment, so secrets from either are redacted."""
    from pathlib import Path

    from vultrscale.cli._common import state
    from vultrscale.config import read_dotenv

    named = state.config_path or os.environ.get("VULTRSCALE_CONFIG")
    merged: dict[str, str] = {}
    for folder in {Path(named).expanduser().parent if named else Path("."), Path(".")}:
        try:
            merged.update(read_dotenv(folder / ".env", strict=False))
        except Exception:  # noqa: BLE001 - an unreadable .env: redact what the environment has
            continue
    return {**merged, **os.environ}


def fail(
    message: str, hint: str, code: int, as_json: bool = False, already_shown: bool = False
) -> int:
    """Report an error on stderr (``Error:`` and ``Fix:`` lines; not again when click has
    ``already_shown`` it), secrets redacted; with ``as_json`` also as one JSON document on stdout.
    Returns ``code``."""
    from vultrscale.config import Secrets
    from vultrscale.redaction import redact

    secrets = Secrets.from_env(_env_with_dotenv()).values()
    text, fix = _cut_long_words(redact(message, secrets)), _cut_long_words(redact(hint, secrets))
    if not already_shown:
        typer.echo(f"Error: {text}", err=True)
        if fix:
            typer.echo(f"Fix: {fix}", err=True)
    if as_json:
        import json

        typer.echo(json.dumps({"error": text, "hint": fix or None, "exit_code": code}, indent=2))
    return code


# A word of outside text longer than this (a 100 KB database name in a URL, a server's echo)
# is cut in the middle: the message stays a line or two, its start and end still show. Far
# above any path or URL a user writes, so those are never cut.
_LONG_WORD = 400
_KEPT_HEAD, _KEPT_TAIL = 200, 80


def _cut_long_words(text: str) -> str:
    import re

    def cut(m: re.Match[str]) -> str:
        word, kept = m[0], _KEPT_HEAD + _KEPT_TAIL
        return f"{word[:_KEPT_HEAD]}...({len(word) - kept} characters cut)...{word[-_KEPT_TAIL:]}"

    return re.sub(rf"\S{{{_LONG_WORD + 1},}}", cut, text)


def library_logs(debug: bool) -> None:
    """Third-party loggers speak only with --debug: paramiko prints a traceback for a host
    that accepts TCP and sends no banner, and the drain reports that host itself, in one line."""
    import logging

    for name in ("paramiko", "dotenv"):  # dotenv: a line it cannot read (config says which)
        logger = logging.getLogger(name)
        if not logger.handlers:
            logger.addHandler(logging.NullHandler())  # no "last resort" printing either
        logger.propagate = debug
    if debug:  # a no-op when logging is configured already (a test runner, an embedding app)
        logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")


def _click_exceptions() -> Any:
    """Click's exception classes as this Typer raises them: recent Typer releases carry their
    own copy of click (``typer._click``), older ones use the ``click`` package."""
    try:
        from typer._click import exceptions
    except ImportError:
        from click import exceptions  # type: ignore[no-redef]
    return exceptions


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point; returns the exit code (docs/reference/cli.md, "Exit codes").
    The one guard: nothing unexpected escapes as a traceback unless --debug asks for it."""
    args = hoist_globals(list(sys.argv[1:] if argv is None else argv))
    opts = args[: args.index("--")] if "--" in args else args
    state.debug = "--debug" in opts
    as_json = "--json" in opts
    # Typer turns a Ctrl-C inside a command into a silent exit 130, indistinguishable from a
    # command's own return 130 (the demo's, after its summary): noted here as it arrives.
    interrupted: list[int] = []
    previous = _note_sigint(interrupted)
    try:
        rv = typer.main.get_command(app).main(
            args=args, prog_name="vultrscale", standalone_mode=False
        )
        code = rv if isinstance(rv, int) else 0
        if interrupted:
            from vultrscale.errors import EXIT_INTERRUPTED

            if code == EXIT_INTERRUPTED:  # said once, as any other way a command ends
                code = _outcome(KeyboardInterrupt(), as_json)
    except BaseException as exc:  # noqa: BLE001 - sorted out below; errors load only on failure
        code = _outcome(exc, as_json, interrupted=bool(interrupted))
    finally:
        if previous is not None:
            # The process's own command (argv None) only exits from here: a Ctrl-C now found
            # the work done and, Python shutting down, killed the process by the signal (status
            # -2, not the command's code). It is ignored instead.
            signal.signal(signal.SIGINT, signal.SIG_IGN if argv is None else previous)
    if argv is None:
        sys.exit(code)
    return code


def _note_sigint(into: list[int]) -> Any:
    """Python's own SIGINT handling (KeyboardInterrupt), noting each signal in ``into``; returns
    the handler it replaced, or None where there is none to replace (not the main thread, or
    SIGINT ignored: a shell's background job). Commands that handle SIGINT themselves (the
    demo, the worker) install their own over it."""
    if threading.current_thread() is not threading.main_thread():
        return None
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return None

    def noted(signum: int, frame: Any) -> None:
        into.append(signum)
        signal.default_int_handler(signum, frame)

    return signal.signal(signal.SIGINT, noted)


def _outcome(exc: BaseException, as_json: bool, *, interrupted: bool = False) -> int:
    """The exit code for an exception ending a command, reported once. ``interrupted``: a
    SIGINT arrived (click turns a Ctrl-C at a prompt into Abort)."""
    from vultrscale.errors import EXIT_INTERRUPTED, EXIT_RUNTIME, EXIT_USAGE, VultrscaleError
    from vultrscale.redaction import first_line

    errors = _click_exceptions()
    if isinstance(exc, (typer.Exit, getattr(errors, "Exit", typer.Exit))):
        return int(exc.exit_code)  # type: ignore[attr-defined]
    if isinstance(exc, (typer.Abort, getattr(errors, "Abort", typer.Abort))):
        if interrupted:  # Ctrl-C at a prompt: as a Ctrl-C anywhere else (it said 'aborted.', 1)
            return fail("interrupted.", "", EXIT_INTERRUPTED, as_json)
        return fail("aborted: the input ended before an answer.", "", EXIT_RUNTIME, as_json)
    if isinstance(exc, errors.ClickException):
        exc.show()
        code = EXIT_USAGE if isinstance(exc, errors.UsageError) else exc.exit_code
        if as_json:
            hint = "Run the command with --help to see what it takes."
            fail(exc.format_message(), hint, code, as_json=True, already_shown=True)
        return code
    if isinstance(exc, KeyboardInterrupt):
        return fail("interrupted.", "", EXIT_INTERRUPTED, as_json)
    if not isinstance(exc, Exception):  # SystemExit from a library, GeneratorExit
        raise exc
    if state.debug:
        import traceback

        traceback.print_exception(exc)
    if isinstance(exc, VultrscaleError):
        return fail(exc.message, exc.hint, exc.exit_code, as_json)
    # the guard: a bug, or a failure no adapter translated yet
    hint = (
        "Report it with the traceback above."
        if state.debug
        else "Run again with --debug and report it."
    )
    message = f"unexpected {type(exc).__name__}: {first_line(exc)}"
    return fail(message, hint, EXIT_RUNTIME, as_json)
