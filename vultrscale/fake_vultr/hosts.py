"""Simulated instances for the demo: what cloud-init and systemd would do with the user-data.

When the simulator reports that an instance booted, :class:`Hosts` reads its user-data the way
cloud-init would: the worker's environment file, the ed25519 host key the scaler generated and
pinned, the scaler's authorized key, the sudoers rule and the unit's stop timeout. It then
starts the "unit", a real ``vultrscale worker`` process, and an SSH server on the instance's
address that presents that host key, lets in only that key, and runs only the three commands the
scaler sends (``sudo -n systemctl stop --no-block <service>`` and ``sudo -n systemctl start
--no-block <service>``, allowed by the sudoers rule from the user-data, and ``systemctl
is-active <service>``) with systemd's answers and exit codes.
When the instance is deleted the host powers off: a worker still running is killed and the SSH
server closes.

Nothing here fakes the scaler's side: it talks to these hosts with the real SSH drain.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ipaddress
import logging
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vultrscale.config import SERVICE_NAME
from vultrscale.errors import RuntimeFailure
from vultrscale.workerunit import RESTART_SECONDS

if TYPE_CHECKING:
    import paramiko

log = logging.getLogger("vultrscale.fake_vultr.hosts")

# Where cloud-init/user-data.yaml.tmpl writes the worker's environment.
WORKER_ENV_PATH = "/etc/vultrscale/worker.env"
SUDOERS_DIR = "/etc/sudoers.d/"
# worker.service: TimeoutStopSec=30 unless the user-data's drop-in says otherwise; RestartSec is
# workerunit.RESTART_SECONDS, as the unit file sets it.
DEFAULT_TIMEOUT_STOP = 30.0
# `systemctl is-active`: 0 when active, 3 ("program is not running") otherwise.
EXIT_ACTIVE, EXIT_NOT_ACTIVE = 0, 3


class BootFailed(RuntimeFailure):
    """A simulated instance could not boot from its user-data (as cloud-init would fail)."""


# --- the user-data, as cloud-init reads it ---------------------------------------------------


@dataclass(frozen=True)
class BootSpec:
    """What a host takes from its user-data."""

    label: str
    env: dict[str, str] = field(repr=False)  # holds DATABASE_URL
    host_key_private: str = field(repr=False)
    host_key_public: str
    ssh_user: str
    authorized_keys: tuple[str, ...]
    service: str
    sudo_allowed: frozenset[tuple[str, ...]]  # argument lists ssh_user may run with sudo -n
    timeout_stop: float


def parse_env_file(text: str) -> dict[str, str]:
    """KEY="value" lines of a systemd EnvironmentFile (``\\`` escapes), comments skipped."""
    env: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise BootFailed(f"worker env file: cannot read line {line[:40]!r}")
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        env[key] = value
    return env


def _sudoers_rules(text: str, user: str) -> frozenset[tuple[str, ...]]:
    """The commands ``user`` may run with NOPASSWD, as argument lists with a bare program name."""
    allowed: set[tuple[str, ...]] = set()
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", "Defaults")):
            continue
        who, _, rest = line.partition(" ")
        _, sep, commands = rest.partition("NOPASSWD:")
        if who != user or not sep:
            continue
        for command in commands.split(","):
            argv = command.split()
            if argv:
                allowed.add((os.path.basename(argv[0]), *argv[1:]))
    return frozenset(allowed)


def parse_user_data(text: str) -> BootSpec:
    """Read the rendered #cloud-config the way cloud-init would; BootFailed if a part is missing."""
    import yaml

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        raise BootFailed("the user-data is not valid YAML") from None
    if not text.startswith("#cloud-config") or not isinstance(doc, dict):
        raise BootFailed("the user-data is not a #cloud-config document")
    keys = doc.get("ssh_keys") or {}
    private, public = keys.get("ed25519_private"), keys.get("ed25519_public")
    if not isinstance(private, str) or not isinstance(public, str):
        raise BootFailed("the user-data installs no ed25519 host key (ssh_keys)")
    users = [u for u in doc.get("users") or [] if isinstance(u, dict) and u.get("name")]
    if not users:
        raise BootFailed("the user-data creates no login user (users)")
    user = str(users[0]["name"])
    authorized = tuple(str(k).strip() for k in users[0].get("ssh_authorized_keys") or [])
    files = {str(f.get("path")): f for f in doc.get("write_files") or [] if isinstance(f, dict)}
    env_file = files.get(WORKER_ENV_PATH)
    if env_file is None or not isinstance(env_file.get("content"), str):
        raise BootFailed(f"the user-data does not write {WORKER_ENV_PATH}")
    env = parse_env_file(env_file["content"])
    label = env.get("VULTRSCALE_INSTANCE_LABEL") or env.get("VULTRSCALE_WORKER_ID") or ""
    unit = ""
    for cmd in doc.get("runcmd") or []:
        if isinstance(cmd, list) and cmd[:3] == ["systemctl", "enable", "--now"] and len(cmd) == 4:
            unit = str(cmd[3])
    service = unit.removesuffix(".service")
    if not SERVICE_NAME.fullmatch(service):
        raise BootFailed("the user-data enables no worker unit (runcmd: systemctl enable --now)")
    sudo: frozenset[tuple[str, ...]] = frozenset()
    timeout_stop = DEFAULT_TIMEOUT_STOP
    for path, f in files.items():
        content = f.get("content")
        if not isinstance(content, str):
            continue
        if path.startswith(SUDOERS_DIR):
            sudo = sudo | _sudoers_rules(content, user)
        elif path.startswith(f"/etc/systemd/system/{unit}.d/"):
            m = re.search(r"^TimeoutStopSec=(\d+(?:\.\d+)?)s?\s*$", content, re.MULTILINE)
            if m:
                timeout_stop = float(m.group(1))
    return BootSpec(
        label=label,
        env=env,
        host_key_private=private,
        host_key_public=public.strip(),
        ssh_user=user,
        authorized_keys=authorized,
        service=service,
        sudo_allowed=sudo,
        timeout_stop=timeout_stop,
    )


