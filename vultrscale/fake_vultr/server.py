"""Two ways to reach a Simulator: an in-process httpx transport and a loopback HTTP server.

Both turn the request into a :class:`SimRequest` and call :meth:`Simulator.handle`, so the
client code under test is the same code that talks to ``api.vultr.com``.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit

import httpx

from vultrscale.fake_vultr.app import Simulator
from vultrscale.fake_vultr.wire import SimRequest, SimResponse


class SimTransport(httpx.BaseTransport):
    """An httpx transport that answers from ``sim`` without any network.

    ``client`` is the address the rate limiter keys on (a request header ``X-Sim-Client``
    overrides it). A dropped connection raises ``httpx.RemoteProtocolError`` like a server
    that closed the socket without answering.
    """

    def __init__(self, sim: Simulator, client: str = "in-process") -> None:
        self.sim = sim
        self.client = client

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body = request.read()
        req = SimRequest(
            method=request.method,
            path=request.url.path,
            query=dict(parse_qsl(request.url.query.decode(), keep_blank_values=True)),
            headers={k.lower(): v for k, v in request.headers.items()},
            body=body,
            client=self.client,
        )
        resp = self.sim.handle(req)
        if resp.drop:
            raise httpx.RemoteProtocolError(
                "Server disconnected without sending a response.", request=request
            )
        return httpx.Response(
            resp.status, headers=dict(resp.headers), content=resp.body, request=request
        )


@dataclass
class ServerHandle:
    """A running loopback server: ``url`` to point the client at, ``stop()`` to end it."""

    url: str
    host: str
    port: int
    _server: ThreadingHTTPServer
    _threads: tuple[threading.Thread, ...]
    _stopping: threading.Event

    def stop(self) -> None:
        """Stop serving, close the socket and join the threads (idempotent)."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        for thread in self._threads:
            thread.join(timeout=5)

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _handler_for(sim: Simulator) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, like the real API behind nginx
        server_version = "nginx"
        sys_version = ""
        disable_nagle_algorithm = True  # headers and body go out in two writes

        def _serve(self) -> None:
            parts = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            req = SimRequest(
                method=self.command,
                path=parts.path,
                query=dict(parse_qsl(parts.query, keep_blank_values=True)),
                headers={k.lower(): v for k, v in self.headers.items()},
                body=body,
                client=self.client_address[0],
            )
            resp: SimResponse = sim.handle(req)
            if resp.drop:
                # the request was acted on; the client gets no answer at all
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self.connection.shutdown(socket.SHUT_RDWR)
                return
            try:
                self.send_response(resp.status)
                for name, value in resp.headers.items():
                    self.send_header(name, value)
                if resp.status != 204:
                    self.send_header("Content-Length", str(len(resp.body)))
                self.end_headers()
                if resp.status != 204:
                    self.wfile.write(resp.body)
            except (BrokenPipeError, ConnectionResetError):
                # the client gave up (its timeout) while we were answering
                self.close_connection = True

        do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = _serve

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            """Quiet: the simulator keeps its own request log."""

    return Handler


def start_server(
    sim: Simulator, host: str = "127.0.0.1", port: int = 0, *, tick_interval: float = 0.2
) -> ServerHandle:
    """Serve ``sim`` over HTTP on ``host:port`` (0 picks a free port) in background threads.

    A ticker thread advances lifecycles every ``tick_interval`` seconds of wall time so that
    ``on_instance_ready`` fires even when nobody is polling.
    """
    server = ThreadingHTTPServer((host, port), _handler_for(sim))
    server.daemon_threads = True
    raw_host, bound_port = server.server_address[:2]
    bound_host = raw_host.decode() if isinstance(raw_host, bytes) else str(raw_host)
    stopping = threading.Event()

    def tick_loop() -> None:
        while not stopping.wait(tick_interval):
            sim.tick()

    threads = (
        threading.Thread(
            target=server.serve_forever, args=(0.05,), name="vultr-sim-http", daemon=True
        ),
        threading.Thread(target=tick_loop, name="vultr-sim-tick", daemon=True),
    )
    for thread in threads:
        thread.start()
    url_host = f"[{bound_host}]" if ":" in bound_host else bound_host
    return ServerHandle(
        url=f"http://{url_host}:{bound_port}",
        host=bound_host,
        port=int(bound_port),
        _server=server,
        _threads=threads,
        _stopping=stopping,
    )


@contextlib.contextmanager
def serving(sim: Simulator, host: str = "127.0.0.1", port: int = 0) -> Iterator[ServerHandle]:
    """``start_server`` as a context manager."""
    handle = start_server(sim, host, port)
    try:
        yield handle
    finally:
        handle.stop()
