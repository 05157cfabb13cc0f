"""Simulated worker instances on loopback: one real OpenSSH server per 127.0.0.x address.

Each host has its own ed25519 host key (made by ``vultrscale.ssh.generate_host_key``, as at
create), its own service directory, and a ``systemctl`` stand-in first on the login user's PATH
that gives a real process systemd's stop semantics:

- ``start``: a supervisor (as systemd) launches ExecStart and records ``active``;
- ``stop --no-block``: records ``deactivating`` and returns at once; the supervisor sends
  SIGTERM, then SIGKILL after TimeoutStopSec;
- ``start --no-block`` (root): starts an inactive or failed service; while it is deactivating
  the start waits, as systemd's start job does, and runs once the old process has exited;
- ``is-active``: prints active/deactivating/inactive/failed; exit 0 only for ``active``.

``sudo -n`` is real: a sudoers drop-in rendered from cloud-init/sudoers-worker.tmpl (pointed at
the stand-in) lets the test user run exactly the three systemctl commands as root.

Requires root, ``/usr/sbin/sshd`` and ``sudo``. Used by tests/e2e/test_ssh_drain.py and
scripts/bench_drain.py.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vultrscale.cloudinit import render_sudoers
from vultrscale.core.model import HostTarget
from vultrscale.ssh import generate_host_key

SSHD = "/usr/sbin/sshd"
# The login user's name, with this process's id: test runs on the same machine (several
# worktrees, CI) each get their own authorized_keys and sudo rule. One shared user had its key
# replaced by another run's, and this run's logins were refused half-way through.
TEST_USER = "vsdrain"

# The systemctl stand-in. Its state lives in $VS_SERVICE_DIR (kept by sudo via env_keep).
STANDIN = r"""
import fcntl, json, os, signal, subprocess, sys, time

D = os.environ.get("VS_SERVICE_DIR", "")


def locked():
    f = open(os.path.join(D, "lock"), "a")
    fcntl.flock(f, fcntl.LOCK_EX)
    return f


def read(name, default=""):
    try:
        with open(os.path.join(D, name)) as f:
            return f.read().strip()
    except FileNotFoundError:
        return default


def write(name, text):
    tmp = os.path.join(D, name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, os.path.join(D, name))


def log(line):
    with open(os.path.join(D, "commands.log"), "a") as f:
        f.write(f"{os.getuid()} {line}\n")


def wake_supervisor():
    # Tell the supervisor the state changed (call with the lock held), as systemd acts on a
    # stop job at once. The supervisor removes its pid file, under the lock, before it exits.
    pid = read("supervisor_pid")
    if pid:
        try:
            os.kill(int(pid), signal.SIGUSR1)
        except ProcessLookupError:
            pass


