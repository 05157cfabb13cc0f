"""Faults for ``vultrscale demo --chaos``, drawn from a seed.

What a fleet meets on a bad day, injected into the demo's simulated world while it runs:
workers SIGKILLed in the middle of a job (their unit restarts them, as systemd would), bursts of
429 and 500 answers from the Vultr API, a create that happens but whose answer is lost, one
host whose SSH stops answering (the connection is accepted, then nothing, or it is dropped),
reconcile passes SIGKILLed at a random point (each pass runs as its own process), and the
fleet's offering (region, plan) sold out from the start for some seconds: its creates are
refused with Vultr's words while availability still lists it, so the queue waits it out.

:func:`schedule` is pure: the seed alone decides when and how hard each fault strikes. The
:class:`Chaos` injector carries it out against the simulator, the hosts and the pass processes
and keeps the list of the faults it injected (kind, seconds into the run, target).
"""

from __future__ import annotations

import random
import signal
import subprocess
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vultrscale.vultr.refusals import Refusal

if TYPE_CHECKING:
    from vultrscale.fake_vultr.app import Simulator
    from vultrscale.fake_vultr.hosts import Hosts

WORKER_KILLED = "worker SIGKILL"
API_429 = "API 429 burst"
API_500 = "API 500 burst"
CREATE_LOST = "create answer lost"
SSH_SILENT = "SSH stops answering"
PASS_KILLED = "pass SIGKILL"
STOCK_OUT = "stock-out"
KINDS = (WORKER_KILLED, API_429, API_500, CREATE_LOST, SSH_SILENT, PASS_KILLED, STOCK_OUT)
# From the start, so that the first passes (the first is never killed), which find the first
# burst queued, have their creates refused; short enough that the run stays about as long.
STOCK_OUT_SECONDS = (5.0, 8.0)

# Long enough that a pass talking to the host meets the silence (a pass process's SSH drain
# waits 10 s for a banner), short enough to end before drain.unreachable_grace (30 s) gives up.
SSH_SILENT_SECONDS = (6.0, 10.0)
# A pass that runs this long is stuck (the SSH drain's timeouts are 5 s per step): kill it, and
# say so as an error, not as a fault that was injected.
PASS_TIMEOUT = 90.0


@dataclass(frozen=True)
class Fault:
    """One fault injected: what, when (seconds into the run), at what."""

    kind: str
    at: float
    target: str

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "at": round(self.at, 1), "target": self.target}


@dataclass(frozen=True)
class Schedule:
    """When and how hard each fault strikes; a function of the seed alone."""

    worker_kills: tuple[float, ...]  # seconds into the run (a busy worker at that time)
    api_bursts: tuple[tuple[float, int, int], ...]  # (seconds into the run, status, requests)
    lost_create: str  # how the first create's answer is lost: "500" or "drop"
    ssh_mode: str  # "hang" (accept, send nothing) or "drop" (accept, close)
    ssh_seconds: float
    pass_kill_odds: float  # chance that a pass is SIGKILLed
    pass_kill_after: tuple[float, float]  # the kill comes this many seconds after the start
    stockout_seconds: float = 0.0  # the offering is sold out for this long from the start


def schedule(seed: int) -> Schedule:
    """The faults of a run with this seed."""
    rng = random.Random(f"{seed}:chaos")
    kills = sorted(round(rng.uniform(2.0, 9.0), 1) for _ in range(2))  # then: the first busy one
    bursts = (
        (round(rng.uniform(2.0, 8.0), 1), 429, rng.randint(3, 6)),
        (round(rng.uniform(8.0, 16.0), 1), 500, rng.randint(2, 4)),
    )
    return Schedule(
        worker_kills=tuple(kills),
        api_bursts=tuple(sorted(bursts)),
        lost_create=rng.choice(("500", "drop")),
        ssh_mode=rng.choice(("hang", "drop")),
        ssh_seconds=round(rng.uniform(*SSH_SILENT_SECONDS), 1),
        pass_kill_odds=0.3,
        # from during the import to well into the pass (a pass process takes 1-3 s)
        pass_kill_after=(0.3, 2.5),
        # drawn last: the draws above, and so every other fault of a seed, are as before
        stockout_seconds=round(rng.uniform(*STOCK_OUT_SECONDS), 1),
    )


@dataclass(frozen=True)
class PassRun:
    """A pass process's end: ``code`` None when the chaos killed it."""

    code: int | None
    stdout: str
    stderr: str


