"""Installable as a tool: the wheel built from this tree installs into an empty virtual
environment with its dependencies and nothing of the project's, and runs from there: the
version; every module of the tree, importable from the wheel's copy; the files it ships
(systemd units, alert rules, dashboard, cloud-init templates) where its code looks for them;
user-data rendered from those templates; and the installed worker taking a real job off a real
queue and stopping cleanly on SIGTERM. (It ran a short demo before: 25 s of the suite's ten
minutes for the same code the fresh-clone test's demo runs, where a module left out of the
wheel is caught by the import of every module, a missing template by the render.)

Quick on purpose: the wheel's dependencies come from a wheelhouse kept in .cache/wheelhouse
(filled from the package index the first time, or when a dependency changes), so the build
and the install run with --no-index; no pip in the new environment (the project's pip installs
into it with --python) and no bytecode compiled."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import psycopg
import pytest

from tests.e2e.worker_procs import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]  # a first run fills the wheelhouse

REPO = Path(__file__).resolve().parents[2]
WHEELHOUSE = REPO / ".cache" / "wheelhouse"
# What the wheel is built from: the project file, its readme, the package and the directories
# its links (vultrscale/deploy, vultrscale/templates) point into.
BUILT_FROM = ("pyproject.toml", "README.md", "vultrscale", "deploy", "cloud-init")


# The installed package's path, then the names of the systemd units, rules, dashboard and
# cloud-init templates it ships, as the code that uses them finds them.
SHIPPED = """
from vultrscale import cloudinit, scaffold
print(scaffold.__file__)
for d in (scaffold.deploy_dir(), cloudinit.template_dir()):
    print(*(p.name for p in d.iterdir()))
"""
# Every module the wheel has, each imported (a subpackage left out of the wheel, or a module
# that imports something the wheel's dependencies lack, fails here).
MODULES = """
import importlib, pkgutil, vultrscale
names = sorted(m.name for m in pkgutil.walk_packages(vultrscale.__path__, "vultrscale."))
names = [n for n in names if not n.endswith(".__main__")]  # importing one runs the CLI
for name in names:
    importlib.import_module(name)
print(*names)
"""


def _pip(*args: str, offline: bool) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.setdefault("PIP_CACHE_DIR", str(REPO / ".cache" / "pip"))
    if offline:
        env.update(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(WHEELHOUSE))
    return subprocess.run(
        [sys.executable, "-m", "pip", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def _ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def _install(venv_python: Path, wheel: Path) -> None:
    args = ("--python", str(venv_python), "install", "-q", "--no-compile", str(wheel))
    if _pip(*args, offline=True).returncode != 0:  # a dependency not in the wheelhouse yet
        _ok(_pip("wheel", "-q", "-w", str(WHEELHOUSE), str(wheel), offline=False))
        (WHEELHOUSE / wheel.name).unlink(missing_ok=True)  # only the dependencies stay
        _ok(_pip(*args, offline=True))


def test_the_wheel_installs_in_an_empty_venv_and_runs_a_worker_from_there(
    tmp_path: Path, db_url: str
) -> None:
    began = time.monotonic()
    WHEELHOUSE.mkdir(parents=True, exist_ok=True)
    if not any(WHEELHOUSE.glob("setuptools-*.whl")):  # the build backend, for --no-index
        _ok(_pip("wheel", "-q", "-w", str(WHEELHOUSE), "setuptools>=68", offline=False))
    # Built from a copy of what the wheel is made of: setuptools builds in the source tree and
    # reuses its build/lib, where a file deleted from the tree lives on into the next wheel;
    # and the test leaves no build/ or egg-info in the clone.
    source = tmp_path / "source"
    source.mkdir()
    for name in BUILT_FROM:
        if (REPO / name).is_dir():
            skip = shutil.ignore_patterns("__pycache__")
            shutil.copytree(REPO / name, source / name, symlinks=True, ignore=skip)
        else:
            shutil.copy2(REPO / name, source / name)
    dist = tmp_path / "dist"
    _ok(_pip("wheel", "-q", "--no-deps", "-w", str(dist), str(source), offline=True))
    (wheel,) = dist.glob("vultrscale-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    _install(venv / "bin" / "python", wheel)
    installed = time.monotonic()

    # Nothing of the project's: no PYTHONPATH, no VIRTUAL_ENV, a working directory of its own.
    env = {
        "PATH": f"{venv / 'bin'}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(tmp_path),
        "LANG": "C.UTF-8",
    }
    home = tmp_path / "work"
    home.mkdir()

    def run(*args: str, timeout: float = 60) -> str:
        result = subprocess.run(
            [str(venv / "bin" / "vultrscale"), *args],
            env=env,
            cwd=home,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        return result.stdout

    def python(code: str) -> str:
        """``code`` run by the venv's python, as the package's own code would run."""
        result = subprocess.run(
            [str(venv / "bin" / "python"), "-c", code],
            env=env,
            cwd=home,
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stdout

    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert run("--version").strip() == f"vultrscale {version}"
    # The files the package ships: the same as the repository's, read from the wheel's copy.
    shipped = python(SHIPPED).split()
    assert shipped[0].startswith(str(venv)), shipped  # the wheel's copy, not the repository's
    expected = sorted(p.name for d in ("deploy", "cloud-init") for p in (REPO / d).iterdir())
    assert sorted(shipped[1:]) == expected
    # Every module of the tree is in the wheel, and imports from there.
    modules = python(MODULES).split()
    in_tree = {
        ".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        for p in (REPO / "vultrscale").rglob("*.py")
        if p.name != "__main__.py" and "__pycache__" not in p.parts
    } - {"vultrscale"}
    assert in_tree <= set(modules), in_tree - set(modules)

    # User-data from the shipped templates: the worker's env file, its unit's drop-in, the
    # sudoers rule.
    key = tmp_path / "scaler"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    env.update(
        DATABASE_URL=db_url,
        WORKER_DATABASE_URL=db_url,
        VULTRSCALE_FLEET_SSH_KEY=str(key),
    )
    user_data = run("cloud-init", "render", "--label", "worker-wheel")
    for shipped_line in (
        "/etc/vultrscale/worker.env",
        "/etc/systemd/system/worker.service.d/vultrscale.conf",
        "/etc/sudoers.d/vultrscale-worker",
        'VULTRSCALE_WORKER_ID=\\"worker-wheel\\"',
    ):
        assert shipped_line in user_data, shipped_line

    # The installed worker takes a real job off the queue, then stops cleanly on SIGTERM.
    run("enqueue", "--queue", "wheel")
    worker = subprocess.Popen(
        [str(venv / "bin" / "vultrscale"), "worker", "--app", "vultrscale.worker.examples:noop"]
        + ["--queue", "wheel", "--drain-seconds", "5s"],
        env={**env, "PYTHONUNBUFFERED": "1"},
        cwd=home,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        with psycopg.connect(db_url) as conn:
            wait_for(
                lambda: (
                    conn.execute(
                        "SELECT count(*) FROM jobs WHERE queue = 'wheel' AND state = 'succeeded'"
                    ).fetchone()
                    == (1,)
                ),
                "the installed worker to run the job",
                timeout=30,
            )
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    output = worker.stdout.read() if worker.stdout else ""
    assert code == 0, output
    assert "Traceback" not in output, output
    print(
        f"wheel built and installed in {installed - began:.1f} s, "
        f"then checked in {time.monotonic() - installed:.1f} s"
    )
