"""The demo's simulated hosts against the real SSH drain: the user-data decides the host key,
the login key, the sudo rule and the stop timeout; the unit behaves like systemd's.

The "worker" here is a small Python process with the same signal behaviour as the real one
(drain on SIGTERM, exit 0), so these tests take seconds; test_demo.py runs the real worker.
"""

from __future__ import annotations

import base64
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import paramiko
import pytest

from tests.e2e.worker_procs import wait_for
from vultrscale import cloudinit, demo, ssh
from vultrscale.core.model import HostTarget, ServiceState
from vultrscale.errors import HostKeyMismatch, SSHError
from vultrscale.fake_vultr.hosts import (
    BootFailed,
    LoopbackIps,
    SimulatedHost,
    SSHCounters,
    WorkerUnit,
    parse_env_file,
    parse_user_data,
)

pytestmark = pytest.mark.e2e

Boot = Callable[..., tuple[SimulatedHost, str]]

# Drains on SIGTERM (half a second), exits 0; ignores SIGTERM with IGNORE_TERM set; with CRASH
# exits 1 at once. Touches $READY once its signal handling is in place.
FAKE_WORKER = """
import os, signal, sys, time
if os.environ.get("IGNORE_TERM"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, lambda *a: (time.sleep(0.5), sys.exit(0)))
if os.environ.get("CRASH"):
    sys.exit(1)
open(os.environ["READY"], "w").close()
while True:
    time.sleep(0.1)
"""


class Scaler:
    """The scaler's side: its key on disk, a config, and user-data rendered for one label."""

    def __init__(self, tmp: Path) -> None:
        self.key_path = tmp / "scaler_ed25519"
        private, self.public = ssh.generate_host_key()
        self.key_path.touch(mode=0o600)
        self.key_path.write_text(private)
        # The fleet's SSH port, as the config names it; each host here listens on a port of
        # its own that the system picks (a port found free and let go could be taken by
        # another process before the host binds it), and the targets name that port.
        self.port = 22
        self.cfg = demo.demo_config(
            demo.Settings(),
            api_url="http://127.0.0.1:9",
            api_key="k",
            db_url="postgresql://demo:secret@127.0.0.1:5432/demo",
            ssh_key=str(self.key_path),
            ssh_port=self.port,
            queue="demo-q",
            fleet="demo-f",
        )

    def user_data(self, label: str) -> tuple[str, str]:
        """(user-data, the host key the scaler pins for it)."""
        host_private, host_public = ssh.generate_host_key()
        text = cloudinit.render_user_data(
            self.cfg, label, host_private, host_public, self.public, show_secrets=True
        )
        return text, host_public

    def target(self, host: SimulatedHost, pinned: str) -> HostTarget:
        f = self.cfg.fleet
        return HostTarget(host.label, host.address, host.ssh.port, f.ssh_user, pinned, f.service)


@pytest.fixture
def scaler(tmp_path: Path) -> Scaler:
    return Scaler(tmp_path)


@pytest.fixture
def boot(scaler: Scaler, tmp_path: Path) -> Iterator[Boot]:
    """Boot a host from user-data rendered for it: (host, the key the scaler pinned)."""
    started: list[SimulatedHost] = []
    ips = LoopbackIps(first=200)

    def _boot(
        label: str = "demo-1-abcd", user_data: str | None = None, **env: str
    ) -> tuple[SimulatedHost, str]:
        text, pinned = scaler.user_data(label)
        spec = parse_user_data(user_data or text)
        ready = tmp_path / f"{label}.ready"
        unit = WorkerUnit(
            label,
            [sys.executable, "-c", FAKE_WORKER],
            {**env, "READY": str(ready)},
            tmp_path,
            tmp_path / f"{label}.log",
            timeout_stop=spec.timeout_stop if "IGNORE_TERM" not in env else 1.0,
            restart_seconds=0.5,
        )
        host = SimulatedHost("id-" + label, ips.allocate(), spec, unit, 0, SSHCounters())
        host.start()
        started.append(host)
        if "CRASH" not in env:  # signal handlers are in place once it says so
            wait_for(ready.exists, "the worker to be ready", timeout=10)
        return host, pinned

    yield _boot
    for h in started:
        h.power_off()


