"""Riding out a database outage: which errors are transient, the one outage clock every worker
thread shares, and running a database call with retries inside the outage budget.

The rules (docs/worker.md):

- a lost connection, a server shutting down or starting up, a statement timeout or a pool with
  no connection to hand out is *transient*: the call is retried with backoff; a wrong password,
  a missing database or table, or a malformed address is not (retrying cannot fix it);
- the first transient failure starts the outage clock (one line says so); only the heartbeat
  ends it, after it has renewed the held leases on the database (fenced by token, on the
  database's clock) and marked the ones it lost. Until then every other caller waits at the
  gate (``checked``), so nothing is saved under a lease that was not re-checked;
- an outage longer than the budget is fatal: ``OutageTooLong``, exit 1 with one line.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import psycopg
import tenacity
from psycopg_pool import PoolTimeout

from vultrscale.errors import DatabaseError
from vultrscale.redaction import first_line, mask_url

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool

T = TypeVar("T")

# SQLSTATE classes a retry can outlive: 08 connection exception, 53 insufficient resources
# (too many connections), 57 operator intervention (admin/crash shutdown, cannot connect now,
# statement timeout), 40 transaction rollback (serialization failure, deadlock).
_TRANSIENT_CLASSES = ("08", "53", "57", "40")
# A connection attempt fails without a SQLSTATE; these words mean a configuration error that
# no amount of waiting fixes.
_PERMANENT_WORDS = ("authentication failed", "does not exist", "pg_hba.conf", "permission denied")

# Backoff between retries: quick at first (a broken pooled connection fails at once and the
# next one may be fine), at most 1 s so a returning database is noticed within a second.
RETRY_FIRST_SECONDS = 0.05
RETRY_MAX_SECONDS = 1.0


def is_transient(exc: BaseException) -> bool:
    """True for a database error that waiting can fix (see the module docstring)."""
    if isinstance(exc, PoolTimeout):
        return True
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate
    if state:
        return state.startswith(_TRANSIENT_CLASSES)
    text = str(exc).lower()
    return not any(word in text for word in _PERMANENT_WORDS)


class OutageTooLong(DatabaseError):
    """The database stayed unreachable for longer than the outage budget."""


class Outage:
    """When the database was first seen unreachable (monotonic seconds), shared by threads.

    ``checked`` is set while the database is known good and the held leases were re-checked
    since the last failure; callers that write wait on it (``wait_checked``). ``poke`` wakes
    the heartbeat as soon as anyone sees a failure.
    """

    def __init__(self, budget_seconds: float, clock: Callable[[], float] = time.monotonic):
        self.budget_seconds = budget_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._since: float | None = None
        self.last_error: BaseException | None = None
        self.checked = threading.Event()
        self.checked.set()
        self.poke = threading.Event()

    def begin(self, exc: BaseException) -> bool:
        """Record a failure; True if it starts an outage (the caller says so, once)."""
        with self._lock:
            self.last_error = exc
            first = self._since is None
            if first:
                self._since = self._clock()
            self.checked.clear()
        if first:  # later failures would only spin the heartbeat, which retries on its own
            self.poke.set()
        return first

    def end(self) -> float:
        """The database answered and the leases were re-checked; return the outage's length."""
        with self._lock:
            took = 0.0 if self._since is None else self._clock() - self._since
            self._since = None
        self.checked.set()
        return took

    @property
    def seconds(self) -> float:
        """How long the current outage has lasted (0 when there is none)."""
        since = self._since
        return 0.0 if since is None else self._clock() - since

    def over_budget(self) -> bool:
        return self.seconds > self.budget_seconds

    def wait_checked(self) -> None:
        """Block until the leases were re-checked; OutageTooLong once the budget is spent."""
        while not self.checked.wait(0.1):
            if self.over_budget():
                raise self.too_long()

    def too_long(self, conninfo: str = "") -> OutageTooLong:
        """The one line a worker exits with when the outage outlasts the budget."""
        last = self.last_error
        why = f" (last error: {first_line(last, [conninfo])})" if last is not None else ""
        where = f" at {mask_url(conninfo)}" if conninfo else ""
        return OutageTooLong(
            f"lost the database{where}: unreachable for longer than the outage budget "
            f"({self.budget_seconds:g} s){why}",
            hint=(
                "Check that Postgres is reachable. Jobs this worker held return to the queue when "
                "their lease expires; systemd restarts the worker, which waits for the database "
                f"up to {self.budget_seconds:g} s again (worker.outage_seconds)."
            ),
        )


def retrying(
    outage: Outage,
    fn: Callable[[], T],
    *,
    announce: Callable[[BaseException], None],
    gate: bool = True,
    stop: threading.Event | None = None,
    until: float | None = None,
) -> T:
    """Run ``fn``, retrying transient errors with backoff until the outage budget is spent
    (then the last error is raised), or the ``until`` deadline (``time.monotonic()``) passed.
    With ``gate``, wait for the leases to be re-checked first. ``announce`` is called once,
    with the error that started an outage."""

    def note(state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        if exc is not None and outage.begin(exc):
            announce(exc)

    def spent(state: tenacity.RetryCallState) -> bool:
        return (
            outage.over_budget()
            or (stop is not None and stop.is_set())
            or (until is not None and time.monotonic() >= until)
        )

    for attempt in tenacity.Retrying(
        retry=tenacity.retry_if_exception(is_transient),
        wait=tenacity.wait_exponential(multiplier=RETRY_FIRST_SECONDS, max=RETRY_MAX_SECONDS)
        + tenacity.wait_random(0, RETRY_FIRST_SECONDS),
        stop=spent,
        after=note,
        reraise=True,
    ):
        with attempt:
            if gate:
                outage.wait_checked()
            return fn()
    raise AssertionError("unreachable: tenacity either returns or raises")


class WorkerDatabase:
    """The pool every job and slot writes through: each call retried within the outage budget
    and held at the gate until the leases were re-checked after an outage."""

    def __init__(
        self,
        pool: ConnectionPool,
        outage: Outage,
        announce: Callable[[BaseException], None],
    ) -> None:
        self.pool = pool
        self.outage = outage
        self.announce = announce

    def run(
        self,
        fn: Callable[[psycopg.Connection], T],
        *,
        gate: bool = True,
        until: float | None = None,
    ) -> T:
        """``fn`` on a pooled connection, retried within the budget; with ``until`` (monotonic),
        neither waiting for a connection nor retrying past it."""

        def once() -> T:
            wait = None if until is None else max(0.1, until - time.monotonic())
            with self.pool.connection(timeout=wait) as conn:
                return fn(conn)

        return retrying(self.outage, once, announce=self.announce, gate=gate, until=until)
