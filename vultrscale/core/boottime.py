"""How long a new instance takes to be ready, learned from the fleet's own ledger. Pure.

A boot is measured from the create (the intent's ``created_at``, where billing starts) to the
first pass that saw its worker report in (``running_at``), for instances this scaler created
(``posted_at`` set; an adopted one has no create of ours). The estimate is a high percentile
(``PERCENTILE``, nearest rank) of the ``LAST_BOOTS`` newest boots within ``WINDOW``: a plan
that counts on it is rarely surprised by a slow boot, and one instance that took an hour does
not set it. Until ``MIN_BOOTS`` are seen, the configured ``policy.boot_time`` is the estimate.

The reconcile pass reads the rows (``FleetLedger.reads``), the policy's wait rule uses the
estimate as the time a create takes to help, and ``simulate --from-db`` replays the same
boots (``replay_range``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol, TypeVar

#: The newest boots the estimate rests on: recent enough to follow a slower image or region.
LAST_BOOTS = 20
#: Boots older than this are not counted (an image baked since may boot otherwise).
WINDOW = timedelta(days=28)
#: Fewer boots than this: the configured ``policy.boot_time`` is used instead.
MIN_BOOTS = 5
#: The percentile (nearest rank) of the boots taken as the estimate.
PERCENTILE = 0.9


class BootRow(Protocol):
    """What a boot is measured from: a ledger row (``model.LedgerRow``)."""

    @property
    def label(self) -> str: ...
    @property
    def created_at(self) -> datetime: ...
    @property
    def posted_at(self) -> datetime | None: ...
    @property
    def running_at(self) -> datetime | None: ...


_Row = TypeVar("_Row", bound=BootRow)


@dataclass(frozen=True)
class BootTime:
    """The boot time the policy plans with: ``learned`` from ``boots`` boots of the ledger, or
    the configured fallback (``boots`` then says how many were seen, fewer than needed)."""

    estimate: timedelta
    boots: int
    learned: bool

    def describe(self) -> str:
        """One line for ``status`` and the plan's reasons."""
        minutes = self.estimate.total_seconds() / 60
        if self.learned:
            return f"{minutes:.1f}m (p{PERCENTILE * 100:.0f} of the last {self.boots} boot(s))"
        return (
            f"{minutes:.1f}m (policy.boot_time: {self.boots} boot(s) seen, "
            f"{MIN_BOOTS} needed to learn it)"
        )


def is_boot(row: BootRow) -> bool:
    """The row is a boot this scaler made that came up: created here, its worker seen."""
    return row.posted_at is not None and row.running_at is not None


def newest_boots(rows: Iterable[_Row]) -> list[_Row]:
    """The ``LAST_BOOTS`` newest boots (``is_boot``) of ``rows``, newest first: what a ledger
    reads for ``learn`` (the Postgres one with a query, ``ledger._BOOTS``)."""
    boots = sorted((r for r in rows if is_boot(r)), key=lambda r: r.created_at, reverse=True)
    return boots[:LAST_BOOTS]


def boot_seconds(
    rows: Iterable[BootRow], now: datetime | None, window: timedelta = WINDOW
) -> list[float]:
    """Create to worker up, in seconds, of each boot (``is_boot``) created within ``window``
    before ``now`` (None: rows read within a window already), newest first, each row once
    (by label)."""
    since = None if now is None else now - window
    seen: dict[str, BootRow] = {}
    for r in rows:
        if is_boot(r) and (since is None or r.created_at >= since):
            seen[r.label] = r
    newest = sorted(seen.values(), key=lambda r: r.created_at, reverse=True)
    out = []
    for r in newest:
        assert r.running_at is not None  # is_boot
        out.append(max(0.0, (r.running_at - r.created_at).total_seconds()))
    return out


def learn(rows: Iterable[BootRow], fallback: timedelta, now: datetime) -> BootTime:
    """The boot time to plan with at ``now``: the ``PERCENTILE`` of the ``LAST_BOOTS`` newest
    boots within ``WINDOW``, or ``fallback`` with fewer than ``MIN_BOOTS`` of them."""
    boots = boot_seconds(rows, now)[:LAST_BOOTS]
    if len(boots) < MIN_BOOTS:
        return BootTime(fallback, len(boots), learned=False)
    return BootTime(timedelta(seconds=nearest_rank(boots, PERCENTILE)), len(boots), learned=True)


def nearest_rank(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (not empty) by nearest rank: a value that occurred."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def replay_range(boots: Sequence[float]) -> tuple[float, float]:
    """The boot range a replay draws from, learned from a fleet's own boots: their 10th to
    ``PERCENTILE`` percentile (nearest rank), so one instance that never came up does not set
    it, and its upper end is the estimate ``learn`` plans with."""
    return nearest_rank(boots, 0.1), nearest_rank(boots, PERCENTILE)
