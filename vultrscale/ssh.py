"""The SSH drain transport: paramiko with pinned host keys, key auth and timeouts.

Reconcile asks three things of an instance: ``sudo -n systemctl stop --no-block <service>``,
``systemctl is-active <service>`` and, to revive a draining one, ``sudo -n systemctl start
--no-block <service>``. Nothing else is ever sent. The host must present exactly the
key the scaler generated for it at create (``HostTarget.host_key``); any other key is refused
before a command runs. Connections are cached per target for one pass and closed by ``close()``.

paramiko is imported inside the methods so that ``import vultrscale.ssh`` stays cheap.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from vultrscale.config import SERVICE_NAME
from vultrscale.core.model import HostTarget, ServiceState
from vultrscale.errors import HostKeyMismatch, HostUnreachable, SSHError, UsageError

if TYPE_CHECKING:
    import paramiko

T = TypeVar("T")

# `systemctl is-active` exits 0 for these and 3 (program not running) for the others.
_ACTIVE_STDOUT = {"active": ServiceState.ACTIVE, "reloading": ServiceState.ACTIVE}
_NOT_RUNNING_STDOUT = {
    "inactive": ServiceState.INACTIVE,
    "failed": ServiceState.FAILED,
    "activating": ServiceState.ACTIVATING,
    "deactivating": ServiceState.DEACTIVATING,
}
_MAX_STDERR = 300  # characters of a remote error shown to the user


def validate_service(service: str) -> str:
    """``service`` if it is a plain systemd unit name; UsageError before anything is sent."""
    if not isinstance(service, str) or not SERVICE_NAME.fullmatch(service):
        raise UsageError(
            f"refusing service name {service!r}: only letters, digits, '_', '.', '@' and '-' "
            "are allowed (max 64 characters)",
            hint='Set fleet.service to a plain unit name such as "worker".',
        )
    return service


def stop_command(service: str) -> str:
    """The exact command a drain sends."""
    return f"sudo -n systemctl stop --no-block {validate_service(service)}"


def start_command(service: str) -> str:
    """The exact command a revive sends. ``--no-block``: a unit still deactivating (its worker
    draining) keeps the start job queued until the old process has exited (systemd answers the
    job "try again later" while the unit stops), and a pass never waits for a drain."""
    return f"sudo -n systemctl start --no-block {validate_service(service)}"


def is_active_command(service: str) -> str:
    """The exact command a drain poll sends."""
    return f"systemctl is-active {validate_service(service)}"


def parse_is_active(stdout: str, exit_code: int) -> ServiceState:
    """Map `systemctl is-active` output and exit code to a ServiceState."""
    word = stdout.strip().splitlines()[0].strip() if stdout.strip() else ""
    if exit_code == 0:
        return _ACTIVE_STDOUT.get(word, ServiceState.UNKNOWN)
    if exit_code == 3:
        return _NOT_RUNNING_STDOUT.get(word, ServiceState.UNKNOWN)
    return ServiceState.UNKNOWN


def generate_host_key() -> tuple[str, str]:
    """A fresh ed25519 host key: (private key in OpenSSH PEM format, ``ssh-ed25519 AAAA...``)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    ).decode("ascii")
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    return private, public.decode("ascii")


def check_key_file(key_path: str | os.PathLike[str]) -> Path:
    """The expanded path of a private key that exists, is a regular file owned by the user
    running the scaler (or root) and is readable by its owner only (or, as a systemd
    credential in $CREDENTIALS_DIRECTORY, by the unit's user only). Only ``stat``: no read."""
    return _stat_key(key_path)[0]


