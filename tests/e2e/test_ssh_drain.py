"""The SSH drain transport against real OpenSSH servers on loopback (see sshd_hosts.py).

The hosts run a real ``vultrscale worker`` behind a systemctl stand-in with systemd's stop
semantics, reached through real sudo with the project's sudoers rule. Nothing is mocked.
"""

from __future__ import annotations

import io
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import paramiko
import psycopg
import pytest

from tests.e2e import sshd_hosts
from vultrscale.core.model import HostTarget, ServiceState
from vultrscale.db import queue
from vultrscale.errors import HostKeyMismatch, HostUnreachable, SSHError, UsageError
from vultrscale.ssh import SSHDrain, generate_host_key

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0, reason="starts sshd and adds a sudoers rule: root"),
    pytest.mark.skipif(not Path("/usr/sbin/sshd").exists(), reason="openssh-server missing"),
    pytest.mark.skipif(shutil.which("sudo") is None, reason="sudo missing (apt-get install sudo)"),
]

wait_for = sshd_hosts.wait_for

HANDLERS = '''
import time


def slow_first_attempt(job):
    """The first attempt outlives any drain; a later attempt finishes at once."""
    if job.attempt == 1:
        time.sleep(120)
'''


def _keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    path.chmod(0o600)
    return path


@pytest.fixture(scope="session")
def client_key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _keygen(tmp_path_factory.mktemp("scaler") / "id_ed25519")


@pytest.fixture(scope="session")
def hosts(client_key: Path) -> Iterator[sshd_hosts.Hosts]:
    started = sshd_hosts.start_hosts(2, client_key, first_address=41)
    handlers = started.root / "handlers"
    handlers.mkdir(mode=0o755)
    (handlers / "drain_handlers.py").write_text(HANDLERS)
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def host(hosts: sshd_hosts.Hosts) -> Iterator[sshd_hosts.Host]:
    """Host 0 with no service running; whatever a test starts is stopped afterwards."""
    h = hosts.hosts[0]
    yield h
    pid = h.main_pid()
    if pid and h.state() not in ("inactive", "failed"):
        sshd_hosts._kill_group(pid, 9)
        wait_for(lambda: h.state() in ("inactive", "failed"), 10, "service to end")


@pytest.fixture
def drain(client_key: Path) -> Iterator[SSHDrain]:
    with SSHDrain(str(client_key), connect_timeout=5, command_timeout=10) as d:
        yield d


def _worker_argv() -> list[str]:
    exe = shutil.which("vultrscale")
    assert exe, "the vultrscale console script is not installed"
    return [exe, "worker"]


def _worker_env(db_url: str, label: str, app: str, hosts: sshd_hosts.Hosts, **extra: str) -> dict:
    return {
        "DATABASE_URL": db_url,
        "VULTRSCALE_WORKER_ID": label,
        "VULTRSCALE_WORKER_APP": app,
        "VULTRSCALE_WORKER_CONCURRENCY": "1",
        "PYTHONPATH": str(hosts.root / "handlers"),
        **extra,
    }


def _job(db_url: str, job_id: int) -> tuple[str, int, str | None]:
    with psycopg.connect(db_url) as conn:
        row = conn.execute(
            "SELECT j.state, j.attempts, l.worker_id FROM jobs j "
            "LEFT JOIN job_leases l ON l.job_id = j.id AND l.expires_at > now() WHERE j.id = %s",
            (job_id,),
        ).fetchone()
    assert row is not None
    return row[0], row[1], row[2]


def _accepted(host: sshd_hosts.Host) -> int:
    """How many SSH logins the host's sshd accepted so far."""
    return (host.dir / "sshd.log").read_text(errors="replace").count("Accepted publickey")


