"""The simulated vultrscale is the reconcile pass itself: the same functions run in both.

Every function of the pass's core is wrapped with a counter; a fleet driven through a whole
cycle (burst, boot, idle, drain, delete) on core's in-memory ports and a simulated day must
call the same set. A simulator that called ``policy.decide`` on its own, or skipped the
lifecycle or the drain verdicts, would fail here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from vultrscale import reconcile
from vultrscale.config import Config, Secret
from vultrscale.core.clock import FakeClock
from vultrscale.core.model import Signals, WorkerView
from vultrscale.memory import (
    SNAPSHOT,
    MemoryCloud,
    MemoryDrain,
    MemoryLedger,
    MemorySignals,
    memory_parts,
)
from vultrscale.replay import compare, workload
from vultrscale.replay.fleet import Vultrscale
from vultrscale.rules import budget, lifecycle, policy

# The pass's own stages and the pure core they call (docs/architecture.md, "A pass's data
# flow": read -> decide -> apply).
SPIED: list[tuple[Any, str]] = [
    (reconcile, "read"),
    (reconcile, "decide"),
    (reconcile, "apply"),
    (lifecycle, "sync"),
    (lifecycle, "applied"),
    (lifecycle, "drain_step"),
    (policy, "decide"),
    (budget, "ledger_bills"),
    (budget, "check"),
]


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    seen: Counter[str] = Counter()

    def spy(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            seen[name] += 1
            return fn(*args, **kwargs)

        return wrapper

    for module, attr in SPIED:
        name = f"{module.__name__}.{attr}"
        monkeypatch.setattr(module, attr, spy(name, getattr(module, attr)))
    return seen


CFG = replace(
    Config(),
    fleet=replace(Config().fleet, snapshot_id=SNAPSHOT),
    policy=replace(Config().policy, billing_hour_aware=False),
    # A real fleet must tell its instances a workers' database URL before any create.
    secrets=replace(Config().secrets, worker_database_url=Secret("postgresql://w@db.invalid/q")),
)


def _memory_cycle() -> None:
    """Burst -> boot -> running -> idle -> drain -> delete on core's in-memory ports."""
    clock = FakeClock(datetime(2026, 6, 1, 9, 0, tzinfo=UTC))
    cloud = MemoryCloud(clock)
    ledger = MemoryLedger(CFG.fleet.name)
    signals = MemorySignals(Signals(ready=8, in_flight=0))
    drain = MemoryDrain()
    parts = memory_parts(clock, cloud, ledger, signals, drain)
    reconcile.run_pass(CFG, parts)
    assert cloud.posts == 2
    for _ in range(40):  # 20 minutes of passes: boot, workers up, idle, drain, delete
        clock.advance(30)
        if clock.now().minute >= 5:
            signals.signals = Signals(ready=0, in_flight=0)
        ledger.workers_by_label = {
            label: WorkerView(label, clock.now(), False, 0, True) for label in ledger.instances
        }
        reconcile.run_pass(CFG, parts)
    assert cloud.deletes == 2 and not cloud.instances


def test_the_simulator_calls_what_the_reconcile_pass_calls(calls: Counter[str]) -> None:
    _memory_cycle()
    reference = set(calls)
    assert reference == {f"{m.__name__}.{a}" for m, a in SPIED}, "the reference cycle covers all"

    calls.clear()
    trace = workload.shape("bursty-day", days=1, seed=0, jobs_per_day=100)
    setup = compare.Setup(boot_time=(120.0, 180.0))
    pol = Vultrscale(CFG, compare.plan_price(CFG), trace.epoch)
    world, stats = compare.play(pol, trace, CFG, setup)
    assert set(calls) == reference
    # One read, decide and apply per pass that ran; the lifecycle and the policy each time.
    assert calls["vultrscale.reconcile.read"] == stats.passes
    assert calls["vultrscale.reconcile.apply"] == stats.passes
    assert calls["vultrscale.rules.policy.decide"] == stats.passes
    assert world.c.drains > 0 and world.c.deletes > 0 and world.c.finished == len(trace)