def _stat_key(key_path: str | os.PathLike[str]) -> tuple[Path, os.stat_result]:
    path = Path(key_path).expanduser()
    try:
        st = path.stat()
    except FileNotFoundError:
        raise UsageError(
            f"SSH private key {path} does not exist",
            hint=f"Create one with `ssh-keygen -t ed25519 -N '' -f {path}` "
            "or point fleet.ssh_key at your key.",
        ) from None
    except OSError as exc:
        raise UsageError(f"cannot read SSH private key {path}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(
            f"SSH private key {path} is not a regular file",
            hint="Point fleet.ssh_key at the private key file.",
        )
    # A systemd credential (the scaler's units pass the key with LoadCredential=) is 0400 with
    # an ACL entry for the unit's user where the file system has ACLs: stat shows that ACL's
    # mask in the group bits (0440), though systemd lets only that user (and root) read it.
    credentials = os.environ.get("CREDENTIALS_DIRECTORY")
    systemd_credential = bool(credentials) and path.parent == Path(credentials or "")
    if st.st_mode & (0o007 if systemd_credential else 0o077):
        raise UsageError(
            f"SSH private key {path} is accessible by group or others "
            f"(mode {stat.S_IMODE(st.st_mode):04o}); refusing to use it",
            hint=f"chmod 600 {path}",
        )
    me = os.geteuid()
    if st.st_uid not in (me, 0):  # as sshd's StrictModes: the user's own, or root's
        raise UsageError(
            f"SSH private key {path} belongs to uid {st.st_uid}, not to the user running the "
            f"scaler (uid {me}); refusing to use it",
            hint=f"Give the scaler its own key: `chown {me} {path}`, or point fleet.ssh_key "
            "at a key of the user that runs it.",
        )
    return path, st


# Private keys parsed by this process, by path, with the file's identity when read. Loading an
# RSA key costs 100 ms (2048-bit) to 800 ms (4096-bit) of CPU (paramiko derives the private
# numbers twice), ed25519 well under 1 ms: a key is parsed at most once per process, and again
# only when its file changes (another inode, size or modification time).
_parsed: dict[Path, tuple[tuple[int, int, int, int], paramiko.PKey]] = {}
_parsed_lock = threading.Lock()


def load_private_key(key_path: str | os.PathLike[str]) -> paramiko.PKey:
    """Load an unencrypted private key (ed25519, ECDSA or RSA), parsed once per process while
    the file is unchanged; its stat checks (``check_key_file``) are made on every call. Errors
    never show key material."""
    path, st = _stat_key(key_path)
    identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    with _parsed_lock:
        known = _parsed.get(path)
    if known is not None and known[0] == identity:
        return known[1]
    key = _parse_private_key(path)
    with _parsed_lock:
        _parsed[path] = (identity, key)
    return key


def _parse_private_key(path: Path) -> paramiko.PKey:
    import paramiko

    try:
        return paramiko.PKey.from_path(path)
    except paramiko.PasswordRequiredException:
        raise UsageError(
            f"SSH private key {path} is encrypted with a passphrase",
            hint="Use a key without a passphrase, dedicated to the scaler "
            f"(`ssh-keygen -t ed25519 -N '' -f {path}`).",
        ) from None
    except (paramiko.SSHException, paramiko.UnknownKeyType, ValueError, OSError, binascii.Error):
        raise UsageError(
            f"SSH private key {path} could not be read as an OpenSSH or PEM private key "
            "of a type paramiko supports (ed25519, ECDSA, RSA)",
            hint="Point fleet.ssh_key at a private key made by ssh-keygen.",
        ) from None


def public_key_line(key_path: str | os.PathLike[str]) -> str:
    """The scaler's public key (``ssh-ed25519 AAAA...``): ``<key>.pub`` if present, else derived."""
    path = check_key_file(key_path)
    pub = path.with_name(path.name + ".pub")
    if pub.is_file():
        fields = pub.read_text(encoding="ascii", errors="replace").split()
        if len(fields) >= 2:
            return f"{fields[0]} {fields[1]}"
    key = load_private_key(path)
    return f"{key.get_name()} {key.get_base64()}"


