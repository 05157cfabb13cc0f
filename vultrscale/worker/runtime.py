"""The reference worker runtime (README "The worker"): claim, lease, heartbeat, drain.

Threads, and why each exists:

- the main thread claims (one statement for all free slots), reaps expired leases, handles
  SIGTERM/SIGINT and drains;
- ``concurrency`` slot threads run the handler and write the outcome (fenced); they are daemons
  because a stuck sync handler cannot be killed: at drain its job is given back, so whatever it
  writes later is refused, and the process exits without waiting for it;
- a heartbeat thread renews every held lease in one statement every ``lease/3`` seconds on a
  connection of its own (a pool emptied by handlers cannot starve it); after a failure it
  retries quickly, and a job whose lease it could not renew in time (lease minus a margin, by
  the local clock since the last renewal) is marked ``lost`` before the lease runs out;
- a listener thread waits on LISTEN/NOTIFY so an idle worker wakes as soon as a job arrives
  (polling backs off from 50 ms to 1 s as a fallback, and covers retries with a later run_at);
- for ``async def`` handlers, one event-loop thread runs the coroutines.

Every connection has TCP keepalives, ``tcp_user_timeout`` and a ``statement_timeout`` sized
from the lease, so a silent network partition is an error in seconds, not a 15-minute hang.
The main loop checks that the slot, loop and heartbeat threads are alive: a dead one is fatal
(what can be given back is, then exit 1).

A database outage (``outage.py``) is ridden out for the outage budget: every thread's
statements are retried, the main loop claims nothing, and writes wait until the heartbeat has
re-checked the leases after the database came back; only an outage past the budget is fatal.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib
import inspect
import os
import queue as queue_mod
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, ParamSpec, TypeVar

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from vultrscale.config import mask_url, outage_budget
from vultrscale.db import pg, queue
from vultrscale.db.queue import DEFAULT_BACKOFF_CAP_SECONDS, DEFAULT_BACKOFF_SECONDS
from vultrscale.errors import (
    DatabaseError,
    RuntimeFailure,
    UsageError,
    first_line,
    redact,
    secret_values,
)
from vultrscale.worker.job import Job, LeaseLost, PermanentError
from vultrscale.worker.outage import (
    RETRY_MAX_SECONDS,
    Outage,
    OutageTooLong,
    WorkerDatabase,
    is_transient,
    retrying,
)

Handler = Callable[[Job], Any]
T = TypeVar("T")
_P = ParamSpec("_P")

# The drain's last writes (results, give-backs, the stopped mark) get this long past the drain
# deadline, through an outage too: the unit's TimeoutStopSec leaves at least 10 s past it
# (cloud-init/worker.service), so the worker ends before systemd's SIGKILL. A database away
# longer gets none of them; the jobs return when their leases expire.
DRAIN_WRITES_SECONDS = 5.0

POLL_MIN_SECONDS = 0.05
POLL_MAX_SECONDS = 1.0
# The pool's own reconnect backoff grows to 16 s and more: after a 30 s outage it would leave
# the pool empty long after the database is back. Giving up after 1 s lets the next request
# start a fresh attempt at once (our retries pace those requests).
POOL_RECONNECT_SECONDS = 1.0


@dataclass(frozen=True)
class WorkerSettings:
    """Everything a worker process needs besides the database address."""

    app: str
    concurrency: int = 4
    drain_seconds: float = 20.0
    lease_seconds: float = 60.0
    queue: str = "default"
    worker_id: str = ""
    instance_label: str = ""
    backoff_seconds: float = DEFAULT_BACKOFF_SECONDS
    backoff_cap_seconds: float = DEFAULT_BACKOFF_CAP_SECONDS
    outage_seconds: float = 0.0  # 0: the lease time

    @property
    def outage_budget_seconds(self) -> float:
        """How long the database may stay unreachable before the worker exits 1."""
        return outage_budget(self.outage_seconds, self.lease_seconds)

    @property
    def heartbeat_seconds(self) -> float:
        return self.lease_seconds / 3

    @property
    def lost_margin_seconds(self) -> float:
        """A job is marked lost this long before its lease would run out unrenewed."""
        return max(0.5, self.lease_seconds / 6)

    @property
    def statement_timeout_seconds(self) -> float:
        """The heartbeat's statement timeout (pooled connections get twice as long)."""
        return max(1.0, self.lease_seconds / 6)

    @property
    def reap_seconds(self) -> float:
        # Cheap (an index range scan on live leases), and it bounds how long after expiry a
        # killed worker's job waits.
        return min(1.0, self.lease_seconds / 3)


