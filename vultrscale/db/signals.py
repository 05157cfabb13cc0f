"""The queue signals the scaler reads, for our own queue and for foreign ones (presets).

Each preset (``db/presets/``, one module per library, which says what each number means there)
is a list of statements and what their answers mean. ``read_signals`` sends them in ONE
read-only REPEATABLE READ transaction, so the numbers come from one snapshot and one ``now()``
(the database clock; no client clock is used), and in one pipeline: BEGIN, the statements
(one round trip), COMMIT, whatever the preset. In a pass they go with the ledger's reads
(``send_signals``): no round trip of their own.

"No data" is never read as zero: a failing query, a missing row or a NULL raises
``DatabaseError``; the scaler then holds the fleet. A foreign preset that meets a database
without its library's tables, or with a version of them it does not read, raises
``QueueSchemaError`` (exit 2) naming the preset, what is missing and the versions it reads.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql

from vultrscale.config import QueueConfig
from vultrscale.core.model import Signals
from vultrscale.db import pg
from vultrscale.db.presets import PRESETS
from vultrscale.db.presets.base import Read, Statement
from vultrscale.db.presets.builtin import explain_ready_count
from vultrscale.errors import ConfigError, DatabaseError, QueueSchemaError
from vultrscale.redaction import first_line

__all__ = [
    "STATEMENT_TIMEOUT_MS",
    "SentSignals",
    "explain_ready_count",
    "read_signals",
    "translate",
    "translated",
]

#: A signal read that takes longer than this is cancelled (and raises): the scaler holds.
STATEMENT_TIMEOUT_MS = 10_000

_TABLE_HINTS = {
    "vultrscale": "Run `vultrscale db init`, or set queue.preset to the queue you use.",
    "custom": "Check queue.ready_sql, queue.in_flight_sql and queue.oldest_ready_seconds_sql "
    "(and queue.recent_jobs_sql, queue.recent_arrivals_sql).",
}


def preset_read(queue_cfg: QueueConfig, stale_after: timedelta | None = None) -> Read:
    """The statements of the preset's signal read; ConfigError for an unknown preset or a
    custom preset without its SQL."""
    preset = PRESETS.get(queue_cfg.preset)
    if preset is None:
        raise ConfigError(
            [f"queue.preset: unknown preset {queue_cfg.preset!r} (one of {', '.join(PRESETS)})"]
        )
    return preset.read(queue_cfg.queue or None, queue_cfg, stale_after)


def read_signals(
    conn_or_url: psycopg.Connection[Any] | str,
    queue_cfg: QueueConfig,
    *,
    stale_after: timedelta | None = None,
) -> Signals:
    """Read ready, in-flight, expired, oldest-ready age, leases per worker and (where the
    library keeps them) the recent finished jobs and arrivals, in one snapshot.

    ``conn_or_url`` is a database URL (a connection is opened and closed here) or an open
    connection with no transaction in progress. ``stale_after`` overrides the liveness window
    of the procrastinate, pgqueuer and graphile-worker presets. Raises DatabaseError (never
    returns a guess) and ConfigError for an unknown preset or a custom preset without its SQL.
    """
    read = preset_read(queue_cfg, stale_after)
    with _connection(conn_or_url) as conn, translated(conn_or_url, queue_cfg.preset):
        if conn.closed:
            raise DatabaseError(
                "read_signals got a closed connection", hint="Reconnect, or pass a database URL."
            )
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            raise DatabaseError(
                "read_signals needs a connection with no transaction in progress",
                hint="Commit or roll back first, or pass a database URL.",
            )
        with conn.transaction():
            with conn.pipeline():
                # SET TRANSACTION must be the first statement of the transaction.
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                conn.execute(_timeout())
                cursors = [_send(conn, s) for s in read.statements]
            return read.signals([cur.fetchall() for cur in cursors])


def _timeout() -> sql.Composed:
    return sql.SQL("SET LOCAL statement_timeout = {}").format(sql.Literal(STATEMENT_TIMEOUT_MS))


def _send(conn: psycopg.Connection[Any], statement: Statement) -> psycopg.Cursor[Any]:
    """One statement of a read, sent in the connection's pipeline; its cursor holds the answer."""
    cur = conn.cursor(binary=statement.binary)
    cur.execute(statement.query, statement.params)
    return cur


# --- connection and error translation ----------------------------------------------------------


@contextmanager
def _connection(conn_or_url: psycopg.Connection[Any] | str) -> Iterator[psycopg.Connection[Any]]:
    if not isinstance(conn_or_url, str):
        yield conn_or_url
        return
    conn = pg.connect(conn_or_url)
    try:
        yield conn
    finally:
        conn.close()