def _parse_host_key(target: HostTarget) -> paramiko.PKey:
    import paramiko

    fields = (target.host_key or "").split()
    if len(fields) < 2:
        raise SSHError(
            f"{target.label}: no pinned host key recorded",
            hint="The instance's host key is stored at create; without it the scaler "
            "will not connect. Replace the instance.",
        )
    try:
        return paramiko.PKey.from_type_string(fields[0], base64.b64decode(fields[1]))
    except (paramiko.SSHException, paramiko.UnknownKeyType, ValueError, binascii.Error) as exc:
        raise SSHError(
            f"{target.label}: the pinned host key is not a valid OpenSSH public key ({exc})",
            hint="Replace the instance; its ledger row holds a damaged host key.",
        ) from None


def _refuse_unpinned(pinned: paramiko.PKey) -> paramiko.MissingHostKeyPolicy:
    """A missing-host-key policy that refuses with ``BadHostKeyException`` (a mismatch)."""
    import paramiko

    class Refuse(paramiko.MissingHostKeyPolicy):
        def missing_host_key(
            self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
        ) -> None:
            raise paramiko.BadHostKeyException(hostname, key, pinned)

    return Refuse()


def _where(target: HostTarget) -> str:
    return f"{target.label} ({target.user}@{target.address}:{target.port})"


CONNECT_TIMEOUT_S = 10.0  # each of: the TCP connect, the banner, the key exchange, the auth
COMMAND_TIMEOUT_S = 20.0  # one command, from opening its channel to its exit status
MAX_PARALLEL = 32


