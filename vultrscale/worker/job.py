"""What a handler sees: the ``Job`` it is given, and the errors it may raise."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar
from uuid import UUID

from vultrscale.db.queue import LeaseLost

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool

T = TypeVar("T")

__all__ = ["Job", "LeaseLost", "PermanentError"]


class PermanentError(Exception):
    """Raise from a handler for an error that retrying cannot fix: the job ends ``failed``."""


class Job:
    """One claimed job, handed to ``handle(job)``.

    ``id``, ``payload`` and ``attempt`` (1 on the first run) describe it; ``step(name, fn)`` runs
    ``fn`` once per job and returns its saved JSON result on later attempts; ``stopping`` turns
    True when the worker starts draining, and ``lost`` when its lease is gone (writes refused).
    """

    def __init__(
        self,
        id: int,
        payload: Any,
        attempt: int,
        token: UUID,
        *,
        worker_id: str,
        pool: ConnectionPool,
    ) -> None:
        self.id = id
        self.payload = payload
        self.attempt = attempt
        self.token = token
        self._worker_id = worker_id
        self._pool = pool
        self._stopping = threading.Event()
        self._lost = threading.Event()
        self.given_back = False

    @property
    def stopping(self) -> bool:
        """True once the worker drains: a long job may stop early (and will be given back)."""
        return self._stopping.is_set()

    @property
    def lost(self) -> bool:
        """True once the lease is lost: nothing this job writes will be accepted."""
        return self._lost.is_set()

    def step(self, name: str, fn: Callable[[], T]) -> T:
        """Run ``fn`` once for this job and save its JSON result under ``name``.

        On a later attempt the saved result is returned and ``fn`` is not called. Raises
        ``LeaseLost`` if the lease is gone, so the handler stops instead of working for nothing.
        """
        from vultrscale.db import queue

        self._check_lease(name)
        with self._pool.connection() as conn:
            found, saved = queue.load_step(conn, self.id, name)
        if found:
            return saved  # type: ignore[no-any-return]
        result = fn()
        self._check_lease(name)
        with self._pool.connection() as conn:
            ok = queue.save_step(conn, self.id, self._worker_id, self.token, name, result)
        if not ok:
            self._lost.set()
            self._check_lease(name)
        return result

    def _check_lease(self, name: str) -> None:
        if self.lost:
            raise LeaseLost(
                f"job {self.id}: lease lost before step {name!r} was saved",
                hint="Another worker may run this job; this attempt's results are dropped.",
            )

    def _mark_stopping(self) -> None:
        self._stopping.set()

    def _mark_lost(self) -> None:
        self._lost.set()

    def __repr__(self) -> str:
        return f"Job(id={self.id}, attempt={self.attempt})"
