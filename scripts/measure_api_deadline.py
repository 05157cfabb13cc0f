#!/usr/bin/env python3
"""Measure: how long the Vultr client takes to give up on an API that is silent or trickles.

Starts a server on loopback (127.0.0.1, an ephemeral port) that reads each request and then,
by ``--mode``: ``silent`` never answers; ``head`` sends the status line and headers one byte
every ``--gap`` seconds; ``body`` sends the headers, then a 100 kB body one byte every
``--gap`` seconds. The server gives up on its own after ``--server-limit`` seconds per
connection, so even a client without a bound ends. Then it times one ``GET /v2/account`` by
the real client (its default 10 s timeout and 5 attempts), inside a pass deadline of
``--deadline`` seconds (the reconcile pass's, 30 s, by default; 0: none, the call's own limit).

Example: python scripts/measure_api_deadline.py --mode body
"""

from __future__ import annotations

import argparse
import socket
import sys
import threading
import time
from contextlib import nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vultrscale.core.clock import PASS_DEADLINE_S, Deadline  # noqa: E402
from vultrscale.errors import VultrscaleError  # noqa: E402
from vultrscale.vultr.client import VultrClient  # noqa: E402

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
BODY = b"{" + b" " * 99998 + b"}"


def serve(sock: socket.socket, mode: str, gap: float, limit: float, stop: threading.Event) -> int:
    """Answer connections until ``stop``; returns how many were made."""
    count = 0
    sock.settimeout(0.1)
    while not stop.is_set():
        try:
            conn, _ = sock.accept()
        except TimeoutError:
            continue
        count += 1
        threading.Thread(target=answer, args=(conn, mode, gap, limit, stop), daemon=True).start()
    return count


def answer(conn: socket.socket, mode: str, gap: float, limit: float, stop: threading.Event) -> None:
    began = time.monotonic()
    with conn:
        try:
            conn.settimeout(limit)
            conn.recv(65536)
            if mode == "body":
                conn.sendall(HEAD)
            data = HEAD if mode == "head" else BODY
            for i in range(len(data)):
                if stop.is_set() or time.monotonic() - began > limit:
                    return
                if mode != "silent":
                    conn.sendall(data[i : i + 1])
                stop.wait(gap)
        except OSError:
            return


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="measure_api_deadline.py", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--mode", choices=("silent", "head", "body"), default="body")
    parser.add_argument("--gap", type=float, default=0.5, help="seconds between bytes (0.5)")
    parser.add_argument(
        "--deadline", type=float, default=PASS_DEADLINE_S, help="pass deadline (30; 0: none)"
    )
    parser.add_argument(
        "--server-limit", type=float, default=180.0, help="the server's own bound (180)"
    )
    args = parser.parse_args()

    sock = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    counted: list[int] = []
    server = threading.Thread(
        target=lambda: counted.append(serve(sock, args.mode, args.gap, args.server_limit, stop)),
        daemon=True,
    )
    server.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    deadline = Deadline(args.deadline) if args.deadline > 0 else None
    began = time.monotonic()
    outcome = "answered"
    try:
        client = VultrClient("MEASUREKEY0123456789ABCDEFGHIJKL", url, deadline=deadline)
        with client, deadline.running() if deadline else nullcontext():
            client.account()
    except VultrscaleError as exc:
        outcome = f"{type(exc).__name__}: {exc.message}"
    took = time.monotonic() - began
    stop.set()
    server.join(5)
    sock.close()
    print(f"mode={args.mode} gap={args.gap}s deadline={args.deadline or 'none'}")
    print(f"gave up after {took:.1f}s, {counted[0] if counted else '?'} connection(s)")
    print(f"error: {outcome}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
