"""Time as an argument: a Clock protocol, the system clock, and a fake clock for tests.

Logic takes ``now`` from a Clock so that tests advance time instead of sleeping.
"""

from __future__ import annotations

import time
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