@dataclass
class Summary:
    """What one worker process did; ``line()`` is the one summary line it prints."""

    taken: int = 0
    succeeded: int = 0
    retried: int = 0
    failed: int = 0
    dead: int = 0
    given_back: int = 0
    lost: int = 0
    elapsed: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + n)

    def line(self) -> str:
        return (
            f"Done in {self.elapsed:.1f} s: {self.taken} taken, {self.succeeded} succeeded, "
            f"{self.retried} to retry later, {self.failed} failed, {self.dead} dead, "
            f"{self.given_back} given back, {self.lost} lost lease."
        )


def default_worker_id() -> str:
    """``hostname-pid``: unique per process, readable in the workers table."""
    return f"{socket.gethostname()}-{os.getpid()}"


def load_handler(spec: str) -> Handler:
    """Import ``MODULE:FUNC`` (the working directory is importable); UsageError if it is not."""
    module_name, sep, func_name = spec.partition(":")
    hint = "Pass --app MODULE:FUNC naming an importable module and a function in it."
    if not sep or not module_name or not func_name:
        raise UsageError(f"--app {spec!r} is not MODULE:FUNC (e.g. myjobs:handle).", hint=hint)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise UsageError(f"--app {spec!r}: cannot import module {exc.name!r}.", hint=hint) from exc
    except SyntaxError as exc:
        where = f"{exc.filename}, line {exc.lineno}" if exc.filename else module_name
        raise UsageError(
            f"--app {spec!r}: module {module_name} has a syntax error at {where}: {exc.msg}",
            hint="Fix the handler module, then start the worker again.",
        ) from exc
    except Exception as exc:  # the module's own code raised while being imported
        raise UsageError(
            f"--app {spec!r}: importing module {module_name} failed at {_raised_at(exc)}: "
            f"{type(exc).__name__}: {first_line(exc)}",
            hint="Fix the handler module, then start the worker again."
            if not isinstance(exc, ImportError)
            else hint,
        ) from exc
    func = module
    for part in func_name.split("."):
        func = getattr(func, part, None)  # type: ignore[assignment]
        if func is None:
            raise UsageError(
                f"--app {spec!r}: module {module_name} has no attribute {func_name!r}.", hint=hint
            )
    if not callable(func):
        raise UsageError(f"--app {spec!r}: {func_name} is not a function.", hint=hint)
    return func  # type: ignore[return-value]


def _raised_at(exc: BaseException) -> str:
    """``file, line N``: where an exception was raised (its innermost frame)."""
    tb = exc.__traceback__
    if tb is None:
        return "an unknown line"
    while tb.tb_next is not None:
        tb = tb.tb_next
    return f"{tb.tb_frame.f_code.co_filename}, line {tb.tb_lineno}"


def connect_kwargs(
    conninfo: str, lease_seconds: float, statement_timeout_seconds: float
) -> dict[str, Any]:
    """psycopg connect arguments bounding every wait by the lease: TCP keepalives and
    ``tcp_user_timeout`` end a silently partitioned connection, ``statement_timeout`` a
    statement stuck behind a lock (appended to any ``options`` the address already has)."""
    try:
        existing = str(psycopg.conninfo.conninfo_to_dict(conninfo).get("options") or "")
    except psycopg.Error:
        existing = ""  # a malformed address fails at connect, with a redacted message
    statement_ms = int(statement_timeout_seconds * 1000)
    return {
        "autocommit": True,
        "connect_timeout": max(2, int(lease_seconds / 3)),
        **pg.keepalives(lease_seconds),
        "options": f"{existing} -c statement_timeout={statement_ms}".strip(),
    }


