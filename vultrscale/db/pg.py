"""The one Postgres edge: connect with the project's timeouts, translate psycopg errors.

Every part that talks to Postgres (the reconcile pass, the ledger, the signals, the snapshots,
the schema, the CLI commands and the demo) connects here and lets ``translated`` turn a psycopg
error into a ``DatabaseError`` with one of the hints below, passwords removed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import psycopg

from vultrscale.errors import DatabaseError
from vultrscale.redaction import first_line, mask_url

if TYPE_CHECKING:  # the pool's module is imported by the worker only, when it makes one
    from psycopg_pool import ConnectionPool

# A connect that has not succeeded in 10 s will not: the host is down or a firewall drops us.
# Long enough for a cold TLS handshake over a slow link, short enough for a 30 s pass interval.
CONNECT_TIMEOUT_S = 10

# The scaler's pass connection (`reconcile`, `status`): a statement stuck behind a lock or a
# network that went silent mid-pass ends in an error within about this long, and `--loop` goes
# on with its next pass, instead of waiting out TCP's retransmissions (15 minutes on Linux)
# while holding the fleet's lock. A steady pass's statements take milliseconds; the queue
# signals keep their own, shorter bound.
PASS_STALL_S = 30.0

HINT_UNREACHABLE = "Check DATABASE_URL (host, port, user, database) and that Postgres is running."
HINT_NO_TABLES = "Run `vultrscale db init` against this DATABASE_URL first."
HINT_OLD_SCHEMA = (
    "Run `vultrscale db init` against this DATABASE_URL: it upgrades the schema (and the "
    "workers' grants) to this version's; upgrade it before rolling out new workers."
)
HINT_PRIVILEGE = "Check that this database user may read and write the vultrscale tables."
HINT_STALLED = (
    "A statement ran out of time: another session may hold a lock on the vultrscale tables (look "
    "in pg_stat_activity), or the database is overloaded; the next pass tries again."
)


def translate(
    exc: psycopg.Error,
    doing: str,
    url: str = "",
    *,
    unreachable: str = HINT_UNREACHABLE,
    other: str | None = None,
) -> DatabaseError:
    """The project's error for a psycopg error met while ``doing`` something; ``unreachable``
    is the hint for a connection that failed or broke, ``other`` for any other error
    (DatabaseError's own when None). The worker passes its own for both, naming its leases."""
    line = first_line(exc, [url])
    if isinstance(exc, psycopg.errors.UndefinedTable):
        return DatabaseError(
            f"{doing}: the vultrscale tables are missing ({line})", hint=HINT_NO_TABLES
        )
    if isinstance(exc, psycopg.errors.UndefinedColumn):  # a column a later version added
        return DatabaseError(
            f"{doing}: the vultrscale schema is older than this vultrscale ({line})",
            hint=HINT_OLD_SCHEMA,
        )
    if isinstance(exc, psycopg.errors.QueryCanceled):  # statement_timeout (PASS_STALL_S)
        return DatabaseError(f"{doing}: {line}", hint=HINT_STALLED)
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        return DatabaseError(f"{doing}: {line}", hint=HINT_PRIVILEGE)
    if isinstance(exc, psycopg.OperationalError):
        return DatabaseError(f"{doing}: {line}", hint=unreachable)
    return DatabaseError(f"{doing}: {line}", hint=other)


@contextmanager
def translated(doing: str, url: str = "") -> Iterator[None]:
    """Run the block; a psycopg error leaves it as a ``DatabaseError``."""
    try:
        yield
    except psycopg.Error as exc:
        raise translate(exc, doing, url) from None


def keepalives(within_s: float) -> dict[str, Any]:
    """libpq's TCP settings that end a silently partitioned connection within about
    ``within_s``: keepalives while waiting for an answer, ``tcp_user_timeout`` while data sent
    goes unacknowledged (the worker sizes them from its lease, the pass from PASS_STALL_S)."""
    return {
        "keepalives": 1,
        "keepalives_idle": max(1, int(within_s / 6)),
        "keepalives_interval": max(1, int(within_s / 12)),
        "keepalives_count": 3,
        "tcp_user_timeout": int(max(2.0, within_s / 3) * 1000),
    }


def server_keepalives(conn: psycopg.Connection[Any], within_s: float) -> None:
    """The server's side of ``keepalives``: the server ends this session within about
    ``within_s`` of its client vanishing without a word (a scaler host's power lost, its
    network cut), so the advisory locks the session holds (a fleet's pass lock, the
    account's) are free for the other host's next pass; the server's defaults wait two hours.
    A killed process's socket is closed by its kernel and frees them at once. Ignored on a
    Unix socket; ``tcp_user_timeout`` needs Postgres 12."""
    idle, interval = max(1, int(within_s / 6)), max(1, int(within_s / 12))
    conn.execute(f"SET tcp_keepalives_idle = {idle}")
    conn.execute(f"SET tcp_keepalives_interval = {interval}")
    conn.execute("SET tcp_keepalives_count = 3")
    if conn.info.server_version >= 120000:
        conn.execute(f"SET tcp_user_timeout = {int(max(2.0, within_s / 3) * 1000)}")


def configure(conn: psycopg.Connection[Any], statement_timeout_s: float = 0.0) -> None:
    """The session settings every connection gets, the pooled ones too (``pool``).

    Timestamps arrive in UTC, whatever the server's or the role's TimeZone: two read in a zone
    with daylight saving (Europe/Berlin) subtract in wall-clock time in Python, an hour off
    across the change (a replayed history's gaps); and datetimes of another tzinfo (even
    "Etc/UTC") each ask for their offset when compared, which makes the pass's pure core 1.7x
    slower. SETs, not startup options: PgBouncer refuses unknown startup parameters.
    ``statement_timeout_s``: the session's bound on every statement (0: the server's)."""
    conn.execute("SET TimeZone TO 'UTC'")
    if statement_timeout_s:
        conn.execute(f"SET statement_timeout = {int(statement_timeout_s * 1000)}")


def open_connection(
    url: str, *, autocommit: bool = True, statement_timeout_s: float = 0.0, **kwargs: Any
) -> psycopg.Connection[Any]:
    """``connect`` without the translation: psycopg's own errors reach the caller, for one that
    tells a passing outage from a configuration error by them (the worker rides outages out)."""
    kwargs.setdefault("connect_timeout", CONNECT_TIMEOUT_S)
    conn = psycopg.connect(url, autocommit=autocommit, **kwargs)
    try:
        configure(conn, statement_timeout_s)
        if not autocommit:
            conn.commit()
    except BaseException:
        conn.close()
        raise
    return conn


def connect(
    url: str,
    *,
    autocommit: bool = True,
    doing: str = "",
    statement_timeout_s: float = 0.0,
    **kwargs: Any,
) -> psycopg.Connection[Any]:
    """A connection to ``url`` with the project's connect timeout and session settings
    (``configure``; ``kwargs`` go to psycopg); a failure names what it was for (``doing``) and
    where, password masked."""
    where = f"cannot reach the database at {mask_url(url)}"
    with translated(f"{doing}: {where}" if doing else where, url):
        try:
            return open_connection(
                url, autocommit=autocommit, statement_timeout_s=statement_timeout_s, **kwargs
            )
        except UnicodeError:  # a host the resolver refuses (conninfo_problem checks first)
            raise DatabaseError(
                f"{doing + ': ' if doing else ''}{where}: its host is not a valid host name",
                hint="Check the host in the connection string (an empty or overlong label?).",
            ) from None


def pool(
    url: str,
    *,
    name: str,
    max_size: int,
    timeout: float,
    reconnect_timeout: float,
    min_size: int = 1,
    statement_timeout_s: float = 0.0,
    **kwargs: Any,
) -> ConnectionPool:
    """A pool of autocommit connections to ``url``, not yet open (``open()``), each made as
    ``connect`` makes one (connect timeout, ``configure``); ``kwargs`` go to psycopg."""
    from psycopg_pool import ConnectionPool

    kwargs.setdefault("connect_timeout", CONNECT_TIMEOUT_S)
    return ConnectionPool(
        url,
        min_size=min_size,
        max_size=max_size,
        kwargs={"autocommit": True, **kwargs},
        configure=lambda conn: configure(conn, statement_timeout_s),
        timeout=timeout,
        reconnect_timeout=reconnect_timeout,
        open=False,
        name=name,
    )


@contextmanager
def session(url: str, doing: str, *, autocommit: bool = True) -> Iterator[psycopg.Connection[Any]]:
    """Connect, run the block, close; psycopg errors inside become ``DatabaseError``s."""
    conn = connect(url, autocommit=autocommit, doing=doing)
    try:
        with translated(doing, url), conn:
            yield conn
    finally:
        conn.close()
