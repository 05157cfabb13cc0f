"""Everything the command line draws: a pass, the fleet's instances, the config, the demo's
live view and summary. Text from outside (labels, tags, API and database messages) goes in as
``status.plain`` Text, never as markup; no console here highlights words on its own."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from vultrscale import status
from vultrscale.status import clean, plain

if TYPE_CHECKING:
    from rich.live import Live

    from vultrscale.db.roles import WorkerAccess
    from vultrscale.demo import Summary, Tick
    from vultrscale.reconcile import PassResult
    from vultrscale.vultr.models import VInstance


def console(stderr: bool = False) -> Console:
    """A console that paints only what we style: rich's highlighter would colour words like
    ``up`` in ``scale-up(s)`` and numbers inside messages."""
    return Console(stderr=stderr, highlight=False)


def say_plain(out: Console) -> Callable[[str], None]:
    """A ``say(line)`` printing outside text as is (no markup)."""
    return lambda line: out.print(plain(line))


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


def print_config(data: dict[str, Any], access: WorkerAccess) -> None:
    """`config check`: the resolved config, one table per section (secrets already masked),
    after the workers' database role and any warning about it."""
    out = console()
    out.print(
        Text("Configuration is valid", style="green") + plain(f" (from {data.pop('source')})")
    )
    out.print(
        plain(
            f"Workers log in as {access.role or '(no role named)'}"
            f" (from {access.source or 'nowhere yet'})"
        )
    )
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


# --- the demo ---------------------------------------------------------------------------------


def demo_counts(tick: Tick) -> str:
    jobs = tick.jobs
    done = sum(jobs.get(s, 0) for s in ("succeeded", "failed", "dead"))
    states: dict[str, int] = {}
    if tick.result is not None and tick.result.observation is not None:
        for i in tick.result.observation.instances:
            states[i.state.value] = states.get(i.state.value, 0) + 1
    fleet = ", ".join(f"{n} {s}" for s, n in states.items()) or "none"
    return (
        f"[{tick.elapsed:5.1f}s] instances: {fleet} | jobs: {jobs.get('ready', 0)} ready, "
        f"{jobs.get('leased', 0)} running, {done}/{tick.enqueued} done"
    )


def tick_events(tick: Tick) -> list[str]:
    """What happened since the last tick: the run's notes, the pass's results and errors."""
    lines = list(tick.notes)
    if tick.result is not None:
        lines += [f"{r['label']}: {r['result']}" for r in tick.result.results]
        lines += [f"error: {e}" for e in tick.result.errors]
    if tick.error:
        lines.append(f"error: {tick.error}")
    return lines


def demo_log(say: Callable[[str], None]) -> Callable[[Tick], None]:
    """``--no-live``: a line of counts per tick, then what happened, indented."""

    def log(tick: Tick) -> None:
        say(demo_counts(tick))
        for line in tick_events(tick):
            say(f"         {line}")

    return log


class DemoView:
    """The live view: the fleet table of `vultrscale status` and the run's recent events."""

    def __init__(self, live: Live) -> None:
        self.live = live
        self.lines: list[str] = []

    def say(self, line: str) -> None:
        self.live.console.print(plain(line))

    def update(self, tick: Tick) -> None:
        self.lines += [f"{tick.elapsed:5.1f}s  {line}" for line in tick_events(tick)]
        self.lines = self.lines[-8:]
        parts: list[RenderableType] = [plain(demo_counts(tick), style="bold")]
        result = tick.result
        if result is not None and result.observation is not None and result.plan is not None:
            cfg = tick.config
            parts.append(
                status.render(
                    result.observation,
                    result.plan,
                    datetime.now(UTC),
                    cfg.budget.monthly_ceiling_usd,
                    cfg.fleet.name,
                )
            )
        parts.append(plain("\n".join(self.lines), style="dim"))
        self.live.update(Group(*parts), refresh=True)


def print_demo_summary(out: Console, s: Summary) -> None:
    verdict = "[green]OK[/green]" if s.ok else "[red]FAILED[/red]"
    out.print(f"\n[bold]Demo summary[/bold] ({s.wall_seconds:.0f}s): {verdict}")
    out.print(
        f"  jobs: {s.enqueued} enqueued, {s.succeeded} succeeded, {s.failed} failed, "
        f"{s.dead} dead, [bold]{s.lost} lost[/bold] ({s.retried} needed a retry); "
        f"{s.waiting} still queued, {s.given_back} given back by stopping workers; "
        f"[bold]{s.steps_run_twice} step(s) run twice[/bold]"
    )
    out.print(
        f"  fleet: peak {s.peak} of max {s.max_instances}, {s.created} created, "
        f"{s.scale_ups} scale-up(s), {s.scale_ins} scale-in(s), {s.final} left at the end"
    )
    out.print(
        f"  instance time: {s.instance_seconds:.0f} instance-seconds against "
        f"{s.always_on_seconds:.0f} for {s.max_instances} always-on instances "
        f"({s.saved_pct:.0f}% less)"
    )
    out.print(
        f"  workers: {s.booted} booted, {s.worker_clean_exits} drained and exited cleanly, "
        f"{s.worker_failed_exits} failed, {s.killed_at_power_off} killed at power-off; "
        f"SSH: {s.ssh['stop']} stop, {s.ssh['is_active']} is-active, "
        f"{s.ssh['refused_commands'] + s.ssh['refused_logins']} refused"
    )
    if s.chaos:
        out.print(f"  faults injected: {len(s.faults)}")
        for f in s.faults:
            out.print(plain(f"    {f.at:6.1f}s  {f.kind}: {f.target}"))
    for problem in s.problems:
        out.print(Text("  problem: ", style="red") + plain(problem))


__all__ = ["clean", "console", "plain"]