def _database_error(
    exc: BaseException,
    conninfo: str,
    lease_seconds: float,
    *,
    starting: bool = False,
    waited: float = 0.0,
) -> DatabaseError:
    # libpq echoes parts of a malformed address (a bad percent-escape in the password, say):
    # the password is redacted here, where the message is built.
    text = first_line(exc, [conninfo])
    if isinstance(exc, psycopg.errors.UndefinedTable):
        return DatabaseError(
            f"the queue tables are missing in {mask_url(conninfo)}: {text}",
            hint=pg.HINT_NO_TABLES,
        )
    if starting:
        after = f" after waiting {waited:.0f} s" if waited else ""
        return DatabaseError(
            f"cannot reach the database at {mask_url(conninfo)}{after}: {text}",
            hint=pg.HINT_UNREACHABLE,
        )
    return DatabaseError(
        f"lost the database at {mask_url(conninfo)}: {text}",
        hint=(
            "Check that Postgres is reachable. Jobs this worker held return to the queue when "
            f"their lease expires (at most {lease_seconds:g} s); systemd restarts the worker."
        ),
    )


def _error_text(error: BaseException, conninfo: str) -> str:
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


class _ThreadDied(Exception):
    """A slot, event-loop or heartbeat thread ended while the worker runs (main thread only)."""


