"""The pass's deadline bounds its waits on Vultr; its waits on SSH (bounded on their own, and
shown to other passes through the lock) do not use it up."""

from __future__ import annotations

from typing import Any

from vultrscale import wiring
from vultrscale.core.clock import Deadline


class _SlowHosts:
    """An SSH transport whose every fan-out takes ``seconds`` of the fake clock."""

    def __init__(self, now: list[float], seconds: float) -> None:
        self.now, self.seconds = now, seconds

    def stop_many(self, targets: list[Any]) -> dict[str, Any]:
        self.now[0] += self.seconds
        return {}

    def is_active_many(self, targets: list[Any]) -> dict[str, Any]:
        self.now[0] += self.seconds
        return {}

    def close(self) -> None:
        pass


def test_waiting_on_hosts_leaves_the_pass_its_time_for_vultr() -> None:
    # Before: the deadline ran on through SSH, so one hung draining host (a 20 s probe, a
    # 20 s stop) left every pass's creates "not sent: the pass's 30s deadline has passed",
    # and the fleet could not grow until the drain timed out.
    now = [100.0]
    deadline = Deadline(30.0, monotonic=lambda: now[0])
    drain = wiring._LazyDrain("unused", deadline, make=lambda _key: _SlowHosts(now, 20.0))
    with deadline.running():
        now[0] += 5.0  # the listing
        drain.is_active_many([])
        drain.stop_many([])
        assert deadline.remaining() == 25.0
        now[0] += 26.0  # Vultr alone still ends the pass on time
        assert (deadline.remaining() or 0) < 0


def test_a_pause_outside_a_pass_arms_nothing() -> None:
    now = [0.0]
    deadline = Deadline(30.0, monotonic=lambda: now[0])
    with deadline.paused():
        now[0] += 10.0
    assert deadline.remaining() is None