# --- addresses -------------------------------------------------------------------------------


class LoopbackIps:
    """127.0.0.x addresses for the simulator's instances, handed out in turn.

    A released address goes to the back of the line, so a new instance does not get the
    address of one deleted a moment ago while its host may still be powering off.
    """

    def __init__(self, network: str = "127.0.0.0/24", first: int = 2) -> None:
        net = ipaddress.ip_network(network)
        self._free = [str(net.network_address + i) for i in range(first, net.num_addresses - 1)]
        self._lock = threading.Lock()

    def allocate(self) -> str:
        with self._lock:
            if not self._free:
                raise RuntimeFailure("no loopback address left for a simulated instance")
            return self._free.pop(0)

    def release(self, ip: str) -> None:
        with self._lock:
            if ip not in self._free:
                self._free.append(ip)


# --- the worker unit (what systemd does with worker.service) ---------------------------------


_PR_SET_PDEATHSIG = 1


def _death_signal() -> Callable[[], None] | None:
    """Linux: a pre-exec step that makes the worker get SIGKILL when the thread that started
    it dies (the demo killed with -9 leaves no worker behind). None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # loaded before the fork
    except (OSError, AttributeError):
        return None

    def set_death_signal() -> None:  # runs in the child between fork and exec
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)

    return set_death_signal


class WorkerUnit:
    """A ``vultrscale worker`` process managed like worker.service.

    States and transitions follow systemd: ``active`` while it runs; ``stop()`` sends SIGTERM
    and returns at once (``deactivating``), SIGKILL to the process group after
    ``timeout_stop``; ``inactive`` after a clean exit (0, or killed by the SIGTERM), ``failed``
    after a non-zero exit or the SIGKILL; a failure that was not asked for restarts it after
    ``restart_seconds`` (``activating``), as ``Restart=on-failure`` does.
    """

    def __init__(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str],
        cwd: Path,
        log_path: Path,
        *,
        timeout_stop: float,
        restart_seconds: float = RESTART_SECONDS,
    ) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.cwd = cwd
        self.log_path = log_path
        self.timeout_stop = timeout_stop
        self.restart_seconds = restart_seconds
        self.exits: list[int] = []  # return codes, in order (negative: killed by that signal)
        self.killed_on_timeout = 0
        self.injected_kills = 0  # SIGKILLs sent by kill_worker (the demo's chaos), not failures
        self._killed_pid = 0
        self._state = "activating"
        self._proc: subprocess.Popen[bytes] | None = None
        self._stopping = False
        self._stop_deadline = 0.0
        self._restart_at = 0.0
        self._start_queued = False  # a start sent while deactivating (start_again)
        self._off = False
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._supervise, name=f"unit-{name}", daemon=True)

    def start(self) -> None:
        """Start the unit (the supervisor thread spawns the process)."""
        self._thread.start()

    @property
    def state(self) -> str:
        """What `systemctl is-active` prints."""
        with self._cv:
            return self._state

    @property
    def pid(self) -> int | None:
        with self._cv:
            return self._proc.pid if self._proc is not None else None

    def stop(self) -> None:
        """`systemctl stop --no-block`: SIGTERM now, SIGKILL after timeout_stop; never waits."""
        with self._cv:
            if self._state == "active" and self._proc is not None:
                self._stopping = True
                self._stop_deadline = time.monotonic() + self.timeout_stop
                self._state = "deactivating"
                with contextlib.suppress(ProcessLookupError):
                    self._proc.send_signal(signal.SIGTERM)
            elif self._state == "activating":  # waiting to (re)start: cancel that
                self._stopping = True
                if self._proc is None:
                    self._state = "inactive"
            self._cv.notify_all()

    def start_again(self) -> None:
        """`systemctl start --no-block` (a revive): an inactive or failed unit starts now; one
        still deactivating starts once its process has exited (systemd keeps the start job
        waiting while the unit stops); an active or activating one is left as it is."""
        with self._cv:
            if self._state in ("inactive", "failed"):
                self._state = "activating"
                self._stopping = False
                self._restart_at = 0.0
            elif self._state == "deactivating":
                self._start_queued = True
            elif self._state == "activating":
                self._stopping = False  # a stop that cancelled a pending restart: undone
            self._cv.notify_all()

    def power_off(self, grace: float = 0.0) -> bool:
        """The instance goes away: SIGTERM (if ``grace``), SIGKILL after it; wait for the exit.
        True if the worker had to be killed (an exit within ``grace`` is the unit's exit, as
        for a host shut down in order: systemd stops the unit first)."""
        with self._cv:
            self._off = True
            proc = self._proc
            self._cv.notify_all()
        if proc is not None and grace > 0 and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(grace)
            if proc.returncode is not None:
                with self._cv:
                    self.exits.append(proc.returncode)
        running = proc is not None and proc.poll() is None
        if running and proc is not None:
            _kill_group(proc)
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        return running

    def kill_worker(self) -> int | None:
        """SIGKILL the running worker (only the process: the unit restarts it, as
        ``Restart=on-failure`` does); its pid, or None when none runs."""
        with self._cv:
            proc = self._proc
            if self._state != "active" or proc is None or proc.pid == self._killed_pid:
                return None
            self._killed_pid = proc.pid  # not twice: it may not have been reaped yet
            self.injected_kills += 1
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGKILL)
            return proc.pid

    def kill_now(self) -> None:
        """SIGKILL whatever runs (the atexit safety net)."""
        with self._cv:
            proc = self._proc
        if proc is not None and proc.poll() is None:
            _kill_group(proc)

    def _spawn(self) -> subprocess.Popen[bytes]:
        with open(self.log_path, "ab") as out:
            return subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, like a unit's cgroup
                preexec_fn=_death_signal(),
            )

    def _supervise(self) -> None:
        while True:
            with self._cv:
                # This thread started the worker, whose death signal fires when the thread
                # ends: at power-off it lives on until the worker has exited.
                if self._off and self._proc is None:
                    break
                due = time.monotonic() >= self._restart_at
                if self._proc is None and self._state == "activating" and due and not self._off:
                    try:
                        self._proc = self._spawn()
                        self._state = "active"
                    except OSError as exc:
                        log.warning("%s: cannot start the worker: %s", self.name, exc)
                        self._state = "failed"
                proc = self._proc
                if proc is None:
                    self._cv.wait(0.2)
                    continue
            try:
                rc = proc.wait(0.1)
            except subprocess.TimeoutExpired:
                with self._cv:
                    if (
                        self._stopping
                        and not self._off
                        and time.monotonic() >= self._stop_deadline
                        and proc.poll() is None
                    ):
                        self.killed_on_timeout += 1
                        _kill_group(proc)
                continue
            with self._cv:
                self._proc = None
                if self._off:
                    break  # the power-off kill is not an exit of the unit
                self.exits.append(rc)
                if self._stopping and self._start_queued:
                    # The start job that waited while the unit stopped runs now.
                    self._stopping = self._start_queued = False
                    self._state = "activating"
                    self._restart_at = 0.0
                elif self._stopping:
                    # SIGTERM is a clean end for systemd; SIGKILL after the timeout is not
                    self._state = "inactive" if rc in (0, -signal.SIGTERM) else "failed"
                elif rc == 0:
                    self._state = "inactive"
                else:
                    self._state = "activating"  # Restart=on-failure
                    self._restart_at = time.monotonic() + self.restart_seconds


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


# --- the SSH endpoint ------------------------------------------------------------------------


@dataclass
class SSHCounters:
    """What the SSH endpoints saw (the demo's summary shows it)."""

    stop: int = 0
    start: int = 0  # revives
    is_active: int = 0
    refused_commands: int = 0
    refused_logins: int = 0


def _make_interface(endpoint: SSHEndpoint) -> paramiko.ServerInterface:
    import paramiko

    class Interface(paramiko.ServerInterface):
        def get_allowed_auths(self, username: str) -> str:
            return "publickey"

        def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
            if username == endpoint.user and f"{key.get_name()} {key.get_base64()}" in (
                endpoint.authorized
            ):
                return paramiko.AUTH_SUCCESSFUL
            endpoint.note_refused_login()
            return paramiko.AUTH_FAILED

        def check_channel_request(self, kind: str, chanid: int) -> int:
            if kind == "session":
                return paramiko.OPEN_SUCCEEDED
            return paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

        def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
            threading.Thread(
                target=endpoint.exec, args=(channel, command), name="ssh-exec", daemon=True
            ).start()
            return True

    return Interface()


class SSHEndpoint:
    """An SSH server on ``address:port`` with one host key, one user and a command handler."""

    def __init__(
        self,
        address: str,
        port: int,
        host_key: paramiko.PKey,
        user: str,
        authorized: Collection[str],
        run: Callable[[str], tuple[int, str, str]],
        counters: SSHCounters,
    ) -> None:
        self.address = address
        self.port = port
        self.host_key = host_key
        self.user = user
        self.authorized = frozenset(" ".join(k.split()[:2]) for k in authorized)
        self.run = run
        self.counters = counters
        self._sock: socket.socket | None = None
        self._stop = threading.Event()
        self._silent_until = 0.0
        self._silent_mode = "hang"
        self._transports: list[paramiko.Transport] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._accept_loop, name=f"sshd-{address}", daemon=True
        )

    def start(self) -> None:
        """Listen (raises OSError when the address is taken) and accept in the background.
        Port 0 listens on a free port the system picks; ``port`` is then the one bound."""
        self._sock = socket.create_server((self.address, self.port))
        self.port = int(self._sock.getsockname()[1])
        self._sock.settimeout(0.2)
        self._thread.start()

    def close(self) -> None:
        """Stop listening and close every connection."""
        self._stop.set()
        if self._sock is not None:
            self._sock.close()
        with self._lock:
            transports = list(self._transports)
            self._transports.clear()
        for t in transports:
            t.close()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def silence(self, seconds: float, mode: str = "hang") -> None:
        """Stop answering for ``seconds``: new connections are accepted, then get nothing
        (``"hang"``: no banner, held open until the silence ends) or are closed at once
        (``"drop"``). Connections already open are closed."""
        with self._lock:
            self._silent_until = time.monotonic() + seconds
            self._silent_mode = mode
            transports = list(self._transports)
            self._transports.clear()
        for t in transports:
            t.close()

    def _silent(self) -> str | None:
        with self._lock:
            return self._silent_mode if time.monotonic() < self._silent_until else None

    def note_refused_login(self) -> None:
        with self._lock:
            self.counters.refused_logins += 1

    def _accept_loop(self) -> None:
        assert self._sock is not None
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                break
            threading.Thread(
                target=self._serve, args=(conn,), name="sshd-conn", daemon=True
            ).start()

    def _serve(self, conn: socket.socket) -> None:
        import paramiko

        mode = self._silent()
        if mode is not None:
            with conn:
                while mode == "hang" and self._silent() and not self._stop.wait(0.2):
                    pass
            return
        conn.settimeout(None)
        transport = paramiko.Transport(conn)
        transport.add_server_key(self.host_key)
        with self._lock:
            if self._stop.is_set():
                transport.close()
                return
            self._transports.append(transport)
        try:
            transport.start_server(server=_make_interface(self))
        except (paramiko.SSHException, EOFError, OSError):
            transport.close()

    def exec(self, channel: paramiko.Channel, command: bytes) -> None:
        """Run one command and answer: output, exit status, then EOF (the client closes)."""
        code, out, err = self.run(command.decode("utf-8", errors="replace"))
        try:
            if out:
                channel.sendall(out.encode())
            if err:
                channel.sendall_stderr(err.encode())
            channel.send_exit_status(code)
            # EOF, not close: a close could overtake the reply to the exec request.
            channel.shutdown_write()
            deadline = time.monotonic() + 10
            while not channel.closed and time.monotonic() < deadline:
                time.sleep(0.05)
        except (OSError, EOFError):
            pass
        finally:
            channel.close()


