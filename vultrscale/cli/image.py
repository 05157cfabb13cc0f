"""Image commands: what new instances boot from (snapshot) and with (cloud-init)."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Annotated

import typer

from vultrscale import params
from vultrscale.cli._common import examples, group, load_config, shown
from vultrscale.errors import UsageError
from vultrscale.wiring import api_key, database_url

if TYPE_CHECKING:
    from vultrscale import snapshot as snapshots

app = group()
cloudinit_app = group(
    help="The user-data new instances get.",
    epilog=examples(
        "vultrscale cloud-init render",
        "vultrscale cloud-init render --label worker-7 > user-data",
    ),
)
app.add_typer(cloudinit_app, name="cloud-init")


@app.command(
    "snapshot",
    epilog=examples(
        "vultrscale snapshot --from-instance 3f1c0e2a-...",
        "vultrscale snapshot --resume 9a7b...  # after --no-wait or a timeout",
    ),
)
def snapshot_cmd(
    from_instance: Annotated[
        str | None,
        typer.Option(
            "--from-instance",
            parser=params.instance_id,
            metavar="ID",
            help="Instance to snapshot (its id).",
        ),
    ] = None,
    description: Annotated[
        str | None,
        typer.Option(
            "--description",
            metavar="TEXT",
            help=shown("Snapshot description.", "<fleet>-<UTC time>"),
            show_default=False,
        ),
    ] = None,
    keep: Annotated[
        int,
        typer.Option(
            "--keep",
            parser=params.count(),
            metavar="N",
            help="Fleet snapshots to keep, newest first.",
        ),
    ] = 3,
    no_wait: Annotated[
        bool,
        typer.Option(
            "--no-wait", help="Return after the request; use --resume later.", show_default=False
        ),
    ] = False,
    wait_for: Annotated[
        timedelta,
        typer.Option(
            "--timeout",
            parser=params.duration(timedelta(seconds=1)),
            metavar="DURATION",
            show_default=False,
            help=shown("How long to wait for `complete`.", "60m"),
        ),
    ] = timedelta(minutes=60),
    resume: Annotated[
        str | None,
        typer.Option(
            "--resume",
            parser=params.snapshot_id,
            metavar="ID",
            help="Wait for a snapshot made earlier (--no-wait, a timeout), then record and prune.",
        ),
    ] = None,
) -> None:
    """Bake the base image: snapshot an instance, wait until complete, record it, prune."""
    if bool(from_instance) == bool(resume):
        raise UsageError(
            "give exactly one of --from-instance ID and --resume ID",
            hint="Find instance ids with `vultrscale instances`.",
        )
    if resume and no_wait:
        raise UsageError("--no-wait has no meaning with --resume", hint="Drop --no-wait.")
    cfg = load_config()
    key, db_url = api_key(cfg), database_url(cfg)

    from rich.markup import escape
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
    from rich.table import Column

    from vultrscale import snapshot as snapshots
    from vultrscale.cli.views import console, plain
    from vultrscale.vultr.client import VultrClient

    out, err = console(), console(stderr=True)
    what = f"snapshot of instance {from_instance}" if from_instance else f"snapshot {resume}"
    # elapsed time before the text, so a narrow terminal cuts the text, not the clock
    progress = Progress(
        SpinnerColumn(table_column=Column(min_width=1, no_wrap=True)),
        TimeElapsedColumn(table_column=Column(min_width=7, no_wrap=True)),
        TextColumn("{task.description}", table_column=Column(no_wrap=True, overflow="ellipsis")),
        console=err,
        transient=True,
    )
    task = progress.add_task(escape(f"requesting {what}"), total=None)

    def show(p: snapshots.Progress) -> None:
        note = f" ({p.note})" if p.note else f" (next check in {p.next_poll:.0f}s)"
        progress.update(
            task,
            description=f"[bold]{escape(p.status)}[/bold] "
            + escape(f"snapshot {p.snapshot_id}{note}"),
        )

    with VultrClient(key, cfg.api_url) as client, progress:
        if resume:
            result = snapshots.resume(
                client, db_url, cfg, resume, keep=keep, timeout=wait_for, on_progress=show
            )
        else:
            assert from_instance is not None
            result = snapshots.bake(
                client,
                db_url,
                cfg,
                from_instance,
                description=description,
                keep=keep,
                wait=not no_wait,
                timeout=wait_for,
                on_progress=show,
            )

    fleet = cfg.fleet.name
    if not result.is_complete:
        out.print(
            plain(
                f"Snapshot {result.snapshot_id} ({result.description}) requested; "
                f"it is {result.status} at Vultr and listed for fleet {fleet!r}, but is not its "
                "snapshot until complete."
            )
        )
        out.print(
            plain(
                f"Run `vultrscale snapshot --resume {result.snapshot_id}` to wait for it and "
                "make it the fleet's snapshot."
            )
        )
        return
    minutes, seconds = divmod(int(result.elapsed), 60)
    size = f", {result.size / 1024**3:.1f} GiB" if result.size else ""
    out.print(
        plain(f"Snapshot {result.snapshot_id}", style="green")
        + plain(
            f" ({result.description}) is complete after {minutes}m{seconds:02d}s{size}; "
            f"it is now the snapshot of fleet {fleet!r}"
            + (f" (was {result.previous})." if result.previous else ".")
        )
    )
    if cfg.fleet.snapshot_id and cfg.fleet.snapshot_id != result.snapshot_id:
        err.print(
            plain("Note:", style="yellow")
            + plain(
                f" fleet.snapshot_id = {cfg.fleet.snapshot_id!r} in the config takes "
                'precedence; set it to "" to boot new instances from this snapshot.'
            )
        )
    if result.deleted:
        out.print(
            plain(
                f"Deleted {len(result.deleted)} older fleet snapshot(s): "
                + ", ".join(result.deleted)
            )
        )
    elif not result.delete_errors:
        out.print(f"No older fleet snapshots to delete (keeping {keep}).")
    for problem in result.delete_errors:
        err.print(
            plain("Warning:", style="yellow")
            + plain(f" could not delete {problem}; the next bake retries.")
        )


@cloudinit_app.command(
    "render",
    short_help="Print a new instance's user-data, secrets masked.",
    epilog=examples(
        "vultrscale cloud-init render", "vultrscale cloud-init render --label web-7 > user-data"
    ),
)
def cloudinit_render(
    label: Annotated[
        str | None,
        typer.Option(
            "--label",
            metavar="LABEL",
            help=shown("Instance label.", "<fleet.label_prefix>-preview"),
            show_default=False,
        ),
    ] = None,
    show_secrets: Annotated[
        bool,
        typer.Option(
            "--show-secrets",
            help="Print the database password and private host key.",
            show_default=False,
        ),
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
