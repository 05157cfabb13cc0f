"""The fleet view: rich tables and a JSON document built from one pass's values. No I/O here."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from vultrscale.core.model import AccountSpend, Instance, Observation, Plan

if TYPE_CHECKING:
    from vultrscale.core.forecast import SlotForecast
    from vultrscale.rules.offerings import OfferingView

_STATE_STYLE = {
    "creating": "yellow",
    "pending": "yellow",
    "booting": "cyan",
    "running": "green",
    "draining": "magenta",
    "deleting": "red",
    "gone": "dim",
}


# C0 and C1 control characters but newline and tab, and the bidirectional overrides and
# isolates: text from outside (labels, tags, API and database messages) must not move the
# cursor, clear the screen, retitle the terminal or show its characters in another order.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def clean(value: object) -> str:
    """Text from outside, safe for a terminal: control characters dropped."""
    return _CONTROL.sub("", str(value))


def one_line(value: object) -> str:
    """``clean``, on one line: for a name (a label, a description) shown in a table or a list,
    where a newline would pass for another row."""
    return " ".join(clean(value).split("\n"))


def plain(value: object, style: str = "") -> Text:
    """Text from outside as a table cell or line: never read as rich markup, no escapes."""
    return Text(one_line(value), style=style)


def age(since: datetime | None, now: datetime) -> str:
    """``3m``, ``2h05m``, ``4d3h``: a short age for a table cell."""
    if since is None:
        return "-"
    seconds = max(0, int((now - since).total_seconds()))
    if seconds < 60:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours}h"


def instance_rows(instances: tuple[Instance, ...], now: datetime) -> list[dict[str, Any]]:
    """One plain dict per instance: what `status --json` prints and the table shows."""
    return [
        {
            "label": i.label,
            "id": i.id,
            "state": i.state.value,
            "vultr_status": "/".join(s for s in (i.vultr_status, i.server_status) if s),
            "ip": i.main_ip or None,
            "age_seconds": int((now - i.created_at).total_seconds()) if i.created_at else None,
            "live_leases": i.live_leases,
            "worker_last_seen": i.worker_last_seen.isoformat() if i.worker_last_seen else None,
            "billed_usd": round(i.billed_usd, 4),
            "offering": f"{i.region}/{i.plan}" if i.plan else None,
        }
        for i in instances
    ]


def status_document(
    obs: Observation,
    plan: Plan,
    now: datetime,
    ceiling: float,
    offerings: Sequence[OfferingView] = (),
) -> dict[str, Any]:
    """Everything `vultrscale status --json` prints."""
    sig = obs.signals
    return {
        "offerings": [v.row(now) for v in offerings],
        "at": now.isoformat(),
        "instances": instance_rows(obs.instances, now),
        "queue": None if sig is None else sig.summary(),
        "errors": [e for e in (obs.signal_error, obs.api_error) if e],
        "boot_time": obs.summary()["boot_time"],
        **plan.summary(),
        "budget": {
            "ceiling_usd": ceiling,
            "month_to_date_usd": _round(plan.month_to_date_usd),
            "committed_usd": _round(plan.committed_usd),
            "headroom_usd": _round(ceiling - plan.committed_usd)
            if plan.committed_usd is not None
            else None,
        },
    }


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 2)


def render(
    obs: Observation,
    plan: Plan,
    now: datetime,
    ceiling: float,
    fleet: str,
    offerings: Sequence[OfferingView] = (),
) -> RenderableType:
    """The fleet table and the summary under it; fits 80 columns."""
    lines: list[RenderableType] = [fleet_table(obs.instances, now, fleet)]
    lines += summary_lines(obs, plan, ceiling)
    lines += offering_lines(offerings, now)
    return Group(*lines)


def offering_lines(offerings: Sequence[OfferingView], now: datetime) -> list[Text]:
    """The offerings in order of preference: price, usable or why skipped, the time left on a
    remembered refusal and the refusals counted (docs/offerings.md)."""
    if not offerings:
        return []
    lines = [Text("offerings (in order of preference):")]
    for n, v in enumerate(offerings, start=1):
        price = f"${v.price.monthly:.2f}/month" if v.price else "price unknown"
        refused = f"; {v.refusals} refusal(s) so far" if v.refusals else ""
        if v.usable:
            lines.append(plain(f"  {n}. {v.offering.name} {price}: usable{refused}"))
            continue
        left = ""
        if v.until is not None and v.until > now:
            left = f" [unavailable {age_s((v.until - now).total_seconds())} more]"
        text = f"  {n}. {v.offering.name} {price}: skipped{left}: {v.skip}{refused}"
        lines.append(plain(text, style="yellow"))
    return lines


def fleet_table(instances: tuple[Instance, ...], now: datetime, fleet: str) -> Table:
    """One row per instance; 74 columns wide with the demo's labels."""
    from rich import box

    table = Table(title=f"fleet {fleet}", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    # A long label (an unlabelled@<uuid> the scaler tracks) is cut, not the figures beside it;
    # --json has it whole.
    table.add_column("label", no_wrap=True, max_width=24, overflow="ellipsis")
    table.add_column("state", no_wrap=True)
    table.add_column("ip", no_wrap=True)
    table.add_column("age", justify="right", no_wrap=True)
    table.add_column("jobs", justify="right")
    table.add_column("seen", justify="right", no_wrap=True)
    table.add_column("$", justify="right", no_wrap=True)
    for i in instances:
        state = Text(i.state.value, style=_STATE_STYLE.get(i.state.value, ""))
        table.add_row(
            plain(i.label),
            state,
            plain(i.main_ip if i.main_ip and i.main_ip != "0.0.0.0" else "-"),
            age(i.created_at, now),
            str(i.live_leases),
            age(i.worker_last_seen, now) if i.worker_last_seen else "-",
            f"{i.billed_usd:.2f}",
        )
    if not instances:
        table.add_row("(no instances)", "", "", "", "", "", "")
    return table


def summary_lines(obs: Observation, plan: Plan, ceiling: float) -> list[Text]:
    """What goes under the fleet table: the queue, the plan, the budget, the next scale-in."""
    lines: list[Text] = []
    sig = obs.signals
    if sig is None:
        lines.append(plain(f"queue: unreadable ({obs.signal_error})", style="red"))
    else:
        lines.append(
            Text(
                f"queue: {sig.ready} ready, {sig.in_flight} in flight, "
                f"{sig.expired_leases} expired lease(s), "
                f"oldest ready {age_s(sig.oldest_ready_seconds)}"
                + (
                    f", mean run {age_s(sig.recent_job_seconds)} over the last "
                    f"{sig.recent_jobs} finished job(s)"
                    if sig.recent_jobs and sig.recent_job_seconds is not None
                    else ""
                )
            )
        )
    if plan.wait_estimate is not None and plan.arrival_rate is not None:
        wait = plan.wait_estimate
        lines.append(
            Text(
                f"wait estimate: {age_s(wait) if math.isfinite(wait) else 'no instance to run'}"
                f", {plan.arrival_rate * 60:.2g} job(s)/min arriving"
            )
        )
    if obs.boot_time is not None:
        lines.append(Text(f"boot time: {obs.boot_time.describe()}"))
    if obs.api_error:
        lines.append(plain(f"api: {obs.api_error}", style="red"))
    lines += plan_lines(plan, "next")
    if plan.committed_usd is not None and plan.month_to_date_usd is not None:
        lines.append(
            Text(
                f"budget: ${plan.month_to_date_usd:.2f} billed this month, "
                f"${plan.committed_usd:.2f} if the fleet runs to the month's end; "
                f"ceiling ${ceiling:.2f}, headroom ${ceiling - plan.committed_usd:.2f}"
            )
        )
    if plan.next_scale_in_at is not None:
        lines.append(
            Text(f"next scale-in possible at {plan.next_scale_in_at:%Y-%m-%d %H:%M:%S} UTC")
        )
    if plan.forecast_mode != "off":
        acts = "acts" if plan.forecast_mode == "scale" else "observed, not applied"
        lines.append(
            plain(
                f"forecast ({plan.forecast_mode}: {acts}): floor "
                f"{'-' if plan.forecast_floor is None else plan.forecast_floor}; "
                f"{plan.forecast_source}"
            )
        )
    return lines


def plan_lines(plan: Plan, verb: str, head: str = "") -> list[Text]:
    """A plan as lines: the counts, why, the clamps, the actions (``verb``: what they are to
    this reader, "next", "would" or "do") and the warnings. The one rendering of a plan."""
    lines = [
        Text(head, style="bold")
        + Text(
            f"desired {plan.desired}, target {plan.target} (capacity {plan.capacity}, "
            f"floor {plan.floor}, cap {plan.cap})",
            style="" if head else "bold",
        )
    ]
    lines += [plain(f"  why: {reason}") for reason in plan.reasons]
    lines += [plain(f"  clamp: {clamp.describe()}", style="yellow") for clamp in plan.clamps]
    lines += [
        plain(f"  {verb}: {line}", style="cyan")
        for line in grouped(a.describe() for a in plan.actions)
    ]
    lines += [plain(f"  warning: {warning}", style="red") for warning in plan.warnings]
    return lines


def grouped(lines: Iterable[str]) -> list[str]:
    """Identical lines once each, with a count: three equal creates read `3x create: ...`."""
    counts: dict[str, int] = {}
    for line in lines:
        counts[line] = counts.get(line, 0) + 1
    return [line if n == 1 else f"{n}x {line}" for line, n in counts.items()]


def age_s(seconds: float) -> str:
    if seconds <= 0:
        return "-"
    from datetime import UTC, timedelta

    origin = datetime(2000, 1, 1, tzinfo=UTC)
    return age(origin, origin + timedelta(seconds=seconds))


def events_table(events: list[dict[str, Any]]) -> Table:
    """The decision ledger as a table: one row per pass (with a fleet column when the rows
    are of several fleets, each carrying its ``fleet``)."""
    table = Table(title="events", title_justify="left", pad_edge=False)
    fleets = any("fleet" in e for e in events)
    if fleets:
        table.add_column("fleet", no_wrap=True)
    table.add_column("pass", justify="right", no_wrap=True)  # the id the loop's log lines carry
    table.add_column("at (UTC)", no_wrap=True)
    table.add_column("exit", justify="right")
    table.add_column("plan")
    table.add_column("actions / results / errors")
    for e in events:
        plan = e.get("plan") or {}
        summary = f"desired {plan.get('desired', '?')} target {plan.get('target', '?')}"
        details: list[str] = []
        details += [f"clamp: {c}" for c in plan.get("clamps", [])]
        details += [
            f"{a['kind']} {a.get('label') or ''}: {a['reason']}" for a in e.get("actions") or []
        ]
        details += [f"{r['label']}: {r['result']}" for r in e.get("results") or []]
        details += [f"error: {x}" for x in e.get("errors") or []]
        at = e["at"]
        table.add_row(
            *([plain(e.get("fleet", ""))] if fleets else []),
            str(e.get("id", "")),
            at.strftime("%m-%d %H:%M:%S") if isinstance(at, datetime) else str(at),
            str(e.get("exit_code")),
            plain(summary),
            Text("\n").join(plain(d) for d in details) if details else Text("-"),
        )
    return table


def forecast_rows(slots: Sequence[SlotForecast], slot: timedelta) -> list[dict[str, Any]]:
    """The coming slots as `vultrscale forecast --json` lists them."""
    return [
        {
            "start": f.start.isoformat(),
            "end": (f.start + slot).isoformat(),
            "jobs_at_once": round(f.load, 3),
            "needs": f.need,
            "floor": f.floor,
        }
        for f in slots
    ]


def forecast_table(slots: Sequence[SlotForecast], slot: timedelta, title: str) -> Table:
    """The coming slots, runs of slots that ask the same joined into one row."""
    table = Table(title=title, title_justify="left")
    for name, justify in (("from", "left"), ("to", "left"), ("jobs at once", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    table.add_column("needs", justify="right")
    table.add_column("floor", justify="right")
    runs: list[list[SlotForecast]] = []
    for f in slots:
        if runs and (runs[-1][-1].need, runs[-1][-1].floor) == (f.need, f.floor):
            runs[-1].append(f)
        else:
            runs.append([f])
    for run in runs:
        first, last = run[0], run[-1]
        top = max(f.load for f in run)
        table.add_row(
            f"{first.start:%a %H:%M}",
            f"{last.start + slot:%a %H:%M}",
            f"{top:.2f}",
            str(first.need),
            Text(str(first.floor), style="bold" if first.floor else "dim"),
        )
    return table


# --- the account: every fleet of the database --------------------------------------------------


def account_document(
    total: AccountSpend | None, ceiling: float, orphans: Sequence[Any]
) -> dict[str, Any]:
    """The account's part of `status --json` for a directory of fleets: every fleet's spend
    this month against ``account.monthly_ceiling_usd``, and the instances of fleets no file
    describes (``db.account.Orphans``)."""
    return {
        "ceiling_usd": ceiling or None,
        "month_to_date_usd": None if total is None else round(total.month_to_date_usd, 2),
        "committed_usd": None if total is None else round(total.committed_usd, 2),
        "headroom_usd": round(ceiling - total.committed_usd, 2) if total and ceiling else None,
        "fleets": [] if total is None else list(total.fleets),
        "instances": None if total is None else total.instances,
        "orphans": [
            {
                "fleet": o.fleet,
                "instances": o.instances,
                "labels": list(o.labels),
                "oldest": o.oldest.isoformat() if o.oldest else None,
            }
            for o in orphans
        ],
    }


def account_lines(
    total: AccountSpend | None, ceiling: float, orphans: Sequence[Any], now: datetime
) -> list[RenderableType]:
    """Under every fleet's table: the account's spend against its ceiling, and the instances
    of fleets no file describes (nothing scales or deletes them)."""
    out: list[RenderableType] = []
    if total is None:
        out.append(plain("account: its spend could not be read", style="red"))
    else:
        limit = (
            f"; ceiling ${ceiling:.2f}, headroom ${ceiling - total.committed_usd:.2f}"
            if ceiling
            else "; no account ceiling (account.monthly_ceiling_usd = 0)"
        )
        style = "red" if ceiling and total.committed_usd > ceiling else ""
        out.append(
            plain(
                f"account: ${total.month_to_date_usd:.2f} billed this month over "
                f"{len(total.fleets)} fleet(s), ${total.committed_usd:.2f} if each runs as it "
                f"is to the month's end ({total.instances} instance(s)){limit}",
                style=style,
            )
        )
    if orphans:
        from rich import box

        table = Table(
            title="instances of fleets no config file describes (nothing scales or deletes "
            "them: put the file back, or drain and delete them by hand)",
            title_justify="left",
            box=box.SIMPLE_HEAD,
            pad_edge=False,
            title_style="yellow",
        )
        table.add_column("fleet", no_wrap=True)
        table.add_column("instances", justify="right")
        table.add_column("oldest", justify="right")
        table.add_column("labels")
        for o in orphans:
            table.add_row(
                plain(o.fleet),
                str(o.instances),
                age(o.oldest, now),
                plain(", ".join(o.labels[:5]) + (" ..." if len(o.labels) > 5 else "")),
            )
        out.append(table)
    return out
