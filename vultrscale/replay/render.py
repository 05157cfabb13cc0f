"""The results as a terminal table and as a PNG. Rendering only: no simulation here."""

from __future__ import annotations

import math
import os
import tomllib
from pathlib import Path

from rich import box
from rich.table import Table

from vultrscale.errors import UsageError
from vultrscale.replay.compare import Comparison
from vultrscale.replay.report import PolicyResult

# The table fits this many columns (a pipe or a file gets exactly this); --wide shows all.
NARROW = 100
# --wide: the columns after the row's name, unsqueezed.
_WIDE_NUMBERS = 130
PLOT_HINT = "Install the plot extra: pip install 'vultrscale[plot]' (it adds matplotlib)."
# Short names of the limits that bound a row, for the narrow table.
_LIMIT = {"cap": "cap", "budget": "budget", "cool-down": "cool", "max_step_up": "step"}


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


def _ratio(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x:.2f}" if x < 10 else f"{x:.0f}"


def floor_text(text: str) -> str:
    """A floor value, short: ``none`` or ``2@* 8-17 * * mon-fri`` (+ more, and a timezone if
    not UTC)."""
    try:
        floors = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
    if not isinstance(floors, list):
        return text
    if not floors:
        return "none"
    parts = []
    for fl in floors:
        if not isinstance(fl, dict):
            return text
        tz = fl.get("timezone", "UTC")
        where = "" if tz == "UTC" else f" {tz}"
        cron = str(fl.get("cron", "?"))
        fields = cron.split()
        if len(fields) == 5 and fields[0] == fields[2] == fields[3] == "*":
            cron = f"{fields[1]} {fields[4]}" if fields[4] != "*" else f"{fields[1]}h"
        parts.append(f"{fl.get('min_instances', 1)}@{cron}{where}")
    return "+".join(parts)


# Short names of the keys swept most, for the narrow table and the plot (--wide: whole keys).
_SHORT_KEY = {
    "idle_before_scale_down": "idle",
    "scale_down_cooldown": "down_cd",
    "scale_up_cooldown": "up_cd",
    "billing_hour_aware": "hour_aware",
    "monthly_ceiling_usd": "budget",
    "jobs_per_instance": "jobs/inst",
}


def knob_text(key: str, value: str) -> str:
    """One knob, short: the key without its section (or shorter), a floor as ``floor_text``."""
    short = key.rpartition(".")[2]
    if short == "floor":  # "2@8-17 mon-fri" says it is a floor; "none" would not
        text = floor_text(value)
        return "no floor" if text == "none" else text
    return f"{_SHORT_KEY.get(short, short)}={value}"


def row_name(r: PolicyResult, *, wide: bool = False) -> str:
    """The row's name: a sweep's combination by its knobs, short unless ``wide``."""
    full = " ".join(f"{k}={v}" for k, v in r.knobs)
    if r.knobs and not wide and r.policy.endswith(full):
        named = r.policy[: len(r.policy) - len(full)].strip()
        return " ".join([named] * bool(named) + [knob_text(k, v) for k, v in r.knobs])
    return r.policy


def _marks(r: PolicyResult) -> str:
    return ("*" if r.on_frontier else " ") + (">" if r.current else " ")


def _bound(r: PolicyResult, *, wide: bool) -> str:
    if wide:
        return ", ".join(r.bound_by) or "-"
    return ",".join(_LIMIT.get(n, n) for n in r.bound_by) or "-"


def table_width(cmp: Comparison) -> int:
    """The width the wide table needs so that no column is cut."""
    names = max((len(row_name(r, wide=True)) for r in cmp.results), default=10)
    return _WIDE_NUMBERS + names + 4


