"""Time as an argument: a Clock protocol, the system clock, and a fake clock for tests; and
the pass's deadline, the one bound on how long a pass waits on the outside.

Logic takes ``now`` from a Clock so that tests advance time instead of sleeping.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """Aware UTC wall-clock time."""
        ...

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin; never goes backwards."""
        ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class FakeClock:
    """A clock that moves only when told to. ``sleep`` advances it instantly."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
        self._mono = 1000.0
        self.slept: list[float] = []

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float | timedelta) -> None:
        delta = seconds if isinstance(seconds, timedelta) else timedelta(seconds=seconds)
        self._now += delta
        self._mono += delta.total_seconds()

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        if seconds > 0:
            self.advance(seconds)

    def set(self, when: datetime) -> None:
        if when.tzinfo is None:
            raise ValueError("FakeClock.set needs an aware datetime")
        self.advance(when - self._now)


# How long a pass may wait on the outside (Vultr, with every retry) before it gives up: half of
# cron's one-minute interval, so a pass that found the API silent or trickling has ended, its
# lock freed, before the next one starts. A healthy pass takes about a second.
PASS_DEADLINE_S = 30.0


class Deadline:
    """The end of a pass, shared by the parts that wait on the outside: armed for the length of
    a pass (``running``), read by the Vultr client before and during every attempt.

    The clock is a plain monotonic function: the network's waits are real ones."""

    def __init__(self, seconds: float, monotonic: Callable[[], float] = time.monotonic) -> None:
        if seconds <= 0:
            raise ValueError(f"a deadline must be positive, got {seconds}")
        self.seconds = seconds
        self._monotonic = monotonic
        self._until: float | None = None

    @contextmanager
    def running(self) -> Iterator[None]:
        """Arm the deadline ``seconds`` from now for the block (one pass), then disarm it."""
        self._until = self._monotonic() + self.seconds
        try:
            yield
        finally:
            self._until = None

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Stop the deadline's clock for the block: SSH to the hosts, which has bounds of its
        own (and which the pass shows its lock's holder to need), must not eat the time the
        pass has for Vultr, or one hung host would leave every pass no time to create."""
        began = self._monotonic()
        try:
            yield
        finally:
            if self._until is not None:
                self._until += self._monotonic() - began

    def remaining(self) -> float | None:
        """Seconds left (negative once passed); None while no pass runs."""
        until = self._until
        return None if until is None else until - self._monotonic()
