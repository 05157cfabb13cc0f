"""The account's ceiling across fleets (account.monthly_ceiling_usd): the rule, pure, and the
pass on in-memory ports, two fleets in two threads racing for the same headroom."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from vultrscale import config as config_mod
from vultrscale.core.clock import FakeClock
from vultrscale.core.limits import Limit
from vultrscale.core.model import AccountSpend, InstanceState, LedgerRow, Signals
from vultrscale.memory import (
    SNAPSHOT,
    MemoryAccount,
    MemoryCloud,
    MemoryDrain,
    MemoryLedger,
    MemorySignals,
    memory_parts,
)
from vultrscale.reconcile import PassResult, run_pass
from vultrscale.rules import budget

START = datetime(2026, 5, 10, 9, 0, tzinfo=UTC)
S = InstanceState
ENV = {
    "VULTR_API_KEY": "k" * 32,
    "DATABASE_URL": "postgresql://unused@nowhere/db",
    "WORKER_DATABASE_URL": "postgresql://worker@nowhere/db",
}


def _row(fleet: str, label: str, state: InstanceState, **kw: Any) -> LedgerRow:
    kw.setdefault("monthly_cost", 10.0)
    kw.setdefault("hourly_rate", 0.015)
    return LedgerRow.new(label, fleet, state, kw.pop("created_at", START), **kw)


# --- the rule, pure -----------------------------------------------------------------------------


def test_account_spend_counts_intents_as_instances_and_bills_gone_rows_so_far() -> None:
    now = START + timedelta(hours=2, minutes=5)
    rows = [
        _row("web", "a", S.RUNNING),
        _row("web", "b", S.CREATING, created_at=now),  # an intent: counted, nothing billed yet
        _row("gpu", "c", S.GONE, gone_at=START + timedelta(minutes=30)),
        _row("gpu", "d", S.DRAINING),  # on its way out: billed so far, not to the month's end
    ]
    spend = budget.account_spend(rows, 100.0, now)
    assert spend.instances == 2 and spend.monthly_usd == 20.0
    assert spend.fleets == ("gpu", "web")
    so_far = 3 * 0.015 + 0 + 1 * 0.015 + 3 * 0.015  # a: 3 started hours; c: 1; d: 3
    assert spend.month_to_date_usd == pytest.approx(so_far)
    # to the month's end (519 hours from 09:00 on the 10th, under the monthly 10.0): a runs
    # on, b from 11:05 (517 started hours); c and d are gone or going
    assert spend.committed_usd == pytest.approx(so_far + (519 - 3) * 0.015 + 517 * 0.015)


@pytest.mark.parametrize(
    ("others_monthly", "others_committed", "allowed"),
    [
        pytest.param(0.0, 0.0, 3, id="no-other-fleet: 3 of 30"),
        pytest.param(20.0, 20.0, 1, id="two-instances-elsewhere: room for one of 30"),
        pytest.param(30.0, 30.0, 0, id="account-full: none"),
    ],
)
def test_the_account_ceiling_bounds_a_fleet_by_what_the_others_hold(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    others_monthly: float,
    others_committed: float,
    allowed: int,
) -> None:
    fleet = _fleet(tmp_path, "web", ceiling=30.0)
    fleet.queue(20)
    spend = AccountSpend(30.0, 0.0, others_committed, others_monthly, 2, ("gpu",))
    result = _run_with_spend(fleet, spend, monkeypatch)
    assert result.plan is not None
    assert result.plan.creates == allowed
    if others_monthly:
        clamp = next(c for c in result.plan.clamps if c.kind is Limit.BUDGET_ACCOUNT)
        assert clamp.allowed == allowed and clamp.limit == 30.0
        assert "other fleets (gpu)" in clamp.describe()


def test_an_account_the_pass_could_not_check_again_does_not_grow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet = _fleet(tmp_path, "web", ceiling=300.0)
    fleet.queue(8)
    spend = AccountSpend(300.0, unknown="another pass held the account's lock past 10s")
    result = _run_with_spend(fleet, spend, monkeypatch)
    assert result.plan is not None and result.plan.creates == 0
    clamp = next(c for c in result.plan.clamps if c.kind is Limit.BUDGET_ACCOUNT)
    assert "could not be checked" in clamp.describe()


def _run_with_spend(
    fleet: _Fleet, spend: AccountSpend, monkeypatch: pytest.MonkeyPatch
) -> PassResult:
    """A dry run decided on ``spend`` as the other fleets' (the read stage's own is replaced)."""
    monkeypatch.setattr("vultrscale.read.account", lambda cfg, session, now: spend)
    return run_pass(fleet.cfg, fleet.parts, dry_run=True, take_lock=False)


# --- two fleets, one account, on in-memory ports --------------------------------------------------


class _GatedCloud(MemoryCloud):
    """A cloud whose creates wait at ``gate`` (set: they go through), saying so at ``entered``."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def create_instance(self, **kw: Any) -> Any:
        self.entered.set()
        assert self.gate.wait(10), "the test never opened the gate"
        return super().create_instance(**kw)