def supervise():
    # Event-driven, like systemd: it sleeps until the service exits (SIGCHLD), a stop is
    # requested (SIGUSR1 from the stop command) or TimeoutStopSec runs out. It used to poll
    # every 50 ms, which with 20 hosts on one machine cost the drain benchmark a good share of
    # the CPU it measures; a real host's systemd costs the scaler's machine nothing.
    signal.signal(signal.SIGUSR1, lambda *_: None)  # a stop before the mask below is harmless
    conf = json.loads(read("unit.json"))
    out = open(os.path.join(D, "service.log"), "ab")
    proc = subprocess.Popen(conf["exec_start"], env={**os.environ, **conf.get("env", {})},
                            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    wake = {signal.SIGUSR1, signal.SIGCHLD}
    # Blocked after Popen (the service must not inherit the mask): from here on a wake-up is
    # kept pending until sigtimedwait takes it, so none is lost between a check and the wait.
    signal.pthread_sigmask(signal.SIG_BLOCK, wake)
    with locked():
        write("supervisor_pid", str(os.getpid()))
        write("main_pid", str(proc.pid))
        write("state", "active")
    stop_at = None
    killed = False
    while True:
        code = proc.poll()
        if code is not None:
            break
        if stop_at is None and read("state") == "deactivating":
            proc.send_signal(signal.SIGTERM)
            stop_at = time.monotonic()
        if stop_at is None or killed:
            signal.sigwaitinfo(wake)
            continue
        left = stop_at + conf["timeout_stop_sec"] - time.monotonic()
        if left <= 0:
            proc.kill()  # systemd: "State 'stop-sigterm' timed out. Killing."
            killed = True
        else:
            signal.sigtimedwait(wake, left)
    clean = not killed and code in (0, -signal.SIGTERM, 143)
    with locked():
        try:
            os.unlink(os.path.join(D, "supervisor_pid"))
        except FileNotFoundError:
            pass
        write("result", "killed" if killed else f"exit {code}")
        write("state", "inactive" if clean else "failed")
        if read("start_queued"):
            # systemd ran the start job that waited while the unit stopped.
            os.unlink(os.path.join(D, "start_queued"))
            write("state", "activating")
            spawn_supervisor()


def spawn_supervisor():
    subprocess.Popen([sys.executable, __file__, "_supervise"], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)


def main(argv):
    log(" ".join(argv))
    unit = read("service")
    if argv[:1] == ["start"] and argv[1:] == [unit]:
        with locked():
            write("state", "activating")
        spawn_supervisor()
        return 0
    if argv[:2] == ["start", "--no-block"] and argv[2:] == [unit]:
        if os.getuid() != 0:
            print("Failed to start unit: Access denied", file=sys.stderr)
            return 4
        with locked():
            state = read("state", "inactive")
            if state == "deactivating":
                # systemd answers the start job "try again later" while the unit stops and
                # runs it once the old process has exited (the supervisor does that).
                write("start_queued", "1")
            elif state in ("inactive", "failed"):
                write("state", "activating")
                spawn_supervisor()
        return 0  # active or activating: already on it
    if argv[:1] == ["_supervise"]:
        supervise()
        return 0
    if argv[:2] == ["stop", "--no-block"] and argv[2:] == [unit]:
        if os.getuid() != 0:
            print("Failed to stop unit: Access denied", file=sys.stderr)
            return 4
        with locked():
            if read("state") in ("active", "activating"):
                write("state", "deactivating")
                wake_supervisor()
        return 0
    if argv[:1] == ["is-active"] and len(argv) == 2:
        state = read("state", "inactive") if argv[1] == unit else "inactive"
        print(state)
        return 0 if state == "active" else 3
    print(f"systemctl stand-in: unsupported: {argv}", file=sys.stderr)
    return 1


sys.exit(main(sys.argv[1:]))
"""


FAST_SH = r"""#!/bin/sh
D="$VS_SERVICE_DIR"
read -r unit <"$D/service"
# A hung host: answer nothing while the file "hang" exists.
while [ -f "$D/hang" ]; do sleep 0.05; done
if [ "$1" = is-active ] && [ $# -eq 2 ]; then
    uid=$(id -u)
    printf '%s is-active %s\n' "$uid" "$2" >>"$D/commands.log"
    state=inactive
    if [ "$2" = "$unit" ] && [ -f "$D/state" ]; then read -r state <"$D/state"; fi
    echo "$state"
    [ "$state" = active ] && exit 0
    exit 3
fi
if [ "$1" = stop ] && [ "$2" = --no-block ] && [ $# -eq 3 ] && [ "$3" = "$unit" ]; then
    uid=$(id -u)
    printf '%s stop --no-block %s\n' "$uid" "$3" >>"$D/commands.log"
    if [ "$uid" != 0 ]; then echo "Failed to stop unit: Access denied" >&2; exit 4; fi
    exec 9>>"$D/lock"
    flock 9
    state=inactive
    if [ -f "$D/state" ]; then read -r state <"$D/state"; fi
    case "$state" in
        active|activating)
            printf deactivating >"$D/state.tmp"; chmod 644 "$D/state.tmp"
            mv "$D/state.tmp" "$D/state"
            # Wake the supervisor (see wake_supervisor in systemctl.py); kill is a builtin.
            sup=
            if [ -f "$D/supervisor_pid" ]; then read -r sup <"$D/supervisor_pid"; fi
            if [ -n "$sup" ]; then kill -USR1 "$sup" 2>/dev/null || true; fi;;
    esac
    exit 0
fi
exec @PYTHON@ @BIN@/systemctl.py "$@"
"""


def wait_for(
    condition: Callable[[], object], timeout: float, what: str, interval: float = 0.02
) -> object:
    """Poll ``condition`` until it returns something truthy; AssertionError at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


def free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


def run_user() -> str:
    """This test run's own login user (see TEST_USER)."""
    return f"{TEST_USER}{os.getpid()}"


def ensure_user(name: str) -> pwd.struct_passwd:
    """A non-root login user with ~/.ssh, unlocked for key login (sshd refuses ``!``)."""
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "-m", "-s", "/bin/sh", name], check=True)
        pw = pwd.getpwnam(name)
    subprocess.run(["usermod", "-p", "*", name], check=True)
    ssh_dir = Path(pw.pw_dir) / ".ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    os.chown(ssh_dir, pw.pw_uid, pw.pw_gid)
    ssh_dir.chmod(0o700)
    return pw


