"""The config's schema: each setting declared once, with a help line, a default its own facts
take, and messages made from those facts (the key, the value, what is allowed)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from vultrscale import config
from vultrscale.config.kinds import Tables, value_problems
from vultrscale.config.schema import SECTIONS, all_settings, default_of


def test_every_setting_has_one_help_line_and_a_default_its_own_facts_take() -> None:
    for s in all_settings():
        assert s.spec.help and "\n" not in s.spec.help, s.dotted
        assert value_problems(s.spec, s.dotted, s.default) == [], s.dotted
    for cls in SECTIONS.values():
        for f in dataclasses.fields(cls):
            assert default_of(f) is not dataclasses.MISSING, f.name


def test_the_schema_names_the_settings_and_their_variables() -> None:
    keys = [s.dotted for s in all_settings()]
    assert keys == config.setting_keys() and len(keys) == len(set(keys))
    assert "policy.forecast.mode" in keys and "policy.floor" in keys
    envs = {s.dotted: s.env for s in all_settings()}
    assert envs["policy.forecast.mode"] == "VULTRSCALE_POLICY_FORECAST_MODE"
    assert envs["fleet.offerings"] == "VULTRSCALE_FLEET_OFFERINGS"
    assert isinstance(next(s for s in all_settings() if s.key == "floor").spec.kind, Tables)


def test_a_setting_refused_by_its_own_facts_is_named_with_what_is_allowed(tmp_path: Path) -> None:
    path = tmp_path / "vultrscale.toml"
    path.write_text(
        '[fleet]\nssh_port = 70000\nssh_address = "eth0"\n[worker]\napp = "x"\n'
        '[policy]\nboot_time = "0s"\n[policy.forecast]\nrefresh = "30s"\n'
    )
    with pytest.raises(config.ConfigError) as info:
        config.load(path, {})
    assert info.value.problems == [
        "fleet.ssh_port: 70000 is out of range: allowed 1 to 65535",
        "fleet.ssh_address: 'eth0' must be main_ip or internal_ip",
        "worker.app: 'x' must be MODULE:FUNC, e.g. myjobs:handle",
        "policy.forecast.refresh: 30s must be at least 1m",
        "policy.boot_time: 0s must be longer than 0s",
    ]


def test_the_target_wait_is_auto_or_a_duration_by_its_type() -> None:
    env = {"VULTRSCALE_POLICY_TARGET_WAIT": "90"}
    assert str(config.load(None, env, require_file=False).policy.target_wait) == "90s"
    env = {"VULTRSCALE_POLICY_TARGET_WAIT": "Auto"}
    assert config.load(None, env, require_file=False).policy.target_wait.fixed is None
    with pytest.raises(config.ConfigError, match='policy.target_wait: .* or "auto"'):
        config.load(None, {"VULTRSCALE_POLICY_TARGET_WAIT": "soon"}, require_file=False)
