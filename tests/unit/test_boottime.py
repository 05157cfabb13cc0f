"""boottime.learn(): the boot time learned from ledger rows, on a fake clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from vultrscale.core import boottime
from vultrscale.core.model import InstanceState, LedgerRow

NOW = datetime(2026, 11, 10, 12, 0, tzinfo=UTC)
FALLBACK = timedelta(minutes=12)


def boot(label: str, minutes: float, *, days_ago: float = 1, posted: bool = True) -> LedgerRow:
    """A row created ``days_ago`` whose worker reported in ``minutes`` later."""
    created = NOW - timedelta(days=days_ago)
    return LedgerRow.new(
        label,
        "workers",
        InstanceState.GONE,
        created,
        posted_at=created + timedelta(seconds=5) if posted else None,
        running_at=created + timedelta(minutes=minutes),
    )


def test_too_few_boots_keep_the_configured_boot_time() -> None:
    rows = [boot(f"w{i}", 3, days_ago=i) for i in range(boottime.MIN_BOOTS - 1)]
    got = boottime.learn(rows, FALLBACK, NOW)
    assert got == boottime.BootTime(FALLBACK, boottime.MIN_BOOTS - 1, learned=False)
    assert "policy.boot_time" in got.describe()


def test_enough_boots_give_their_90th_percentile() -> None:
    rows = [boot(f"w{i}", minutes=i + 1, days_ago=i / 10) for i in range(10)]  # 1..10 min
    got = boottime.learn(rows, FALLBACK, NOW)
    assert got == boottime.BootTime(timedelta(minutes=9), 10, learned=True)
    assert got.describe() == "9.0m (p90 of the last 10 boot(s))"


def test_only_the_newest_boots_count() -> None:
    slow_old = [boot(f"old{i}", 30, days_ago=10 + i) for i in range(10)]
    fast_new = [boot(f"new{i}", 4, days_ago=i / 10) for i in range(boottime.LAST_BOOTS)]
    got = boottime.learn([*slow_old, *fast_new], FALLBACK, NOW)
    assert got == boottime.BootTime(timedelta(minutes=4), boottime.LAST_BOOTS, learned=True)


def test_boots_older_than_the_window_do_not_count() -> None:
    days = boottime.WINDOW.days
    rows = [boot(f"w{i}", 4, days_ago=days + 1 + i) for i in range(10)]
    assert boottime.learn(rows, FALLBACK, NOW) == boottime.BootTime(FALLBACK, 0, learned=False)


def test_adopted_instances_and_workers_never_seen_are_not_boots() -> None:
    adopted = [boot(f"a{i}", 4, posted=False) for i in range(10)]
    never_up = [
        LedgerRow.new(f"n{i}", "workers", InstanceState.GONE, NOW, posted_at=NOW) for i in range(10)
    ]
    assert boottime.learn([*adopted, *never_up], FALLBACK, NOW).boots == 0


def test_a_row_read_twice_counts_once() -> None:
    rows = [boot(f"w{i}", 5, days_ago=i) for i in range(3)]
    assert boottime.learn([*rows, *rows], FALLBACK, NOW).boots == 3


def test_a_replay_draws_between_the_10th_and_90th_percentile() -> None:
    boots = [float(60 * m) for m in range(1, 11)]
    assert boottime.replay_range(boots) == (60.0, 540.0)
