"""What the demo draws: timestamped plain lines off a terminal, a live frame that fits 80x24 at
every phase of a run, summary lines broken between phrases. Driven with recorded ticks; no
Postgres, no simulator."""

from __future__ import annotations

import io
import os
import pty
import re
import termios
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest
from rich.console import Console
from rich.live import Live

from tests.unit.test_demo_summary import _summary
from vultrscale import demo
from vultrscale.cli import views
from vultrscale.core.limits import Clamp, Limit
from vultrscale.core.model import (
    Action,
    ActionKind,
    Instance,
    InstanceState,
    Observation,
    Plan,
    PlanPrice,
    Signals,
)
from vultrscale.reconcile import PassResult

NOW = datetime(2026, 11, 30, 23, 0, tzinfo=UTC)
FLEET = "demo-1764543600-ab12"
CONFIG = demo.demo_config(
    demo.Settings(),
    api_url="http://127.0.0.1:9",
    api_key="k",
    db_url="postgresql://demo@127.0.0.1/demo",
    ssh_key="/nonexistent/key",
    ssh_port=2222,
    queue=FLEET,
    fleet=FLEET,
)
LONG_REASONS = (
    "capacity 4 (3 running, 1 booting); 2 draining or deleting, not counted",
    "demand 29 job(s) (ready 12, in flight 16, expired leases 1) at 4 per instance -> "
    "8 instance(s)",
)
LONG_CLAMPS = (
    Clamp(Limit.CAP, asked=8, allowed=4, limit=4),
    Clamp(Limit.CAP_LEAVING, asked=4, allowed=2, limit=4, count=2),
    Clamp(
        Limit.COOLDOWN_UP,
        since=NOW - timedelta(seconds=2),
        window=timedelta(seconds=5),
        until=NOW + timedelta(seconds=3),
        wait=timedelta(seconds=3),
    ),
)


def _tick(states: list[InstanceState], elapsed: float, events: int, **plan: object) -> demo.Tick:
    instances = tuple(
        Instance(
            label=f"{FLEET}-{n}",
            state=state,
            id=f"{n:08d}-aaaa-bbbb-cccc-dddddddddddd",
            created_at=NOW - timedelta(seconds=50),
            main_ip=f"127.0.0.{n + 2}",
            live_leases=4,
            worker_last_seen=NOW,
            billed_usd=0.01,
        )
        for n, state in enumerate(states)
    )
    obs = Observation(
        instances=instances,
        signals=Signals(ready=12, in_flight=16, expired_leases=1, oldest_ready_seconds=12),
        price=PlanPrice("vc2-1c-2gb", 10.0),
        api_error="503 Service Unavailable from GET /v2/instances, retried 3 times, giving up",
    )
    drain = Action(
        ActionKind.DRAIN,
        "idle for 12s, longer than idle_before_scale_down=10s; youngest first",
        f"{FLEET}-3",
    )
    decided = Plan(
        **{
            "desired": 7,
            "target": 4,
            "capacity": 4,
            "floor": 0,
            "cap": 4,
            "actions": (drain, replace(drain, label=f"{FLEET}-2")),
            "reasons": LONG_REASONS,
            "clamps": LONG_CLAMPS,
            "warnings": ("a warning that goes on well past the eighty columns of a terminal",),
            "next_scale_in_at": NOW,
            "month_to_date_usd": 0.12,
            "committed_usd": 40.5,
            **plan,
        }  # type: ignore[arg-type]
    )
    results = [
        {"label": f"{FLEET}-{n}", "result": "drained in 4.1s, the worker exited cleanly; deleted"}
        for n in range(events)
    ]
    return demo.Tick(
        elapsed=elapsed,
        result=PassResult(
            exit_code=0,
            at=NOW,
            plan=decided,
            observation=obs,
            results=results,
            errors=["Vultr API error: 503 Service Unavailable while listing instances"],
        ),
        error=None,
        config=CONFIG,
        jobs={"ready": 12, "leased": 16, "succeeded": 8},
        enqueued=36,
        fleet=len(states),
        notes=[f"burst: 12 jobs enqueued at {elapsed:.0f}s"],
    )


S = InstanceState
PHASES = {
    "starting": demo.Tick(0.0, None, "no pass yet", CONFIG, {}, 0, 0, ["burst: 24 jobs"]),
    "empty": _tick([], 1.0, 0),
    "scale-up": _tick([S.CREATING, S.PENDING, S.PENDING, S.BOOTING], 6.0, 4),
    "full": _tick([S.RUNNING] * 4, 30.0, 8),
    "scale-in": _tick(
        [S.RUNNING, S.RUNNING, S.BOOTING, S.DRAINING, S.DELETING, S.DELETING], 61.0, 12
    ),
    "crowded": _tick([S.RUNNING] * 30, 90.0, 30),
}


def _frame_rows(phase: str) -> list[str]:
    """The live frame at this phase, after every earlier one, on an 80x24 console."""
    out = Console(width=80, height=24, record=True, highlight=False)
    live = Live(console=out, auto_refresh=False)  # never started: it only keeps the frame
    view = views.DemoView(live)
    for name, tick in PHASES.items():
        view.update(tick)
        if name == phase:
            break
    out.print(live.renderable)
    return out.export_text().splitlines()


@pytest.mark.parametrize("phase", list(PHASES))
def test_the_live_frame_fits_80x24_at_every_phase(phase: str) -> None:
    rows = _frame_rows(phase)
    assert len(rows) <= 24 - 1, "\n".join(rows)  # one row left for the cursor
    assert all(len(row) <= 80 for row in rows), "\n".join(rows)
    assert rows[0].startswith(f"[{PHASES[phase].elapsed:5.1f}s] jobs:"), rows[0]
    # the latest event is always on screen, whole rows only (rich's own crop shows "...")
    assert rows[-1] != "..."
    last = views.tick_events(PHASES[phase])[-1]
    assert rows[-1].strip().startswith(f"{PHASES[phase].elapsed:.1f}s  {last}"[:60]), rows