def test_stop_goes_deactivating_then_inactive_and_the_job_finishes(
    hosts: sshd_hosts.Hosts, host: sshd_hosts.Host, drain: SSHDrain, db_url: str
) -> None:
    with psycopg.connect(db_url) as conn:
        [job_id] = queue.enqueue(conn, [{"step_seconds": 0.4}])
    env = _worker_env(
        db_url, host.label, "vultrscale.worker.examples:three_steps", hosts,
        VULTRSCALE_WORKER_DRAIN_SECONDS="30", VULTRSCALE_WORKER_LEASE_SECONDS="10",
    )  # fmt: skip
    hosts.start_service(host, _worker_argv(), timeout_stop_sec=40, env=env)
    target = host.target()
    assert drain.is_active(target) is ServiceState.ACTIVE
    wait_for(lambda: _job(db_url, job_id)[2] == host.label, 20, "the worker to lease the job")

    drain.stop(target)
    # The worker is mid-job: systemd reports the stop in progress.
    assert drain.is_active(target) is ServiceState.DEACTIVATING
    state = wait_for(
        lambda: (s := drain.is_active(target)).stopped and s, 20, "the service to stop"
    )
    assert state is ServiceState.INACTIVE
    assert _job(db_url, job_id)[0] == "succeeded"  # drained, not killed
    # The stop went through sudo (uid 0) with exactly the documented arguments.
    assert "0 stop --no-block worker" in host.commands()
    # One connection served every command of this pass.
    assert _accepted(host) >= 1
    before = _accepted(host)
    drain.is_active(target)
    assert _accepted(host) == before


def test_drain_past_timeout_stop_sec_ends_failed_and_the_job_comes_back_by_lease(
    hosts: sshd_hosts.Hosts, host: sshd_hosts.Host, drain: SSHDrain, db_url: str
) -> None:
    with psycopg.connect(db_url) as conn:
        [job_id] = queue.enqueue(conn, [{}])
    env = _worker_env(
        db_url, host.label, "drain_handlers:slow_first_attempt", hosts,
        VULTRSCALE_WORKER_DRAIN_SECONDS="60", VULTRSCALE_WORKER_LEASE_SECONDS="3",
    )  # fmt: skip
    hosts.start_service(host, _worker_argv(), timeout_stop_sec=1.5, env=env)
    target = host.target()
    wait_for(lambda: _job(db_url, job_id)[2] == host.label, 20, "the worker to lease the job")

    drain.stop(target)
    state = wait_for(lambda: (s := drain.is_active(target)).stopped and s, 15, "SIGKILL")
    assert state is ServiceState.FAILED
    assert (host.service_dir / "result").read_text() == "killed"
    assert _job(db_url, job_id)[:2] == ("leased", 1)  # killed: nothing was given back

    # The lease runs out; a fresh worker (the replacement instance, with its own label: the
    # killed worker's row stays draining) takes the job and ends it.
    env["VULTRSCALE_WORKER_ID"] = f"{host.label}-replacement"
    hosts.start_service(host, _worker_argv(), timeout_stop_sec=5, env=env)
    wait_for(lambda: _job(db_url, job_id)[0] == "succeeded", 30, "the job to come back")
    assert _job(db_url, job_id)[1] == 2
    drain.stop(target)
    wait_for(lambda: drain.is_active(target).stopped, 15, "the second worker to stop")


def test_a_host_with_another_key_is_refused_and_nothing_runs(
    hosts: sshd_hosts.Hosts, drain: SSHDrain
) -> None:
    good, other = hosts.hosts
    _, impostor_key = generate_host_key()
    before, logins = other.commands(), _accepted(other)
    with pytest.raises(HostKeyMismatch, match="host key other than the one pinned"):
        drain.stop(other.target(host_key=impostor_key))
    # In a parallel pass the mismatch is reported for that host only.
    results = drain.is_active_many([good.target(), other.target(host_key=good.host_key)])
    assert isinstance(results[other.label], HostKeyMismatch)
    assert isinstance(results[good.label], ServiceState)
    assert other.commands() == before
    assert _accepted(other) == logins  # refused before authenticating: no login, no command


