"""The Vultr client's sockets, each wait bounded by the call's end.

httpx bounds each read only, so a server sending a byte every few seconds held a call for good.
``BoundedTransport`` is an httpx transport made of httpcore's pools through httpcore's public
API, with a network backend of ours that cuts every connect, TLS handshake, read and write to
the time the call has left (``Limit``); httpx's own transport takes no backend. Proxies come
from the environment as httpx reads them. The name lookup is not bounded: the standard
library's ``getaddrinfo`` takes no timeout.
"""

from __future__ import annotations

import contextlib
import ssl
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

import httpcore

from vultrscale.vultr._http import httpx


class Limit:
    """A wall-clock end per thread for the sockets of one client: every connect, TLS handshake,
    read and write waits at most until then, and none begins after it. httpx bounds each read
    only, so a server sending a byte every few seconds held a call for good; bounded here, an
    attempt ends when its time is up, whether the headers or the body trickle."""

    def __init__(self) -> None:
        self._local = threading.local()  # the pass lists the cloud in a thread of its own

    def set(self, until: float | None) -> None:
        """Bound this thread's requests to ``until`` (time.monotonic); None: no bound."""
        self._local.until = until

    def clamp(self, timeout: float | None, error: type[Exception]) -> float | None:
        """``timeout`` cut to the time left; ``error`` once none is left."""
        until: float | None = getattr(self._local, "until", None)
        if until is None:
            return timeout
        left = until - time.monotonic()
        if left <= 0:
            raise error("the call's time is up")
        return left if timeout is None else min(timeout, left)


class LimitedBackend(httpcore.NetworkBackend):
    def __init__(self, backend: httpcore.NetworkBackend, limit: Limit) -> None:
        self._backend = backend
        self._limit = limit

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        timeout = self._limit.clamp(timeout, httpcore.ConnectTimeout)
        stream = self._backend.connect_tcp(host, port, timeout, local_address, socket_options)
        return LimitedStream(stream, self._limit)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        timeout = self._limit.clamp(timeout, httpcore.ConnectTimeout)
        stream = self._backend.connect_unix_socket(path, timeout, socket_options)
        return LimitedStream(stream, self._limit)

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


class LimitedStream(httpcore.NetworkStream):
    def __init__(self, stream: httpcore.NetworkStream, limit: Limit) -> None:
        self._stream = stream
        self._limit = limit

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, self._limit.clamp(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, self._limit.clamp(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        timeout = self._limit.clamp(timeout, httpcore.ConnectTimeout)
        stream = self._stream.start_tls(ssl_context, server_hostname, timeout)
        return LimitedStream(stream, self._limit)

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


# httpcore's errors as httpx raises them (httpx maps them so in its own transport): the client
# and its retries read httpx's.
_HTTPCORE_ERRORS: tuple[tuple[type[Exception], type[httpx.HTTPError]], ...] = (
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.NetworkError, httpx.NetworkError),
    (httpcore.ProxyError, httpx.ProxyError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.ProtocolError, httpx.ProtocolError),
)


@contextlib.contextmanager
def _as_httpx() -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        for theirs, ours in _HTTPCORE_ERRORS:  # the most specific first
            if isinstance(exc, theirs):
                raise ours(str(exc)) from exc
        raise


class _Body(httpx.SyncByteStream):
    def __init__(self, stream: Iterable[bytes]) -> None:
        self._stream = stream

    def __iter__(self) -> Iterator[bytes]:
        with _as_httpx():
            yield from self._stream

    def close(self) -> None:
        close = getattr(self._stream, "close", None)
        if close is not None:
            close()


class BoundedTransport(httpx.BaseTransport):
    """An httpx transport whose sockets all wait at most until ``limit`` says: httpcore's
    pools, made through its public API with a network backend of ours (httpx's own transport
    takes no backend). Proxies come from the environment as httpx reads them (HTTPS_PROXY,
    HTTP_PROXY, ALL_PROXY, NO_PROXY: the standard library's ``getproxies`` and
    ``proxy_bypass``), their sockets bounded too."""

    def __init__(self, limit: Limit) -> None:
        from urllib.request import getproxies

        self._ssl = httpx.create_ssl_context()
        self.backend = LimitedBackend(httpcore.SyncBackend(), limit)
        self._direct = httpcore.ConnectionPool(ssl_context=self._ssl, network_backend=self.backend)
        found = getproxies()
        # NO_PROXY "*": nothing goes through a proxy (urllib's proxy_bypass reads it so too).
        self._proxy_urls = (
            {}
            if found.get("no", "").strip() == "*"
            else {k: v for k, v in found.items() if k in ("http", "https", "all") and v}
        )
        self._proxies: dict[str, httpcore.ConnectionPool] = {}  # made on first use

    def _proxy(self, proxy: httpx.Proxy) -> httpcore.ConnectionPool:
        url = httpcore.URL(
            scheme=proxy.url.raw_scheme,
            host=proxy.url.raw_host,
            port=proxy.url.port,
            target=proxy.url.raw_path,
        )
        if proxy.url.scheme in ("socks5", "socks5h"):
            return httpcore.SOCKSProxy(
                proxy_url=url,
                proxy_auth=proxy.raw_auth,
                ssl_context=self._ssl,
                network_backend=self.backend,
            )
        return httpcore.HTTPProxy(
            proxy_url=url,
            proxy_auth=proxy.raw_auth,
            proxy_headers=proxy.headers.raw,
            ssl_context=self._ssl,
            proxy_ssl_context=proxy.ssl_context,
            network_backend=self.backend,
        )

    def pool_for(self, url: httpx.URL) -> httpcore.ConnectionPool:
        """The pool a request to ``url`` goes through: its scheme's proxy (or ALL_PROXY's)
        unless NO_PROXY names its host, else straight."""
        from urllib.request import proxy_bypass

        scheme = url.scheme if url.scheme in self._proxy_urls else "all"
        proxy_url = self._proxy_urls.get(scheme)
        # The host with its port: NO_PROXY may name either (urllib checks both).
        if proxy_url is None or proxy_bypass(url.netloc.decode("ascii")):
            return self._direct
        if scheme not in self._proxies:
            full = proxy_url if "://" in proxy_url else f"http://{proxy_url}"
            self._proxies[scheme] = self._proxy(httpx.Proxy(full))
        return self._proxies[scheme]

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.SyncByteStream)
        req = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        with _as_httpx():
            resp = self.pool_for(request.url).handle_request(req)
        assert isinstance(resp.stream, Iterable)
        return httpx.Response(
            status_code=resp.status,
            headers=resp.headers,
            stream=_Body(resp.stream),
            extensions=resp.extensions,
        )

    def close(self) -> None:
        for pool in (self._direct, *self._proxies.values()):
            pool.close()
