"""The worker's connections carry timeouts sized from the lease (checked on a real server)."""

from __future__ import annotations

import psycopg

from vultrscale.worker.runtime import WorkerSettings, connect_kwargs


def test_worker_connections_get_keepalives_and_a_statement_timeout_from_the_lease(
    db_url: str,
) -> None:
    s = WorkerSettings(app="x:y", lease_seconds=60)
    url = db_url + "?options=-c%20lock_timeout%3D7s"  # the address's own options are kept
    kw = connect_kwargs(url, s.lease_seconds, s.statement_timeout_seconds)
    assert kw["keepalives"] == 1 and kw["keepalives_idle"] == 10
    assert kw["tcp_user_timeout"] == 20_000
    with psycopg.connect(url, **kw) as conn:
        assert conn.execute("SHOW statement_timeout").fetchone() == ("10s",)
        assert conn.execute("SHOW lock_timeout").fetchone() == ("7s",)
        params = dict(conn.info.get_parameters())
        assert params.get("keepalives") == "1" and params.get("tcp_user_timeout") == "20000"
