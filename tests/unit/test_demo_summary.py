"""The demo's verdict and its workload option (no I/O)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
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
        waiting=0,
        given_back=0,
        steps_run_twice=0,
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
        "waiting": 0,
        "given_back": 0,
        "retried": 1,
        "steps_run_twice": 0,
    }


@pytest.mark.parametrize(
    "changes",
    [{"lost": 1}, {"final": 1}, {"peak": 5}, {"steps_run_twice": 1}],
    ids=["a-job-lost", "fleet-not-down", "above-the-cap", "a-step-ran-twice"],
)
def test_not_ok(changes: dict[str, Any]) -> None:
    s = _summary(**changes)
    assert not s.ok and not s.to_json()["ok"]


def test_bursts() -> None:
    assert demo.parse_bursts("40:12, 0:24") == (demo.Burst(0, 24), demo.Burst(40, 12))
    for bad in ("", "24", "0:0", "-1:3", "a:b", "0:24,", "nan:4", "inf:4", "0:1000000"):
        with pytest.raises(UsageError, match="SECONDS:JOBS"):
            demo.parse_bursts(bad)


def test_jobs_given_back_at_a_stop_are_queued_not_lost() -> None:
    s = _summary(succeeded=10, failed=0, waiting=14, given_back=8, ended_by="interrupted")
    assert s.lost == 0 and s.to_json()["jobs"]["given_back"] == 8


def test_job_seconds() -> None:
    assert demo.parse_job_seconds("1:4") == (1.0, 4.0)
    assert demo.parse_job_seconds("2") == (2.0, 2.0)
    for bad in ("", "0:1", "4:1", "a:b", "nan:nan", "1:inf", "-1:2"):
        with pytest.raises(UsageError, match="LOW:HIGH"):
            demo.parse_job_seconds(bad)


def _pass_config(tmp_path: Path, *, api_key: str, name: str) -> Any:
    """The demo's config for a run whose fleet and queue are ``name``."""
    return demo.demo_config(
        demo.Settings(),
        api_url="http://127.0.0.1:1",
        api_key=api_key,
        db_url="postgresql://u:p@127.0.0.1/db",
        ssh_key=str(tmp_path / "key"),
        ssh_port=2222,
        queue=name,
        fleet=name,
    )


def test_the_pass_process_config_reads_back_as_the_same_settings(tmp_path: Path) -> None:
    from vultrscale import config

    cfg = _pass_config(tmp_path, api_key="k", name="demo-f")
    path = tmp_path / "vultrscale.toml"
    path.write_text(demo.config_toml(cfg))
    back = config.load(str(path), env={"VULTR_API_URL": cfg.api_url})
    for section in ("fleet", "worker", "queue", "policy", "budget", "drain"):
        assert getattr(back, section) == getattr(cfg, section), section
    assert "postgresql" not in path.read_text()  # secrets stay in the environment


def test_the_pass_config_keeps_a_fleet_name_that_shares_six_characters_with_the_api_key(
    tmp_path: Path,
) -> None:
    # The masking of a key's fragments (six characters or more, wherever they appear) is for
    # what is shown; the file a pass reads back is written unmasked. A demo whose key began
    # "demo-1" wrote its fleet name as "***796187083-c47d", and every pass refused the config.
    from vultrscale import config

    name = "demo-1796187083-c47d"
    cfg = _pass_config(tmp_path, api_key="demo-1f0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c", name=name)
    assert "***" in cfg.masked()["fleet"]["name"]  # shown: masked, the key's run in it
    path = tmp_path / "vultrscale.toml"
    path.write_text(demo.config_toml(cfg))
    back = config.load(str(path), env={"VULTR_API_URL": cfg.api_url})
    assert (back.fleet.name, back.queue.queue, back.worker.queue) == (name, name, name)
    assert "demo-1f0e9d" not in path.read_text()  # and the key itself is not a setting


def test_a_pass_that_failed_before_its_pass_is_an_error_not_a_silent_pass() -> None:
    doc = {"error": "Invalid configuration:\n  - fleet.name: ...", "hint": "Fix", "exit_code": 2}
    with pytest.raises(ValueError, match="^Invalid configuration:$"):
        demo.PassSeen.of_json(doc)
    seen = demo.PassSeen.of_json(
        {
            "inputs": {"instances": {"running": 3, "draining": 1}},
            "actions": [{"kind": "create"}, {"kind": "drain", "label": "demo-x"}],
            "results": [{"label": "demo-y", "result": "created 1 on ewr/vc2-1c-2gb"}],
            "errors": ["boom"],
        }
    )
    assert (seen.creates, seen.drains, seen.ledger) == (1, ("demo-x",), 4)
    assert seen.instances == {"running": 3, "draining": 1}
    assert seen.lines == ("demo-y: created 1 on ewr/vc2-1c-2gb", "error: boom")
