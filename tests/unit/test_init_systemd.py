"""`vultrscale init --systemd DIR`: the scaler's units, ExecStart naming this vultrscale, the
config's directory where the units read it; never a path the sandbox hides, never over a file
without --force. (systemd's own checks of the units: tests/e2e/test_scaler_units.py.)"""

from __future__ import annotations

import configparser
from pathlib import Path

import pytest

from tests.sandbox_paths import clone_let_through
from vultrscale import scaffold
from vultrscale.cli import main
from vultrscale.errors import UsageError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def clone_anywhere(monkeypatch: pytest.MonkeyPatch) -> tuple[str, ...]:
    """The clone, and so the vultrscale these tests write into ExecStart, may lie where the
    services' sandbox hides it (a CI clone under /tmp, a home directory): init refuses that
    (test_a_program_the_service_could_not_run_is_refused), so here the clone's own directory
    is let through and every other hidden one is still refused. Returns those."""
    kept = clone_let_through(scaffold._HIDDEN)
    monkeypatch.setattr(scaffold, "_HIDDEN", kept)
    return kept


def _service(text: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(text)
    return parser


def test_the_units_ship_inside_the_package() -> None:
    # vultrscale/deploy links to deploy/, and setuptools copies it as package data.
    assert scaffold.deploy_dir().resolve() == (REPO / "deploy").resolve()
    assert {*scaffold.SYSTEMD_UNITS} <= {p.name for p in scaffold.deploy_dir().iterdir()}


@pytest.mark.usefixtures("clone_anywhere")
def test_init_writes_the_three_units_with_this_program_in_exec_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["init", "--systemd", str(tmp_path)]) == 0
    said = capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(scaffold.SYSTEMD_UNITS)
    loop = _service((tmp_path / "vultrscale.service").read_text())["Service"]
    program = loop["ExecStart"].split(" reconcile ")[0]
    assert Path(program.split()[0]).is_absolute() and program in said
    assert loop["ExecStart"].endswith("reconcile --loop --interval 30s --metrics-port 9464")
    one = _service((tmp_path / "vultrscale-pass.service").read_text())["Service"]
    assert one["ExecStart"] == f"{program} reconcile"
    assert (tmp_path / "vultrscale.service").stat().st_mode & 0o777 == 0o644
    assert "systemctl enable --now vultrscale.service" in said


def test_a_config_named_with_config_moves_every_file_the_units_read(tmp_path: Path) -> None:
    units = scaffold.systemd_units(["/usr/bin/vultrscale"], Path("/srv/fleet/prod.toml"))
    svc = _service(units["vultrscale.service"])["Service"]
    assert svc["EnvironmentFile"] == "/srv/fleet/.env"
    assert "LoadCredential=vultrscale.toml:/srv/fleet/prod.toml" in units["vultrscale.service"]
    assert "LoadCredential=ssh_key:/srv/fleet/ssh_key" in units["vultrscale-pass.service"]
    assert "/etc/vultrscale" not in "".join(units.values())
    assert "/srv/fleet/vultrscale.toml" not in units["vultrscale.service"]  # comments too


@pytest.mark.usefixtures("clone_anywhere")
def test_the_next_steps_point_the_config_at_the_key_the_units_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The services read the key as their credential copy; the operator's own commands as root
    # (`reconcile --dry-run`, `image bake`) read fleet.ssh_key, whose default is under ~.
    assert main(["--config", "/srv/fleet/prod.toml", "init", "--systemd", str(tmp_path)]) == 0
    said = capsys.readouterr().out
    assert 'ssh_key = "/srv/fleet/ssh_key"' in said


@pytest.mark.parametrize(
    ("program", "said"),
    [
        ("/root/.local/bin/vultrscale", "sandbox cannot see it"),
        ("/home/ops/.local/bin/vultrscale", "sandbox cannot see it"),
        ("/tmp/venv/bin/vultrscale", "sandbox cannot see it"),
        ("/opt/my tools/vultrscale", "holds ' '"),
        ("/opt/50%/vultrscale", "holds '%'"),
        ("bin/vultrscale", "not an absolute path"),
    ],
    ids=["root-home", "user-home", "tmp", "space", "specifier", "relative"],
)
def test_a_program_the_service_could_not_run_is_refused(program: str, said: str) -> None:
    with pytest.raises(UsageError) as refused:
        scaffold.systemd_units([program])
    assert said in refused.value.message
    assert "pipx install" in refused.value.hint


@pytest.mark.parametrize(
    "runtime",
    [
        # `uv tool install` as root with a Python uv downloaded: the tool's venv links to it.
        "/root/.local/share/uv/python/cpython-3.12.8-linux-x86_64-gnu/bin/python3.12",
        "/home/ops/.pyenv/versions/3.12.8",
    ],
    ids=["uv-managed-python", "pyenv-prefix"],
)
def test_a_python_the_sandbox_hides_is_warned_of(runtime: str) -> None:
    # /usr/local/bin/vultrscale can be seen, but the Python it runs under cannot: the service
    # would fail at every start (203/EXEC), and this is the moment to say so.
    warning = scaffold.hidden_runtime(["/usr/bin/python3.12", runtime, runtime])
    assert warning is not None and warning.count(runtime) == 1
    assert "sandbox cannot see it" in warning and "/usr/bin" not in warning
    assert "UV_PYTHON_INSTALL_DIR" in scaffold.UNIT_RUNTIME_FIX
    assert scaffold.hidden_runtime(["/usr/bin/python3.12", "/opt/uv-python/cpython"]) is None


