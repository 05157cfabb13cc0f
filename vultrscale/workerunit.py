"""The numbers of the worker's systemd unit (cloud-init/worker.service) and the outage budget
they follow: one rule for the worker runtime, the unit cloud-init writes and the simulated
hosts. Plain numbers in, plain numbers out: the worker imports this without the scaler's
config, and cloud-init below the worker in the layers uses the same rule."""

from __future__ import annotations

from typing import Protocol

# worker.service: RestartSec=5 and StartLimitBurst=5 (the unit file says why).
RESTART_SECONDS = 5
START_LIMIT_BURST = 5


class WorkerTimes(Protocol):
    """What the unit's numbers are made of: ``[worker]``'s times, in seconds."""

    @property
    def drain_seconds(self) -> float: ...

    @property
    def lease_seconds(self) -> float: ...

    @property
    def outage_seconds(self) -> float: ...


def outage_budget(outage_seconds: float, lease_seconds: float) -> float:
    """How long a worker rides out an unreachable database: outage_seconds, else the lease."""
    return outage_seconds or lease_seconds


def start_limit_interval_seconds(worker: WorkerTimes) -> int:
    """StartLimitIntervalSec for the unit. A worker that gives up on a long outage has waited
    its whole outage budget (running, or at start-up), so its restarts are at least budget +
    RestartSec apart: START_LIMIT_BURST + 1 starts span more than this interval and an outage
    of any length never trips the start limit, while a worker failing faster than that (a
    crash, not an outage) does, and stays failed for an operator to see."""
    budget = outage_budget(worker.outage_seconds, worker.lease_seconds)
    return int(START_LIMIT_BURST * (budget + RESTART_SECONDS)) - 1


def timeout_stop_seconds(worker: WorkerTimes) -> int:
    """TimeoutStopSec for the unit: the drain time plus a margin for giving jobs back."""
    return int(worker.drain_seconds + max(10.0, worker.drain_seconds * 0.5))