def fan_out_bound_s(
    hosts: int,
    *,
    connect_timeout: float = CONNECT_TIMEOUT_S,
    command_timeout: float = COMMAND_TIMEOUT_S,
    max_parallel: int = MAX_PARALLEL,
) -> float:
    """The longest ``stop_many`` or ``is_active_many`` on ``hosts`` targets can take when every
    host uses up every timeout: a connect (four waits), the command, and the one fresh try a
    dead connection gets, in rounds of ``max_parallel``. A pass announces it before it waits
    (``FleetLedger.extend_lock``), so a healthy pass draining many hosts is not taken for a
    stuck one."""
    if hosts <= 0:
        return 0.0
    rounds = -(-hosts // max(1, max_parallel))
    return rounds * 2 * (4 * connect_timeout + command_timeout)


class SSHDrain:
    """Stop and poll worker services over SSH with pinned host keys.

    One instance serves one reconcile pass: connections are opened on first use, reused for
    later commands to the same target, and closed by ``close()`` (or ``with``).
    """

    def __init__(
        self,
        key_path: str,
        *,
        connect_timeout: float = CONNECT_TIMEOUT_S,
        command_timeout: float = COMMAND_TIMEOUT_S,
        max_parallel: int = MAX_PARALLEL,
    ) -> None:
        self._key = load_private_key(key_path)
        self.connect_timeout = connect_timeout
        self.command_timeout = command_timeout
        self.max_parallel = max(1, max_parallel)
        self._clients: dict[HostTarget, paramiko.SSHClient] = {}
        self._target_locks: dict[HostTarget, threading.Lock] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"SSHDrain(connections={len(self._clients)})"

    # --- one host ------------------------------------------------------------------------

    def stop(self, target: HostTarget) -> None:
        """Ask systemd to stop the worker service and return at once (the drain runs on)."""
        self._sudo(target, stop_command(target.service), "stop")

    def start(self, target: HostTarget) -> None:
        """Ask systemd to start the worker service again and return at once (a revive)."""
        self._sudo(target, start_command(target.service), "start")

    def _sudo(self, target: HostTarget, command: str, verb: str) -> None:
        code, _out, err = self._run(target, command)
        if code != 0:
            hint = "Check the sudoers rule on the instance (cloud-init/sudoers-worker.tmpl)."
            if "password is required" in err or "not allowed" in err:
                hint = (
                    f"{target.user} may not run `systemctl {verb} --no-block {target.service}` "
                    "with sudo -n; install the sudoers drop-in from cloud-init/."
                )
            raise SSHError(
                f"{_where(target)}: `{command}` exited {code}: {err.strip()[:_MAX_STDERR]}",
                hint=hint,
            )

    def is_active(self, target: HostTarget) -> ServiceState:
        """What `systemctl is-active <service>` says on the host."""
        code, out, _err = self._run(target, is_active_command(target.service))
        return parse_is_active(out, code)

    # --- many hosts in parallel ----------------------------------------------------------

    def stop_many(self, targets: Iterable[HostTarget]) -> dict[str, None | SSHError]:
        """``stop`` on every target in parallel; per label None (sent) or the SSHError."""
        return self._many(list(targets), self.stop)

    def start_many(self, targets: Iterable[HostTarget]) -> dict[str, None | SSHError]:
        """``start`` on every target in parallel; per label None (sent) or the SSHError."""
        return self._many(list(targets), self.start)

    def is_active_many(self, targets: Iterable[HostTarget]) -> dict[str, ServiceState | SSHError]:
        """``is_active`` on every target in parallel; per label the state or the SSHError."""
        return self._many(list(targets), self.is_active)

    def _many(
        self, targets: list[HostTarget], fn: Callable[[HostTarget], T]
    ) -> dict[str, T | SSHError]:
        # Every service name is checked before any host is contacted.
        for target in targets:
            validate_service(target.service)
        if not targets:
            return {}

        def one(target: HostTarget) -> T | SSHError:
            try:
                return fn(target)
            except SSHError as exc:
                return exc
            except Exception as exc:  # whatever else a peer provokes: that host's error only
                return SSHError(f"{_where(target)}: SSH failed: {type(exc).__name__}: {exc}")

        workers = min(self.max_parallel, len(targets))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="vultrscale-ssh") as pool:
            results = list(pool.map(one, targets))
        return {t.label: r for t, r in zip(targets, results, strict=True)}

    # --- connections ---------------------------------------------------------------------

    def close(self) -> None:
        """Close every cached connection and forget every host (the pass's end): a drain kept
        across passes (the demo's) holds nothing of instances long deleted."""
        with self._lock:
            clients = list(self._clients.values())
            self._clients.clear()
            self._target_locks.clear()
        for client in clients:
            client.close()

    def __enter__(self) -> SSHDrain:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _target_lock(self, target: HostTarget) -> threading.Lock:
        with self._lock:
            return self._target_locks.setdefault(target, threading.Lock())

    def _client(self, target: HostTarget) -> paramiko.SSHClient:
        with self._lock:
            client = self._clients.get(target)
        if client is not None:
            transport = client.get_transport()
            if transport is not None and transport.is_active():
                return client
            client.close()
        client = self._connect(target)
        with self._lock:
            self._clients[target] = client
        return client

    def _connect(self, target: HostTarget) -> paramiko.SSHClient:
        import paramiko

        pinned = _parse_host_key(target)
        client = paramiko.SSHClient()
        name = target.address if target.port == 22 else f"[{target.address}]:{target.port}"
        client.get_host_keys().add(name, pinned.get_name(), pinned)
        # A host whose name paramiko cannot match to the pin goes through the missing-key
        # policy: refuse it as a mismatch (RejectPolicy would raise a plain SSHException).
        client.set_missing_host_key_policy(_refuse_unpinned(pinned))
        where = _where(target)
        try:
            sock = _open_socket(target.address, target.port, self.connect_timeout)
            client.connect(
                target.address,
                port=target.port,
                sock=sock,
                transport_factory=_transport,
                username=target.user,
                pkey=self._key,
                timeout=self.connect_timeout,
                banner_timeout=self.connect_timeout,
                auth_timeout=self.connect_timeout,
                channel_timeout=self.command_timeout,
                allow_agent=False,
                look_for_keys=False,
            )
        except paramiko.BadHostKeyException as exc:
            client.close()
            offered = exc.key.get_name()
            if offered != pinned.get_name():
                # paramiko asks for the pinned type first; the host has no key of that type.
                raise HostKeyMismatch(
                    f"{where} offered no host key of the pinned type ({pinned.get_name()}; it "
                    f"offered {offered}); nothing was run on it",
                    hint="Do not trust this host: the instance the scaler created serves the "
                    "key generated for it. Inspect it in the Vultr console; replace the "
                    "instance if unsure.",
                ) from None
            raise HostKeyMismatch(
                f"{where} presented a host key other than the one pinned at create; "
                "nothing was run on it",
                hint="Do not trust this host: it may not be the instance the scaler created. "
                "Inspect it in the Vultr console; replace the instance if unsure.",
            ) from None
        except paramiko.AuthenticationException:
            client.close()
            raise SSHError(
                f"{where} refused the scaler's SSH key",
                hint=f"Authorize the public half of fleet.ssh_key for {target.user} on the "
                "instance (the cloud-init user-data does this at boot).",
            ) from None
        except TimeoutError as exc:
            client.close()
            raise HostUnreachable(
                f"{where} did not answer within {self.connect_timeout:g}s ({_reason(exc)})",
                hint="The instance may still be booting or be gone; the drain retries on the "
                "next pass.",
            ) from None
        except paramiko.SSHException as exc:
            transport = client.get_transport()
            # No SSH version string from the peer: it accepted TCP but never spoke SSH.
            silent = transport is None or not getattr(transport, "remote_version", "")
            client.close()
            text = str(exc)
            if silent or "banner" in text.lower():
                raise HostUnreachable(
                    f"{where} accepted a connection but sent no SSH banner within "
                    f"{self.connect_timeout:g}s",
                    hint="sshd may be overloaded or not running on that port.",
                ) from None
            if "host key" in text.lower():
                raise HostKeyMismatch(
                    f"{where} offered no host key of the pinned type; nothing was run on it",
                    hint="The instance does not serve the key the scaler generated for it.",
                ) from None
            raise SSHError(f"{where}: SSH failed: {text}") from None
        except EOFError:
            client.close()  # paramiko's word for a peer that closed the connection mid-login
            raise HostUnreachable(
                f"{where} closed the connection during the SSH handshake",
                hint="sshd may be restarting or the instance shutting down; the drain retries "
                "on the next pass.",
            ) from None
        except OSError as exc:
            client.close()
            raise HostUnreachable(
                f"{where} is unreachable ({_reason(exc)})",
                hint="Check the address and the firewall group (port "
                f"{target.port} must be open to the scaler).",
            ) from None
        return client

    def _run(self, target: HostTarget, command: str) -> tuple[int, str, str]:
        """Run ``command`` on ``target``: (exit code, stdout, stderr) within command_timeout."""
        import paramiko

        validate_service(target.service)
        with self._target_lock(target):
            client = self._client(target)
            try:
                return self._exec(client, command)
            except (paramiko.SSHException, OSError, EOFError) as exc:
                # A cached connection that died between commands: one fresh try.
                self._drop(target, client)
                if isinstance(exc, _CommandTimeout):
                    raise SSHError(
                        f"{_where(target)}: `{command}` gave no answer within "
                        f"{self.command_timeout:g}s",
                        hint="The host is overloaded or hung; the drain retries next pass.",
                    ) from None
                client = self._client(target)
                try:
                    return self._exec(client, command)
                except (paramiko.SSHException, OSError, EOFError) as exc2:
                    self._drop(target, client)
                    raise SSHError(f"{_where(target)}: `{command}` failed: {exc2}") from None

    def _drop(self, target: HostTarget, client: paramiko.SSHClient) -> None:
        with self._lock:
            if self._clients.get(target) is client:
                del self._clients[target]
        client.close()

    def _exec(self, client: paramiko.SSHClient, command: str) -> tuple[int, str, str]:
        import paramiko

        transport = client.get_transport()
        if transport is None or not transport.is_active():
            raise EOFError("connection closed")
        deadline = time.monotonic() + self.command_timeout
        channel = transport.open_session(timeout=self.command_timeout)
        # paramiko waits for the answer to the exec request with no timeout of its own: a host
        # that never answers would hold the pass, and the fleet's lock, for good. At the
        # deadline the channel is closed, which ends every wait on it.
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            _close_quietly(channel)

        watchdog = threading.Timer(self.command_timeout, expire)
        watchdog.daemon = True
        watchdog.start()
        try:
            channel.settimeout(self.command_timeout)
            channel.exec_command(command)
            out = _read_all(channel.recv, deadline)
            err = _read_all(channel.recv_stderr, deadline)
            if not channel.status_event.wait(max(0.0, deadline - time.monotonic())):
                raise _CommandTimeout("no exit status")
            if expired.is_set():
                raise _CommandTimeout("no answer")
            return channel.recv_exit_status(), out, err
        except TimeoutError as exc:
            raise _CommandTimeout(str(exc)) from None
        except (paramiko.SSHException, EOFError, OSError):
            if expired.is_set():
                raise _CommandTimeout("no answer") from None
            raise
        finally:
            watchdog.cancel()
            _close_quietly(channel)