# --- one host, and all of them ---------------------------------------------------------------


class SimulatedHost:
    """One instance: its worker unit and its SSH endpoint."""

    def __init__(
        self,
        instance_id: str,
        address: str,
        spec: BootSpec,
        unit: WorkerUnit,
        ssh_port: int,
        counters: SSHCounters,
    ) -> None:
        import io

        import paramiko

        self.instance_id = instance_id
        self.address = address
        self.spec = spec
        self.unit = unit
        self.counters = counters
        self._lock = threading.Lock()
        try:
            key = paramiko.Ed25519Key.from_private_key(io.StringIO(spec.host_key_private))
        except (paramiko.SSHException, ValueError) as exc:
            raise BootFailed(f"{spec.label}: the host key in the user-data is unusable") from exc
        if f"{key.get_name()} {key.get_base64()}" != " ".join(spec.host_key_public.split()[:2]):
            raise BootFailed(f"{spec.label}: ed25519_private and ed25519_public do not match")
        self.ssh = SSHEndpoint(
            address, ssh_port, key, spec.ssh_user, spec.authorized_keys, self.command, counters
        )

    @property
    def label(self) -> str:
        return self.spec.label

    def start(self) -> None:
        """Boot: the SSH server listens, the worker unit starts (``enable --now``)."""
        try:
            self.ssh.start()
        except OSError as exc:
            raise BootFailed(
                f"{self.label}: cannot listen on {self.address}:{self.ssh.port} ({exc.strerror})"
            ) from None
        self.unit.start()

    def power_off(self, grace: float = 0.0) -> bool:
        """The instance is gone: close SSH, kill the worker if it still runs (then True)."""
        self.ssh.close()
        return self.unit.power_off(grace)

    def _count(self, what: str) -> None:
        with self._lock:
            if what == "stop":
                self.counters.stop += 1
            elif what == "start":
                self.counters.start += 1
            elif what == "is-active":
                self.counters.is_active += 1
            else:
                self.counters.refused_commands += 1

    def command(self, command: str) -> tuple[int, str, str]:
        """Run one SSH command as the login user: (exit code, stdout, stderr)."""
        argv = command.split()
        names = (self.spec.service, f"{self.spec.service}.service")
        if argv[:2] == ["sudo", "-n"]:
            if tuple(argv[2:]) not in self.spec.sudo_allowed:
                self._count("refused")
                return 1, "", "sudo: a password is required\n"
            argv = argv[2:]
            stop = argv[:3] == ["systemctl", "stop", "--no-block"]
            if stop and len(argv) == 4 and argv[3] in names:
                self._count("stop")
                self.unit.stop()
                return 0, "", ""
            start = argv[:3] == ["systemctl", "start", "--no-block"]
            if start and len(argv) == 4 and argv[3] in names:
                self._count("start")
                self.unit.start_again()
                return 0, "", ""
        elif len(argv) == 3 and argv[:2] == ["systemctl", "is-active"] and argv[2] in names:
            self._count("is-active")
            state = self.unit.state
            return (EXIT_ACTIVE if state == "active" else EXIT_NOT_ACTIVE), f"{state}\n", ""
        self._count("refused")
        return 1, "", f"{argv[0] if argv else 'command'}: not allowed\n"


