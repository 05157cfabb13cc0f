"""`reconcile --loop`'s log line: one line per pass whatever the text from outside holds, the
pass id in it, no secret in either format."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from vultrscale.cli.passlog import LogFormat, error_line, metrics_line, pass_line
from vultrscale.core.limits import Clamp, Limit
from vultrscale.core.model import (
    Action,
    ActionKind,
    Instance,
    InstanceState,
    Observation,
    Plan,
    Signals,
)
from vultrscale.errors import DatabaseError
from vultrscale.reconcile import PassResult

AT = datetime(2026, 5, 10, 9, 0, 30, tzinfo=UTC)
SECRET = "s3cret-password-42"

CAP = Clamp(Limit.CAP, asked=8, allowed=5, limit=5)


def _result(actions: tuple[Action, ...] | None = None, **kw: object) -> PassResult:
    """A pass's result; ``actions`` are its plan's (the result shows the plan's actions)."""
    if actions is None:
        actions = (Action(ActionKind.CREATE, "queue needs 2"),)
    obs = Observation(
        instances=(
            Instance("worker-1", InstanceState.RUNNING),
            Instance("worker-2", InstanceState.PENDING),
        ),
        signals=Signals(ready=6, in_flight=2, oldest_ready_seconds=12.5),
        price=None,
    )
    plan = Plan(
        desired=2,
        target=2,
        capacity=2,
        floor=0,
        cap=5,
        actions=actions,
        clamps=(CAP,),
    )
    fields: dict[str, object] = {
        "exit_code": 0,
        "at": AT,
        "plan": plan,
        "observation": obs,
        "pass_id": 41,
        "duration_s": 0.42,
    }
    fields.update(kw)
    return PassResult(**fields)  # type: ignore[arg-type]


def test_the_human_line_says_the_pass_its_fleet_queue_and_actions() -> None:
    line = pass_line(_result(), "workers", LogFormat.HUMAN, [])
    assert line == (
        "2026-05-10T09:00:30Z fleet workers pass 41: exit 0 in 0.4s; "
        "instances 2 (1 pending, 1 running); queue 6 ready, 2 in flight, oldest 12.5s; "
        f"desired 2 target 2; clamp: {CAP.describe()}; create: queue needs 2"
    )


def test_the_json_line_carries_the_pass_id_and_the_figures() -> None:
    line = pass_line(_result(), "workers", LogFormat.JSON, [])
    record = json.loads(line)
    assert record["pass_id"] == 41 and record["fleet"] == "workers"
    assert record["level"] == "info" and record["exit_code"] == 0
    assert record["queue"]["ready"] == 6 and record["instances"] == {"running": 1, "pending": 1}
    assert record["actions"] == ["create: queue needs 2"]


@pytest.mark.parametrize("fmt", list(LogFormat), ids=str)
def test_a_label_with_a_newline_and_a_secret_in_an_error_stay_one_clean_line(
    fmt: LogFormat,
) -> None:
    result = _result(
        exit_code=1,
        actions=(Action(ActionKind.DRAIN, "idle", "evil\nINJECTED 2028\u2028line"),),
        errors=[f"cannot reach postgresql://u:{SECRET}@db/x"],
    )
    line = pass_line(result, "workers", fmt, [SECRET])
    assert "\n" not in line and "\u2028" not in line
    assert SECRET not in line and "***" in line
    if fmt is LogFormat.JSON:
        assert json.loads(line)["level"] == "error"


def test_a_pass_that_found_the_lock_held_says_so_without_an_id() -> None:
    line = pass_line(_result(lock_held=True, pass_id=None), "workers", LogFormat.HUMAN, [])
    assert line == "2026-05-10T09:00:30Z fleet workers pass -: another pass holds the " + (
        "fleet's lock, nothing to do"
    )


@pytest.mark.parametrize("fmt", list(LogFormat), ids=str)
def test_a_pass_that_failed_before_its_result_is_one_line_with_its_fix(fmt: LogFormat) -> None:
    exc = DatabaseError(f"cannot connect: password {SECRET} refused", hint="Check Postgres.")
    line = error_line(exc, AT, "workers", fmt, [SECRET])
    assert "\n" not in line and SECRET not in line
    if fmt is LogFormat.JSON:
        record = json.loads(line)
        assert record["level"] == "error" and record["exit_code"] == 1
        assert record["hint"] == "Check Postgres." and record["pass_id"] is None
    else:
        assert line.endswith("Fix: Check Postgres.") and "exit 1" in line


@pytest.mark.parametrize("fmt", list(LogFormat), ids=str)
def test_a_failed_pass_that_was_recorded_names_its_pass_id(fmt: LogFormat) -> None:
    exc = DatabaseError("fleet ledger: saving the fleet state: connection lost")
    exc.pass_id = 57  # run_pass sets it when the pass's events row was written
    line = error_line(exc, AT, "workers", fmt, [])
    if fmt is LogFormat.JSON:
        assert json.loads(line)["pass_id"] == 57
    else:
        assert line.startswith("2026-05-10T09:00:30Z fleet workers pass 57 failed: exit 1: ")


def test_the_loop_says_where_it_serves_metrics_in_the_logs_format() -> None:
    # `--metrics-port 0` binds a port the system picks: this line is how a scraper learns it.
    url = "http://127.0.0.1:40123/metrics"
    human = metrics_line(url, AT, "workers", LogFormat.HUMAN)
    assert human == f"2026-05-10T09:00:30Z fleet workers serves metrics at {url}"
    record = json.loads(metrics_line(url, AT, "workers", LogFormat.JSON))
    assert record == {"time": "2026-05-10T09:00:30Z", "level": "info", "msg": "metrics",
                      "fleet": "workers", "url": url}  # fmt: skip