class Chaos:
    """Carries out a :class:`Schedule` against a run's simulator, hosts and pass processes.

    The demo calls :meth:`arm` once before its first pass, :meth:`inject_due` a few times a
    second (from a thread of its own), :meth:`on_drains` after a pass that began draining, and
    runs each pass with :meth:`run_pass`. ``faults`` lists what was injected, in order
    (appended under a lock; read it as a whole).
    """

    def __init__(
        self,
        plan: Schedule,
        sim: Simulator,
        hosts: Hosts,
        seed: int,
        offering: tuple[str, str] | None = None,
    ) -> None:
        self.plan = plan
        self.offering = offering  # (region, plan) to sell out; None: no stock-out
        self.sim = sim
        self.hosts = hosts
        self.rng = random.Random(f"{seed}:chaos-run")
        self.faults: list[Fault] = []
        self._kills = list(plan.worker_kills)
        self._bursts = list(plan.api_bursts)
        self._silenced = False
        self._restock_at: float | None = None
        self._passes = 0
        self._pass_seconds: list[float] = []  # how long each pass that ran to its end took
        self._lock = threading.Lock()

    def _record(self, kind: str, at: float, target: str) -> None:
        with self._lock:
            self.faults.append(Fault(kind, at, target))

    def injected(self) -> list[Fault]:
        """The faults injected so far, in order."""
        with self._lock:
            return list(self.faults)

    def arm(self, elapsed: float) -> None:
        """The next create acts, then loses its answer."""
        self.sim.drop_after_acting("POST", "/v2/instances", mode=self.plan.lost_create)  # type: ignore[arg-type]
        how = "a 500 after acting" if self.plan.lost_create == "500" else "connection dropped"
        self._record(CREATE_LOST, elapsed, f"the next POST /v2/instances ({how})")
        if self.offering is not None and self.plan.stockout_seconds > 0:
            region, plan = self.offering
            self.sim.stock_out(region, plan)
            self._restock_at = elapsed + self.plan.stockout_seconds
            self._record(
                STOCK_OUT,
                elapsed,
                f"{region}/{plan} sold out for {self.plan.stockout_seconds:g}s: creates refused, "
                "availability still lists it",
            )

    def refused_creates(self) -> int:
        """How many creates the simulator refused for a sold-out offering."""
        return self.sim.refused[Refusal.UNAVAILABLE]

    def create_lost_fired(self) -> bool:
        """Whether the armed create has happened (and its answer was lost)."""
        return self.sim.drops_pending() == 0

    def inject_due(self, elapsed: float, busy: Collection[str]) -> None:
        """The API bursts, the end of the stock-out and the worker kills whose time has come.
        A kill waits for a worker
        that holds a job (``busy``: the labels of the hosts whose worker holds a lease)."""
        if self._restock_at is not None and self._restock_at <= elapsed and self.offering:
            self.sim.restock(*self.offering)
            self._restock_at = None
        while self._bursts and self._bursts[0][0] <= elapsed:
            _, status, count = self._bursts.pop(0)
            self.sim.fail_next("*", "/v2/*", status, count=count)
            self._record(
                API_429 if status == 429 else API_500,
                elapsed,
                f"the next {count} API requests answer {status}",
            )
        while self._kills and self._kills[0] <= elapsed:
            # A worker killed before is passed over: its dead self's leases still name it
            # until they expire, so "busy" would not mean it is in a job.
            hosts = [
                h for h in self.hosts.running() if h.label in busy and not h.unit.injected_kills
            ]
            if not hosts:
                return  # no worker is in a job now: try again soon
            host = self.rng.choice(hosts)
            pid = host.unit.kill_worker()
            if pid is None:
                return
            self._kills.pop(0)
            self._record(WORKER_KILLED, elapsed, f"{host.label}: worker pid {pid} mid-job")
            return  # one kill per call: the next finds the workers busy after this one

    def on_drains(self, elapsed: float, labels: Sequence[str]) -> None:
        """At the first scale-in, one of the hosts being drained stops answering SSH."""
        if self._silenced:
            return
        hosts = [h for h in self.hosts.running() if h.label in labels]
        if not hosts:
            return
        host = self.rng.choice(hosts)
        host.ssh.silence(self.plan.ssh_seconds, self.plan.ssh_mode)
        self._silenced = True
        how = "accepts TCP, sends nothing" if self.plan.ssh_mode == "hang" else "drops connections"
        self._record(SSH_SILENT, elapsed, f"{host.label}: {how} for {self.plan.ssh_seconds:g}s")

    def run_pass(self, argv: Sequence[str], env: Mapping[str, str], elapsed: float) -> PassRun:
        """Run one pass process to its end, or SIGKILL it at a random point. The first pass is
        never killed, and from the third on each is until one was, so every run kills one."""
        self._passes += 1
        killed_before = any(f.kind == PASS_KILLED for f in self.injected())
        forced = self._passes >= 3 and not killed_before
        draw = self.rng.random()
        delay = self.rng.uniform(*self.plan.pass_kill_after)
        if forced and self._pass_seconds:
            # At a point every pass so far has reached: on a quick machine a pass ends before
            # most drawn delays, and a run ended with no pass killed (seen in CI).
            delay = min(delay, self.rng.uniform(0.3, 0.9) * min(self._pass_seconds))
        kill = self._passes > 1 and (forced or draw < self.plan.pass_kill_odds)
        kill_after = delay if kill else None
        started = time.monotonic()
        proc = subprocess.Popen(
            list(argv),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # Ctrl-C at the terminal ends the run after the pass
        )
        try:
            out, err = proc.communicate(timeout=kill_after or PASS_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            out, err = proc.communicate()
            if kill_after is None:
                return PassRun(1, out, err + f"\nthe pass ran over {PASS_TIMEOUT:g}s: killed")
            self._record(
                PASS_KILLED,
                elapsed + delay,
                f"pass {self._passes} (pid {proc.pid}) after {delay:.1f}s",
            )
            return PassRun(None, out, err)
        except BaseException:  # interrupted while waiting: leave no pass running behind us
            proc.kill()
            proc.wait()
            raise
        self._pass_seconds.append(time.monotonic() - started)
        return PassRun(proc.returncode, out, err)