@dataclass
class HostStats:
    """Totals over every host of a run."""

    booted: int = 0
    boot_failures: list[str] = field(default_factory=list)
    clean_exits: int = 0  # the worker drained and exited 0 (or on the SIGTERM itself)
    failed_exits: int = 0  # non-zero exits, SIGKILL after TimeoutStopSec included
    failures: list[str] = field(default_factory=list)  # each failed exit, with its log's end
    killed_at_power_off: int = 0  # killed: still running at power-off, after any grace
    injected_kills: int = 0  # workers SIGKILLed on purpose (kill_worker), restarted by the unit
    ssh: SSHCounters = field(default_factory=SSHCounters)


class Hosts:
    """Every simulated instance of a run, booted from the simulator's ready hook.

    ``on_instance_ready`` (give it to the Simulator) queues the boot; one thread boots hosts,
    and powers off those whose instance ``alive()`` no longer lists. Only instances carrying
    ``tag`` boot a host. Workers run ``python -m vultrscale.cli worker`` with a clean
    environment plus the user-data's env file, as systemd would run the unit.
    """

    def __init__(
        self,
        workdir: Path,
        ssh_port: int,
        alive: Callable[[], Collection[str]],
        *,
        tag: str,
        python: str = sys.executable,
        restart_seconds: float = RESTART_SECONDS,
        poll: float = 0.25,
    ) -> None:
        self.workdir = workdir
        self.ssh_port = ssh_port
        self.alive = alive
        self.tag = tag
        self.python = python
        self.restart_seconds = restart_seconds
        self.poll = poll
        self.stats = HostStats()
        self.hosts: dict[str, SimulatedHost] = {}
        self._queue: queue.Queue[tuple[dict[str, Any], str]] = queue.Queue()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="sim-hosts", daemon=True)
        self._thread.start()
        atexit.register(self._kill_all)

    def on_instance_ready(self, instance: dict[str, Any], user_data: str) -> None:
        """The Simulator's hook: the instance is active with its IP; cloud-init runs now."""
        if self.tag in (instance.get("tags") or []):
            self._queue.put((instance, user_data))

    def logs(self) -> dict[str, Path]:
        """Each host's worker log, by label."""
        with self._lock:
            return {h.label: h.unit.log_path for h in self.hosts.values()}

    def running(self) -> list[SimulatedHost]:
        """The hosts up now, in boot order."""
        with self._lock:
            return list(self.hosts.values())

    def close(self, grace: float = 3.0) -> None:
        """Power off every host (SIGTERM, SIGKILL after ``grace``) and stop the thread."""
        self._stop.set()
        self._thread.join(timeout=10)
        with self._lock:
            hosts = list(self.hosts.values())
            self.hosts.clear()
        threads = [
            threading.Thread(target=self._power_off, args=(h, grace), daemon=True) for h in hosts
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=grace + 10)
        atexit.unregister(self._kill_all)

    def _kill_all(self) -> None:
        for h in list(self.hosts.values()):
            h.unit.kill_now()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                instance, user_data = self._queue.get(timeout=self.poll)
            except queue.Empty:
                pass
            else:
                self._boot(instance, user_data)
            alive = set(self.alive())
            with self._lock:
                gone = [h for i, h in self.hosts.items() if i not in alive]
                for h in gone:
                    del self.hosts[h.instance_id]
            for h in gone:
                self._power_off(h, 0.0)

    def _boot(self, instance: dict[str, Any], user_data: str) -> None:
        iid, address = str(instance["id"]), str(instance.get("main_ip") or "")
        label = str(instance.get("label") or iid)
        try:
            spec = parse_user_data(user_data)
            hostdir = self.workdir / label
            hostdir.mkdir(parents=True, exist_ok=True)
            unit = WorkerUnit(
                label,
                [self.python, "-m", "vultrscale.cli", "worker"],
                unit_environment(spec.env),
                hostdir,
                hostdir / "worker.log",
                timeout_stop=spec.timeout_stop,
                restart_seconds=self.restart_seconds,
            )
            host = SimulatedHost(iid, address, spec, unit, self.ssh_port, self.stats.ssh)
            host.start()
        except (BootFailed, OSError) as exc:
            message = exc.message if isinstance(exc, BootFailed) else str(exc)
            with self._lock:
                self.stats.boot_failures.append(f"{label}: {message}")
            return
        with self._lock:
            self.hosts[iid] = host
            self.stats.booted += 1

    def _power_off(self, host: SimulatedHost, grace: float) -> None:
        running = host.power_off(grace)
        with self._lock:
            self.stats.killed_at_power_off += int(running)
            injected = host.unit.injected_kills
            for rc in host.unit.exits:
                if rc == -signal.SIGKILL and injected > 0:
                    injected -= 1
                    self.stats.injected_kills += 1
                elif rc in (0, -signal.SIGTERM):
                    self.stats.clean_exits += 1
                else:
                    self.stats.failed_exits += 1
                    self.stats.failures.append(
                        f"{host.label}: worker exited {rc}: {_last_line(host.unit.log_path)}"
                    )


def _last_line(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return lines[-1][:300] if lines else "(empty log)"


def unit_environment(env_file: dict[str, str]) -> dict[str, str]:
    """A unit's environment: a few basics from ours (to find Python and the package) + the file."""
    keep = ("PATH", "LANG", "LC_ALL", "HOME", "PYTHONPATH", "VIRTUAL_ENV", "TMPDIR")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(env_file)
    return env
