"""What every command module shares: the invocation's global options, the config loader, the
one JSON printer, the group factory and the option types used by more than one command."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from vultrscale.config import Config
    from vultrscale.config.fleets import Fleets


@dataclass
class Globals:
    """The root options (``--config``, ``--fleet``, ``--debug``), set before a command runs."""

    config_path: str | None = None
    fleet: str | None = None
    debug: bool = False


state = Globals()


def load_config(flags: dict[str, Any] | None = None, *, any_fleet: bool = False) -> Config:
    """The resolved config for this invocation (flags > environment > file > defaults): the
    file's, or with a directory of fleets the one ``--fleet`` names (a directory of several
    needs it, unless ``any_fleet``: a command that reads only the environment's secrets)."""
    fleets = load_fleets(flags)
    if any_fleet and state.fleet is None and fleets.configs:
        return fleets.configs[0]
    return fleets.one()


def load_fleets(flags: dict[str, Any] | None = None) -> Fleets:
    """Every fleet of the config path (a directory's ``*.toml``, or the one file), or only the
    one ``--fleet`` names: for the commands that act on every fleet."""
    from vultrscale.config.fleets import load_fleets as load

    return load(state.config_path, os.environ, flags).select(state.fleet)


def print_json(data: Any) -> None:
    import json

    typer.echo(json.dumps(data, indent=2, default=str, sort_keys=False))


def group(**kwargs: Any) -> typer.Typer:
    """A Typer app for one command group: plain click help (no type metavars, no rich import
    just to print help), no completion, our own error handling."""
    return typer.Typer(
        rich_markup_mode=None,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        **kwargs,
    )


def examples(*lines: str) -> str:
    """The "Examples:" epilog of a command's help; ``\\b`` keeps click from re-wrapping it."""
    return "Examples:\n\n\b\n" + "\n".join(f"  {line}" for line in lines)


def shown(help: str, default: str) -> str:
    """An option's help with a default that is not its Python value (it comes from the config
    or the environment), shown the way click shows the others."""
    return f"{help}  [default: {default}]"


# Options more than one command takes, spelled once. Flags show no default: absent means off.
JsonFlag = Annotated[
    bool, typer.Option("--json", help="Print one JSON document on stdout.", show_default=False)
]