@pytest.mark.parametrize("served", ["rsa", "ecdsa"])
def test_a_host_serving_no_key_of_the_pinned_type_is_a_host_key_mismatch(
    hosts: sshd_hosts.Hosts, drain: SSHDrain, served: str
) -> None:
    # The pinned key is ed25519 (as at create); this sshd serves only an rsa or ecdsa key.
    _, pinned = generate_host_key()
    address = "127.0.0.45" if served == "rsa" else "127.0.0.46"
    with sshd_hosts.extra_host(hosts, address, key_type=served) as other:
        assert not other.host_key.startswith("ssh-ed25519")
        with pytest.raises(HostKeyMismatch, match="no host key of the pinned type") as info:
            drain.is_active(other.target(host_key=pinned))
        assert "nothing was run" in info.value.message and info.value.hint
        results = drain.stop_many([other.target(host_key=pinned)])
        assert isinstance(results[other.label], HostKeyMismatch)
        assert other.commands() == []
        assert _accepted(other) == 0  # refused before authenticating: no login, no command


def test_connections_send_without_nagle_and_prefer_aes_gcm(
    hosts: sshd_hosts.Hosts, drain: SSHDrain
) -> None:
    # With Nagle on, a login stalls on a delayed ACK (~40 ms) and so does a command sent right
    # after another; GCM spares paramiko a Python HMAC check per packet.
    target = hosts.hosts[1].target()
    assert isinstance(drain.is_active(target), ServiceState)
    transport = drain._client(target).get_transport()
    assert transport is not None
    assert transport.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    assert transport.local_cipher == transport.remote_cipher == "aes128-gcm@openssh.com"


def test_a_host_without_aes_gcm_is_reached_with_another_cipher(
    hosts: sshd_hosts.Hosts, drain: SSHDrain
) -> None:
    with sshd_hosts.extra_host(hosts, "127.0.0.47", sshd_options="Ciphers aes128-ctr\n") as old:
        assert isinstance(drain.is_active(old.target()), ServiceState)
        transport = drain._client(old.target()).get_transport()
        assert transport is not None and transport.local_cipher == "aes128-ctr"


def test_a_silent_host_is_unreachable_within_the_connect_timeout(
    hosts: sshd_hosts.Hosts, client_key: Path
) -> None:
    good = hosts.hosts[1]
    silent = []
    for i in range(2):
        # Listening sockets that accept the TCP handshake (backlog) and never speak.
        s = socket.socket()
        s.bind((f"127.0.0.{60 + i}", 0))
        s.listen(8)
        silent.append(s)
    # Bound and never listened on: refused, and no other process can take the port meanwhile.
    refusing = socket.socket()
    refusing.bind(("127.0.0.62", 0))
    refused_port = refusing.getsockname()[1]
    targets = [
        HostTarget(f"silent-{i}", f"127.0.0.{60 + i}", s.getsockname()[1], hosts.user,
                   good.host_key, "worker")
        for i, s in enumerate(silent)
    ]  # fmt: skip
    refused = HostTarget("refused", "127.0.0.62", refused_port, hosts.user, good.host_key, "worker")
    try:
        with SSHDrain(str(client_key), connect_timeout=1.0, command_timeout=5) as drain:
            started = time.monotonic()
            with pytest.raises(HostUnreachable, match="no SSH banner within 1s"):
                drain.is_active(targets[0])
            assert time.monotonic() - started < 3
            with pytest.raises(HostUnreachable, match="refused"):
                drain.stop(refused)

            # Two silent hosts and a good one in one parallel pass: nobody waits in line.
            started = time.monotonic()
            results = drain.is_active_many([*targets, good.target()])
            elapsed = time.monotonic() - started
        assert all(isinstance(results[t.label], HostUnreachable) for t in targets)
        assert isinstance(results[good.label], ServiceState)
        assert elapsed < 1.9, f"silent hosts were waited for one after another ({elapsed:.2f}s)"
    finally:
        for s in [*silent, refusing]:
            s.close()