def test_init_warns_of_the_python_it_runs_under(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    clone_anywhere: tuple[str, ...],
) -> None:
    python = f"{clone_anywhere[0]}/ops/.local/share/uv/python/cpython-3.12"
    monkeypatch.setattr("sys.base_prefix", python)
    assert main(["init", "--systemd", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "Warning: the Python that runs vultrscale needs " in err
    assert python in err and "\nFix: Install " in err
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(scaffold.SYSTEMD_UNITS)


def test_a_python_without_the_console_script_runs_the_module() -> None:
    units = scaffold.systemd_units(["/opt/py/bin/python3", "-m", "vultrscale"])
    svc = _service(units["vultrscale-pass.service"])["Service"]
    assert svc["ExecStart"] == "/opt/py/bin/python3 -m vultrscale reconcile"


@pytest.mark.usefixtures("clone_anywhere")
def test_existing_units_are_kept_unless_force_and_then_kept_as_bak(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = tmp_path / "vultrscale.service"
    mine.write_text("# my edits\n")
    assert main(["init", "--systemd", str(tmp_path)]) == 2
    assert "vultrscale.service exists" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vultrscale.service"]  # nothing else
    assert main(["init", "--systemd", str(tmp_path), "--force"]) == 0
    assert (tmp_path / "vultrscale.service.bak").read_text() == "# my edits\n"
    assert "ExecStart=" in mine.read_text()


@pytest.mark.usefixtures("clone_anywhere")
def test_a_directory_that_is_not_there_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["init", "--systemd", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "Fix:" in err


def test_the_loop_cannot_restart_fast_nor_restart_a_config_it_refused() -> None:
    unit = _service((REPO / "deploy" / "vultrscale.service").read_text())
    svc, head = unit["Service"], unit["Unit"]
    assert svc["Restart"] == "on-failure"
    assert int(svc["RestartSec"]) >= 30  # at most one start every 30 s
    assert svc["RestartPreventExitStatus"] == "2"  # a bad config stays failed, for the operator
    # Stopped with SIGINT, the loop records the pass it cut short and exits 130: not a failure.
    assert (svc["KillSignal"], svc["SuccessExitStatus"]) == ("SIGINT", "130")
    burst, interval = int(head["StartLimitBurst"]), int(head["StartLimitIntervalSec"])
    assert burst * int(svc["RestartSec"]) < interval  # a crash loop reaches the limit and stops


def test_the_scaler_units_hold_no_secret_and_name_the_root_only_files() -> None:
    for name in scaffold.SYSTEMD_UNITS:
        text = (REPO / "deploy" / name).read_text()
        for secret in ("VULTR_API_KEY=", "DATABASE_URL=", "postgresql://"):
            assert secret not in text, (name, secret)
    svc = _service((REPO / "deploy" / "vultrscale.service").read_text())["Service"]
    assert svc["EnvironmentFile"] == "/etc/vultrscale/.env"
    assert svc["DynamicUser"] == "yes" and svc["NoNewPrivileges"] == "yes"
    assert svc["ProtectSystem"] == "strict" and svc["PrivateTmp"] == "yes"


def test_a_directory_of_fleets_is_loaded_whole_as_the_config() -> None:
    """The same units on each scaler host: every file of the directory a credential, the
    directory of credentials the config, its .env the secrets, the SSH key beside it."""
    folder = Path("/srv/scaler/fleets")  # not there yet, no suffix: a directory of fleets
    units = scaffold.systemd_units(["/usr/bin/vultrscale"], folder)
    for name in ("vultrscale.service", "vultrscale-pass.service"):
        text = units[name]
        svc = _service(text)["Service"]
        assert svc["EnvironmentFile"] == f"{folder}/.env"
        assert f"LoadCredential=fleets:{folder}\n" in text
        assert "LoadCredential=ssh_key:/srv/scaler/ssh_key" in text
        assert "VULTRSCALE_CONFIG=%d VULTRSCALE_FLEET_SSH_KEY=%d/ssh_key" in text
        assert "vultrscale.toml" not in text.split("[Service]", 1)[1]
    assert f"#   {folder}/*.toml  the fleets' configs" in units["vultrscale.service"]


@pytest.mark.usefixtures("clone_anywhere")
def test_init_systemd_for_a_directory_says_how_to_run_it_on_two_hosts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    units = tmp_path / "units"
    units.mkdir()
    assert main(["--config", "/etc/vultrscale/fleets", "init", "--systemd", str(units)]) == 0
    said = capsys.readouterr().out
    assert "vultrscale --config /etc/vultrscale/fleets init --fleet NAME" in said
    assert "VULTRSCALE_ACCOUNT_SCALERS=2" in said