def test_a_crowded_fleet_says_how_many_rows_it_left_out() -> None:
    rows = _frame_rows("crowded")
    more = [r for r in rows if re.fullmatch(r"\.\.\. and \d+ more instance\(s\)\s*", r)]
    assert len(more) == 1, "\n".join(rows)
    shown = sum(1 for r in rows if r.lstrip().startswith(f"{FLEET}-") and "running" in r)
    assert shown + int(more[0].split()[2]) == 30


def test_the_scale_in_frame_shows_the_table_and_the_plan() -> None:
    text = "\n".join(_frame_rows("scale-in"))
    for state in ("draining", "deleting", "booting"):
        assert state in text
    assert "desired 7, target 4" in text and "why: capacity 4" in text


def test_off_a_terminal_each_message_is_one_timestamped_line_as_it_happens() -> None:
    buffer = io.StringIO()
    out = Console(file=buffer, width=80, highlight=False)
    assert not out.is_terminal
    clock = iter(NOW + timedelta(seconds=s) for s in range(1000))
    log = views.DemoLog(out, now=lambda: next(clock))
    log.say("Postgres: throwaway server on 127.0.0.1:5433")
    seen = [buffer.getvalue()]
    for tick in PHASES.values():
        log.update(tick)
        seen.append(buffer.getvalue())
    # every tick added its lines at once, not at the end
    assert all(later.startswith(earlier) and later != earlier for earlier, later in pairwise(seen))
    lines = buffer.getvalue().splitlines()
    events = sum(1 + len(views.tick_events(t)) for t in PHASES.values())
    assert len(lines) == 1 + events  # long events are not wrapped onto a second line
    assert lines[0] == "23:00:00 Postgres: throwaway server on 127.0.0.1:5433"
    assert all(re.match(r"\d\d:\d\d:\d\d  *\S", line) for line in lines), lines
    assert lines[1].startswith("23:00:01 [  0.0s] instances: none | jobs: 0 ready")
    assert "\x1b" not in buffer.getvalue()


def test_summary_lines_break_only_between_phrases_at_80_columns() -> None:
    out = Console(width=200, record=True, highlight=False)
    views.print_demo_summary(out, _summary(enqueued=123456, succeeded=123455, lost=1))
    lines = out.export_text().splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    continued = [line for line in lines if line.startswith("    ")]
    assert continued, "a long line should have been broken"
    for n, line in enumerate(lines):
        if line.startswith("    "):
            assert lines[n - 1].endswith(","), lines  # broken after a whole phrase


def test_phrases_pack_greedily_and_a_long_phrase_stands_alone() -> None:
    assert views.phrase_lines("  a: ", ["one", "two", "three"], 80) == ["  a: one, two, three"]
    assert views.phrase_lines("  a: ", ["one", "two", "x" * 90], 20) == [
        "  a: one, two,",
        "    " + "x" * 90,
    ]


def test_the_live_view_turns_key_echo_off_and_restores_it() -> None:
    main, tty = pty.openpty()
    try:
        with os.fdopen(tty, "r", closefd=False) as stream:
            before = termios.tcgetattr(tty)
            assert before[3] & termios.ECHO
            with views.keys_not_echoed(stream):
                during = termios.tcgetattr(tty)[3]
                assert not during & termios.ECHO and not during & termios.ECHOCTL
            assert termios.tcgetattr(tty) == before
    finally:
        os.close(main)
        os.close(tty)


def test_off_a_terminal_key_echo_is_left_alone() -> None:
    # A StringIO has no file descriptor: any termios call on it would raise here.
    with views.keys_not_echoed(io.StringIO()):
        pass


def test_the_summary_paints_nothing_of_its_own_accord() -> None:
    """rich's highlighter would colour ``up`` in ``scale-up(s)`` and the numbers."""
    buffer = io.StringIO()
    out = Console(file=buffer, width=80, force_terminal=True, color_system="truecolor")
    views.print_demo_summary(out, _summary())
    heads = ("  jobs:", "  fleet:", "  instance time:", "  workers:", "  SSH:")
    checked = [line for line in buffer.getvalue().splitlines() if line.startswith(heads)]
    assert {line.split(":")[0] + ":" for line in checked} == set(heads), checked
    for line in checked:
        assert "\x1b" not in line, repr(line)


def test_the_summary_counts_the_starts_of_revived_workers_only_when_there_were_some() -> None:
    out = Console(width=80, record=True, highlight=False)
    ssh = {"stop": 16, "is_active": 12, "start": 4, "refused_commands": 0, "refused_logins": 0}
    views.print_demo_summary(out, _summary(ssh=ssh))
    assert "SSH: 16 stop, 12 is-active, 4 start (revives), 0 refused" in out.export_text()
    out = Console(width=80, record=True, highlight=False)
    views.print_demo_summary(out, _summary(ssh={**ssh, "start": 0}))
    assert "SSH: 16 stop, 12 is-active, 0 refused" in out.export_text()


def test_the_progress_line_shows_the_fleet_a_pass_process_saw() -> None:
    # A chaos run's passes are processes: the tick has their JSON's counts, not a result.
    tick = replace(PHASES["starting"], elapsed=14.0, instances={"running": 3, "booting": 1})
    assert views.demo_counts(tick).startswith("[ 14.0s] instances: 3 running, 1 booting |")
