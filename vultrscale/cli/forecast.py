"""The forecast command: the floor forecast of the next 48 hours, read or computed."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Annotated, Any

import typer

from vultrscale.cli._common import JsonFlag, examples, group, load_config, print_json
from vultrscale.errors import UsageError
from vultrscale.wiring import database_url

if TYPE_CHECKING:
    from pathlib import Path

app = group()

# What `vultrscale forecast` shows ahead.
FORECAST_HOURS = 48


@app.command(
    "forecast",
    epilog=examples(
        "vultrscale forecast",
        "vultrscale forecast --json",
        "vultrscale forecast --plot week.png",
    ),
)
def forecast_cmd(
    as_json: JsonFlag = False,
    plot: Annotated[
        str | None,
        typer.Option("--plot", metavar="PATH.png", help="Draw the next 48 hours (needs [plot])."),
    ] = None,
) -> None:
    """The floor forecast for the next 48 hours: per slot of the week, the jobs the queue's
    history says run at once, the instances they need, and the floor the forecast sets one
    boot time ahead (acted on only with policy.forecast.mode = "scale"). Reads the profile
    the passes cached, or computes it from the jobs table; changes nothing."""
    from datetime import UTC, datetime
    from pathlib import Path

    from vultrscale import read
    from vultrscale.core import boottime, forecast
    from vultrscale.db import ledger, pg
    from vultrscale.db.history import PgHistory, has_history
    from vultrscale.db.presets import PRESETS
    from vultrscale.rules import offerings

    cfg = load_config()
    path = None
    if plot is not None:
        from vultrscale.replay.render import plot_path

        path = plot_path(Path(plot))
    if not has_history(cfg.queue.preset):
        why = PRESETS[cfg.queue.preset].no_history
        raise UsageError(
            f"the forecast reads the queue's finished jobs; with queue.preset = "
            f"{cfg.queue.preset!r} there are none: {why}",
            hint='Set policy.forecast.mode = "off" (the depth rule and the floor still act).',
        )
    url = database_url(cfg)
    now = datetime.now(UTC)
    with pg.session(url, "cannot read the forecast profile") as conn:
        cached = ledger.forecast_profile(conn, cfg.fleet.name)
        boots = ledger.boot_rows(
            conn, cfg.fleet.name, within=boottime.WINDOW, limit=boottime.LAST_BOOTS
        )
    fresh = cached is not None and cached.fresh(cfg.policy.forecast, now)
    history = PgHistory(url, cfg.queue.queue, cfg.queue.preset)
    profile = read.forecast_profile(cfg, history, cached, now)
    # the lead the pass uses: the boot time learned from the same boots
    lead = boottime.learn(boots, cfg.policy.boot_time, now).estimate
    # new instances go to the first offering (the pass prefers the one its price is of)
    jobs, cap = offerings.new_jobs_per_instance(cfg, None), cfg.policy.max_instances
    slots = (
        forecast.horizon(
            profile,
            now,
            FORECAST_HOURS,
            lead,
            jobs_per_instance=jobs,
            max_instances=cap,
            round_up_from=cfg.policy.forecast.round_up_from,
            clear_within=cfg.policy.forecast.clear_within,
        )
        if profile.enough
        else []
    )
    origin = (
        f"cached by a pass at {profile.computed_at:%Y-%m-%d %H:%M} UTC"
        if fresh
        else "computed now from the jobs table"
    )
    note = profile.shortfall()
    if as_json:
        from vultrscale.status import forecast_rows

        print_json(
            {
                "fleet": cfg.fleet.name,
                "at": now.isoformat(),
                "mode": cfg.policy.forecast.mode,
                "lead_seconds": lead.total_seconds(),
                "usable": profile.enough,
                "note": note or None,
                "profile": origin,
                "history_seconds": profile.history.total_seconds(),
                "jobs_seen": profile.jobs,
                "mean_run_seconds": profile.mean_run_seconds,
                "slots": forecast_rows(slots, profile.slot),
            }
        )
    else:
        from vultrscale.cli.views import console
        from vultrscale.config import format_duration
        from vultrscale.status import forecast_table

        out = console()
        mode = cfg.policy.forecast.mode
        acts = {"scale": "acts on it", "observe": "observes only", "off": "off"}[mode]
        out.print(
            f"forecast of fleet {cfg.fleet.name}: mode {mode} ({acts}); profile {origin}; "
            f"{profile.jobs} job(s) over {format_duration(profile.history)}, lead "
            f"{format_duration(lead)}, {jobs} job(s) per instance, cap {cap}",
            markup=False,
            highlight=False,
        )
        if note:
            out.print(f"no forecast: {note}", markup=False, highlight=False)
        else:
            title = f"next {FORECAST_HOURS} hours (UTC), slots of {format_duration(profile.slot)}"
            out.print(forecast_table(slots, profile.slot, title))
    if path is not None:
        _plot_forecast(slots, profile.slot, jobs, path)


def _plot_forecast(slots: list[Any], slot: timedelta, jobs: int, path: Path) -> None:
    """The coming slots as steps: the load in instances, the need and the floor."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4))
    xs = [f.start for f in slots] + ([slots[-1].start + slot] if slots else [])

    def steps(values: list[float]) -> list[float]:
        return values + values[-1:]

    if slots:
        ax.step(xs, steps([f.load / jobs for f in slots]), where="post", label="load / jobs")
        ax.step(xs, steps([float(f.need) for f in slots]), where="post", label="needs")
        ax.step(xs, steps([float(f.floor) for f in slots]), where="post", label="floor (lead)")
    ax.set_ylabel("instances")
    ax.set_title("floor forecast, next 48 hours (UTC)")
    ax.legend(loc="upper right")
    fig.autofmt_xdate()
    fig.savefig(path, dpi=100)
    plt.close(fig)