def test_user_data_gives_the_host_its_key_login_sudo_rule_and_stop_timeout(
    scaler: Scaler,
) -> None:
    text, pinned = scaler.user_data("demo-1-abcd")
    spec = parse_user_data(text)
    assert spec.label == "demo-1-abcd" and spec.host_key_public == pinned
    assert spec.ssh_user == "worker" and spec.authorized_keys == (scaler.public,)
    assert spec.service == "worker"
    assert spec.sudo_allowed == {
        ("systemctl", "stop", "--no-block", "worker"),
        ("systemctl", "is-active", "worker"),
        ("systemctl", "start", "--no-block", "worker"),
    }
    assert spec.timeout_stop == 15  # drain_seconds 5 + the 10 s margin
    assert spec.env["DATABASE_URL"] == "postgresql://demo:secret@127.0.0.1:5432/demo"
    assert spec.env["VULTRSCALE_WORKER_ID"] == "demo-1-abcd"
    assert spec.env["VULTRSCALE_WORKER_APP"] == demo.APP
    assert spec.env["VULTRSCALE_WORKER_QUEUE"] == "demo-q"
    assert "secret" not in repr(spec) and "PRIVATE" not in repr(spec)


def test_env_file_quoting_round_trips() -> None:
    value = 'p@ss"w\\rd$HOME`x`'
    assert parse_env_file(f"# c\nA={cloudinit.env_quote(value)}\n") == {"A": value}


def test_broken_user_data_fails_the_boot(scaler: Scaler) -> None:
    text, _ = scaler.user_data("demo-1-abcd")
    with pytest.raises(BootFailed, match="host key"):
        parse_user_data(text.replace("ed25519_public", "rsa_public"))
    with pytest.raises(BootFailed, match="worker.env"):
        parse_user_data(text.replace("/etc/vultrscale/worker.env", "/tmp/elsewhere"))
    with pytest.raises(BootFailed, match="cloud-config"):
        parse_user_data("just text\n")


def test_drain_stops_the_unit_over_ssh_with_systemd_answers(scaler: Scaler, boot: Boot) -> None:
    host, pinned = boot()
    target = scaler.target(host, pinned)
    with ssh.SSHDrain(str(scaler.key_path), connect_timeout=5, command_timeout=5) as drain:
        assert drain.is_active(target) is ServiceState.ACTIVE
        drain.stop(target)  # returns at once; the worker drains for half a second
        assert host.unit.state == "deactivating"
        assert drain.is_active(target) in (ServiceState.DEACTIVATING, ServiceState.INACTIVE)
        wait_for(lambda: drain.is_active(target) is ServiceState.INACTIVE, "inactive", timeout=10)
        drain.stop(target)  # stopping a stopped unit is fine, as with systemctl
    assert host.unit.exits == [0]
    assert host.counters.stop == 2 and host.counters.is_active >= 3
    assert host.counters.refused_commands == host.counters.refused_logins == 0


def test_a_start_over_ssh_brings_the_worker_back_after_its_drain_or_at_once(
    scaler: Scaler, boot: Boot, tmp_path: Path
) -> None:
    host, pinned = boot()
    target = scaler.target(host, pinned)
    ready = tmp_path / f"{host.label}.ready"
    with ssh.SSHDrain(str(scaler.key_path), connect_timeout=5, command_timeout=5) as drain:
        ready.unlink()  # each new process says when its signal handlers are in place
        drain.stop(target)
        assert host.unit.state == "deactivating"
        # Still draining: the start waits for the old process to exit, as systemd's does.
        assert drain.start_many([target]) == {host.label: None}
        assert host.unit.state == "deactivating"
        wait_for(
            lambda: host.unit.exits == [0] and host.unit.state == "active",
            "the worker started again after its drain",
            timeout=10,
        )
        wait_for(ready.exists, "the new worker to be ready", timeout=10)
        drain.stop(target)
        wait_for(lambda: drain.is_active(target) is ServiceState.INACTIVE, "inactive", timeout=10)
        drain.start(target)  # stopped: it starts at once
        wait_for(lambda: host.unit.state == "active", "the worker started again", timeout=10)
    assert host.unit.exits == [0, 0]
    assert host.counters.start == 2 and host.counters.refused_commands == 0