def table(cmp: Comparison, *, title: str, wide: bool = False) -> Table:
    """Every row: marks (* on the frontier, > the current setting), cost, wait, what bound it.
    Fits NARROW columns, the names cut to fit; ``wide`` adds instance-hours, killed, scale
    events and faults, and whole names."""
    cols = ["cost $", "billed h", "xHS", "xLB", "p50", "p95", "max", "lost"]
    if wide:
        cols += ["inst-h", "killed", "ups/downs", "refused/429/dead"]
    cols.append("bound by")
    body = []
    for r in cmp.results:
        cells = [
            f"{r.cost_usd:.2f}",
            str(r.billed_hours),
            _ratio(r.cost_vs_hindsight),
            _ratio(r.cost_ratio),
            _wait(r.wait_p50, r.wait_p50_at_least),
            _wait(r.wait_p95, r.wait_p95_at_least),
            _wait(r.wait_max, r.wait_max_at_least),
            str(r.lost),
        ]
        if wide:
            cells += [
                f"{r.instance_hours:.1f}",
                str(r.killed),
                f"{r.scale_ups}/{r.scale_downs}",
                f"{r.refused_creates}/{r.throttled}/{r.dead_boots}",
            ]
        body.append((r, [*cells, _bound(r, wide=wide)]))
    widths = [max([len(c)] + [len(cells[i]) for _, cells in body]) for i, c in enumerate(cols)]
    # Marks (2), the name, and one space between columns: the name gets what is left.
    room = max(12, NARROW - 2 - sum(widths) - (len(cols) + 1))
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=0, show_edge=False)
    t.add_column("", no_wrap=True, min_width=2)
    t.add_column("setting", no_wrap=True)
    for col, w in zip(cols, widths, strict=True):
        t.add_column(
            col, justify="left" if col == "bound by" else "right", no_wrap=True, min_width=w
        )
    for r, cells in body:
        name = row_name(r, wide=wide)
        if not wide and len(name) > room:
            name = name[: room - 1] + "…"
        t.add_row(_marks(r), name, *cells)
    return t


