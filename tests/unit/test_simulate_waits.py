"""The wait rule and the learned boot time in `simulate`: the replayed pass feeds them from the
simulated world (jobs finished so far, the fleet's own boots), and they change its creates."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from vultrscale.config import Config, WaitTarget
from vultrscale.replay import compare, workload
from vultrscale.replay.fleet import Vultrscale

BOOT = 600.0
SETUP = compare.Setup(interval=30.0, boot_time=(BOOT, BOOT), seed=0)
PRICE = compare.plan_price(Config())

pytestmark = pytest.mark.usefixtures("one_process")


def _cfg(target_wait: timedelta) -> Config:
    cfg = Config()
    return replace(cfg, policy=replace(cfg.policy, target_wait=WaitTarget(target_wait)))


def _run(cfg: Config, trace: workload.Trace) -> compare.PolicyResult:
    pol = compare._policies(["vultrscale"], cfg, trace, PRICE)[0]
    return compare.run_one(pol, trace, cfg, SETUP, PRICE)


def test_a_backlog_the_running_fleet_clears_before_a_boot_creates_nothing_more() -> None:
    # 12 one-minute jobs at 0 s: three instances (4 slots each) run them from 600 s, and the
    # queue now has a history (12 finished jobs). 40 more at 700 s: the depth rule asks for
    # ten instances (two more, up to the cap of five); the wait rule sees the three running
    # ones start the last within 3 minutes, long before a new instance would boot.
    jobs = [(0.0, 60.0)] * 12 + [(700.0, 60.0)] * 40
    trace = workload.from_jobs("hand", jobs)
    depth = _run(_cfg(timedelta(0)), trace)
    wait = _run(_cfg(timedelta(minutes=10)), trace)
    assert depth.lost == wait.lost == 0
    assert depth.scale_ups == 5 and wait.scale_ups == 3  # instances created
    assert (depth.billed_hours, wait.billed_hours) == (5, 3)
    # The longest wait is the first burst's boot under both: the 40 waited less.
    assert depth.wait_max == wait.wait_max == BOOT


def test_the_replayed_pass_learns_the_boot_time_from_its_own_boots_gone_ones_too() -> None:
    # A job every two hours: each meets an empty fleet (scaled to zero after its paid hour),
    # boots one instance, and that instance is gone before the next job comes.
    cfg = _cfg(timedelta(minutes=10))
    trace = workload.from_jobs("hand", [(k * 7200.0, 60.0) for k in range(8)])
    pol = compare._policies(["vultrscale"], cfg, trace, PRICE)[0]
    assert isinstance(pol, Vultrscale)
    world, _ = compare.play(pol, trace, cfg, SETUP)
    assert len(world.instances) == 8 and not world.live
    last = pol._last_decision
    assert last is not None
    learned = last.observation.boot_time
    assert learned is not None and learned.learned and learned.boots == 8
    # Create to the first pass that saw the worker: the boot, and at most one pass more.
    assert BOOT <= learned.estimate.total_seconds() <= BOOT + SETUP.interval