@dataclass
class Host:
    """One simulated instance: an sshd on ``address:port`` and a service directory."""

    label: str
    address: str
    port: int
    host_key: str  # public line, as pinned in the ledger
    dir: Path
    service: str
    user: str
    sshd: subprocess.Popen[bytes] | None = None

    @property
    def service_dir(self) -> Path:
        return self.dir / "service"

    def target(self, *, host_key: str | None = None, service: str | None = None) -> HostTarget:
        return HostTarget(
            label=self.label,
            address=self.address,
            port=self.port,
            user=self.user,
            host_key=self.host_key if host_key is None else host_key,
            service=self.service if service is None else service,
        )

    def state(self) -> str:
        path = self.service_dir / "state"
        return path.read_text().strip() if path.exists() else "inactive"

    def stopped(self) -> bool:
        return self.state() in ("inactive", "failed")

    def commands(self) -> list[str]:
        """Every systemctl invocation the host received (``uid argv``)."""
        path = self.service_dir / "commands.log"
        return path.read_text().splitlines() if path.exists() else []

    def main_pid(self) -> int | None:
        path = self.service_dir / "main_pid"
        return int(path.read_text()) if path.exists() else None


@dataclass
class Hosts:
    """N sshd hosts sharing one login user and one systemctl stand-in."""

    root: Path
    user: str
    service: str
    client_key: Path
    hosts: list[Host] = field(default_factory=list)
    sudoers: Path | None = None
    bin_dir: Path | None = None

    def start_service(
        self,
        host: Host,
        exec_start: Sequence[str],
        *,
        timeout_stop_sec: float,
        env: dict[str, str] | None = None,
    ) -> None:
        """Start the unit on ``host`` (as systemd would at boot) and wait until it is active."""
        unit = {"exec_start": list(exec_start), "timeout_stop_sec": timeout_stop_sec}
        unit["env"] = env or {}
        sd = host.service_dir
        for name in ("state", "result", "main_pid", "supervisor_pid", "start_queued"):
            (sd / name).unlink(missing_ok=True)
        (sd / "unit.json").write_text(json.dumps(unit))
        (sd / "unit.json").chmod(0o600)  # may hold DATABASE_URL: root only, like worker.env
        assert self.bin_dir is not None
        subprocess.run(
            [str(self.bin_dir / "systemctl"), "start", host.service],
            env={**os.environ, "VS_SERVICE_DIR": str(sd)},
            check=True,
        )
        wait_for(lambda: host.state() == "active", 20, f"{host.label} to become active")

    def stop(self) -> None:
        """Stop every sshd and service process, remove the sudoers drop-in and the run's own
        login user."""
        try:
            self._stop_processes()
        finally:
            if self.sudoers is not None:
                self.sudoers.unlink(missing_ok=True)
            shutil.rmtree(self.root, ignore_errors=True)
            if self.user == run_user():
                subprocess.run(["userdel", "-r", self.user], capture_output=True, check=False)

    def _stop_processes(self) -> None:
        for host in self.hosts:
            pid = host.main_pid()
            if pid and host.state() not in ("inactive", "failed"):
                _kill_group(pid)
            if host.sshd is not None and host.sshd.poll() is None:
                _terminate(host.sshd)
        for host in self.hosts:
            # The supervisor writes the final state once its service process is gone.
            try:
                wait_for(host.stopped, 10, f"{host.label} to stop")
            except AssertionError:
                pid = host.main_pid()
                if pid:
                    _kill_group(pid, signal.SIGKILL)