# The errors of a statement that names what the library's schema lacks: a table, a column, a
# type, a function, an enum value (a version that has not got it).
_MISSING = (
    pg_errors.UndefinedTable,
    pg_errors.UndefinedColumn,
    pg_errors.UndefinedObject,
    pg_errors.UndefinedFunction,
    pg_errors.InvalidSchemaName,
)


@contextmanager
def translated(
    conn_or_url: psycopg.Connection[Any] | str, preset: str, doing: str = "reading queue signals"
) -> Iterator[None]:
    """Turn psycopg errors into DatabaseError with a hint, password removed."""
    url = conn_or_url if isinstance(conn_or_url, str) else ""
    try:
        yield
    except psycopg.Error as exc:
        raise translate(exc, preset, url, doing) from exc


def translate(
    exc: psycopg.Error, preset: str, url: str = "", doing: str = "reading queue signals"
) -> DatabaseError:
    """A psycopg error met ``doing`` something with the preset's tables (a signal read, a
    history read) as the error the scaler reports."""
    line = f"{doing} (preset {preset}): {_primary(exc, url)}"
    library = PRESETS.get(preset)
    if isinstance(exc, pg_errors.QueryCanceled):
        return DatabaseError(
            f"{doing} (preset {preset}) took longer than "
            f"{STATEMENT_TIMEOUT_MS / 1000:g} s and was cancelled",
            hint="Check the queue table's indexes and bloat (VACUUM), or the database load.",
        )
    if isinstance(exc, psycopg.OperationalError):
        return DatabaseError(line, hint=pg.HINT_UNREACHABLE)
    if preset in _TABLE_HINTS or library is None:  # our own schema, the user's own SQL
        hint = _TABLE_HINTS.get(preset)
        if hint and isinstance(exc, _MISSING) and not isinstance(exc, pg_errors.UndefinedTable):
            hint += " The tables exist but not in the expected version."
        return DatabaseError(line, hint=hint)
    # an enum value the library's version has not got, as well as a table or column
    enum = isinstance(exc, pg_errors.InvalidTextRepresentation) and "enum" in str(exc)
    if isinstance(exc, _MISSING) or enum:
        return QueueSchemaError(
            f"{line}; the {preset} preset reads {library.supported}",
            hint=f"Is queue.preset right? `vultrscale queue detect` names the queues whose "
            f"tables this database holds; the {preset} preset needs "
            f"{', '.join(library.tables)} as {library.supported} creates them.",
        )
    return DatabaseError(
        line, hint=f"Check that this database user may read the {library.library} tables."
    )


def _primary(exc: psycopg.Error, url: str) -> str:
    diag = getattr(exc, "diag", None)
    return first_line((diag.message_primary if diag is not None else None) or exc, [url])


# --- in the pass's pipeline --------------------------------------------------------------------


class SentSignals:
    """A preset's signal read, sent on a connection in pipeline mode and not yet answered
    (``send_signals``). ``answered``: its statements' answers are in, so an error of the
    pipeline is another statement's; ``result()`` reads them (DatabaseError as
    ``read_signals`` raises it)."""

    def __init__(self, queue_cfg: QueueConfig) -> None:
        self.preset = queue_cfg.preset
        self._read = preset_read(queue_cfg)
        self._cursors: list[psycopg.Cursor[Any]] = []
        self._commit: psycopg.Cursor[Any] | None = None

    def send(self, conn: psycopg.Connection[Any]) -> None:
        """Send the read on ``conn``, in pipeline mode. An error of an earlier answer may be
        raised here already (psycopg reads what has come while it sends): the caller holds
        this value before it sends, to tell that error from the others of its pipeline."""
        # One read-only REPEATABLE READ transaction, as read_signals runs it: BEGIN and COMMIT
        # as statements, since psycopg's transaction() in a pipeline syncs (a round trip) on
        # entry and exit. Each statement alone: a pipeline takes no multi-statement string.
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        conn.execute(_timeout())
        self._cursors = [_send(conn, s) for s in self._read.statements]
        self._commit = conn.execute("COMMIT")

    @property
    def answered(self) -> bool:
        done = None if self._commit is None else self._commit.pgresult
        return done is not None and done.status == psycopg.pq.ExecStatus.COMMAND_OK

    def result(self) -> Signals:
        with translated("", self.preset):
            return self._read.signals([cur.fetchall() for cur in self._cursors])

    def error(self, exc: psycopg.Error) -> DatabaseError:
        """``exc``, raised by the pipeline before this read was answered, as read_signals would
        have raised it."""
        return translate(exc, self.preset)


def send_signals(conn: psycopg.Connection[Any], queue_cfg: QueueConfig) -> SentSignals:
    """Send the signal read on ``conn``, which is in pipeline mode with no transaction in
    progress, to be answered with the other statements of the pipeline (one round trip)."""
    sent = SentSignals(queue_cfg)
    sent.send(conn)
    return sent
