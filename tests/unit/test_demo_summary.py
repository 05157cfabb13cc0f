"""The demo's verdict and its workload option (no I/O)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from vultrscale import demo
from vultrscale.errors import UsageError


def _summary(**changes: Any) -> demo.Summary:
    base = demo.Summary(
        wall_seconds=60.0,
        enqueued=24,
        succeeded=23,
        failed=1,
        dead=0,
        lost=0,
        retried=1,
        max_instances=4,
        peak=4,
        final=0,
        created=6,
        scale_ups=2,
        scale_ins=2,
        instance_seconds=120.0,
        always_on_seconds=240.0,
        booted=6,
        worker_clean_exits=6,
        worker_failed_exits=0,
        killed_at_power_off=0,
        ssh={"stop": 6, "is_active": 6, "refused_commands": 0, "refused_logins": 0},
        database="throwaway",
        ended_by="done",
    )
    return replace(base, **changes)


def test_failed_jobs_are_not_lost() -> None:
    s = _summary()
    assert s.ok and s.finished and s.saved_pct == pytest.approx(50.0)
    assert s.to_json()["jobs"] == {
        "enqueued": 24,
        "succeeded": 23,
        "failed": 1,
        "dead": 0,
        "lost": 0,
        "retried": 1,
    }


@pytest.mark.parametrize(
    "changes",
    [{"lost": 1}, {"final": 1}, {"peak": 5}],
    ids=["a-job-lost", "fleet-not-down", "above-the-cap"],
)
def test_not_ok(changes: dict[str, Any]) -> None:
    s = _summary(**changes)
    assert not s.ok and not s.to_json()["ok"]


def test_bursts() -> None:
    assert demo.parse_bursts("40:12, 0:24") == (demo.Burst(0, 24), demo.Burst(40, 12))
    for bad in ("", "24", "0:0", "-1:3", "a:b", "0:24,"):
        with pytest.raises(UsageError, match="SECONDS:JOBS"):
            demo.parse_bursts(bad)
