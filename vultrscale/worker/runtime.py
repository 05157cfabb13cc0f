"""The reference worker runtime (docs/worker.md): one process, made of parts you can read
alone, which share one ``WorkerState`` (``state.py``):

- claiming (``claiming.py``): the main thread claims (one statement for all free slots),
  completes the successes, reaps expired leases; a listener thread wakes it on NOTIFY;
- running a job (``running.py``): ``concurrency`` slot threads run the handler and write a
  failure (fenced); for ``async def`` handlers, one event-loop thread runs the coroutines;
- renewing leases (``heartbeat.py``): one thread renews every held lease every ``lease/3``
  seconds on a connection of its own, and ends an outage;
- draining (``draining.py``): on SIGTERM/SIGINT, the main thread waits for the running jobs up
  to the drain time and gives back the rest.

This module starts them and watches them: a dead slot, loop or heartbeat thread is fatal (what
can be given back is, then exit 1). A database outage (``outage.py``) is ridden out for the
outage budget; only an outage past the budget is fatal. Postgres is reached through ``db/pg``
(``database.py`` sizes the connections from the lease).
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType

import psycopg
from psycopg_pool import PoolTimeout

from vultrscale.db import queue
from vultrscale.errors import DatabaseError, RuntimeFailure, UsageError
from vultrscale.redaction import first_line
from vultrscale.worker import database
from vultrscale.worker.claiming import Claimer
from vultrscale.worker.draining import Drainer
from vultrscale.worker.heartbeat import Heartbeat
from vultrscale.worker.outage import is_transient, retrying
from vultrscale.worker.running import Handler, Runner
from vultrscale.worker.state import Summary, WorkerSettings, WorkerState, default_worker_id

__all__ = ["Handler", "Summary", "Worker", "WorkerSettings", "default_worker_id", "load_handler"]


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
        pool = database.pool(
            conninfo,
            settings.lease_seconds,
            settings.statement_timeout_seconds * 2,
            max_size=settings.concurrency + 1,  # slots + main loop (the heartbeat has its own)
        )
        self.state = WorkerState(settings, conninfo, say, pool)
        self.runner = Runner(self.state, handler, self._guarded_thread)
        self.heartbeat = Heartbeat(self.state, self._guarded_thread)
        self.claimer = Claimer(self.state, self.runner, self._check_health)
        self.drainer = Drainer(self.state, self.runner, self._check_health, self._stop_threads)
        self._watched = [*self.runner.threads, self.heartbeat.thread]

    @property
    def summary(self) -> Summary:
        return self.state.summary

    @property
    def worker_id(self) -> str:
        return self.state.worker_id

    def request_stop(self) -> None:
        """Begin the drain; a second call skips the wait (what SIGTERM/SIGINT do)."""
        self.state.request_stop()

    def run(self) -> Summary:
        """Work until a stop is requested, drain, and return what was done."""
        started = time.monotonic()
        st, s = self.state, self.state.settings
        self._install_signals()  # first: a SIGTERM during start-up drains an idle worker
        draining = self._register()
        if draining is None:  # stopped while waiting for the database
            st.summary.elapsed = time.monotonic() - started
            st.say(st.summary.line())
            return st.summary
        st.pool.open(wait=False)
        st.say(
            f"Worker {st.worker_id} ({st.label}) started: app {s.app}, "
            f"concurrency {s.concurrency}, queue {s.queue!r}, lease {s.lease_seconds:g} s, "
            f"drain {s.drain_seconds:g} s, outage budget {s.outage_budget_seconds:g} s."
        )
        if draining:
            st.mark_draining("Marked draining in the database: claiming no more jobs.")
        st.heartbeat_ok = time.monotonic()
        for t in [*self._watched, self.claimer.listener]:
            t.start()
        try:
            self.claimer.loop()
            self.drainer.drain()
        except _ThreadDied as exc:
            st.stop.set()
            self.drainer.give_back_after_fatal()
            self._close()
            raise RuntimeFailure(
                f"worker {st.worker_id}: {exc}",
                hint="This is a bug in the worker or the handler; systemd restarts the worker. "
                "Its unfinished jobs were given back (or return when their lease expires).",
            ) from exc
        except (psycopg.Error, PoolTimeout) as exc:
            self._close()
            raise database.database_error(exc, st.conninfo, s.lease_seconds) from exc
        except DatabaseError:
            self._close()
            raise
        st.summary.elapsed = time.monotonic() - started
        st.say(st.summary.line())
        return st.summary

    def _register(self) -> bool | None:
        """Register this worker on a direct connection (a wrong address fails with the real
        reason), waiting out a database that is down within the outage budget; return whether
        it is marked draining, None if a stop was requested while it waited."""
        st, s = self.state, self.state.settings

        def register() -> bool:
            with database.connect(
                st.conninfo, s.lease_seconds, s.statement_timeout_seconds * 2, "vultrscale-worker"
            ) as conn:
                queue.register_worker(conn, st.worker_id, st.label)
                return queue.worker_heartbeat(conn, st.worker_id)

        try:
            draining = retrying(
                st.outage, register, announce=st.waiting_for, gate=False, stop=st.stop
            )
        except psycopg.Error as exc:
            if st.stop.is_set() and is_transient(exc):
                st.say("Stopped while waiting for the database.")
                return None
            waited = st.outage.seconds if is_transient(exc) else 0.0
            raise database.database_error(
                exc, st.conninfo, s.lease_seconds, starting=True, waited=waited
            ) from exc
        took = st.outage.end()
        if took:
            st.say(f"The database answered after {took:.1f} s.")
        return draining

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
                self.state.thread_errors[threading.current_thread().name] = exc
                self.state.wake.set()

        return run

    def _check_health(self) -> None:
        """Raise if the worker cannot go on: an outage longer than the budget, a heartbeat
        silent for longer than lease and budget together, or a dead thread."""
        st, s = self.state, self.state.settings
        for t in self._watched:
            if not t.is_alive():
                err = st.thread_errors.get(t.name)
                why = f"{type(err).__name__}: {err}" if err is not None else "it returned"
                raise _ThreadDied(f"thread {t.name} died ({why}).")
        if st.outage.over_budget():
            raise st.outage.too_long(st.conninfo)
        silent = time.monotonic() - st.heartbeat_ok
        if silent > s.lease_seconds + s.outage_budget_seconds:
            # A heartbeat hung without an error (every wait it makes is bounded, so a bug):
            # every lease has run out; stop rather than work as a zombie.
            err = TimeoutError(f"no heartbeat for {silent:.1f} s")
            raise database.database_error(err, st.conninfo, s.lease_seconds)
        st.expire_locally()

    def _stop_threads(self) -> None:
        self.state.threads_stop.set()
        self.runner.stop_slots()
        self.heartbeat.stop()
        self.claimer.listener.join(timeout=2)
        self.runner.stop_loop()

    def _close(self) -> None:
        self._stop_threads()
        self.state.pool.close(timeout=1)
