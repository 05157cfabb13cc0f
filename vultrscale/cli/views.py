"""Everything the command line draws: a pass, the fleet's instances, the config, the demo's
live view and summary. Text from outside (labels, tags, API and database messages) goes in as
``status.plain`` Text, never as markup; no console here highlights words on its own."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TextIO

from rich import box
from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from vultrscale import status
from vultrscale.status import clean, plain

if TYPE_CHECKING:
    from rich.live import Live

    from vultrscale.config.fleets import Fleets
    from vultrscale.db.roles import WorkerAccess
    from vultrscale.demo import Summary, Tick
    from vultrscale.reconcile import PassResult
    from vultrscale.vultr.models import VInstance


def console(stderr: bool = False) -> Console:
    """A console that paints only what we style: rich's highlighter would colour words like
    ``up`` in ``scale-up(s)`` and numbers inside messages."""
    return Console(stderr=stderr, highlight=False)


# --- a pass -----------------------------------------------------------------------------------


def result_lines(result: PassResult, indent: str = "  ") -> list[Text]:
    """What a pass did and what went wrong, one line each."""
    lines = [plain(f"{indent}{r['label']}: {r['result']}") for r in result.results]
    lines += [plain(f"{indent}error: {e}", style="red") for e in result.errors]
    return lines


def print_pass(result: PassResult) -> None:
    """One pass as `vultrscale reconcile` prints it (``--json``: ``result.to_json()``)."""
    out = console()
    if result.lock_held:
        out.print("Another reconcile pass holds the lock for this fleet; nothing to do.")
        return
    if result.plan is not None:
        verb = "would" if result.dry_run else "do"
        for line in status.plan_lines(result.plan, verb, "dry run: " if result.dry_run else ""):
            out.print(line)
    for line in result_lines(result):
        out.print(line)


# --- instances ----------------------------------------------------------------------------------

_STATUS_STYLE = {"active": "green", "pending": "yellow"}


def instance_json(inst: VInstance) -> dict[str, Any]:
    created = inst.date_created.isoformat() if inst.date_created else None
    return {
        "id": inst.id,
        "label": inst.label,
        "status": inst.status,
        "power_status": inst.power_status,
        "server_status": inst.server_status,
        "main_ip": inst.main_ip,
        "internal_ip": inst.internal_ip,
        "region": inst.region,
        "plan": inst.plan,
        "date_created": created,
        "tags": list(inst.tags),
    }


def instances_table(found: list[VInstance], width: int) -> Table:
    """One column per field when the terminal is wide; stacked cells that fit 80 columns."""

    def when(inst: VInstance) -> str:
        return inst.date_created.strftime("%Y-%m-%d %H:%M") if inst.date_created else "-"

    def ip(inst: VInstance) -> str:
        return inst.main_ip if inst.has_address else "-"

    if width >= 150:
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
        for name in ("id", "label", "status", "power", "server", "main IP", "region", "plan"):
            table.add_column(name, no_wrap=name in ("id", "main IP"))
        table.add_column("created (UTC)", no_wrap=True)
        table.add_column("tags", overflow="fold")
        for i in found:
            table.add_row(
                plain(i.id),
                plain(i.label),
                plain(i.status, style=_STATUS_STYLE.get(i.status, "red")),
                plain(i.power_status),
                plain(i.server_status),
                plain(ip(i)),
                plain(i.region),
                plain(i.plan),
                when(i),
                plain(", ".join(i.tags)),
            )
        return table
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_lines=False)
    # Each cell stacks three fields; the header names them in the same order.
    table.add_column("id\nlabel\ntags", min_width=36, overflow="fold")
    table.add_column("status\npower\nserver", min_width=17, overflow="fold")
    table.add_column("main IP\nregion plan\ncreated (UTC)", min_width=16, overflow="fold")
    for n, i in enumerate(found):
        style = _STATUS_STYLE.get(i.status, "red")
        table.add_row(
            Text("\n").join([plain(i.id), plain(i.label, "bold"), plain(", ".join(i.tags), "dim")]),
            Text("\n").join(
                [plain(i.status, style), plain(i.power_status), plain(i.server_status)]
            ),
            Text("\n").join([plain(ip(i)), plain(f"{i.region} {i.plan}"), Text(when(i))]),
            end_section=n < len(found) - 1,
        )
    return table


# --- config -----------------------------------------------------------------------------------


def worker_login_line(access: WorkerAccess) -> str:
    """`config check`'s line on the workers' database login, in words for each case."""
    if not access.source:
        return "Workers' database login: none yet (WORKER_DATABASE_URL is not set)"
    if not access.role:
        return (
            f"Workers log in with {access.source}, which names no user (libpq then uses the "
            "operating system user's name on the instance)"
        )
    return f"Workers log in as {access.role} (from {access.source})"


def print_config(data: dict[str, Any], access: WorkerAccess, warnings: Sequence[str] = ()) -> None:
    """`config check`: the resolved config, one table per section (secrets already masked),
    after the warnings about the config as a whole, the workers' database role and any warning
    about it."""
    out = console()
    out.print(
        Text("Configuration is valid", style="green") + plain(f" (from {data.pop('source')})")
    )
    for warning in warnings:
        out.print(Text("warning: ", style="yellow") + plain(warning))
    out.print(plain(worker_login_line(access)))
    for note in access.notes:
        out.print(plain(note))
    for warning in access.warnings:
        out.print(Text("warning: ", style="yellow") + plain(warning))
    for section, values in data.items():
        table = Table(
            title=f"\\[{escape(section)}]", show_header=False, title_justify="left", box=None
        )
        table.add_column("key", style="cyan")
        table.add_column("value")
        for key, value in values.items():
            table.add_row(
                plain(key), plain(json.dumps(value) if not isinstance(value, str) else value)
            )
        out.print(table)


def print_fleets(fleets: Fleets) -> None:
    """`config check` of a directory: its fleets in a table (file, tag, where they run, the
    cap, the fleet's ceiling), the account's settings, and every file that cannot run with its
    problems; each valid fleet's whole config follows (``print_config``)."""
    out = console()
    out.print(plain(f"{len(fleets.configs)} fleet(s) in {fleets.source}"))
    table = Table(box=box.SIMPLE_HEAD)
    for col in ("fleet", "file", "tag", "offerings", "queue", "max", "ceiling $"):
        table.add_column(col)
    from vultrscale.rules.offerings import of

    for cfg in fleets.configs:
        table.add_row(
            plain(cfg.fleet.name),
            plain(cfg.source.rsplit("/", 1)[-1]),
            plain(cfg.fleet.tag),
            plain(", ".join(o.name for o in of(cfg))),
            plain(f"{cfg.queue.preset}:{cfg.queue.queue or '*'}"),
            str(cfg.policy.max_instances),
            f"{cfg.budget.monthly_ceiling_usd:g}",
        )
    out.print(table)
    account = fleets.account
    ceiling = account.monthly_ceiling_usd
    limit = f"${ceiling:g} over every fleet" if ceiling else "none (monthly_ceiling_usd = 0)"
    out.print(
        plain(
            f"account: monthly ceiling {limit}; API pacing shared by {account.scalers} "
            "scaler process(es)"
        )
    )
    for bad in fleets.bad:
        named = f" (fleet {bad.name})" if bad.name else ""
        out.print(Text("invalid: ", style="red") + plain(f"{bad.path.name}{named}, not run:"))
        for problem in bad.problems:
            out.print(plain(f"  - {problem}"))


# --- the demo ---------------------------------------------------------------------------------

# The live view keeps the last few events: enough to follow a burst and its scale-up, few
# enough that the fleet table and the plan still fit a 24-row terminal.
EVENTS_SHOWN = 8
# Rows the live view keeps for events before the plan's lines take the rest.
EVENTS_MIN = 3
STOPPING = "Stopping: cleaning up; press Ctrl-C again to stop at once."


def demo_jobs(tick: Tick) -> str:
    jobs = tick.jobs
    done = sum(jobs.get(s, 0) for s in ("succeeded", "failed", "dead"))
    return (
        f"jobs: {jobs.get('ready', 0)} ready, {jobs.get('leased', 0)} running, "
        f"{done}/{tick.enqueued} done"
    )


def demo_counts(tick: Tick) -> str:
    """The run in one line: the fleet's states and the jobs."""
    states: dict[str, int] = dict(tick.instances or {})
    if not states and tick.result is not None and tick.result.observation is not None:
        states = tick.result.observation.summary()["instances"]
    fleet = ", ".join(f"{n} {s}" for s, n in states.items()) or "none"
    return f"[{tick.elapsed:5.1f}s] instances: {fleet} | {demo_jobs(tick)}"


def tick_events(tick: Tick) -> list[str]:
    """What happened since the last tick: the run's notes, the pass's results and errors."""
    lines = list(tick.notes)
    if tick.result is not None:
        lines += [f"{r['label']}: {r['result']}" for r in tick.result.results]
        lines += [f"error: {e}" for e in tick.result.errors]
    if tick.error:
        lines.append(f"error: {tick.error}")
    return lines


class DemoLog:
    """Off a terminal (or ``--no-live``): a timestamped line per message, written as it happens.
    Never wrapped, so a log keeps one event per line."""

    def __init__(self, out: Console, now: Callable[[], datetime] = lambda: datetime.now(UTC)):
        self.out = out
        self.now = now

    def say(self, line: str) -> None:
        self.out.print(plain(f"{self.now():%H:%M:%S} {line}"), soft_wrap=True)

    def update(self, tick: Tick) -> None:
        """A line of counts, then what happened, indented under it."""
        self.say(demo_counts(tick))
        for line in tick_events(tick):
            self.say(f"         {line}")


def _row(text: str | Text, style: str = "") -> Text:
    """One row of the live view: cut with an ellipsis rather than wrapped onto a second row."""
    row = text.copy() if isinstance(text, Text) else plain(text, style)
    row.no_wrap, row.overflow = True, "ellipsis"
    return row


def demo_frame(tick: Tick, events: list[str], out: Console) -> Group:
    """The live view for ``out``'s size: the jobs, the fleet table, as much of the plan as
    fits, and the latest events. Every row is one terminal row, so the frame never passes the
    console's height (one row less: the cursor's) and rich never crops it into ``...``."""
    width, rows_left = out.width, out.height - 1
    options = out.options.update(width=width)

    def height(renderable: RenderableType) -> int:
        return len(out.render_lines(renderable, options, pad=False))

    head = [_row(f"[{tick.elapsed:5.1f}s] {demo_jobs(tick)}", "bold")]
    body: list[RenderableType] = []
    under: list[Text] = []
    result = tick.result
    if result is not None and result.observation is not None and result.plan is not None:
        obs, now = result.observation, datetime.now(UTC)
        keep_for_events = min(EVENTS_MIN, len(events))
        shown = len(obs.instances)
        while True:
            table = status.fleet_table(obs.instances[:shown], now, tick.config.fleet.name)
            more = len(obs.instances) - shown
            extra = [_row(f"... and {more} more instance(s)", "dim")] if more else []
            used = len(head) + height(table) + len(extra)
            if used + keep_for_events <= rows_left or shown == 0:
                break
            shown -= 1
        body = [table, *extra]
        rows_left -= used
        summary = status.summary_lines(obs, result.plan, tick.config.budget.monthly_ceiling_usd)
        under = [_row(line) for line in summary[: max(0, rows_left - keep_for_events)]]
        rows_left -= len(under)
    else:
        rows_left -= len(head)
    recent = events[-rows_left:] if rows_left > 0 else []
    return Group(*head, *body, *under, *(_row(line, "dim") for line in recent))


class DemoView:
    """The live view on a terminal: the fleet table of `vultrscale status` and recent events."""

    def __init__(self, live: Live) -> None:
        self.live = live
        self.events: list[str] = []

    def say(self, line: str) -> None:
        self.live.console.print(plain(line))

    def update(self, tick: Tick) -> None:
        self.events += [f"{tick.elapsed:5.1f}s  {line}" for line in tick_events(tick)]
        self.events = self.events[-EVENTS_SHOWN:]
        self.live.update(demo_frame(tick, self.events, self.live.console), refresh=True)


@contextlib.contextmanager
def keys_not_echoed(stream: TextIO | None = None) -> Iterator[None]:
    """While the live view draws: keys typed (and the ``^C`` of Ctrl-C) are not echoed. An echo
    moves the cursor the live view counts on, leaving a stale copy of its first row behind."""
    import termios

    try:
        fd = (stream or sys.stdin).fileno()
        saved = termios.tcgetattr(fd)
    except (AttributeError, OSError, ValueError, termios.error):  # no terminal: nothing echoes
        yield
        return
    quiet = list(saved)
    quiet[3] &= ~(termios.ECHO | termios.ECHOCTL)
    termios.tcsetattr(fd, termios.TCSANOW, quiet)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSANOW, saved)


