"""The workload suite the policy's defaults are chosen on (vultrscale.replay.suite): its
cells, the bar a candidate is held to, and one small cell replayed for real."""

from __future__ import annotations

import pytest

from vultrscale.replay import suite, workload
from vultrscale.replay.suite import Cell, CellResult, Outcome, Workload
from vultrscale.rules import waits

pytestmark = pytest.mark.usefixtures("one_process")


def test_the_suite_has_every_shape_three_seeds_and_three_boot_times() -> None:
    shapes = {w.shape for w in suite.WORKLOADS}
    assert shapes == set(workload.SHAPES) and len(shapes) >= 8
    grid = suite.cells()
    assert len(grid) == len(suite.WORKLOADS) * 3 * 3
    assert {c.boot for c in grid} == {60.0, 240.0, 720.0}


def _result(default: Outcome, depth: Outcome, keda: Outcome | None = None) -> CellResult:
    keda = keda or Outcome(cost=99.0, p50=0.0, p95=999.0, lost=0)
    hind = Outcome(cost=1.0, p50=0.0, p95=0.0, lost=0)
    one = Outcome(cost=5.0, p50=0.0, p95=9999.0, lost=0)
    cell = Cell(Workload("w", "steady"), 0, 60.0)
    return CellResult(
        cell,
        {"default": default, "depth": depth, "keda": keda, "hindsight": hind, "always-on 1": one},
    )


@pytest.mark.parametrize(
    ("default", "depth", "fails"),
    [
        (Outcome(5.0, 0, 100.0, 0), Outcome(5.0, 0, 100.0, 0), set()),
        # Dearer and slower: dominated, and dearer.
        (Outcome(6.0, 0, 200.0, 0), Outcome(5.0, 0, 100.0, 0), {"dominated", "dearer", "far"}),
        # The same cost, a p95 9 s longer: no domination, within the bound.
        (Outcome(5.0, 0, 109.0, 0), Outcome(5.0, 0, 100.0, 0), set()),
        # Cheaper, p95 past 1.25x and past +60 s.
        (Outcome(4.0, 0, 400.0, 0), Outcome(5.0, 0, 300.0, 0), {"far"}),
        # Cheaper, p95 59 s above a depth rule of 0: within +60 s.
        (Outcome(4.0, 0, 59.0, 0), Outcome(5.0, 0, 0.0, 0), set()),
        (Outcome(4.0, 0, 75.0, 0), Outcome(5.0, 0, 0.0, 0), {"far"}),
        (Outcome(4.0, 0, 10.0, 1), Outcome(5.0, 0, 0.0, 0), {"lost"}),
    ],
    ids=["same", "worse-both", "tie-cost", "slow", "slack", "past-slack", "lost"],
)
def test_the_bar_a_candidate_is_held_to(default: Outcome, depth: Outcome, fails: set) -> None:
    s = suite.summarize([_result(default, depth)], "default")
    got = {
        name
        for name, failed in (
            ("dominated", s.dominated_by_depth),
            ("dearer", s.dearer_than_depth),
            ("far", s.wait_not_close),
            ("lost", s.lost),
        )
        if failed
    }
    assert got == fails
    assert s.holds == (not fails)


def test_a_candidate_quicker_than_keda_for_less_is_not_dominated_by_it() -> None:
    keda = Outcome(cost=8.0, p50=0, p95=90.0, lost=3)
    s = suite.summarize(
        [_result(Outcome(7.0, 0, 95.0, 0), Outcome(7.0, 0, 95.0, 0), keda)], "default"
    )
    assert not s.dominated_by_keda
    s = suite.summarize(
        [_result(Outcome(9.0, 0, 95.0, 0), Outcome(9.0, 0, 95.0, 0), keda)], "default"
    )
    assert s.dominated_by_keda


def test_a_cell_replays_the_candidate_and_every_baseline_on_the_same_trace() -> None:
    cell = Cell(Workload("steady-small", "steady", 400), seed=0, boot=60.0)
    [res] = suite.run(
        {"default": {}, "half": {"waits.AUTO_SHARE": 0.25}}, [cell], days=1, workers=1
    )
    assert set(res.rows) == {"default", "half", *suite.BASELINES}
    assert all(o.lost == 0 for name, o in res.rows.items() if name != "keda")
    assert res.rows["always-on 1"].cost == pytest.approx(24 * 0.015, rel=0.05)
    assert res.rows["default"].over_target is not None and res.rows["depth"].over_target is None
    assert waits.AUTO_SHARE == 0.5  # a candidate's constants are put back after its rows


def test_a_candidate_sets_the_wait_rules_constants_by_name() -> None:
    from datetime import timedelta

    got = suite._constants({"waits.AUTO_MAX": 90, "waits.AUTO_SHARE": "0.25", "policy.x": 1})
    assert got == {"AUTO_MAX": timedelta(seconds=90), "AUTO_SHARE": 0.25}


def test_an_unknown_constant_is_refused_before_any_replay() -> None:
    with pytest.raises(ValueError, match="waits.AUTO_SHAER"):
        suite.run({"x": {"waits.AUTO_SHAER": 1}}, [], workers=1)


def test_candidates_differing_in_more_than_policy_or_named_as_a_baseline_are_refused() -> None:
    with pytest.raises(ValueError, match="named as a baseline: depth"):
        suite.run({"depth": {}}, [], workers=1)
    with pytest.raises(ValueError, match="other keys than policy"):
        suite.run(
            {"a": {}, "b": {"policy.max_instances": 3, "budget.monthly_ceiling_usd": 99}},
            [],
            workers=1,
        )
