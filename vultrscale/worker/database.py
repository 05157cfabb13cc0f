"""The worker's connections, made through ``db/pg`` and sized from the lease, and the one error a
database failure ends the worker with (``pg.translate``'s, with the worker's own hint).

Every connection has TCP keepalives, ``tcp_user_timeout`` and a ``statement_timeout`` sized
from the lease, so a silent network partition is an error in seconds, not a 15-minute hang.
They are made with ``pg.open_connection``/``pg.pool``, which leave psycopg's errors as they are:
the outage rules (``outage.is_transient``) tell a passing outage from a configuration error by
them; the worker translates once, when it gives up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import psycopg

from vultrscale.db import pg
from vultrscale.errors import DatabaseError
from vultrscale.redaction import first_line, mask_url

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool

# The pool's own reconnect backoff grows to 16 s and more: after a 30 s outage it would leave
# the pool empty long after the database is back. Giving up after 1 s lets the next request
# start a fresh attempt at once (our retries pace those requests).
POOL_RECONNECT_SECONDS = 1.0


def connect_kwargs(lease_seconds: float, application_name: str) -> dict[str, Any]:
    """psycopg connect arguments bounding every wait by the lease: the connect timeout, and TCP
    keepalives and ``tcp_user_timeout`` that end a silently partitioned connection."""
    return {
        "connect_timeout": max(2, int(lease_seconds / 3)),
        **pg.keepalives(lease_seconds),
        "application_name": application_name,
    }


def connect(
    conninfo: str, lease_seconds: float, statement_timeout_s: float, application_name: str
) -> psycopg.Connection[Any]:
    """A direct autocommit connection (registration, the heartbeat, LISTEN); psycopg's errors
    are raised as they are (see the module docstring)."""
    return pg.open_connection(
        conninfo,
        statement_timeout_s=statement_timeout_s,
        **connect_kwargs(lease_seconds, application_name),
    )


def pool(
    conninfo: str, lease_seconds: float, statement_timeout_s: float, max_size: int
) -> ConnectionPool:
    """The pool the slots, the jobs' steps and the main loop share (not yet open)."""
    return pg.pool(
        conninfo,
        name="vultrscale-worker",
        min_size=2,
        max_size=max_size,
        timeout=max(5.0, lease_seconds / 3),
        reconnect_timeout=POOL_RECONNECT_SECONDS,
        statement_timeout_s=statement_timeout_s,
        **connect_kwargs(lease_seconds, "vultrscale-worker"),
    )


def database_error(
    exc: BaseException,
    conninfo: str,
    lease_seconds: float,
    *,
    starting: bool = False,
    waited: float = 0.0,
) -> DatabaseError:
    """The error the worker ends with when the database fails it: at start (``starting``,
    after waiting ``waited`` seconds for it) or while it runs. The password is redacted here,
    where the message is built: libpq echoes parts of a malformed address."""
    where = mask_url(conninfo)
    if starting:
        after = f" after waiting {waited:.0f} s" if waited else ""
        # Mostly a connection refused or a wrong password; a missing table is said as such.
        reach = "cannot reach" if isinstance(exc, psycopg.OperationalError) else "cannot start on"
        doing, unreachable = f"{reach} the database at {where}{after}", pg.HINT_UNREACHABLE
    else:
        doing = f"lost the database at {where}"
        unreachable = (
            "Check that Postgres is reachable. Jobs this worker held return to the queue when "
            f"their lease expires (at most {lease_seconds:g} s); systemd restarts the worker."
        )
    if isinstance(exc, psycopg.Error):
        # Any other error (a failover to a read-only replica, say) ends the worker as a broken
        # connection does: the same hint, not "run `vultrscale db init`".
        return pg.translate(exc, doing, conninfo, unreachable=unreachable, other=unreachable)
    # Not the database's own error (a heartbeat silent without one): the connection's fault.
    return DatabaseError(f"{doing}: {first_line(exc, [conninfo])}", hint=unreachable)
