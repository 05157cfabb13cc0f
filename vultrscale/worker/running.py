"""Running a job: the slot threads that run the handler and write a failure (fenced), the
event-loop thread for ``async def`` handlers, and the batch completion of the successes, which
the main thread writes (``flush_done``) in one statement.

The slots are daemons because a stuck sync handler cannot be killed: at the drain its job is
given back, so whatever it writes later is refused, and the process exits without waiting for
it. A failed write drops that job's result only (its lease, no longer renewed, runs out and the
job runs again); whether the worker goes on is the main thread's call.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import queue as queue_mod
import threading
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import psycopg
from psycopg_pool import PoolTimeout

from vultrscale.db import queue
from vultrscale.redaction import first_line, redact, secret_values
from vultrscale.worker.job import Job, LeaseLost, PermanentError
from vultrscale.worker.outage import OutageTooLong
from vultrscale.worker.state import WorkerState

Handler = Callable[[Job], Any]
T = TypeVar("T")
_P = ParamSpec("_P")

_COUNTERS = {"ready": "retried", "failed": "failed", "dead": "dead"}
_OUTCOMES = {"ready": "will retry", "failed": "failed for good", "dead": "is dead"}


def error_text(error: BaseException, conninfo: str) -> str:
    """``Type: message`` of a handler's error, as it is stored and printed: the worker's
    database address and its password redacted (a handler may quote the environment's
    DATABASE_URL), a NUL (Postgres text refuses it) and a lone surrogate (not UTF-8, so not
    printable either) as escapes."""
    try:
        message = str(error)
    except Exception:  # noqa: BLE001 - the handler's __str__ is the handler's bug
        message = "(its message could not be read)"
    text = redact(f"{type(error).__name__}: {message}", secret_values([conninfo]))
    text = text.replace("\x00", "\\x00")
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class _DaemonThreadPool(concurrent.futures.ThreadPoolExecutor):
    """The event loop's default executor (``asyncio.to_thread``, ``run_in_executor(None, fn)``,
    ``astep``'s database calls) on daemon threads, as the slots are: a handler's blocking call
    still running when its job is given back cannot hold the process past the drain (Python
    joins a ThreadPoolExecutor's own threads at exit, and systemd's SIGKILL came first). asyncio
    takes only a ThreadPoolExecutor, so this is one that runs its own threads."""

    def __init__(self) -> None:
        super().__init__(thread_name_prefix="vs-executor")  # its default size; no thread yet
        self._tasks: queue_mod.SimpleQueue[Callable[[], None] | None] = queue_mod.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._started: list[threading.Thread] = []
        self._pool_lock = threading.Lock()
        self._closed = False

    def submit(
        self, fn: Callable[_P, T], /, *args: _P.args, **kwargs: _P.kwargs
    ) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def task() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - the caller's to see, as in the stdlib
                future.set_exception(exc)
            else:
                future.set_result(result)

        with self._pool_lock:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._tasks.put(task)
            if not self._idle.acquire(blocking=False) and len(self._started) < self._max_workers:
                t = threading.Thread(
                    target=self._serve, name=f"vs-executor-{len(self._started)}", daemon=True
                )
                t.start()
                self._started.append(t)
        return future

    def _serve(self) -> None:
        while (task := self._tasks.get()) is not None:
            task()
            del task
            self._idle.release()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._pool_lock:
            self._closed = True
            threads = list(self._started)
        for _ in threads:
            self._tasks.put(None)
        if wait:
            for t in threads:
                t.join()


def is_async(handler: Handler) -> bool:
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 - async callable objects
    )


class Runner:
    """The slots (and the event loop of an async handler): each takes a job from the state's
    ``work`` queue, runs the handler and records the outcome. ``threads`` are the ones the
    main thread watches (created here, started by ``start``)."""

    def __init__(
        self,
        state: WorkerState,
        handler: Handler,
        guard: Callable[[Callable[[], None]], Callable[[], None]],
    ) -> None:
        self.state = state
        self.handler = handler
        self.loop: asyncio.AbstractEventLoop | None = None
        self.threads: list[threading.Thread] = []
        if is_async(handler):
            self.loop = asyncio.new_event_loop()
            self.loop.set_default_executor(_DaemonThreadPool())
            self.threads.append(
                threading.Thread(
                    target=guard(self.loop.run_forever), name="vs-asyncio", daemon=True
                )
            )
        for i in range(state.settings.concurrency):
            self.threads.append(
                threading.Thread(target=guard(self._slot), name=f"vs-slot-{i}", daemon=True)
            )

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def stop_slots(self) -> None:
        """End each slot once it is free (a given-back run's handler may still run on)."""
        for _ in range(self.state.settings.concurrency):
            self.state.work.put(None)

    def stop_loop(self) -> None:
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.loop.stop)

    def _slot(self) -> None:
        st = self.state
        while True:
            job = st.work.get()
            if job is None:
                return
            handed_on = False
            try:
                handed_on = self._execute(job)
            except (psycopg.Error, PoolTimeout, OutageTooLong) as exc:
                # A failed write (retried through an outage) drops this job's result only.
                job.run.mark_lost()
                if not job.given_back:
                    st.summary.add("lost")
                    st.say(
                        f"job {job.id}: writing its outcome failed "
                        f"({first_line(exc, [st.conninfo])}); result dropped, the job runs "
                        "again when its lease expires."
                    )
            finally:
                st.slot_ended(job, handed_on)
                st.wake.set()

    def _execute(self, job: Job) -> bool:
        """Run the handler and record a failure; True if a success waits for the batch
        completion in the main thread (the job stays running, and heartbeated, until then)."""
        st = self.state
        if job.lost:  # given back, or its lease gone, before a slot was free: never start it
            if not job.given_back:
                st.summary.add("lost")
            return False
        error: BaseException | None = None
        try:
            self._call_handler(job)
        except (concurrent.futures.CancelledError, LeaseLost) as exc:
            if not job.lost:
                # Not the drain's cancel nor a step refused on a lost lease: the handler's own
                # (a Future it cancelled, say). A failed attempt like any other, or its error
                # was never written and the job sat leased until its lease ran out.
                error = exc
            else:
                if not job.given_back:
                    st.summary.add("lost")
                return False
        except BaseException as exc:  # SystemExit too: a failed attempt, not a worker exit
            error = exc
        if not st.finished(job, succeeded=error is None):
            return False  # handed back at the drain deadline: whatever it did is dropped
        if error is None:
            return True
        try:
            self._write_failure(job, error)
        finally:
            st.failure_written(job)
        return False

    def _call_handler(self, job: Job) -> None:
        if job.payload_error is not None:  # a failure of its own, never the handler's
            raise PermanentError(f"payload cannot be decoded ({job.payload_error})")
        if self.loop is None:
            self.handler(job)
            return
        fut = asyncio.run_coroutine_threadsafe(self._guarded(job), self.loop)
        self.state.started(job, fut)
        raised = fut.result()
        if raised is not None:
            raise raised

    async def _guarded(self, job: Job) -> BaseException | None:
        # The loop must never see SystemExit/KeyboardInterrupt from a handler: run_forever
        # would re-raise it and end the loop thread with every coroutine on it.
        try:
            await self.handler(job)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # the handler's error is this job's outcome
            return exc
        return None

    def _write_failure(self, job: Job, error: BaseException) -> None:
        st, s = self.state, self.state.settings
        text = error_text(error, st.conninfo)
        new_state = st.database.run(
            lambda conn: queue.fail(
                conn,
                job.id,
                st.worker_id,
                job.token,
                text,
                permanent=isinstance(error, PermanentError),
                backoff_seconds=s.backoff_seconds,
                backoff_cap_seconds=s.backoff_cap_seconds,
            )
        )
        if new_state is None:
            if not job.given_back:
                st.summary.add("lost")
                st.say(f"job {job.id}: lease lost; its result was dropped.")
            return
        st.summary.add(_COUNTERS[new_state])
        st.say(f"job {job.id} attempt {job.attempt} raised {text}; {_OUTCOMES[new_state]}.")

    # --- the successes, completed by the main thread --------------------------------------------

    def flush_done(self, conn: psycopg.Connection) -> None:
        """Complete every finished job in one fenced statement (main thread only); if the
        statement fails they wait for the next try (a second try of a write that did commit
        finds the leases gone and drops nothing twice: the jobs are already succeeded)."""
        done = self.state.take_done()
        try:
            self.complete(conn, done)
        except BaseException:
            for job in done:
                self.state.done.put(job)
            raise

    def complete(self, conn: psycopg.Connection, done: list[Job]) -> None:
        st = self.state
        if not done:
            return
        written = queue.complete_many(conn, st.worker_id, [(j.id, j.token) for j in done])
        st.completed(done)
        st.summary.add("succeeded", len(written))
        for job in done:
            if job.id not in written:
                st.summary.add("lost")
                st.say(f"job {job.id}: lease lost; its result was dropped.")
