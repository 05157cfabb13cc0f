"""What a handler sees: the ``Job`` it is given, and the errors it may raise."""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, overload
from uuid import UUID

from vultrscale.db.queue import LeaseLost

if TYPE_CHECKING:
    import psycopg

T = TypeVar("T")


class Database(Protocol):
    """Where a job reads and writes its steps: ``run(fn)`` calls ``fn`` with a connection (the
    runtime's ``WorkerDatabase`` retries through an outage and waits for the lease re-check)."""

    def run(self, fn: Callable[[psycopg.Connection], T]) -> T: ...


__all__ = ["Job", "LeaseLost", "PermanentError"]


class Run:
    """The runtime's side of one run of a claimed job: when its lease was last known good,
    whether it was lost or given back, whether the worker drains. The runtime's threads mark
    it (each mark is final); the ``Job`` and its handler only read it."""

    def __init__(self, renewed_at: float | None = None) -> None:
        self._stopping = threading.Event()
        self._lost = threading.Event()
        self.given_back = False
        # Local monotonic time the lease was last known good (the claim's and each renewal's
        # send time): the heartbeat marks the job lost well before the lease would run out.
        self.renewed_at = time.monotonic() if renewed_at is None else renewed_at

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    @property
    def lost(self) -> bool:
        return self._lost.is_set()

    def renewed(self, sent: float) -> None:
        """A renewal sent at ``sent`` (monotonic) kept the lease."""
        self.renewed_at = max(self.renewed_at, sent)

    def mark_stopping(self) -> None:
        self._stopping.set()

    def mark_lost(self) -> None:
        self._lost.set()

    def mark_given_back(self) -> None:
        # Lost too: a sync handler still running must not run another step's side effects.
        self.given_back = True
        self._lost.set()


class PermanentError(Exception):
    """Raise from a handler for an error that retrying cannot fix: the job ends ``failed``."""


class Job:
    """One claimed job, handed to ``handle(job)``.

    ``id``, ``payload`` and ``attempt`` (1 on the first run) describe it; ``step(name, fn)`` runs
    ``fn`` once per job and returns its saved JSON result on later attempts (``await
    job.astep(name, fn)`` is the same for ``async def`` handlers: it never blocks the event
    loop); ``stopping`` turns True when the worker starts draining, and ``lost`` when its lease
    is gone or the job was given back (writes refused, steps raise ``LeaseLost``).
    """

    def __init__(
        self,
        id: int,
        payload: Any,
        attempt: int,
        token: UUID,
        *,
        worker_id: str,
        database: Database,
        run: Run | None = None,
        payload_error: str | None = None,
    ) -> None:
        self.id = id
        self.payload = payload
        self.attempt = attempt
        self.token = token
        self.run = run if run is not None else Run()
        # Why the payload could not be decoded, if it could not: the job fails, unrun.
        self.payload_error = payload_error
        self._worker_id = worker_id
        self._database = database

    @property
    def given_back(self) -> bool:
        """True once the drain handed the job back to the queue (its attempt refunded)."""
        return self.run.given_back

    @property
    def stopping(self) -> bool:
        """True once the worker drains: a long job may stop early (and will be given back)."""
        return self.run.stopping

    @property
    def lost(self) -> bool:
        """True once the lease is lost: nothing this job writes will be accepted."""
        return self.run.lost

    def step(self, name: str, fn: Callable[[], T]) -> T:
        """Run ``fn`` once for this job and save its JSON result under ``name``.

        On a later attempt the saved result is returned and ``fn`` is not called. Raises
        ``LeaseLost`` if the lease is gone or the job was given back at the drain deadline, so
        the handler stops instead of working for nothing. Blocks on the database: an ``async
        def`` handler uses ``astep``.
        """
        self._check_lease(name)
        found, saved = self._load(name)
        if found:
            return saved  # type: ignore[no-any-return]
        self._check_lease(name)  # given back while loading: fn must not run
        result = fn()
        self._save(name, result)
        return result

    @overload
    async def astep(self, name: str, fn: Callable[[], Awaitable[T]]) -> T: ...

    @overload
    async def astep(self, name: str, fn: Callable[[], T]) -> T: ...

    async def astep(self, name: str, fn: Callable[[], Any]) -> Any:
        """``step`` for ``async def`` handlers: ``fn`` may be sync or async, and the database
        reads and writes run in the loop's default executor, so other jobs keep running."""
        loop = asyncio.get_running_loop()
        self._check_lease(name)
        found, saved = await loop.run_in_executor(None, self._load, name)
        if found:
            return saved
        self._check_lease(name)
        result = fn()
        if inspect.isawaitable(result):
            result = await result
        await loop.run_in_executor(None, self._save, name, result)
        return result

    def _load(self, name: str) -> tuple[bool, Any]:
        from vultrscale.db import queue

        return self._database.run(lambda conn: queue.load_step(conn, self.id, name))

    def _save(self, name: str, result: Any) -> None:
        from vultrscale.db import queue

        self._check_lease(name)
        ok = self._database.run(
            lambda conn: queue.save_step(conn, self.id, self._worker_id, self.token, name, result)
        )
        if not ok:
            self.run.mark_lost()
            self._check_lease(name)

    def _check_lease(self, name: str) -> None:
        if self.lost:
            raise LeaseLost(
                f"job {self.id}: lease lost before step {name!r} was saved",
                hint="Another worker may run this job; this attempt's results are dropped.",
            )

    def __repr__(self) -> str:
        return f"Job(id={self.id}, attempt={self.attempt})"
