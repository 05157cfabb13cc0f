"""The command line: parses, builds the real parts, prints, and maps errors to exit codes.

Heavy libraries (httpx, psycopg, paramiko, rich) are imported inside the commands that use
them, so ``--help`` and ``--version`` start fast. Errors become one or two lines here, once:
what is wrong and how to fix it; ``--debug`` adds the traceback.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer

from vultrscale import __version__
from vultrscale.errors import EXIT_RUNTIME, EXIT_USAGE, UsageError, VultrscaleError, redact

if TYPE_CHECKING:
    from vultrscale.config import Config

app = typer.Typer(
    name="vultrscale",
    help="Scale a fleet of Vultr instances running queue workers from zero to a cap and back.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
config_app = typer.Typer(help="Inspect the configuration.", no_args_is_help=True)
db_app = typer.Typer(help="The database schema.", no_args_is_help=True)
sim_app = typer.Typer(help="The Vultr simulator.", no_args_is_help=True)
cloudinit_app = typer.Typer(help="The user-data new instances get.", no_args_is_help=True)
app.add_typer(config_app, name="config")
app.add_typer(db_app, name="db")
app.add_typer(sim_app, name="sim")
app.add_typer(cloudinit_app, name="cloud-init")


@dataclass
class Globals:
    config_path: str | None = None
    debug: bool = False


_globals = Globals()


def _version(value: bool) -> None:
    if value:
        typer.echo(f"vultrscale {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    config: Annotated[
        str | None,
        typer.Option("--config", help="TOML config file (default: $VULTRSCALE_CONFIG, ./vultrscale.toml)."),
    ] = None,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    _globals.config_path = config
    _globals.debug = debug


def load_config(flags: dict[str, Any] | None = None) -> Config:
    """The resolved config for this invocation (flags > environment > file > defaults)."""
    from vultrscale import config as cfg

    return cfg.load(_globals.config_path, os.environ, flags)


def print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, default=str, sort_keys=False))


def require(value: str, name: str, hint: str) -> str:
    """A secret the command cannot run without; exit 2 with ``hint`` when it is missing."""
    if not value:
        raise UsageError(f"{name} is not set.", hint=hint)
    return value


# --- config ----------------------------------------------------------------------------------


@config_app.command("check")
def config_check(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
) -> None:
    """Load, validate and print the resolved config (secrets masked)."""
    cfg = load_config()
    data = cfg.masked()
    if as_json:
        print_json(data)
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(f"[green]Configuration is valid[/green] (from {data.pop('source')})")
    for section, values in data.items():
        table = Table(title=f"\\[{section}]", show_header=False, title_justify="left", box=None)
        table.add_column("key", style="cyan")
        table.add_column("value")
        for key, value in values.items():
            table.add_row(key, json.dumps(value) if not isinstance(value, str) else value)
        console.print(table)


# --- db, worker, enqueue (the built-in queue) ------------------------------------------------

_DB_HINT = "Set DATABASE_URL, e.g. export DATABASE_URL=postgresql://user:password@host:5432/db"


def _database_url() -> str:
    return require(os.environ.get("DATABASE_URL", "").strip(), "DATABASE_URL", _DB_HINT)


@db_app.command("init")
def db_init() -> None:
    """Create or upgrade the schema (idempotent, versioned)."""
    from vultrscale.db import schema

    version = schema.migrate(_database_url())
    typer.echo(f"Schema is at version {version}.")


# --- cloud-init (what a new instance boots with) ---------------------------------------------


@cloudinit_app.command("render")
def cloudinit_render(
    label: Annotated[
        str | None,
        typer.Option("--label", help="Instance label (default: <fleet.label_prefix>-preview)."),
    ] = None,
    show_secrets: Annotated[
        bool,
        typer.Option("--show-secrets", help="Print the database password and private host key."),
    ] = False,
) -> None:
    """Print the user-data a new instance would get (secrets masked unless --show-secrets)."""
    from vultrscale import cloudinit, ssh

    cfg = load_config()
    scaler_key = ssh.public_key_line(cfg.fleet.ssh_key)
    host_private, host_public = ssh.generate_host_key()
    text = cloudinit.render_user_data(
        cfg,
        label or f"{cfg.fleet.label_prefix}-preview",
        host_private,
        host_public,
        scaler_key,
        show_secrets=show_secrets,
    )
    typer.echo(text, nl=False)
    typer.echo(
        "# (host key generated for this preview; each instance gets its own at create)",
        err=True,
    )


# --- entry point -----------------------------------------------------------------------------


def _secrets_from_env() -> list[str | None]:
    from urllib.parse import urlsplit

    out: list[str | None] = [os.environ.get("VULTR_API_KEY")]
    for name in ("DATABASE_URL", "WORKER_DATABASE_URL"):
        url = os.environ.get(name)
        if url:
            out.append(url)
            try:
                out.append(urlsplit(url).password)
            except ValueError:
                pass
    return out


def _fail(message: str, hint: str, code: int) -> int:
    secrets = _secrets_from_env()
    text = redact(message, secrets)
    typer.echo(f"Error: {text}", err=True)
    if hint:
        typer.echo(f"Fix: {redact(hint, secrets)}", err=True)
    return code


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point; returns the exit code (DESIGN §2)."""
    import click

    command = typer.main.get_command(app)
    try:
        rv = command.main(args=argv, prog_name="vultrscale", standalone_mode=False)
        code = rv if isinstance(rv, int) else 0
    except click.exceptions.Exit as exc:
        code = exc.exit_code
    except click.exceptions.Abort:
        typer.echo("Aborted.", err=True)
        code = EXIT_RUNTIME
    except click.exceptions.ClickException as exc:
        exc.show()
        code = EXIT_USAGE if isinstance(exc, click.exceptions.UsageError) else exc.exit_code
    except VultrscaleError as exc:
        if _globals.debug:
            import traceback

            traceback.print_exc()
        code = _fail(exc.message, exc.hint, exc.exit_code)
    except KeyboardInterrupt:
        typer.echo("Interrupted.", err=True)
        code = 130
    if argv is None:
        sys.exit(code)
    return code


if __name__ == "__main__":
    main()
