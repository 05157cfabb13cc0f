"""systemd's own checks of the units: the scaler's (as `vultrscale init --systemd` writes them)
pass `systemd-analyze verify` and rate "OK" or better in `systemd-analyze security`, and so does
the worker's hardened unit."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sandbox_paths import clone_let_through
from vultrscale import scaffold
from vultrscale.cli import main

pytestmark = pytest.mark.e2e  # runs systemd-analyze and the vultrscale command

REPO = Path(__file__).resolve().parents[2]


GOOD = {"SAFE", "OK"}  # systemd's ratings, best first: SAFE, OK, MEDIUM, EXPOSED, UNSAFE


def _analyze(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["systemd-analyze", *args], capture_output=True, text=True, timeout=60, check=False
    )


def _rating(unit: Path) -> tuple[float, str]:
    """systemd-analyze security's overall exposure of ``unit``, and its word for it."""
    result = _analyze("security", "--offline=true", str(unit))
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d) (\w+)", result.stdout)
    assert found, result.stdout + result.stderr
    return float(found[1]), found[2]


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The units as a user gets them: written by the vultrscale command itself (in this
    process: the clone, and so the program, may lie where the services' sandbox hides it, as
    a CI clone under /tmp does; init refuses that, tests/unit/test_init_systemd.py checks it,
    so the clone's own directory is let through here)."""
    out = tmp_path_factory.mktemp("units")
    assert shutil.which("vultrscale"), "not on PATH (run with the project's .venv/bin on PATH)"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(scaffold, "_HIDDEN", clone_let_through(scaffold._HIDDEN))
        assert main(["init", "--systemd", str(out)]) == 0
    yield out


@pytest.mark.parametrize("name", scaffold.SYSTEMD_UNITS)
def test_systemd_accepts_each_unit_init_writes(written: Path, name: str) -> None:
    result = _analyze("verify", str(written / name))
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == ""


@pytest.mark.parametrize("name", ["vultrscale.service", "vultrscale-pass.service"])
def test_the_scaler_services_rate_ok_or_better(written: Path, name: str) -> None:
    score, word = _rating(written / name)
    assert word in GOOD and score < 2.0, (score, word)


def test_the_worker_unit_rates_ok_or_better(tmp_path: Path) -> None:
    unit = tmp_path / "worker.service"
    text = (REPO / "cloud-init" / "worker.service").read_text()
    unit.write_text(text.replace("/opt/vultrscale/venv/bin/vultrscale", sys.executable))
    assert _analyze("verify", str(unit)).returncode == 0
    score, word = _rating(unit)
    assert word in GOOD, (score, word)  # it rated 8.6 EXPOSED before its sandbox


def _filtered(groups: list[str]) -> set[str]:
    """The system calls systemd's groups name, as systemd-analyze expands them."""
    calls: set[str] = set()
    for group in groups:
        listed = _analyze("syscall-filter", group)
        assert listed.returncode == 0, listed.stderr
        names = [n.strip() for n in listed.stdout.splitlines()[1:] if n.strip()]
        for name in names:
            if name.startswith("@"):
                calls |= _filtered([name])
            elif not name.startswith("#"):
                calls.add(name)
    return calls


def test_the_worker_filter_leaves_a_handler_its_own_sandbox() -> None:
    # A headless Chromium's sandbox chroots inside a user namespace of its own, bubblewrap
    # mounts and pivots there: no privilege outside it, so the filter takes nothing by
    # allowing them, and docs/worker.md promises a handler namespaces.
    lines = (REPO / "cloud-init" / "worker.service").read_text().splitlines()
    (denied,) = [x.split("=", 1)[1] for x in lines if x.startswith("SystemCallFilter=~")]
    filtered = _filtered(denied.lstrip("~").split())
    assert "settimeofday" in filtered  # the expansion reads the groups
    assert {"chroot", "mount", "pivot_root", "unshare", "clone", "setns"}.isdisjoint(filtered)


def test_the_rating_would_catch_a_sandbox_taken_away(written: Path, tmp_path: Path) -> None:
    # Guards the tests above: the rating reads the unit's sandbox.
    keep = ("[", "ExecStart=", "Type=", "Description=")
    bare = [
        line
        for line in (written / "vultrscale.service").read_text().splitlines()
        if line.startswith(keep)
    ]
    unit = tmp_path / "bare.service"
    unit.write_text("\n".join(bare) + "\n")
    score, word = _rating(unit)
    assert word not in GOOD and score > 5, (score, word)


def test_the_written_exec_start_is_the_program_on_path(written: Path) -> None:
    exe = shutil.which("vultrscale")
    text = (written / "vultrscale.service").read_text()
    assert f"ExecStart={os.path.abspath(exe or '')} reconcile --loop" in text


def test_the_units_for_a_directory_of_fleets_pass_systemds_checks(tmp_path: Path) -> None:
    """The same units on both scaler hosts of the two-host layout (README "Several fleets, two
    hosts"): the directory of fleets loaded whole as the config."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(scaffold, "_HIDDEN", clone_let_through(scaffold._HIDDEN))
        assert main(["--config", "/etc/vultrscale/fleets", "init", "--systemd", str(tmp_path)]) == 0
    for name in ("vultrscale.service", "vultrscale-pass.service"):
        unit = tmp_path / name
        assert "LoadCredential=fleets:/etc/vultrscale/fleets" in unit.read_text()
        result = _analyze("verify", str(unit))
        assert result.returncode == 0, result.stderr
        _, word = _rating(unit)
        assert word in GOOD, word