def _close_quietly(channel: paramiko.Channel) -> None:
    """Close ``channel``; a transport already gone (the host dropped it: EOFError from
    paramiko) has closed it anyway. Raised in the watchdog's thread, the error printed a
    traceback; raised after the answer, it turned an answer into an error."""
    import paramiko  # loaded already: a channel exists

    with contextlib.suppress(paramiko.SSHException, EOFError, OSError):
        channel.close()


class _CommandTimeout(OSError):
    """A command gave no answer within command_timeout."""


def _read_all(recv: Callable[[int], Any], deadline: float) -> str:
    chunks: list[bytes] = []
    while True:
        if time.monotonic() > deadline:
            raise _CommandTimeout("output not finished")
        data = recv(65536)
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks).decode("utf-8", errors="replace")


def _open_socket(address: str, port: int, timeout: float) -> socket.socket:
    """A TCP connection to the host that neither holds back our small writes nor our ACKs.

    An SSH login and a command are a dozen small messages, each sent with its own write, and
    TCP's defaults stall such exchanges for a delayed ACK (40 ms on Linux, on a real network
    as on loopback), several times per host:

    - Nagle's algorithm holds a message written while the previous one is unacknowledged
      (NEWKEYS then SERVICE_REQUEST at login; a command right after the previous one): off.
    - sshd itself runs Nagle for non-interactive sessions: after login it sends hostkeys-00
      and a debug message, then holds the channel-open confirmation until we ACK those, which
      our kernel delays as long as we have nothing to send. ``_QuickAckSocket`` ACKs at once.
    """
    sock = socket.create_connection((address, port), timeout=timeout)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if _TCP_QUICKACK is not None:
            sock = _QuickAckSocket(fileno=sock.detach())
            sock.settimeout(timeout)  # a socket made from a file descriptor starts blocking
    except OSError:
        sock.close()
        raise
    return sock


