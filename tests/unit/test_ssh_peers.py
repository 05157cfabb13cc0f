"""The SSH drain against peers that misbehave where OpenSSH never would on purpose: one that
drops the connection in the middle of the handshake, one that never answers the exec request.
Each is a paramiko server on loopback; a failure must stay that host's error, within the
timeouts, and never end the pass."""

from __future__ import annotations

import contextlib
import io
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import paramiko
import pytest

from vultrscale.core.model import HostTarget
from vultrscale.errors import HostUnreachable, SSHError
from vultrscale.ssh import SSHDrain, generate_host_key


@pytest.fixture
def client_key(tmp_path: Path) -> Path:
    private, _public = generate_host_key()  # any ed25519 key in OpenSSH form will do
    path = tmp_path / "id_ed25519"
    path.write_text(private)
    path.chmod(0o600)
    return path


@contextlib.contextmanager
def _listen(serve: Callable[[socket.socket], None]) -> Iterator[int]:
    """Accept on a loopback port and hand each connection to ``serve`` in its own thread."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        done.set()
        thread.join(2)
        server.close()


class _Stalls(paramiko.ServerInterface):
    """Logs anyone in, opens sessions, and sits on an exec request without answering."""

    def __init__(self, release: threading.Event) -> None:
        self.release = release

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return paramiko.OPEN_SUCCEEDED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        self.release.wait(30)  # a stuck host: the request is neither granted nor refused
        return False


def _target(port: int, host_key: str, label: str = "w-1") -> HostTarget:
    return HostTarget(label, "127.0.0.1", port, "worker", host_key, "worker")


def test_a_peer_that_drops_the_handshake_is_that_hosts_unreachable_error(
    client_key: Path,
) -> None:
    def drop(conn: socket.socket) -> None:
        conn.settimeout(10)
        conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
        conn.recv(4096)  # the client's banner (and perhaps its key exchange)
        # End our side with a FIN, as a shutting-down sshd does, then read whatever the client
        # still sends until it closes: closing with unread bytes would send a reset instead,
        # a different failure ("connection reset") that this test is not about.
        conn.shutdown(socket.SHUT_WR)
        with contextlib.suppress(OSError):
            while conn.recv(4096):
                pass
        conn.close()

    _private, public = generate_host_key()
    with _listen(drop) as port, SSHDrain(str(client_key)) as drain:
        results = drain.is_active_many([_target(port, public), _target(port, "", "w-2")])
    assert isinstance(results["w-1"], HostUnreachable)
    assert "closed the connection during the SSH handshake" in results["w-1"].message
    assert isinstance(results["w-2"], SSHError)  # no pinned key: its own error, the same pass


def test_a_damaged_pin_is_that_hosts_error(client_key: Path) -> None:
    with SSHDrain(str(client_key)) as drain:
        results = drain.is_active_many([_target(1, "ssh-ed448 AAAAC3NzaC1lZDQ0OA==")])
    assert isinstance(results["w-1"], SSHError) and "pinned host key" in results["w-1"].message


def test_an_exec_request_never_answered_times_out_within_the_command_timeout(
    client_key: Path,
) -> None:
    private, public = generate_host_key()
    host_key = paramiko.Ed25519Key.from_private_key(io.StringIO(private))
    release = threading.Event()

    def stall(conn: socket.socket) -> None:
        transport = paramiko.Transport(conn)
        transport.add_server_key(host_key)
        transport.start_server(server=_Stalls(release))
        release.wait(30)
        transport.close()

    try:
        with (
            _listen(stall) as port,
            SSHDrain(str(client_key), connect_timeout=5, command_timeout=1.0) as drain,
        ):
            started = time.monotonic()
            results = drain.is_active_many([_target(port, public)])
            elapsed = time.monotonic() - started
    finally:
        release.set()
    assert isinstance(results["w-1"], SSHError)
    assert "gave no answer within 1s" in results["w-1"].message
    assert elapsed < 4, f"the exec request was waited on for {elapsed:.1f}s"


def test_closing_a_channel_whose_transport_is_gone_raises_nothing() -> None:
    """The command watchdog closes the channel from its own thread (an error there printed a
    traceback), and every command closes it after the answer (an error there turned the
    answer into an error): a host that dropped the connection makes paramiko raise EOFError."""
    from vultrscale.ssh import _close_quietly

    class Dropped:
        closed = 0

        def close(self) -> None:
            self.closed += 1
            raise EOFError()

    channel = Dropped()
    _close_quietly(channel)  # type: ignore[arg-type]
    assert channel.closed == 1


def test_a_closed_drain_keeps_nothing_of_the_hosts_it_served(client_key: Path) -> None:
    # `vultrscale demo` keeps one drain for its whole loop (closed after every pass): a lock per
    # host it had ever served stayed behind, one more for every instance the fleet went through.
    refusing = socket.socket()  # bound, never listening: each host is refused at once
    refusing.bind(("127.0.0.1", 0))
    _private, public = generate_host_key()
    port = refusing.getsockname()[1]
    try:
        with SSHDrain(str(client_key), connect_timeout=2) as drain:
            for n in range(3):
                targets = [_target(port, public, f"w-{n}-{i}") for i in range(5)]
                results = drain.is_active_many(targets)
                assert all(isinstance(r, HostUnreachable) for r in results.values())
                drain.close()  # as the pass does at its end
                assert drain._clients == {} and drain._target_locks == {}
    finally:
        refusing.close()
