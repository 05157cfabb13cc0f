"""A clamp is a value: its kind and its numbers. Its words are made from it at the edge
(``Clamp.describe``), for status, ``--json`` and the events ledger; what reads clamps (the
simulator, the metrics, the tests) reads the kind and the numbers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from vultrscale.core.limits import Clamp, Limit, span
from vultrscale.core.model import Plan

NOW = datetime(2026, 11, 10, 12, 0, tzinfo=UTC)


def _every_number(kind: Limit) -> Clamp:
    return Clamp(
        kind,
        asked=7,
        allowed=3,
        limit=5,
        count=2,
        since=NOW - timedelta(minutes=2),
        window=timedelta(minutes=5),
        until=NOW + timedelta(minutes=3),
        wait=timedelta(minutes=3),
        detail="the arithmetic",
    )


@pytest.mark.parametrize("kind", list(Limit), ids=[k.value for k in Limit])
def test_every_kind_has_words_that_name_its_rule(kind: Limit) -> None:
    words = _every_number(kind).describe()
    assert words.startswith(f"{kind.rule}:")


def test_a_plan_shows_its_clamps_in_words_and_keeps_them_as_values() -> None:
    clamp = Clamp(Limit.STEP, asked=5, allowed=2, limit=2)
    plan = Plan(desired=5, target=2, capacity=0, floor=0, cap=5, clamps=(clamp,))
    assert plan.summary()["clamps"] == [clamp.describe()]
    assert plan.clamps[0].kind is Limit.STEP and plan.clamps[0].allowed == 2


def test_only_the_limits_of_a_scale_up_hold_one() -> None:
    up = {k for k in Limit if k.holds_scale_up}
    assert {k.rule for k in up} == {"cap", "budget", "cool-down", "max_step_up"}
    assert Limit.OVER_CAP not in up and Limit.COOLDOWN_DOWN_AFTER_UP not in up


@pytest.mark.parametrize(
    ("seconds", "shown"), [(0.2, "1s"), (42, "42s"), (180, "3m00s"), (3900, "1h05m")]
)
def test_a_wait_reads_as_a_person_reads_it(seconds: float, shown: str) -> None:
    assert span(timedelta(seconds=seconds)) == shown