# Linux only (elsewhere the delayed ACK stays, as before).
_TCP_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)


class _QuickAckSocket(socket.socket):
    """A TCP socket that ACKs what it received at once (Linux resets TCP_QUICKACK on its own,
    so it is set again after every read; one cheap system call)."""

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        data = super().recv(bufsize, flags)
        with contextlib.suppress(OSError):  # best effort: a closed socket reports itself
            self.setsockopt(socket.IPPROTO_TCP, _TCP_QUICKACK or 0, 1)
        return data


def _transport(sock: socket.socket, **kwargs: Any) -> paramiko.Transport:
    """A paramiko Transport that prefers AES-GCM (paramiko's default puts AES-CTR first).

    With CTR every packet also carries an HMAC, which paramiko compares byte by byte in Python
    (``util.constant_time_bytes_eq``), about a tenth of the scaler's CPU per host, and the
    scaler's CPU is what grows with the number of hosts drained in one pass. GCM authenticates
    inside the cipher, one C call per packet. OpenSSH has offered it since 6.2; the other
    ciphers stay as fallbacks in paramiko's order.
    """
    import paramiko

    transport = paramiko.Transport(sock, **kwargs)
    options = transport.get_security_options()
    options.ciphers = _AEAD_CIPHERS + tuple(c for c in options.ciphers if c not in _AEAD_CIPHERS)
    return transport


_AEAD_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    text = getattr(exc, "strerror", None) or str(exc)
    return text or type(exc).__name__
