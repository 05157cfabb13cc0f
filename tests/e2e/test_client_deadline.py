"""The Vultr client against a real loopback server that answers slowly: every call ends by its
deadline however the answer trickles (httpx alone bounds each read, not the whole)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from vultrscale.core.clock import Deadline
from vultrscale.vultr.client import VultrClient
from vultrscale.vultr.errors import AmbiguousCreate, ApiUnreachable

pytestmark = pytest.mark.e2e

KEY = "TRICKLEKEY0123456789ABCDEFGHIJKLMNOP"
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
# However slow the client, the server stops after this long: a test that fails ends too.
SERVER_LIMIT_S = 8.0


class SlowServer:
    """Loopback only. ``mode``: ``silent`` reads the request and never answers; ``head``
    trickles the status line and headers; ``body`` sends the headers, then the body a byte at
    a time. ``gap`` is the time between bytes, well under the client's per-read timeout."""

    def __init__(self, mode: str, gap: float = 0.05) -> None:
        self.mode, self.gap = mode, gap
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.stop = threading.Event()
        self.connections = 0
        self.threads: list[threading.Thread] = []

    def serve(self) -> None:
        self.sock.settimeout(0.1)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.connections += 1
            t = threading.Thread(target=self.answer, args=(conn,), daemon=True)
            t.start()
            self.threads.append(t)

    def answer(self, conn: socket.socket) -> None:
        began = time.monotonic()
        with conn:
            conn.settimeout(1.0)
            try:
                conn.recv(65536)  # the request
                if self.mode == "body":
                    conn.sendall(HEAD)
                data = HEAD if self.mode == "head" else b"{" + b" " * 99998 + b"}"
                for i in range(len(data)):
                    if self.stop.is_set() or time.monotonic() - began > SERVER_LIMIT_S:
                        return
                    if self.mode != "silent":
                        conn.sendall(data[i : i + 1])
                    self.stop.wait(self.gap)
            except OSError:  # the client hung up: what a deadline does
                return


@contextmanager
def slow_server(mode: str) -> Iterator[SlowServer]:
    server = SlowServer(mode)
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.stop.set()
        thread.join(5)
        for t in server.threads:
            t.join(5)
        server.sock.close()


@pytest.mark.parametrize("mode", ["silent", "head", "body"])
def test_a_call_to_a_slow_api_ends_by_the_pass_deadline(mode: str) -> None:
    # Per-read timeout 1 s, bytes every 0.05 s: before, a trickle held the call until the
    # server stopped (SERVER_LIMIT_S); a silent server took 5 attempts of 1 s and backoff.
    deadline = Deadline(3.0)
    with (
        slow_server(mode) as server,
        VultrClient(KEY, server.url, timeout=1.0, deadline=deadline) as client,
    ):
        began = time.monotonic()
        with deadline.running(), pytest.raises(ApiUnreachable) as info:
            client.account()
        took = time.monotonic() - began
    # Margin for a loaded machine; before, the trickles ran 8 s and silence about 12 s.
    assert took < 3.0 + 1.5, f"{mode}: gave up after {took:.2f}s"
    assert server.connections >= 2  # retried within the deadline, each attempt cut at 1 s
    assert "deadline" in info.value.message
    assert KEY not in info.value.message


def test_a_create_answered_by_a_trickle_ends_by_its_timeout_as_ambiguous() -> None:
    with slow_server("body") as server, VultrClient(KEY, server.url, timeout=1.0) as client:
        began = time.monotonic()
        with pytest.raises(AmbiguousCreate):
            client.create_instance(
                region="ewr", plan="vc2-1c-2gb", label="w-1", tags=["t"], snapshot_id="s"
            )
        took = time.monotonic() - began
    assert took < 1.0 + 1.5, f"gave up after {took:.2f}s"  # before: 8 s, the whole trickle
    assert server.connections == 1  # a create that may have happened is never sent again