def footer(cmp: Comparison) -> list[str]:
    tr = cmp.trace
    if cmp.lower_bound_hours is None:
        bound = (
            "lower bound: each row's own (job time / the jobs its instances run at once: no "
            "boot, no idle, billed by the second); xLB is each row's cost over it"
        )
    else:
        bound = (
            f"lower bound: {cmp.lower_bound_hours:.1f} instance-hours (job time / the jobs an "
            "instance runs at once: no boot, no idle, billed by the second); xLB is each row's "
            "cost over its cost"
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
        "* on the cost/wait frontier (no other row both cheaper and quicker at p95, none lost); "
        "> the current setting",
        bound,
    ]
    hind = cmp.hindsight
    if hind is not None:
        lines.append(
            f"hindsight: ${hind.cost_usd:.2f}, what a perfect forecast of this workload runs "
            "(each clock hour's work and each burst, started one boot ahead, same cap and "
            "price); xHS is each row's cost over it"
        )
    lines += [
        "bound by: the limits that held back a scale-up the row wanted (cap = max_instances, "
        "budget, cool = scale_up_cooldown, step = max_step_up)",
        f"{price} per started hour; wait = arrival to result less the job's own run time",
        f"lost = not finished {_dur(cmp.grace)} after the trace's end (a boot, the longest job "
        "and a drain) or killed at every attempt; a lost job waits at least to the replay's "
        "end, and >= marks a wait that rests on one",
    ]
    faults = [(r.refused_creates, r.throttled, r.dead_boots) for r in cmp.results if not r.baseline]
    if any(any(f) for f in faults):
        refused, throttled, dead = (max(x) for x in zip(*faults, strict=True))
        lines.append(
            f"faults met (most in any vultrscale row): {refused} create(s) refused by a "
            f"stock-out, {throttled} API call(s) answered 429, {dead} instance(s) that never "
            "booted; --wide shows each row's"
        )
    revived = [(r.revives, r) for r in cmp.results if not r.baseline and r.revives]
    if revived:
        most, row = max(revived, key=lambda x: x[0])
        lines.append(
            f"revives: up to {most} draining instance(s) started again instead of a create "
            f"({row.policy}); --json gives each row's"
        )
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
    """Cost against p95 wait for every row, the frontier drawn, the current setting and the
    baselines labelled; below, the fleet over time of the chosen row (``Comparison.chosen``)
    against the current setting and hindsight, over the queue."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(
        2, 1, figsize=(11, 9.5), dpi=90, gridspec_kw={"height_ratios": [3, 2]}
    )
    rows = list(cmp.results)
    chosen, current = cmp.chosen, cmp.current

    def xy(r: PolicyResult) -> tuple[float, float]:
        return r.wait_p95 / 60.0, r.cost_usd

    variants = [r for r in rows if not r.baseline]
    ax.scatter(
        [xy(r)[0] for r in variants if r.lost == 0],
        [xy(r)[1] for r in variants if r.lost == 0],
        s=22, color="#7a8ca3", label="vultrscale settings", zorder=2,
    )  # fmt: skip
    lost = [r for r in rows if r.lost]
    if lost:
        ax.scatter(
            [xy(r)[0] for r in lost], [xy(r)[1] for r in lost], s=30, marker="x",
            color="#c0392b", label="lost jobs (wait is a floor)", zorder=2,
        )  # fmt: skip
    front = sorted((r for r in rows if r.on_frontier), key=lambda r: r.cost_usd)
    if front:
        fx, fy = zip(*(xy(r) for r in front), strict=True)
        ax.step(fx, fy, where="post", color="#2c7fb8", lw=1.5, zorder=1, label="frontier")
        ax.scatter(fx, fy, s=40, facecolors="none", edgecolors="#2c7fb8", lw=1.5, zorder=3)
    for r in rows:
        if r.baseline:
            ax.scatter(*xy(r), s=45, marker="s", color="#e67e22", zorder=4)
            _label(ax, r, r.policy, "#a04000")
    if current is not None:
        ax.scatter(*xy(current), s=160, marker="*", color="#27ae60", zorder=5, label="current")
        _label(ax, current, "current" + ("" if current.policy == "current" else
                                         f" ({row_name(current)})"), "#1e8449")  # fmt: skip
    for k, r in enumerate(front):
        if not r.baseline and not r.current:
            _label(ax, r, row_name(r), "#1f4e79", small=True, lift=(k % 3) * 8 - 8)
    if chosen is not None and current is not None and chosen is not current:
        ax.scatter(*xy(chosen), s=140, facecolors="none", edgecolors="#8e44ad", lw=2, zorder=6)
    # Zoomed on the rows that lost nothing and are not far off the rest (always-on at the
    # peak costs several times the median; a naive scaler's lost jobs wait for days): they
    # would squeeze every setting into one corner. Those outside are named in a corner.
    kept = [r for r in rows if r.lost == 0]
    if kept:
        mid_cost = sorted(r.cost_usd for r in kept)[(len(kept) - 1) // 2]
        mid_wait = sorted(r.wait_p95 for r in kept)[(len(kept) - 1) // 2]
        kept = [
            r
            for r in kept
            if not r.baseline
            or (r.cost_usd <= 2.5 * mid_cost and r.wait_p95 <= 4 * mid_wait + 60.0)
        ]
    focus = [xy(r) for r in kept]
    if focus:
        xs_, ys_ = zip(*focus, strict=True)
        xpad = max(0.5, (max(xs_) - min(xs_)) * 0.12)
        ypad = max(0.01, (max(ys_) - min(ys_)) * 0.12)
        x0, x1 = max(0.0, min(xs_) - xpad), max(xs_) + xpad * 2.5
        y0, y1 = max(0.0, min(ys_) - ypad), max(ys_) + ypad
        ax.set_xlim(x0, x1)
        ax.set_ylim(y0, y1)
        off = [
            f"{row_name(r)}: ${r.cost_usd:.2f}, p95 {_wait(r.wait_p95, r.wait_p95_at_least)}"
            + (f", {r.lost} lost" if r.lost else "")
            for r in rows
            if not (x0 <= xy(r)[0] <= x1 and y0 <= xy(r)[1] <= y1)
        ]
        for text in off:  # named in the legend (upper right: dear and slow, mostly empty)
            ax.plot([], [], " ", label=f"off the chart: {text}")
    ax.set_xlabel("p95 wait (minutes)")
    ax.set_ylabel("cost ($)")
    ax.set_title(
        "cost against p95 wait: lower left is better; the line joins the frontier",
        fontsize=10, loc="left",
    )  # fmt: skip
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper right", framealpha=0.9)

    shown: list[tuple[PolicyResult | None, str, str]] = [(current, "current", "#27ae60")]
    if chosen is not None and chosen is not current:
        shown.insert(0, (chosen, f"chosen: {row_name(chosen)}", "#8e44ad"))
    elif current is not None:  # the current is the cheapest of its wait: the next trade
        quicker = [r for r in front if not r.baseline and r.wait_p95 < current.wait_p95]
        if quicker:
            step = min(quicker, key=lambda r: r.cost_usd)
            shown.insert(0, (step, f"next quicker: {row_name(step)}", "#8e44ad"))
    shown.append((cmp.hindsight, "hindsight", "#e67e22"))
    if not any(line is not None and line.samples for line, _, _ in shown) and rows:
        # Baselines only (no current setting, no hindsight): the cheapest that lost nothing,
        # rather than an empty panel.
        pick = next((r for r in rows if r.lost == 0), rows[0])
        shown = [(pick, row_name(pick), "#8e44ad")]
    queue_drawn = False
    for line, name, colour in shown:
        if line is None or not line.samples:
            continue
        xs = [s.t / 3600 for s in line.samples]
        if not queue_drawn:
            q = ax2.twinx()
            q.fill_between(xs, [s.queued for s in line.samples], step="post", color="#dddddd")
            q.set_ylabel("jobs queued or running", color="#888888", fontsize=8)
            q.tick_params(labelsize=8, colors="#888888")
            ax2.set_zorder(q.get_zorder() + 1)
            ax2.patch.set_visible(False)
            queue_drawn = True
        ax2.step(xs, [s.fleet for s in line.samples], where="post", lw=1.2, color=colour,
                 label=f"{name} (${line.cost_usd:.2f}, p95 {_dur(line.wait_p95)})")  # fmt: skip
    if queue_drawn:  # head-room for the legend above the busiest moment
        top = max(s.fleet for line, _, _ in shown if line is not None for s in line.samples)
        ax2.set_ylim(-0.2, top * 1.45 + 0.5)
    ax2.set_title("instances at Vultr over time", fontsize=10, loc="left")
    ax2.set_xlabel("hours since the trace began")
    ax2.set_ylabel("instances")
    ax2.legend(fontsize=8, loc="upper left", framealpha=0.9)
    fig.suptitle(cmp.trace.note, fontsize=10)
    fig.tight_layout()
    try:
        fig.savefig(path)
    except OSError as exc:
        raise UsageError(f"cannot write the plot to {path}: {exc.strerror}") from None
    finally:
        plt.close(fig)


def _label(
    ax: object, r: PolicyResult, text: str, colour: str, *, small: bool = False, lift: int = 0
) -> None:
    """A point's name beside it, cut to 40 characters; ``lift`` points up (neighbours apart)."""
    if len(text) > 40:
        text = text[:39] + "..."
    ax.annotate(  # type: ignore[attr-defined]
        text,
        (r.wait_p95 / 60.0, r.cost_usd),
        xytext=(6, 4 + lift),
        textcoords="offset points",
        fontsize=7 if small else 8,
        color=colour,
    )