def test_a_command_that_hangs_times_out_and_the_next_pass_reconnects(
    hosts: sshd_hosts.Hosts, client_key: Path
) -> None:
    # A host of its own, and the hung command waited for: released, it still runs and logs
    # its line, and on the shared host that line landed in the next test's log.
    with sshd_hosts.extra_host(hosts, "127.0.0.48") as host:
        hang = host.service_dir / "hang"
        hang.touch()
        try:
            with SSHDrain(str(client_key), connect_timeout=5, command_timeout=1.0) as drain:
                started = time.monotonic()
                with pytest.raises(SSHError, match="gave no answer within 1s"):
                    drain.is_active(host.target())
                assert time.monotonic() - started < 3
                hang.unlink()
                # The timed-out connection was dropped; the next command connects afresh.
                assert drain.is_active(host.target()) is ServiceState.INACTIVE
        finally:
            hang.unlink(missing_ok=True)
            wait_for(lambda: len(host.commands()) == 2, 10, "the hung command to end")


@pytest.mark.parametrize(
    "service",
    ["worker; rm -rf /", "worker'", 'worker"', "my worker", "$(id)", "worker\nid", "", "-h"],
    ids=["semicolon", "quote", "dquote", "space", "subst", "newline", "empty", "option"],
)
def test_an_injected_service_name_is_rejected_before_anything_is_sent(
    hosts: sshd_hosts.Hosts, drain: SSHDrain, service: str
) -> None:
    # Fresh hosts: nothing another test ran can show up in their logs.
    with (
        sshd_hosts.extra_host(hosts, "127.0.0.49") as host,
        sshd_hosts.extra_host(hosts, "127.0.0.50") as first,
    ):
        bad = host.target(service=service)
        with pytest.raises(UsageError, match="refusing service name"):
            drain.stop(bad)
        with pytest.raises(UsageError, match="refusing service name"):
            drain.is_active(bad)
        # One bad target stops the whole parallel pass before any host is contacted.
        with pytest.raises(UsageError):
            drain.stop_many([first.target(), bad])
        assert _accepted(host) == _accepted(first) == 0
        assert host.commands() == first.commands() == []


def test_a_key_the_host_does_not_authorize_is_an_ssh_error_with_a_hint(
    hosts: sshd_hosts.Hosts, tmp_path: Path
) -> None:
    stranger = _keygen(tmp_path / "stranger")
    with (
        SSHDrain(str(stranger), connect_timeout=5) as drain,
        pytest.raises(SSHError, match="refused the scaler's SSH key") as info,
    ):
        drain.is_active(hosts.hosts[1].target())
    assert not isinstance(info.value, HostKeyMismatch | HostUnreachable)
    assert "Authorize the public half" in info.value.hint


def test_a_key_file_readable_by_others_or_missing_is_refused(tmp_path: Path) -> None:
    key = _keygen(tmp_path / "id")
    secret = key.read_text()
    key.chmod(0o644)
    with pytest.raises(UsageError, match="accessible by group or others") as info:
        SSHDrain(str(key))
    assert info.value.hint == f"chmod 600 {key}"
    assert info.value.exit_code == 2
    key.chmod(0o640)
    with pytest.raises(UsageError):
        SSHDrain(str(key))
    with pytest.raises(UsageError, match="does not exist") as missing:
        SSHDrain(str(tmp_path / "nope"))
    assert missing.value.exit_code == 2
    body = secret.splitlines()[1]
    assert body not in str(info.value) + info.value.hint


def test_a_key_systemd_passes_as_a_credential_is_accepted_though_stat_shows_group_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # systemd writes a credential 0400 and grants the unit's user read by an ACL entry where the
    # file system has ACLs (tmpfs: systemd >= 255 on Ubuntu 24.04, Debian 13), so stat shows
    # the ACL's mask in the group bits: 0440. The scaler's service then refused its own key at
    # its first pass (exit 2, not restarted).
    creds = tmp_path / "credentials" / "vultrscale.service"
    creds.mkdir(parents=True)
    key = _keygen(creds / "ssh_key")
    key.chmod(0o440)
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    SSHDrain(str(key)).close()
    key.chmod(0o444)  # readable by others: not what systemd makes, refused there too
    with pytest.raises(UsageError, match="accessible by group or others"):
        SSHDrain(str(key))
    key.chmod(0o440)  # the same key outside the unit's credentials: refused as before
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    with pytest.raises(UsageError, match="accessible by group or others"):
        SSHDrain(str(key))