def test_a_worker_that_ignores_sigterm_is_killed_after_timeout_stop(
    scaler: Scaler, boot: Boot
) -> None:
    host, pinned = boot(IGNORE_TERM="1")
    target = scaler.target(host, pinned)
    with ssh.SSHDrain(str(scaler.key_path), connect_timeout=5, command_timeout=5) as drain:
        drain.stop(target)
        assert drain.is_active(target) is ServiceState.DEACTIVATING
        wait_for(lambda: drain.is_active(target) is ServiceState.FAILED, "failed", timeout=10)
    assert host.unit.killed_on_timeout == 1


def test_a_crashed_worker_is_restarted_like_restart_on_failure(
    scaler: Scaler, boot: Boot, tmp_path: Path
) -> None:
    host, _ = boot(CRASH="1")
    wait_for(lambda: len(host.unit.exits) >= 2, "two crashes and a restart between", timeout=10)
    assert host.unit.exits[:2] == [1, 1]
    host.unit.stop()  # a stop during the restart wait cancels it
    wait_for(lambda: host.unit.state == "inactive", "inactive", timeout=10)


def test_the_host_presents_only_the_pinned_key(scaler: Scaler, boot: Boot) -> None:
    host, _ = boot()
    _, other_key = ssh.generate_host_key()
    target = scaler.target(host, other_key)
    with (
        ssh.SSHDrain(str(scaler.key_path), connect_timeout=5) as drain,
        pytest.raises(HostKeyMismatch),
    ):
        drain.is_active(target)
    assert host.unit.state == "active" and host.counters.is_active == 0


def test_the_host_lets_in_only_the_scalers_key(scaler: Scaler, boot: Boot, tmp_path: Path) -> None:
    host, pinned = boot()
    stranger = tmp_path / "stranger"
    stranger.touch(mode=0o600)
    stranger.write_text(ssh.generate_host_key()[0])
    target = scaler.target(host, pinned)
    with (
        ssh.SSHDrain(str(stranger), connect_timeout=5) as drain,
        pytest.raises(SSHError, match="refused the scaler's SSH key"),
    ):
        drain.stop(target)
    assert host.unit.state == "active" and host.counters.refused_logins >= 1


def _exec(scaler: Scaler, host: SimulatedHost, pinned: str, command: str) -> tuple[int, str]:
    client = paramiko.SSHClient()
    kind, b64 = pinned.split()[:2]
    key = paramiko.PKey.from_type_string(kind, base64.b64decode(b64))
    client.get_host_keys().add(f"[{host.address}]:{host.ssh.port}", key.get_name(), key)
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(
        host.address,
        port=host.ssh.port,
        username="worker",
        key_filename=str(scaler.key_path),
        allow_agent=False,
        look_for_keys=False,
        timeout=5,
    )
    try:
        _, out, err = client.exec_command(command, timeout=5)
        code = out.channel.recv_exit_status()
        return code, out.read().decode() + err.read().decode()
    finally:
        client.close()


@pytest.mark.parametrize(
    "command",
    [
        "sudo -n systemctl restart worker",
        "systemctl stop --no-block worker",  # without sudo
        "sudo -n systemctl stop --no-block other",
        "sudo -n sh -c 'kill 1'",
        "cat /etc/vultrscale/worker.env",
        "systemctl is-active worker; reboot",
    ],
    ids=["restart", "no-sudo", "other-unit", "shell", "read-env", "chained"],
)
def test_any_other_command_is_refused(scaler: Scaler, boot: Boot, command: str) -> None:
    host, pinned = boot()
    code, text = _exec(scaler, host, pinned, command)
    assert code == 1 and ("not allowed" in text or "password is required" in text)
    assert host.unit.state == "active" and host.counters.refused_commands == 1


def test_a_stop_the_sudoers_rule_does_not_allow_is_refused(scaler: Scaler, boot: Boot) -> None:
    text, pinned = scaler.user_data("demo-1-abcd")
    no_stop = text.replace("/usr/bin/systemctl stop --no-block worker, ", "")
    assert no_stop != text
    host, _ = boot(user_data=no_stop)
    target = scaler.target(host, host.spec.host_key_public)
    with (
        ssh.SSHDrain(str(scaler.key_path), connect_timeout=5) as drain,
        pytest.raises(SSHError, match="password is required"),
    ):
        drain.stop(target)
    assert host.unit.state == "active"
