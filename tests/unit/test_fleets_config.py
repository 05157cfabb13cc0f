"""A directory of fleets (config.fleets.load_fleets): every *.toml one fleet; clashes, bad
files and the account's one value."""

from __future__ import annotations

from pathlib import Path

import pytest

from vultrscale.cli import main
from vultrscale.config.fleets import load_fleets
from vultrscale.errors import ConfigError, UsageError


def _write(folder: Path, name: str, body: str) -> Path:
    path = folder / name
    path.write_text(body)
    return path


def _fleet(name: str, tag: str | None = None, extra: str = "") -> str:
    return f'[fleet]\nname = "{name}"\ntag = "{tag or "vs-" + name}"\n{extra}'


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    d = tmp_path / "fleets.d"
    d.mkdir()
    _write(d, "web.toml", _fleet("web"))
    _write(d, "reports.toml", _fleet("reports", extra='plan = "vc2-4c-8gb"\n'))
    return d


def test_every_toml_is_a_fleet_sorted_by_name(folder: Path) -> None:
    _write(folder, "notes.txt", "not a fleet")
    _write(folder, ".web.toml.swp.toml", "an editor's")
    fleets = load_fleets(folder, {})
    assert fleets.directory and fleets.names == ["reports", "web"] and not fleets.bad
    assert fleets.configs[0].fleet.plan == "vc2-4c-8gb"
    assert fleets.configs[0].source == str(folder / "reports.toml")


def test_a_single_file_is_loaded_as_it_always_was(folder: Path) -> None:
    fleets = load_fleets(folder / "web.toml", {})
    assert not fleets.directory and fleets.one().fleet.name == "web"


def test_an_invalid_file_is_that_fleets_problem_and_the_others_load(folder: Path) -> None:
    _write(folder, "gpu.toml", _fleet("gpu", extra="[policy]\nmax_instances = -1\n"))
    fleets = load_fleets(folder, {})
    assert fleets.names == ["reports", "web"]
    (bad,) = fleets.bad
    assert bad.path.name == "gpu.toml" and bad.name == "gpu"
    err = fleets.bad_error()
    assert err is not None and err.exit_code == 2
    assert "gpu.toml: policy.max_instances: -1 is out of range" in err.message
    with pytest.raises(ConfigError, match="gpu.toml: policy.max_instances"):
        fleets.select("gpu")


@pytest.mark.parametrize(
    ("body", "said"),
    [
        pytest.param(_fleet("web", tag="vs-other"), "fleet.name 'web' is also the name", id="name"),
        pytest.param(_fleet("web2", tag="VS-WEB"), "fleet.tag 'VS-WEB' is also the tag", id="tag"),
    ],
)
def test_two_files_of_one_name_or_tag_are_both_refused_naming_each_other(
    folder: Path, body: str, said: str
) -> None:
    _write(folder, "web2.toml", body)
    fleets = load_fleets(folder, {})
    assert fleets.names == ["reports"]
    by_file = {b.path.name: b for b in fleets.bad}
    assert set(by_file) == {"web.toml", "web2.toml"}
    assert said in " ".join(by_file["web2.toml"].problems)
    assert str(folder / "web.toml") in " ".join(by_file["web2.toml"].problems)
    assert str(folder / "web2.toml") in " ".join(by_file["web.toml"].problems)
    assert "own [fleet] name and tag" in by_file["web.toml"].hint


def test_a_directory_without_fleet_files_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a directory with no \\*.toml fleet file") as exc:
        load_fleets(tmp_path, {})
    assert "vultrscale --config" in exc.value.hint and "init" in exc.value.hint


def test_the_account_is_one_value_every_fleet_gets(folder: Path) -> None:
    _write(folder, "gpu.toml", _fleet("gpu") + "[account]\nmonthly_ceiling_usd = 300\n")
    fleets = load_fleets(folder, {})
    assert [c.account.monthly_ceiling_usd for c in fleets.configs] == [300.0] * 3
    assert fleets.account.monthly_ceiling_usd == 300.0