def test_generated_host_keys_are_served_by_sshd_and_pinned(
    hosts: sshd_hosts.Hosts, drain: SSHDrain
) -> None:
    # Each host serves the key generate_host_key made for it; pinning accepts exactly that one.
    results = drain.is_active_many([h.target() for h in hosts.hosts])
    assert all(isinstance(r, ServiceState) for r in results.values()), results
    private, public = generate_host_key()
    assert private.startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    loaded = paramiko.Ed25519Key.from_private_key(io.StringIO(private))
    assert public == f"ssh-ed25519 {loaded.get_base64()}"


def test_start_brings_a_worker_back_after_its_drain_or_at_once_when_it_has_stopped(
    hosts: sshd_hosts.Hosts, host: sshd_hosts.Host, drain: SSHDrain, db_url: str
) -> None:
    # A revive: `sudo -n systemctl start --no-block` over the pinned SSH. While the unit is
    # still deactivating (its worker mid-job), systemd keeps the start job waiting and runs it
    # once the old process has exited: the job in hand finishes, not killed, and a new worker
    # process then runs and claims.
    with psycopg.connect(db_url) as conn:
        [job_id] = queue.enqueue(conn, [{"step_seconds": 0.4}])
    env = _worker_env(
        db_url, host.label, "vultrscale.worker.examples:three_steps", hosts,
        VULTRSCALE_WORKER_DRAIN_SECONDS="30", VULTRSCALE_WORKER_LEASE_SECONDS="10",
    )  # fmt: skip
    hosts.start_service(host, _worker_argv(), timeout_stop_sec=40, env=env)
    target = host.target()
    wait_for(lambda: _job(db_url, job_id)[2] == host.label, 20, "the worker to lease the job")
    first = host.main_pid()

    drain.stop(target)
    assert drain.is_active(target) is ServiceState.DEACTIVATING
    assert drain.start_many([target]) == {host.label: None}
    assert drain.is_active(target) is ServiceState.DEACTIVATING  # the start waits for the drain
    wait_for(
        lambda: host.main_pid() not in (None, first) and host.state() == "active",
        30,
        "the queued start to run once the drain ended",
    )
    assert _job(db_url, job_id)[0] == "succeeded"  # drained, not killed
    with psycopg.connect(db_url) as conn:
        [again] = queue.enqueue(conn, [{"step_seconds": 0.1}])
    wait_for(lambda: _job(db_url, again)[0] == "succeeded", 20, "the new worker to run a job")

    # Stopped and inactive: the start runs at once.
    second = host.main_pid()
    drain.stop(target)
    wait_for(lambda: drain.is_active(target).stopped, 20, "the service to stop")
    drain.start(target)
    wait_for(
        lambda: host.main_pid() not in (None, second) and host.state() == "active",
        20,
        "the worker to start again",
    )
    # Through sudo (uid 0), with exactly the documented arguments, twice.
    assert host.commands().count("0 start --no-block worker") == 2


@pytest.mark.parametrize(
    ("args", "allowed"),
    [
        (["stop", "--no-block", "worker"], True),
        (["is-active", "worker"], True),
        (["stop", "worker"], False),  # a blocking stop would hold the pass
        (["restart", "worker"], False),
        (["stop", "--no-block", "ssh"], False),
        (["stop", "--no-block", "worker", "ssh"], False),
        (["start", "--no-block", "worker"], True),  # a revive
        (["start", "worker"], False),  # a blocking start would wait out the drain
        (["start", "--no-block", "ssh"], False),
        (["start", "--no-block", "worker", "ssh"], False),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else str(v),
)
def test_the_sudoers_rule_allows_only_the_three_commands(
    hosts: sshd_hosts.Hosts, args: list[str], allowed: bool
) -> None:
    # `sudo -l -U user CMD` asks the real sudo policy (the project's rule, installed by the
    # fixture) whether the user may run exactly CMD.
    assert hosts.bin_dir is not None
    command = [str(hosts.bin_dir / "systemctl"), *args]
    result = subprocess.run(
        ["sudo", "-n", "-l", "-U", hosts.user, *command], capture_output=True, text=True
    )
    assert (result.returncode == 0) is allowed, result.stdout + result.stderr