class _WatchedAccount(MemoryAccount):
    """Says at ``asked`` when a second pass asks for the account's lock."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = threading.Event()

    def lock(self, wait_s: float) -> bool:
        if self.waits:  # the first pass took it: this is the second one asking
            self.asked.set()
        return super().lock(wait_s)


class _Fleet:
    def __init__(
        self,
        tmp_path: Path,
        name: str,
        clock: FakeClock,
        account: MemoryAccount | None,
        ceiling: float,
    ) -> None:
        self.cloud = _GatedCloud(clock)
        self.ledger = MemoryLedger(name)
        self.signals = MemorySignals()
        key = tmp_path / "id_ed25519"
        key.write_text("not read\n")
        key.chmod(0o600)
        path = tmp_path / f"{name}.toml"
        path.write_text(
            f'[fleet]\nname = "{name}"\ntag = "vs-{name}"\nsnapshot_id = "{SNAPSHOT}"\n'
            f'ssh_key = "{key}"\n[policy]\nmax_instances = 5\nbilling_hour_aware = false\n'
            'scale_up_cooldown = "0s"\ntarget_wait = "0s"\n'
            f"[budget]\nmonthly_ceiling_usd = 500.0\n[account]\nmonthly_ceiling_usd = {ceiling}\n"
        )
        self.cfg = config_mod.load(path, env=ENV)
        self.ledger_account = account
        self.parts = memory_parts(
            clock, self.cloud, self.ledger, self.signals, MemoryDrain(), account=account
        )

    def queue(self, ready: int) -> None:
        self.signals.signals = Signals(ready=ready, in_flight=0)

    def live(self) -> int:
        return sum(1 for r in self.ledger.rows(START) if r.state is not S.GONE)


def _fleet(tmp_path: Path, name: str, ceiling: float) -> _Fleet:
    folder = tmp_path / name
    folder.mkdir()
    return _Fleet(folder, name, FakeClock(START), MemoryAccount(), ceiling)


def test_two_fleets_in_two_threads_never_spend_the_same_headroom(tmp_path: Path) -> None:
    """Room for 3 instances in the account; each fleet's queue asks for 3. Web's pass takes the
    account's lock and stops in its first POST (its intent written); gpu's pass reads the
    account then (one intent of web's), decides on 2 creates and waits for the lock; web goes
    on and creates its 3. Read again under the lock, the account has no room left: gpu
    creates none. Without the lock and the second read, it created 2: 5 in an account of 3."""
    clock = FakeClock(START)
    account = _WatchedAccount()
    web = _Fleet(tmp_path, "web", clock, account, ceiling=30.0)
    gpu = _Fleet(tmp_path, "gpu", clock, account, ceiling=30.0)
    web.queue(12)
    gpu.queue(12)
    web.cloud.gate.clear()
    results: dict[str, PassResult] = {}

    def run(f: _Fleet) -> None:
        results[f.cfg.fleet.name] = run_pass(f.cfg, f.parts)

    first = threading.Thread(target=run, args=(web,))
    first.start()
    assert web.cloud.entered.wait(10)
    second = threading.Thread(target=run, args=(gpu,))
    second.start()
    assert account.asked.wait(10)  # gpu decided to create, and waits for the lock
    web.cloud.gate.set()
    first.join(10)
    second.join(10)
    assert web.cloud.posts == 3 and gpu.cloud.posts == 0
    plan = results["gpu"].plan
    assert plan is not None and plan.creates == 0
    assert any(c.kind is Limit.BUDGET_ACCOUNT for c in plan.clamps)
    assert results["web"].exit_code == 0 and results["gpu"].exit_code == 0


def test_a_fleet_with_nothing_to_create_never_takes_the_account_lock(tmp_path: Path) -> None:
    fleet = _fleet(tmp_path, "web", ceiling=30.0)
    fleet.queue(0)
    assert run_pass(fleet.cfg, fleet.parts).exit_code == 0
    assert fleet.ledger_account is not None and fleet.ledger_account.waits == []
    fleet.queue(4)
    assert run_pass(fleet.cfg, fleet.parts).exit_code == 0
    assert fleet.ledger_account.waits == [10.0] and fleet.live() == 1


def test_the_lock_not_had_in_time_creates_nothing_and_the_pass_goes_on(tmp_path: Path) -> None:
    fleet = _fleet(tmp_path, "web", ceiling=300.0)
    account = fleet.ledger_account
    assert account is not None
    fleet.queue(8)
    held = threading.Thread(target=account.lock, args=(1.0,))
    held.start()
    held.join()  # another thread holds it, and never lets go
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("vultrscale.reconcile.ACCOUNT_LOCK_WAIT_S", 0.01)
        result = run_pass(fleet.cfg, fleet.parts)
    assert result.exit_code == 0 and fleet.cloud.posts == 0
    assert result.plan is not None
    assert any("could not be checked" in c.describe() for c in result.plan.clamps)


def test_without_an_account_ceiling_the_other_fleets_are_not_read(tmp_path: Path) -> None:
    fleet = _fleet(tmp_path, "web", ceiling=0.0)
    fleet.queue(8)
    result = run_pass(fleet.cfg, fleet.parts)
    assert result.exit_code == 0 and fleet.cloud.posts == 2
    assert result.decision is not None and result.decision.observation.account is None
