"""The figures the alert rules compare (deploy/vultrscale-rules.yml): the budget against its
ceiling, the oldest drain against its deadline, and counters that exist before their first
increment (a series born at 1 shows no increase() to Prometheus)."""

from __future__ import annotations

import math
from pathlib import Path

from tests.unit.test_reconcile_pass import Fleet
from vultrscale import metrics
from vultrscale.core.model import ActionKind


def _value(m: metrics.Metrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, {"fleet": "workers", **labels})


def test_every_exit_code_and_action_kind_is_a_series_at_zero_before_any_pass(
    tmp_path: Path,
) -> None:
    m = metrics.Metrics.for_config(Fleet(tmp_path).cfg)
    for code in ("0", "1", "2"):
        assert _value(m, "vultrscale_passes_total", exit_code=code) == 0.0
    for kind in ActionKind:
        assert _value(m, "vultrscale_actions_total", kind=kind.value) == 0.0


def test_the_ceiling_and_the_drain_deadline_come_from_the_config(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, drain={"timeout": "4m"}, budget={"monthly_ceiling_usd": 80.0})
    m = metrics.Metrics.for_config(fleet.cfg)
    assert _value(m, "vultrscale_budget_ceiling_usd") == 80.0
    assert _value(m, "vultrscale_drain_deadline_seconds") == 240.0 + 30.0  # + the margin


def test_the_oldest_drain_ages_with_the_clock_and_the_committed_bill_is_the_plans(
    tmp_path: Path,
) -> None:
    fleet = Fleet(tmp_path)
    m = metrics.Metrics.for_config(fleet.cfg)
    a, _b = fleet.bring_up(8)
    m.observe(fleet.run())
    assert _value(m, "vultrscale_drain_oldest_seconds") == 0.0  # no drain
    committed = _value(m, "vultrscale_budget_committed_usd")
    assert committed is not None and committed > 0
    fleet.drain_now(a)
    fleet.clock.advance(400)
    result = fleet.run()
    m.observe(result)
    assert _value(m, "vultrscale_drain_oldest_seconds") == 400.0
    assert result.plan is not None
    assert _value(m, "vultrscale_budget_committed_usd") == result.plan.committed_usd


def test_the_committed_bill_is_unknown_after_a_pass_that_failed_before_its_result(
    tmp_path: Path,
) -> None:
    fleet = Fleet(tmp_path)
    m = metrics.Metrics.for_config(fleet.cfg)
    fleet.bring_up(4)
    m.observe(fleet.run())
    m.failed(1)
    value = _value(m, "vultrscale_budget_committed_usd")
    assert value is not None and math.isnan(value)


def test_the_wait_estimate_the_arrival_rate_and_the_boot_time_are_gauges(tmp_path: Path) -> None:
    from vultrscale.core.model import Signals

    fleet = Fleet(tmp_path)
    m = metrics.Metrics.for_config(fleet.cfg)
    fleet.bring_up(4)
    # 20 queued one-minute jobs, 30 arrived in the window (3 a minute) on one running instance.
    fleet.signals.signals = Signals(
        ready=20, in_flight=0, recent_jobs=50, recent_job_seconds=60.0, recent_arrivals=30
    )
    result = fleet.run()
    m.observe(result)
    assert result.plan is not None and result.plan.wait_estimate is not None
    assert _value(m, "vultrscale_wait_estimate_seconds") == result.plan.wait_estimate
    assert _value(m, "vultrscale_queue_arrival_rate") == 30 / 600
    assert _value(m, "vultrscale_boot_time_seconds") == 12 * 60.0  # policy.boot_time, unlearned
    fleet.queue(20)  # a queue with no history: not estimated, NaN (not the last figure)
    m.observe(fleet.run())
    value = _value(m, "vultrscale_wait_estimate_seconds")
    assert value is not None and math.isnan(value)