def test_the_environment_sets_the_account_for_every_fleet(folder: Path) -> None:
    env = {"VULTRSCALE_ACCOUNT_MONTHLY_CEILING_USD": "120", "VULTRSCALE_ACCOUNT_SCALERS": "2"}
    fleets = load_fleets(folder, env)
    assert {(c.account.monthly_ceiling_usd, c.account.scalers) for c in fleets.configs} == {
        (120.0, 2)
    }


def test_files_that_disagree_on_the_account_refuse_the_directory(folder: Path) -> None:
    _write(folder, "gpu.toml", _fleet("gpu") + "[account]\nmonthly_ceiling_usd = 300\n")
    _write(folder, "web.toml", _fleet("web") + "[account]\nmonthly_ceiling_usd = 200\n")
    with pytest.raises(ConfigError) as exc:
        load_fleets(folder, {})
    assert "account.monthly_ceiling_usd is 300.0 in" in exc.value.message
    assert "gpu.toml" in exc.value.message and "web.toml" in exc.value.message
    assert "VULTRSCALE_ACCOUNT_<KEY>" in exc.value.hint


def test_one_fleet_of_several_is_named_with_fleet(folder: Path) -> None:
    fleets = load_fleets(folder, {})
    with pytest.raises(UsageError, match="holds 2 fleets \\(reports, web\\)") as exc:
        fleets.one()
    assert "--fleet NAME" in exc.value.hint
    assert fleets.select("web").one().fleet.name == "web"
    with pytest.raises(UsageError, match="no fleet of that name .* \\(fleets: reports, web\\)"):
        fleets.select("gpu")


def test_config_check_of_a_directory_prints_the_valid_and_exits_2_for_the_invalid(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write(folder, "gpu.toml", _fleet("gpu", extra="[policy]\nmax_instances = -1\n"))
    code = main(["--config", str(folder), "config", "check"])
    out = capsys.readouterr()
    assert code == 2
    assert "2 fleet(s) in" in out.out and "invalid:" in out.out and "gpu.toml" in out.out
    assert "gpu.toml: policy.max_instances" in out.err
    code = main(["config", "check", "--config", str(folder), "--fleet", "web", "--json"])
    doc = __import__("json").loads(capsys.readouterr().out)
    assert code == 0 and [f["fleet"]["name"] for f in doc["fleets"]] == ["web"]


def test_a_fleet_command_on_a_directory_of_several_asks_for_fleet(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["--config", str(folder), "instances"])
    assert code == 2
    assert "name it with --fleet" in capsys.readouterr().err.lower()


def test_init_writes_a_new_fleet_into_the_directory_and_its_env_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "fleets"
    assert main(["--config", str(d), "init", "--fleet", "web", "--defaults"]) == 0
    assert main(["--config", str(d), "init", "--fleet", "gpu", "--defaults"]) == 0
    said = capsys.readouterr().out
    assert "Wrote" in said and "its secrets are the directory's" in said
    assert sorted(p.name for p in d.iterdir()) == [".env", "gpu.toml", "web.toml"]
    fleets = load_fleets(d, {})
    assert fleets.names == ["gpu", "web"] and not fleets.bad
    gpu = fleets.configs[0]
    assert (gpu.fleet.tag, gpu.fleet.label_prefix, gpu.worker.queue, gpu.queue.queue) == (
        "vultrscale-gpu",
        "gpu",
        "gpu",
        "gpu",
    )


@pytest.mark.parametrize(
    ("args", "said"),
    [
        pytest.param(["init", "--defaults"], "init writes one new fleet into it", id="no-name"),
        pytest.param(
            ["init", "--fleet", "web", "--defaults"], "is fleet 'web' already", id="same-name"
        ),
        pytest.param(["init", "--fleet", "../x", "--defaults"], "is not a fleet name", id="bad"),
    ],
)
def test_init_into_a_directory_refuses_what_would_clash(
    folder: Path, capsys: pytest.CaptureFixture[str], args: list[str], said: str
) -> None:
    before = sorted(p.name for p in folder.iterdir())
    assert main(["--config", str(folder), *args]) == 2
    assert said in capsys.readouterr().err
    assert sorted(p.name for p in folder.iterdir()) == before