def _terminate(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL if it has not exited within 5 s; reaped either way."""
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _kill_group(pid: int, sig: int = signal.SIGTERM) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


def start_hosts(
    count: int,
    client_key: Path,
    *,
    service: str = "worker",
    first_address: int = 2,
    user: str | None = None,
    max_startups: int = 100,
) -> Hosts:
    """Start ``count`` sshd hosts on 127.0.0.<first_address...>, logged into as ``user``
    (default: this run's own, removed by ``stop()``); the caller must ``stop()``."""
    if os.geteuid() != 0:
        raise RuntimeError("the sshd hosts need root (useradd, sshd, sudoers)")
    user = user or run_user()
    pw = ensure_user(user)
    root = Path(tempfile.mkdtemp(prefix="vultrscale-sshd-"))
    root.chmod(0o755)  # the login user must reach the stand-in and its service dirs
    hosts = Hosts(root=root, user=user, service=service, client_key=client_key)
    try:
        _install(hosts, pw, count, first_address, max_startups)
    except BaseException:
        hosts.stop()
        raise
    return hosts


def _install(hosts: Hosts, pw: pwd.struct_passwd, count: int, first: int, startups: int) -> None:
    root, user, service = hosts.root, hosts.user, hosts.service
    bin_dir = root / "bin"
    bin_dir.mkdir(mode=0o755)
    standin = bin_dir / "systemctl"
    # The login user runs it too: use an interpreter outside root's home (pyenv lives there).
    python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
    (bin_dir / "systemctl.py").write_text(STANDIN)
    # is-active and stop are answered by sh (cheap: many hosts share this machine's cores);
    # python (systemctl.py) starts and supervises the service.
    standin.write_text(FAST_SH.replace("@PYTHON@", python).replace("@BIN@", str(bin_dir)))
    standin.chmod(0o755)
    hosts.bin_dir = bin_dir

    # Authorize the scaler's key for the login user.
    pub = Path(str(hosts.client_key) + ".pub").read_text().split()
    auth = Path(pw.pw_dir) / ".ssh" / "authorized_keys"
    auth.write_text(f"{pub[0]} {pub[1]} vultrscale-test\n")
    os.chown(auth, pw.pw_uid, pw.pw_gid)
    auth.chmod(0o600)

    # Real sudo, with the project's rule rendered for the stand-in's path.
    rule = render_sudoers(user, service, systemctl=str(standin))
    drop_in = (
        f'Defaults:{user} secure_path="{bin_dir}:/usr/local/bin:/usr/bin:/bin"\n'
        f'Defaults:{user} env_keep += "VS_SERVICE_DIR"\n' + rule
    )
    candidate = root / "sudoers"
    candidate.write_text(drop_in)
    subprocess.run(["visudo", "-cqf", str(candidate)], check=True)
    sudoers = Path("/etc/sudoers.d") / f"vultrscale_test_{user}_{os.getpid()}"
    shutil.copyfile(candidate, sudoers)
    sudoers.chmod(0o440)
    hosts.sudoers = sudoers

    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    for i in range(count):
        hosts.hosts.append(_add_host(hosts, i, f"127.0.0.{first + i}", startups))
    for host in hosts.hosts:
        wait_for(functools.partial(_accepts, host), 15, f"sshd on {host.address}:{host.port}")


@contextlib.contextmanager
def extra_host(
    hosts: Hosts, address: str, *, key_type: str = "ed25519", sshd_options: str = ""
) -> Iterator[Host]:
    """One more sshd on ``address`` serving only a ``key_type`` host key (rsa, ecdsa, ed25519),
    with ``sshd_options`` (sshd_config lines) added to its config.

    It shares the hosts' login user, sudoers rule and stand-in, but is not in ``hosts.hosts``;
    its sshd is stopped on leaving the block.
    """
    index = len(list(hosts.root.glob("host*")))
    host = _add_host(hosts, index, address, 100, key_type=key_type, sshd_options=sshd_options)
    try:
        wait_for(functools.partial(_accepts, host), 15, f"sshd on {host.address}:{host.port}")
        yield host
    finally:
        assert host.sshd is not None
        _terminate(host.sshd)


def _add_host(
    hosts: Hosts,
    i: int,
    address: str,
    startups: int,
    *,
    key_type: str = "ed25519",
    sshd_options: str = "",
) -> Host:
    """Write host ``i``'s directory, key and sshd_config, and start its sshd (not waited for)."""
    user, service, bin_dir = hosts.user, hosts.service, hosts.bin_dir
    assert bin_dir is not None
    port = free_port(address)
    hdir = hosts.root / f"host{i}"
    (hdir / "service").mkdir(parents=True)
    hdir.chmod(0o755)
    (hdir / "service").chmod(0o755)
    (hdir / "service" / "service").write_text(service)
    log = hdir / "service" / "commands.log"
    log.touch()
    log.chmod(0o666)  # both the login user and root (via sudo) append to it
    key = hdir / f"ssh_host_{key_type}_key"
    if key_type == "ed25519":
        private, public = generate_host_key()  # as at create
        key.write_text(private)
    else:
        subprocess.run(["ssh-keygen", "-q", "-t", key_type, "-N", "", "-f", str(key)], check=True)
        public = " ".join(Path(f"{key}.pub").read_text().split()[:2])
    key.chmod(0o600)
    path_env = f"{bin_dir}:/usr/local/bin:/usr/bin:/bin"
    (hdir / "sshd_config").write_text(
        f"ListenAddress {address}:{port}\n"
        f"HostKey {key}\n"
        f"PidFile {hdir / 'sshd.pid'}\n"
        f"AllowUsers {user}\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "PubkeyAuthentication yes\n"
        "UsePAM no\n"
        f"MaxStartups {startups}\n"
        f"SetEnv PATH={path_env} VS_SERVICE_DIR={hdir / 'service'}\n" + sshd_options
    )
    host = Host(
        label=f"worker-{i:02d}",
        address=address,
        port=port,
        host_key=public,
        dir=hdir,
        service=service,
        user=user,
    )
    host.sshd = subprocess.Popen(
        # -r: no re-exec per connection (less CPU when many hosts share this machine)
        [SSHD, "-D", "-r", "-f", str(hdir / "sshd_config"), "-E", str(hdir / "sshd.log")],
        stdin=subprocess.DEVNULL,
    )
    return host


def _accepts(host: Host) -> bool:
    if host.sshd is not None and host.sshd.poll() is not None:
        log = (host.dir / "sshd.log").read_text(errors="replace")
        raise RuntimeError(f"sshd for {host.label} exited: {log[-500:]}")
    try:
        with socket.create_connection((host.address, host.port), timeout=0.5) as s:
            return s.recv(4).startswith(b"SSH-")
    except OSError:
        return False
