"""Several fleets in one process (vultrscale.fleetloop): each fleet's passes in a thread of
its own, so a slow or failing fleet never holds up another. In-memory ports, fake clocks: the
only waits are on the threads' own events, each under a deadline."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from vultrscale import config as config_mod
from vultrscale.core.clock import FakeClock
from vultrscale.core.model import Signals
from vultrscale.errors import VultrscaleError
from vultrscale.fleetloop import FleetRun, forever, once
from vultrscale.memory import (
    SNAPSHOT,
    MemoryCloud,
    MemoryDrain,
    MemoryLedger,
    MemorySignals,
    memory_parts,
)
from vultrscale.reconcile import PassResult

START = datetime(2026, 5, 10, 9, 0, tzinfo=UTC)
ENV = {
    "VULTR_API_KEY": "k" * 32,
    "DATABASE_URL": "postgresql://unused@nowhere/db",
    "WORKER_DATABASE_URL": "postgresql://worker@nowhere/db",
}


class _HeldCloud(MemoryCloud):
    """A cloud whose list waits at ``gate`` until the test opens it (an API that hangs)."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.gate = threading.Event()
        self.entered = threading.Event()

    def list_instances(self, tag: str | None = None) -> list[Any]:
        self.entered.set()
        assert self.gate.wait(20), "the test never let the slow fleet go on"
        return super().list_instances(tag)


class _BuggyCloud(MemoryCloud):
    def list_instances(self, tag: str | None = None) -> list[Any]:
        raise ZeroDivisionError("a bug in this fleet's adapter")


def _run(tmp_path: Path, name: str, cloud_type: type[MemoryCloud] = MemoryCloud) -> FleetRun:
    clock = FakeClock(START)
    path = tmp_path / f"{name}.toml"
    path.write_text(f'[fleet]\nname = "{name}"\ntag = "vs-{name}"\nsnapshot_id = "{SNAPSHOT}"\n')
    cfg = config_mod.load(path, env=ENV)
    signals = MemorySignals(Signals(ready=4, in_flight=0))
    parts = memory_parts(clock, cloud_type(clock), MemoryLedger(name), signals, MemoryDrain())
    return FleetRun(cfg, parts)


class _Seen:
    """What the loop reported, per fleet, from every thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.results: dict[str, list[PassResult]] = {}
        self.errors: dict[str, list[VultrscaleError]] = {}

    def result(self, cfg: Any, result: PassResult) -> None:
        with self.lock:
            self.results.setdefault(cfg.fleet.name, []).append(result)

    def error(self, cfg: Any, exc: VultrscaleError) -> None:
        with self.lock:
            self.errors.setdefault(cfg.fleet.name, []).append(exc)


def test_a_slow_fleet_never_delays_another(tmp_path: Path) -> None:
    """The slow fleet's first pass hangs in its list at Vultr; the fast fleet runs all its
    passes meanwhile. Then the slow one goes on and ends its own."""
    fast = _run(tmp_path, "fast")
    slow = _run(tmp_path, "slow", _HeldCloud)
    held = slow.parts.cloud
    assert isinstance(held, _HeldCloud)
    seen = _Seen()
    stop = threading.Event()
    done = threading.Event()

    def loop() -> None:
        forever(
            [slow, fast],
            interval=timedelta(seconds=30),
            dry_run=False,
            stop=stop,
            on_result=seen.result,
            on_error=seen.error,
            max_passes=5,
        )
        done.set()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    assert held.entered.wait(20)
    pause = threading.Event()  # never set: a wait under a deadline, between looks
    for _ in range(200):  # until the fast fleet has run its 5 passes, within 20 s
        with seen.lock:
            if len(seen.results.get("fast", [])) == 5:
                break
        pause.wait(0.1)
    with seen.lock:
        assert len(seen.results.get("fast", [])) == 5
        assert "slow" not in seen.results  # still in its first pass
    held.gate.set()
    assert done.wait(20)
    assert len(seen.results["slow"]) == 5 and not seen.errors


def test_a_fleet_whose_pass_raises_a_bug_is_reported_and_the_others_run_on(
    tmp_path: Path,
) -> None:
    good = _run(tmp_path, "good")
    buggy = _run(tmp_path, "buggy", _BuggyCloud)
    seen = _Seen()
    forever(
        [buggy, good],
        interval=timedelta(seconds=30),
        dry_run=False,
        stop=threading.Event(),
        on_result=seen.result,
        on_error=seen.error,
        max_passes=3,
    )
    assert len(seen.results["good"]) == 3
    (error,) = seen.errors["buggy"]
    assert "unexpected ZeroDivisionError: a bug in this fleet's adapter" in error.message
    assert "the other fleets go on" in error.hint


def test_once_runs_every_fleet_and_gives_each_exit_code(tmp_path: Path) -> None:
    good = _run(tmp_path, "good")
    buggy = _run(tmp_path, "buggy", _BuggyCloud)
    seen = _Seen()
    codes = once([good, buggy], dry_run=False, on_result=seen.result, on_error=seen.error)
    assert codes == {"good": 0, "buggy": 1}
    assert [r.exit_code for r in seen.results["good"]] == [0]
    assert good.parts.cloud.posts == 1  # type: ignore[attr-defined]


def test_first_passes_are_spread_over_the_first_interval(tmp_path: Path) -> None:
    runs = [_run(tmp_path, n) for n in ("a", "b", "c", "d")]
    forever(
        runs,
        interval=timedelta(seconds=40),
        dry_run=True,
        stop=threading.Event(),
        on_result=lambda cfg, r: None,
        on_error=lambda cfg, e: None,
        max_passes=1,
    )
    firsts = [r.parts.clock.slept[0] if r.parts.clock.slept else 0.0 for r in runs]  # type: ignore[attr-defined]
    assert firsts == pytest.approx([0.0, 10.0, 20.0, 30.0])