def phrase_lines(head: str, phrases: list[str], width: int) -> list[str]:
    """``head`` and the phrases joined by commas, broken only between phrases so that no line
    passes ``width`` (a phrase longer than that stands alone); later lines indented."""
    indent = " " * min(len(head), 4)
    lines: list[str] = []
    line = head
    for n, phrase in enumerate(phrases):
        piece = phrase + ("," if n < len(phrases) - 1 else "")
        if n and len(line) + 1 + len(piece) > width:
            lines.append(line)
            line = indent + piece
        else:
            line += ("" if n == 0 else " ") + piece
    return [*lines, line]


def print_demo_summary(out: Console, s: Summary) -> None:
    width = min(out.width, 80)
    verdict = Text("OK", style="green") if s.ok else Text("FAILED", style="red")
    out.print(Text.assemble(("\nDemo summary", "bold"), f" ({s.wall_seconds:.0f}s): ", verdict))
    blocks = [
        (
            "  jobs: ",
            [
                f"{s.enqueued} enqueued",
                f"{s.succeeded} succeeded",
                f"{s.failed} failed",
                f"{s.dead} dead",
                f"{s.lost} lost ({s.retried} needed a retry)",
                f"{s.waiting} still queued",
                f"{s.given_back} given back by stopping workers",
                f"{s.steps_run_twice} step(s) run twice",
            ],
        ),
        (
            "  fleet: ",
            [
                f"peak {s.peak} of max {s.max_instances}",
                f"{s.created} created",
                f"{s.scale_ups} scale-up(s)",
                f"{s.scale_ins} scale-in(s)",
                f"{s.final} left at the end",
                *(
                    [f"{s.refused_creates} create(s) refused by a stock-out"]
                    if s.refused_creates or s.chaos
                    else []
                ),
            ],
        ),
        (
            "  instance time: ",
            [
                f"{s.instance_seconds:.0f} instance-seconds",
                f"{s.saved_pct:.0f}% less than {s.max_instances} always-on "
                f"({s.always_on_seconds:.0f})",
            ],
        ),
        (
            "  workers: ",
            [
                f"{s.booted} booted",
                f"{s.worker_clean_exits} drained and exited cleanly",
                f"{s.worker_failed_exits} failed",
                f"{s.killed_at_power_off} killed at power-off",
            ],
        ),
        (
            "  SSH: ",
            [
                f"{s.ssh['stop']} stop",
                f"{s.ssh['is_active']} is-active",
                *([f"{s.ssh['start']} start (revives)"] if s.ssh.get("start") else []),
                f"{s.ssh['refused_commands'] + s.ssh['refused_logins']} refused",
            ],
        ),
    ]
    for head, phrases in blocks:
        for line in phrase_lines(head, phrases, width):
            out.print(line, markup=False, highlight=False)
    if s.chaos:
        out.print(f"  faults injected: {len(s.faults)}", markup=False, highlight=False)
        for f in s.faults:
            out.print(plain(f"    {f.at:6.1f}s  {f.kind}: {f.target}"))
    for problem in s.problems:
        out.print(Text("  problem: ", style="red") + plain(problem))


__all__ = ["clean", "console", "plain"]
