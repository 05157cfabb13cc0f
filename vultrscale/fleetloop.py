"""Several fleets in one process (``reconcile`` of a directory of fleet files).

Each fleet's passes run in a thread of their own, through parts of their own: its own Postgres
connection (and so its own pass lock), its own pass deadline, its own Vultr client (the API
pacing shared by every fleet of the key, ``vultr.client.shared_pace``), its own SSH drain. A
slow fleet (an API that trickles, SSH to a hung host) holds up only its own passes; a failing
one reports its failure and goes on passing; the others never wait for either. The metrics
registry is one, every series labelled by fleet (``metrics.Metrics.family``).

``once`` runs one pass of every fleet at once and gives each fleet's exit code; ``forever``
runs each fleet's ``reconcile.run_forever`` until ``stop``, the fleets' first passes spread
over the first interval (not every fleet's list at Vultr in the same second), and calls
``tick`` between (the account's figures, which no one fleet's pass owns).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta

from vultrscale import reconcile
from vultrscale.config import Config
from vultrscale.errors import EXIT_RUNTIME, RuntimeFailure, VultrscaleError
from vultrscale.ports import Parts
from vultrscale.reconcile import PassResult
from vultrscale.redaction import first_line

OnResult = Callable[[Config, PassResult], None]
OnError = Callable[[Config, VultrscaleError], None]


@dataclass(frozen=True)
class FleetRun:
    """One fleet of the process: its config and the parts its passes go through."""

    cfg: Config
    parts: Parts

    @property
    def name(self) -> str:
        return self.cfg.fleet.name


def once(
    runs: Sequence[FleetRun],
    *,
    dry_run: bool,
    on_result: OnResult,
    on_error: OnError,
    take_lock: bool = True,
) -> dict[str, int]:
    """One pass of every fleet, all at once, each in a thread; every fleet's exit code by
    name (a pass that raised: its error's). The results and errors are reported as they come.
    ``take_lock=False``: read-only dry runs (``status``), as ``reconcile.run_pass`` has it."""
    codes: dict[str, int] = {}

    def one(run: FleetRun) -> None:
        try:
            result = reconcile.run_pass(run.cfg, run.parts, dry_run=dry_run, take_lock=take_lock)
            codes[run.name] = result.exit_code
            on_result(run.cfg, result)
        except VultrscaleError as exc:
            codes[run.name] = exc.exit_code
            on_error(run.cfg, exc)
        except Exception as exc:  # noqa: BLE001 - one fleet's bug must not hide the others'
            codes[run.name] = EXIT_RUNTIME
            on_error(run.cfg, _bug(exc))

    _join(_started([(f"vultrscale-{r.name}", functools.partial(one, r)) for r in runs]))
    return {r.name: codes.get(r.name, EXIT_RUNTIME) for r in runs}


def forever(
    runs: Sequence[FleetRun],
    *,
    interval: timedelta,
    dry_run: bool,
    stop: threading.Event,
    on_result: OnResult,
    on_error: OnError,
    tick: Callable[[], None] = lambda: None,
    max_passes: int | None = None,
) -> dict[str, int]:
    """Every fleet's passes, each fleet in its thread, every ``interval`` until ``stop`` is
    set (or each fleet ran ``max_passes``); each fleet's last exit code by name. Fleet ``i``
    of ``n`` starts ``i/n`` of an interval in. ``tick`` runs in the calling thread, at once
    and every interval, until every fleet has stopped."""
    codes: dict[str, int] = {}
    n = len(runs)

    def fleet(i: int, run: FleetRun) -> None:
        reconcile._wait(run.parts.clock, stop, interval.total_seconds() * i / n)
        while not stop.is_set():
            try:
                codes[run.name] = reconcile.run_forever(
                    run.cfg,
                    run.parts,
                    interval=interval,
                    dry_run=dry_run,
                    stop=stop,
                    on_result=lambda result: on_result(run.cfg, result),
                    on_error=lambda exc: on_error(run.cfg, exc),
                    max_passes=max_passes,
                    refuse_early=False,
                )
                return
            except Exception as exc:  # noqa: BLE001 - a bug in this fleet's pass stops only it
                codes[run.name] = EXIT_RUNTIME
                on_error(run.cfg, _bug(exc))
                if max_passes is not None:
                    return
                reconcile._wait(run.parts.clock, stop, interval.total_seconds())

    threads = _started(
        [(f"vultrscale-{r.name}", functools.partial(fleet, i, r)) for i, r in enumerate(runs)]
    )
    ticked = None
    try:
        while any(t.is_alive() for t in threads):
            now = time.monotonic()
            if ticked is None or now - ticked >= interval.total_seconds():
                ticked = now
                tick()
            for t in threads:  # in slices: the main thread stays free for Ctrl-C
                t.join(0.5 / len(threads))
    except KeyboardInterrupt:
        stop.set()  # each fleet ends after its pass (a second Ctrl-C: at once)
        _join(threads)
        raise
    return {r.name: codes.get(r.name, EXIT_RUNTIME) for r in runs}


def _bug(exc: Exception) -> RuntimeFailure:
    """A pass that raised what no adapter translated: that fleet's failure, in one line."""
    return RuntimeFailure(
        f"unexpected {type(exc).__name__}: {first_line(exc)}",
        hint="Run with --debug and report it; the other fleets go on.",
    )


def _started(targets: list[tuple[str, Callable[[], None]]]) -> list[threading.Thread]:
    # Daemon threads: a second Ctrl-C (or a bug in the main thread) ends the process at once;
    # a pass is safe to kill at any point.
    threads = [threading.Thread(target=fn, name=name, daemon=True) for name, fn in targets]
    for t in threads:
        t.start()
    return threads


def _join(threads: list[threading.Thread]) -> None:
    for t in threads:
        while t.is_alive():  # in slices: Ctrl-C is delivered to the main thread meanwhile
            t.join(0.5)