class Worker:
    """One worker process. ``run()`` returns the summary after a drain; DatabaseError if the
    database stays away longer than the outage budget (the leases then expire on their own),
    RuntimeFailure if one of its threads dies (what it held is given back first)."""

    def __init__(
        self,
        settings: WorkerSettings,
        conninfo: str,
        handler: Handler,
        say: Callable[[str], None],
    ) -> None:
        self.settings = settings
        self.worker_id = settings.worker_id or default_worker_id()
        self.label = settings.instance_label or self.worker_id
        self.conninfo = conninfo
        self.handler = handler
        self.is_async = inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
            getattr(handler, "__call__", None)  # noqa: B004 - async callable objects
        )
        self.say = say
        self.summary = Summary()
        # Every run in hand, by identity: this worker may claim a job again (its lease lost)
        # while the earlier run of it still executes; each run leaves only itself.
        self._running: set[Job] = set()
        self._failing: set[Job] = set()  # runs whose failure is being written (under _lock)
        self._stop_requested: float | None = None  # monotonic time of the first stop request
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._fast = threading.Event()
        self._threads_stop = threading.Event()
        self._fatal: BaseException | None = None
        self._marked_draining = False
        self._work: queue_mod.SimpleQueue[Job | None] = queue_mod.SimpleQueue()
        self._done: queue_mod.SimpleQueue[Job] = queue_mod.SimpleQueue()
        self._pool: ConnectionPool | None = None
        self._db: WorkerDatabase | None = None
        self.outage = Outage(settings.outage_budget_seconds)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._futures: dict[Job, concurrent.futures.Future[Any]] = {}
        self._watched: list[threading.Thread] = []
        self._thread_errors: dict[str, BaseException] = {}
        self._heartbeat_ok = time.monotonic()  # send time of the last successful renewal
        # Jobs marked lost locally (by the heartbeat or the main loop's health check) since the
        # last renewal that succeeded: the count said when an outage ends. Under _lock, as is
        # every such mark, so a job is counted once.
        self._lost_since_renewal = 0

    # --- public --------------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Begin the drain; a second call skips the wait (what SIGTERM/SIGINT do)."""
        if self._stop.is_set():
            self._fast.set()
        else:  # the drain time counts from here, as systemd's TimeoutStopSec does
            self._stop_requested = time.monotonic()
        self._stop.set()
        self._wake.set()

    def run(self) -> Summary:
        """Work until a stop is requested, drain, and return what was done."""
        started = time.monotonic()
        s = self.settings
        self._install_signals()  # first: a SIGTERM during start-up drains an idle worker
        draining = self._register()
        if draining is None:  # stopped while waiting for the database
            self.summary.elapsed = time.monotonic() - started
            self.say(self.summary.line())
            return self.summary
        self._pool = ConnectionPool(
            self.conninfo,
            min_size=2,
            max_size=s.concurrency + 1,  # slots + main loop (the heartbeat has its own)
            kwargs=self._kwargs(s.statement_timeout_seconds * 2, "vultrscale-worker"),
            timeout=max(5.0, s.lease_seconds / 3),
            reconnect_timeout=POOL_RECONNECT_SECONDS,
            open=False,
            name="vultrscale-worker",
        )
        self._pool.open(wait=False)
        self._db = WorkerDatabase(self._pool, self.outage, self._announce_outage)

        self.say(
            f"Worker {self.worker_id} ({self.label}) started: app {s.app}, "
            f"concurrency {s.concurrency}, queue {s.queue!r}, lease {s.lease_seconds:g} s, "
            f"drain {s.drain_seconds:g} s, outage budget {s.outage_budget_seconds:g} s."
        )
        if draining:
            self._marked_draining = True
            self.say("Marked draining in the database: claiming no more jobs.")
        self._heartbeat_ok = time.monotonic()
        self._start_threads()
        try:
            self._main_loop()
            self._drain()
        except _ThreadDied as exc:
            self._stop.set()
            self._give_back_after_fatal()
            self._close()
            raise RuntimeFailure(
                f"worker {self.worker_id}: {exc}",
                hint="This is a bug in the worker or the handler; systemd restarts the worker. "
                "Its unfinished jobs were given back (or return when their lease expires).",
            ) from exc
        except (psycopg.Error, PoolTimeout) as exc:
            self._close()
            raise _database_error(exc, self.conninfo, s.lease_seconds) from exc
        except DatabaseError:
            self._close()
            raise
        self.summary.elapsed = time.monotonic() - started
        self.say(self.summary.line())
        return self.summary

    def _register(self) -> bool | None:
        """Register this worker on a direct connection (a wrong address fails with the real
        reason), waiting out a database that is down within the outage budget; return whether
        it is marked draining, None if a stop was requested while it waited."""
        s = self.settings

        def register() -> bool:
            kw = self._kwargs(s.statement_timeout_seconds * 2, "vultrscale-worker")
            with psycopg.connect(self.conninfo, **kw) as conn:
                queue.register_worker(conn, self.worker_id, self.label)
                return queue.worker_heartbeat(conn, self.worker_id)

        def announce(exc: BaseException) -> None:
            self.say(
                f"Waiting up to {s.outage_budget_seconds:g} s for the database at "
                f"{mask_url(self.conninfo)} ({first_line(exc, [self.conninfo])})."
            )

        try:
            draining = retrying(
                self.outage, register, announce=announce, gate=False, stop=self._stop
            )
        except psycopg.Error as exc:
            if self._stop.is_set() and is_transient(exc):
                self.say("Stopped while waiting for the database.")
                return None
            waited = self.outage.seconds if is_transient(exc) else 0.0
            raise _database_error(
                exc, self.conninfo, s.lease_seconds, starting=True, waited=waited
            ) from exc
        took = self.outage.end()
        if took:
            self.say(f"The database answered after {took:.1f} s.")
        return draining

    def _announce_outage(self, exc: BaseException) -> None:
        self.say(
            f"database unreachable ({first_line(exc, [self.conninfo])}): claiming nothing, "
            f"running jobs go on; waiting up to {self.settings.outage_budget_seconds:g} s "
            "for it to return."
        )

    def _database_failed(self, exc: BaseException) -> None:
        """A transient failure seen outside ``retrying`` (the main loop, the heartbeat)."""
        if self.outage.begin(exc):
            self._announce_outage(exc)

    # --- threads -------------------------------------------------------------------------------

    def _kwargs(self, statement_timeout: float, application_name: str) -> dict[str, Any]:
        kw = connect_kwargs(self.conninfo, self.settings.lease_seconds, statement_timeout)
        kw["application_name"] = application_name
        return kw

    def _install_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def on_signal(signum: int, frame: FrameType | None) -> None:
            self.request_stop()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

    def _guarded_thread(self, target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except BaseException as exc:  # recorded; the main loop sees the thread dead
                self._thread_errors[threading.current_thread().name] = exc
                self._wake.set()

        return run

    def _start_threads(self) -> None:
        watched: list[threading.Thread] = []
        if self.is_async:
            self._loop = asyncio.new_event_loop()
            self._loop.set_default_executor(_DaemonThreadPool())
            watched.append(
                threading.Thread(
                    target=self._guarded_thread(self._loop.run_forever),
                    name="vs-asyncio",
                    daemon=True,
                )
            )
        for i in range(self.settings.concurrency):
            watched.append(
                threading.Thread(
                    target=self._guarded_thread(self._slot), name=f"vs-slot-{i}", daemon=True
                )
            )
        self._heartbeat_thread = threading.Thread(
            target=self._guarded_thread(self._heartbeat), name="vs-heartbeat", daemon=True
        )
        watched.append(self._heartbeat_thread)
        self._listener_thread = threading.Thread(target=self._listen, name="vs-listen", daemon=True)
        self._watched = watched
        for t in [*watched, self._listener_thread]:
            t.start()

    def _shutdown_threads(self) -> None:
        self._threads_stop.set()
        self.outage.poke.set()  # the heartbeat waits on it
        for _ in range(self.settings.concurrency):
            self._work.put(None)
        self._heartbeat_thread.join(timeout=5)
        self._listener_thread.join(timeout=2)
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._loop.stop)

    def _close(self) -> None:
        self._shutdown_threads()
        assert self._pool is not None
        self._pool.close(timeout=1)

    def _listen(self) -> None:
        # A dedicated connection: LISTEN needs one that is not handed around by the pool.
        kw = self._kwargs(self.settings.statement_timeout_seconds, "vultrscale-listen")
        while not self._threads_stop.is_set():
            try:
                with psycopg.connect(self.conninfo, **kw) as conn:
                    conn.execute(f"LISTEN {queue.NOTIFY_CHANNEL}")
                    self._wake.set()  # a job enqueued while we were not listening
                    while not self._threads_stop.is_set():
                        for note in conn.notifies(timeout=0.5):
                            if note.payload == self.settings.queue:
                                self._wake.set()
            except psycopg.Error:
                # Polling finds the jobs meanwhile; the others report an outage. Listen again.
                self._threads_stop.wait(RETRY_MAX_SECONDS)

    def _heartbeat(self) -> None:
        s = self.settings
        conn: psycopg.Connection | None = None
        failures = 0
        wait = s.heartbeat_seconds
        try:
            while True:
                # Poked when any thread sees the database fail: re-check the leases at once.
                self.outage.poke.wait(wait)
                self.outage.poke.clear()
                if self._threads_stop.is_set():
                    return
                with self._lock:
                    held = [j for j in self._running if not j.given_back and not j.lost]
                sent = time.monotonic()
                try:
                    if conn is None or conn.closed:
                        kw = self._kwargs(s.statement_timeout_seconds, "vultrscale-heartbeat")
                        conn = psycopg.connect(self.conninfo, **kw)
                    with conn.transaction():
                        kept = queue.renew(
                            conn, self.worker_id, [(j.id, j.token) for j in held], s.lease_seconds
                        )
                        draining = queue.worker_heartbeat(conn, self.worker_id)
                except Exception as exc:  # noqa: BLE001 - the heartbeat outlives any error; the outage budget bounds how long
                    failures += 1
                    if conn is not None:
                        conn.close()
                    conn = None
                    self._database_failed(exc)
                    self._expire_locally()
                    # Retry soon, and often enough to mark jobs lost before their leases end.
                    wait = min(
                        0.1 * 2 ** min(failures - 1, 10),
                        RETRY_MAX_SECONDS,
                        s.lost_margin_seconds / 2,
                    )
                    continue
                failures = 0
                wait = s.heartbeat_seconds
                self._heartbeat_ok = sent
                with self._lock:
                    lost = [j for j in held if j.id not in kept and not j.lost]
                    for job in held:
                        if job.id in kept:
                            job._renewed_at = max(job._renewed_at, sent)
                    for job in lost:
                        job._mark_lost()
                    abandoned, self._lost_since_renewal = self._lost_since_renewal + len(lost), 0
                if not self.outage.checked.is_set():
                    self._recovered(held, lost, abandoned)
                if draining and not self._marked_draining:
                    self._marked_draining = True
                    self.say("Marked draining in the database: claiming no more jobs.")
        finally:
            if conn is not None:
                conn.close()

    def _recovered(self, held: list[Job], lost: list[Job], abandoned: int) -> None:
        """The database answered the heartbeat after an outage and the leases were re-checked
        (``lost``: the held jobs whose lease is gone, now marked; ``abandoned``: every job marked
        lost since the last renewal that succeeded, those included): drop dead pooled
        connections, open the gate. A held job marked lost locally while the renewal was on its
        way counts as lost, not kept: the worker has given it up (its lease runs out)."""
        assert self._pool is not None
        self._pool.check()
        with self._lock:
            kept = sum(1 for j in held if not j.lost)
        took = self.outage.end()
        self.say(
            f"database back after {took:.1f} s: {kept} lease(s) kept, {abandoned} lost; "
            "claiming again."
        )
        for job in lost:
            self.say(f"job {job.id}: lease lost during the outage; abandoning it.")

    def _expire_locally(self) -> None:
        """Mark held jobs lost once their lease is nearly out without a renewal we know of."""
        s = self.settings
        limit = time.monotonic() - (s.lease_seconds - s.lost_margin_seconds)
        with self._lock:
            late = [
                j
                for j in self._running
                if not j.lost and not j.given_back and j._renewed_at < limit
            ]
            for job in late:
                job._mark_lost()
            self._lost_since_renewal += len(late)
        for job in late:
            self.say(f"job {job.id}: lease not renewed in time; treating it as lost.")

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

    def _slot(self) -> None:
        while True:
            job = self._work.get()
            if job is None:
                return
            handed_on = False
            try:
                handed_on = self._execute(job)
            except (psycopg.Error, PoolTimeout, OutageTooLong) as exc:
                # A failed write (retried through an outage) drops this job's result only: its
                # lease (no longer renewed) runs out and the job runs again. Whether the worker
                # goes on is the main loop's call.
                job._mark_lost()
                if not job.given_back:
                    self.summary.add("lost")
                    self.say(
                        f"job {job.id}: writing its outcome failed "
                        f"({first_line(exc, [self.conninfo])}); result dropped, the job runs "
                        "again when its lease expires."
                    )
            finally:
                with self._lock:
                    self._futures.pop(job, None)
                    if not handed_on:
                        self._running.discard(job)
                self._wake.set()

    def _execute(self, job: Job) -> bool:
        """Run the handler and record a failure; True if a success waits for the batch
        completion in the main thread (the job stays running, and heartbeated, until then)."""
        s = self.settings
        assert self._db is not None
        if job.lost:  # given back, or its lease gone, before a slot was free: never start it
            if not job.given_back:
                self.summary.add("lost")
            return False
        error: BaseException | None = None
        try:
            if job._payload_error is not None:  # a failure of its own, never the handler's
                raise PermanentError(f"payload cannot be decoded ({job._payload_error})")
            if self._loop is not None:
                fut = asyncio.run_coroutine_threadsafe(self._guarded(job), self._loop)
                with self._lock:
                    self._futures[job] = fut
                raised = fut.result()
                if raised is not None:
                    raise raised
            else:
                self.handler(job)
        except (concurrent.futures.CancelledError, LeaseLost) as exc:
            if not job.lost:
                # Not the drain's cancel nor a step refused on a lost lease: the handler's own
                # (a Future it cancelled, say). A failed attempt like any other, or its error
                # was never written and the job sat leased until its lease ran out.
                error = exc
            else:
                if not job.given_back:
                    self.summary.add("lost")
                return False
        except BaseException as exc:  # SystemExit too: a failed attempt, not a worker exit
            error = exc
        with self._lock:
            # Under the lock the drain uses to pick what it gives back: a job is either on
            # _done (completed), failing (its failure being written) or given back, never two.
            if job.given_back:
                return False  # handed back at the drain deadline: whatever it did is dropped
            if error is None:
                self._done.put(job)
                return True
            self._failing.add(job)
        text = _error_text(error, self.conninfo)
        try:
            new_state = self._db.run(
                lambda conn: queue.fail(
                    conn,
                    job.id,
                    self.worker_id,
                    job.token,
                    text,
                    permanent=isinstance(error, PermanentError),
                    backoff_seconds=s.backoff_seconds,
                    backoff_cap_seconds=s.backoff_cap_seconds,
                )
            )
        finally:
            with self._lock:
                self._failing.discard(job)
        if new_state is None:
            if not job.given_back:
                self.summary.add("lost")
                self.say(f"job {job.id}: lease lost; its result was dropped.")
            return False
        counter = {"ready": "retried", "failed": "failed", "dead": "dead"}[new_state]
        self.summary.add(counter)
        outcome = {"ready": "will retry", "failed": "failed for good", "dead": "is dead"}[new_state]
        self.say(f"job {job.id} attempt {job.attempt} raised {text}; {outcome}.")
        return False

    def _take_done(self) -> list[Job]:
        done: list[Job] = []
        while True:
            try:
                job = self._done.get_nowait()
            except queue_mod.Empty:
                return done
            if not job.given_back:
                done.append(job)

    def _flush_done(self, conn: psycopg.Connection) -> None:
        """Complete every finished job in one fenced statement (main thread only); if the
        statement fails they wait for the next try (a second try of a write that did commit
        finds the leases gone and drops nothing twice: the jobs are already succeeded)."""
        done = self._take_done()
        try:
            self._complete(conn, done)
        except BaseException:
            for job in done:
                self._done.put(job)
            raise

    def _complete(self, conn: psycopg.Connection, done: list[Job]) -> None:
        if not done:
            return
        written = queue.complete_many(conn, self.worker_id, [(j.id, j.token) for j in done])
        with self._lock:
            for job in done:
                self._running.discard(job)
        self.summary.add("succeeded", len(written))
        for job in done:
            if job.id not in written:
                self.summary.add("lost")
                self.say(f"job {job.id}: lease lost; its result was dropped.")

    # --- main thread ---------------------------------------------------------------------------

    def _check_health(self) -> None:
        """Raise if the worker cannot go on: a fatal database error, an outage longer than the
        budget, a heartbeat silent for longer than lease and budget together, or a dead
        thread."""
        s = self.settings
        if self._fatal is not None:
            raise self._fatal
        for t in self._watched:
            if not t.is_alive():
                err = self._thread_errors.get(t.name)
                why = f"{type(err).__name__}: {err}" if err is not None else "it returned"
                raise _ThreadDied(f"thread {t.name} died ({why}).")
        if self.outage.over_budget():
            raise self.outage.too_long(self.conninfo)
        silent = time.monotonic() - self._heartbeat_ok
        if silent > s.lease_seconds + s.outage_budget_seconds:
            # A heartbeat hung without an error (every wait it makes is bounded, so a bug):
            # every lease has run out; stop rather than work as a zombie.
            err = TimeoutError(f"no heartbeat for {silent:.1f} s")
            raise _database_error(err, self.conninfo, s.lease_seconds)
        self._expire_locally()

    def _main_loop(self) -> None:
        s = self.settings
        assert self._pool is not None
        next_reap = 0.0
        poll = POLL_MIN_SECONDS
        assert self._db is not None
        while not self._stop.is_set():
            self._check_health()
            if not self.outage.checked.is_set():
                # An outage: claim nothing and save nothing until the heartbeat has re-checked
                # the leases; running jobs go on (their own writes wait at the same gate).
                self._wake.wait(POLL_MIN_SECONDS * 2)
                self._wake.clear()
                continue
            now = time.monotonic()
            claimed: list[queue.Claimed] = []
            try:
                with self._pool.connection() as conn:
                    self._flush_done(conn)
                    if now >= next_reap:
                        next_reap = now + s.reap_seconds
                        if queue.reap_expired(conn):
                            poll = POLL_MIN_SECONDS
                    with self._lock:
                        free = s.concurrency - len(self._running)
                    sent = time.monotonic()
                    if free > 0 and not self._marked_draining:
                        claimed = queue.claim(conn, self.worker_id, s.queue, free, s.lease_seconds)
            except (psycopg.Error, PoolTimeout) as exc:
                if not is_transient(exc):
                    raise
                # A claim whose answer was lost may have leased jobs: they expire and return.
                self._database_failed(exc)
                continue
            for c in claimed:
                job = Job(
                    c.id, c.payload, c.attempt, c.token, worker_id=self.worker_id, database=self._db
                )
                job._renewed_at = sent
                job._payload_error = c.payload_error
                with self._lock:
                    self._running.add(job)
                self._work.put(job)
            self.summary.add("taken", len(claimed))
            if claimed:
                # Full: a finishing slot wakes us. Not full: the queue is empty for now.
                poll = POLL_MIN_SECONDS
                timeout = POLL_MAX_SECONDS if len(claimed) == free else poll
            else:
                timeout = poll
                poll = min(poll * 2, POLL_MAX_SECONDS)
            if self._wake.wait(min(timeout, max(0.0, next_reap - time.monotonic()) + 0.01)):
                poll = POLL_MIN_SECONDS
            self._wake.clear()

    def _with_db(self, fn: Callable[[psycopg.Connection], T], until: float | None = None) -> T:
        """Run ``fn`` for the drain: retried through an outage within the budget and before
        ``until`` (monotonic), without waiting at the gate (every write it makes is fenced by
        the lease)."""
        assert self._db is not None
        return self._db.run(fn, gate=False, until=until)

    def _give_back_unfinished(self, until: float | None = None) -> None:
        """Complete what finished, give back the rest in one fenced statement (the writes
        given up at ``until``: then the jobs return when their leases expire)."""
        self._with_db(self._flush_done, until)
        with self._lock:
            # Slots put a success on _done under this lock, after checking given_back: what is
            # on _done now finished, everything else running is given back and stays so.
            finished = self._take_done()
            finished_runs = set(finished)
            # A job whose handler failed is finished too: its failure is being written (a
            # PermanentError given back would run again, its attempt refunded).
            leftover = [
                j for j in self._running if j not in finished_runs and j not in self._failing
            ]
            for job in leftover:
                job._mark_given_back()  # first: the slot writes nothing more, steps refuse
        if finished:
            self._with_db(lambda conn: self._complete(conn, finished), until)
        if leftover:
            # Fenced by token: a run whose lease is gone (an earlier run of a job claimed
            # again) gives nothing back; each job is said once.
            pairs = [(j.id, j.token) for j in leftover]
            back = self._with_db(
                lambda conn: queue.give_back_many(conn, self.worker_id, pairs), until
            )
            self.summary.add("given_back", len(back))
            for job_id in sorted(back):
                self.say(f"job {job_id}: given back to the queue (the worker is stopping).")
        with self._lock:
            futures = [self._futures.get(j) for j in leftover]
        for fut in futures:
            if fut is not None:
                fut.cancel()

    def _announce_draining(self) -> None:
        # Best effort, whatever the database does: the pool may even be closed under it.
        with contextlib.suppress(Exception):
            self._with_db(lambda c: queue.set_draining(c, self.worker_id))

    def _give_back_after_fatal(self) -> None:
        try:
            self._give_back_unfinished()
        except (psycopg.Error, PoolTimeout) as exc:
            self.say(
                f"could not give jobs back ({first_line(exc, [self.conninfo])}); "
                "they return to the queue when their lease expires."
            )

    def _drain(self) -> None:
        s = self.settings
        assert self._pool is not None
        with self._lock:
            running = list(self._running)
        self.say(
            f"Stopping: no new jobs; {len(running)} running job(s) get up to "
            f"{s.drain_seconds:g} s to finish."
        )
        for job in running:
            job._mark_stopping()
        self._marked_draining = True  # our own mark: the heartbeat need not announce it
        deadline = (self._stop_requested or time.monotonic()) + s.drain_seconds
        writes_until = deadline + DRAIN_WRITES_SECONDS
        # The database's mark only tells others; our own already stops claims. Sent aside, so
        # a database that is slow or away now does not eat the drain time.
        announce = threading.Thread(
            target=self._announce_draining, name="vultrscale-draining", daemon=True
        )
        announce.start()
        while not self._fast.is_set():
            self._check_health()
            if not self._done.empty():
                self._with_db(self._flush_done, writes_until)
            with self._lock:
                if not self._running:
                    break
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._wake.wait(min(left, 0.5))
            self._wake.clear()
        self._give_back_unfinished(writes_until)
        self._shutdown_threads()
        if not self._fast.is_set():
            announce.join(max(0.0, deadline - time.monotonic()))  # the mark, then the stop
        self._with_db(lambda c: queue.mark_stopped(c, self.worker_id), writes_until)
        self._pool.close(timeout=2)
