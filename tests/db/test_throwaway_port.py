"""The throwaway Postgres cannot be given port 0: it is given a port found free, which another
process may take before the server binds it. Then it starts on another one."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import psycopg
import pytest

from vultrscale.db import throwaway


@pytest.mark.filterwarnings("ignore:XDG_RUNTIME_DIR")
def test_a_port_taken_between_the_choice_and_the_start_is_replaced_by_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        free = throwaway._free_port
        ports: Iterator[int] = iter([busy])
        # the first port handed out is the one another process holds; then free ones
        monkeypatch.setattr(throwaway, "_free_port", lambda: next(ports, None) or free())
        server = throwaway.start()
        try:
            assert server.port != busy
            with psycopg.connect(server.url) as conn:
                assert conn.execute("select 1").fetchone() == (1,)
        finally:
            server.stop()
    assert not server.datadir.parent.exists()
