"""The results as a terminal table and as a PNG. Rendering only: no simulation here."""

from __future__ import annotations

import os
from pathlib import Path

from rich import box
from rich.table import Table

from vultrscale.errors import UsageError
from vultrscale.simulate.compare import Comparison

# The table's columns after the policy name, unsqueezed: a pipe or a file gets this much more.
_NUMBERS_WIDTH = 100
PLOT_HINT = "Install the plot extra: pip install 'vultrscale[plot]' (it adds matplotlib)."


def _dur(seconds: float) -> str:
    """Compact: 41s, 11.5m, 2.3h."""
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def _wait(seconds: float, at_least: bool) -> str:
    """A wait, marked >= when lost jobs (waiting still at the replay's end) make it a floor."""
    return (">=" if at_least else "") + _dur(seconds)


def table_width(cmp: Comparison) -> int:
    """The width the table needs so that no column is cut."""
    return _NUMBERS_WIDTH + max((len(r.policy) for r in cmp.results), default=10) + 4


def table(cmp: Comparison, *, title: str) -> Table:
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    t.add_column("policy", no_wrap=True)
    for col in (
        "inst-h",
        "xLB",
        "billed h",
        "cost $",
        "wait p50",
        "p95",
        "max",
        "killed",
        "lost",
        "ups/downs",
    ):
        t.add_column(col, justify="right", no_wrap=True, min_width=max(len(col), 5))
    for r in cmp.results:
        t.add_row(
            r.policy,
            f"{r.instance_hours:.1f}",
            f"{r.ratio:.1f}",
            str(r.billed_hours),
            f"{r.cost_usd:.2f}",
            _wait(r.wait_p50, r.wait_p50_at_least),
            _wait(r.wait_p95, r.wait_p95_at_least),
            _wait(r.wait_max, r.wait_max_at_least),
            str(r.killed),
            str(r.lost),
            f"{r.scale_ups}/{r.scale_downs}",
        )
    return t


def footer(cmp: Comparison) -> list[str]:
    tr = cmp.trace
    if cmp.lower_bound_hours is None:
        bound = (
            "lower bound: each row's own (job time / the jobs its instances run at once: no "
            "boot, no idle); "
            "xLB is each row's instance-hours over it"
        )
    else:
        bound = (
            f"lower bound: {cmp.lower_bound_hours:.1f} instance-hours (job time / the jobs an "
            "instance runs at once: no boot, no idle); xLB is each row's instance-hours over it"
        )
    plans = dict.fromkeys((r.plan, r.monthly_usd) for r in cmp.results)
    if len(plans) > 1:
        price = "prices (by row's plan): " + ", ".join(f"{p} ${m:.2f}/month" for p, m in plans)
        price += ", each"
    else:
        price = f"price: {cmp.price.plan} ${cmp.price.monthly:.2f}/month, ${cmp.price.hourly:.4f}/h"
    lines = [
        f"workload: {tr.note}; {len(tr)} job(s), {tr.total_job_seconds / 3600:.1f} job-hours "
        f"over {tr.span / 3600:.0f} h",
        bound,
        f"{price} per started hour; wait = arrival to result less the job's own run time",
        f"lost = not finished {_dur(cmp.grace)} after the trace's end (a boot, the longest job "
        "and a drain) or killed at every attempt; killed = runs cut off by a delete; a lost "
        "job waits at least to the replay's end, and >= marks a wait that rests on one",
    ]
    return lines + list(cmp.notes)


def require_matplotlib() -> None:
    """Fail before any work is done when --plot cannot be honoured."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError(
            "--plot needs matplotlib, which is not installed", hint=PLOT_HINT
        ) from None


def plot_path(path: Path) -> Path:
    """The file ``plot`` will write for ``--plot PATH``, checked before any replay: a name
    without an extension gets ``.png`` (as matplotlib would add), one matplotlib cannot write
    is refused."""
    require_matplotlib()
    from matplotlib.backend_bases import FigureCanvasBase

    if not path.name or path.is_dir():  # ".", "/", a directory: no file to write
        raise UsageError(
            f"--plot {path}: not a file name", hint="Name the file to draw, e.g. --plot fleet.png."
        )
    folder = path.parent.expanduser()
    if not folder.is_dir() or not os.access(
        folder, os.W_OK | os.X_OK
    ):  # after the replay, too late
        raise UsageError(
            f"--plot {path}: {folder} is not a directory this user can write in",
            hint="Create the directory, or name a file in one you can write.",
        )
    if not path.suffix:
        return path.with_name(path.name + ".png")
    formats = FigureCanvasBase.get_supported_filetypes()
    if path.suffix[1:].lower() not in formats:
        raise UsageError(
            f"--plot {path}: cannot draw a {path.suffix} file",
            hint=f"End the name in .png (or {', '.join('.' + f for f in sorted(formats))}).",
        )
    return path


def plot(cmp: Comparison, path: Path) -> None:
    """Queue depth, fleet size and cumulative cost over time per policy, in one PNG."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(10, 8), sharex=True, dpi=80)
    for r in cmp.results:
        xs = [s.t / 3600 for s in r.samples]
        axes[1].step(xs, [s.fleet for s in r.samples], where="post", label=r.policy, lw=1)
        axes[2].plot(
            [t / 3600 for t, _ in r.cost_curve],
            [c for _, c in r.cost_curve],
            lw=1.2,
            label=r.policy,
        )
        axes[0].step(xs, [s.queued for s in r.samples], where="post", label=r.policy, lw=1)
    axes[0].set_title("jobs queued or running", fontsize=10, loc="left")
    axes[1].set_title("instances at Vultr", fontsize=10, loc="left")
    axes[2].set_title("cumulative cost ($)", fontsize=10, loc="left")
    axes[2].set_xlabel("hours since the trace began")
    axes[2].legend(fontsize=8, loc="upper left")
    fig.suptitle(cmp.trace.note, fontsize=10)
    fig.tight_layout()
    try:
        fig.savefig(path)
    except OSError as exc:
        raise UsageError(f"cannot write the plot to {path}: {exc.strerror}") from None
    finally:
        plt.close(fig)
