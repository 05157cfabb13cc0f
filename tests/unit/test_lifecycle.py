"""The lifecycle's decisions as tables: the ledger state machine and the drain verdicts."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from vultrscale.core.model import InstanceState, LedgerRow, ServiceState, WorkerView
from vultrscale.rules import lifecycle
from vultrscale.rules.lifecycle import DrainStep, Verdict
from vultrscale.vultr.models import VInstance

NOW = datetime(2026, 5, 10, 12, 0, tzinfo=UTC)
S = InstanceState


def row(state: InstanceState, age: float = 0, **kw: object) -> LedgerRow:
    """A ledger row in ``state`` whose create intent is ``age`` seconds old."""
    created = NOW - timedelta(seconds=age)
    base = LedgerRow.new(
        "w-1",
        "workers",
        state,
        created,
        instance_id=None if state is S.CREATING else "i-1",
        plan="vc2-1c-2gb",
        region="ewr",
        hourly_rate=0.015,
        monthly_cost=10.0,
        host_key="ssh-ed25519 AAAA",
        posted_at=None if state is S.CREATING else created,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def listed(status: str = "active", server: str = "ok", iid: str = "i-1") -> VInstance:
    return VInstance(iid, label="w-1", status=status, server_status=server, main_ip="10.0.0.1")


# (row, listed instance or None, worker seen, own workers) -> (next state, error note?)
STATE_MACHINE = [
    pytest.param(row(S.CREATING, 60), None, False, True, S.CREATING, None, id="intent-young-waits"),
    pytest.param(
        row(S.CREATING, 301),
        None,
        False,
        True,
        S.GONE,
        "create never became an instance",
        id="intent-past-visibility-grace-is-dead",
    ),
    pytest.param(
        row(S.CREATING, 10),
        listed("pending", "none"),
        False,
        True,
        S.PENDING,
        None,
        id="intent-found-by-label-pending",
    ),  # fmt: skip
    pytest.param(
        row(S.PENDING, 60), None, False, True, S.PENDING, None, id="fresh-post-not-listed-yet-waits"
    ),  # fmt: skip
    pytest.param(
        row(S.PENDING, 200), None, False, True, S.GONE, None, id="post-missing-past-grace-is-gone"
    ),  # fmt: skip
    pytest.param(
        row(S.PENDING, 60),
        listed(),
        False,
        True,
        S.BOOTING,
        None,
        id="active-without-worker-is-booting",
    ),  # fmt: skip
    pytest.param(
        row(S.BOOTING, 60), listed(), True, True, S.RUNNING, None, id="worker-seen-is-running"
    ),  # fmt: skip
    pytest.param(
        row(S.BOOTING, 60),
        listed(),
        False,
        False,
        S.RUNNING,
        None,
        id="foreign-queue-active-ok-is-running",
    ),  # fmt: skip
    pytest.param(
        row(S.BOOTING, 60),
        listed("pending", "none"),
        False,
        True,
        S.BOOTING,
        None,
        id="never-moves-back-down-the-boot-order",
    ),  # fmt: skip
    pytest.param(
        row(S.RUNNING, 600),
        listed(),
        False,
        True,
        S.BOOTING,
        "worker not seen; waiting for it to come back",
        id="running-whose-worker-vanished-goes-back-to-booting",
    ),
    pytest.param(
        row(S.RUNNING, 600),
        listed(),
        False,
        False,
        S.RUNNING,
        None,
        id="foreign-queue-running-stays",
    ),  # fmt: skip
    pytest.param(
        row(S.DRAINING, 600), listed(), False, True, S.DRAINING, None, id="draining-stays-draining"
    ),  # fmt: skip
    pytest.param(
        row(S.DRAINING, 600),
        None,
        False,
        True,
        S.GONE,
        None,
        id="draining-confirmed-missing-is-gone",
    ),  # fmt: skip
    pytest.param(
        row(S.DELETING, 600),
        None,
        False,
        True,
        S.GONE,
        None,
        id="deleting-confirmed-missing-is-gone",
    ),  # fmt: skip
]


@pytest.mark.parametrize(("r", "v", "seen", "own", "state", "error"), STATE_MACHINE)
def test_next_state(
    r: LedgerRow,
    v: VInstance | None,
    seen: bool,
    own: bool,
    state: InstanceState,
    error: str | None,
) -> None:
    new, _, note = lifecycle.next_state(r, v, NOW, seen=seen, own_workers=own)
    assert (new, note) == (state, error)


LOOKUPS = [
    pytest.param(row(S.CREATING, 600), False, id="intent-has-no-id-to-get"),
    pytest.param(row(S.PENDING, 60), False, id="fresh-post-is-judged-by-age"),
    pytest.param(row(S.PENDING, 600), True, id="old-pending-is-looked-up"),
    pytest.param(row(S.RUNNING, 600), True, id="running-is-looked-up"),
    pytest.param(row(S.DRAINING, 600), True, id="draining-is-looked-up"),
]


@pytest.mark.parametrize(("r", "needed"), LOOKUPS)
def test_a_missing_instance_is_looked_up_before_it_is_called_gone(
    r: LedgerRow, needed: bool
) -> None:
    assert lifecycle.needs_lookup(r, NOW) is needed


def test_sync_follows_boots_notes_addresses_and_adopts_strangers() -> None:
    rows = [row(S.BOOTING, 60), row(S.RUNNING, 60, label="w-2", instance_id="i-2", main_ip="1")]
    cloud = {
        "w-1": listed(),
        "w-2": VInstance("i-2", label="w-2", status="active", server_status="ok", main_ip="2"),
        "stray": VInstance("i-9", label="stray", status="active", server_status="ok"),
    }
    seen = {"w-2": WorkerView("w-2", NOW, False, 0, True)}
    out = {t.label: t for t in lifecycle.sync(rows, cloud, seen, NOW, own_workers=True)}
    assert out["w-1"].state is S.BOOTING and out["w-1"].note == ""  # address only
    assert out["w-1"].address_only and out["w-1"].main_ip == "10.0.0.1"
    assert out["w-2"].address_only and out["w-2"].main_ip == "2"
    assert out["stray"].adopt and out["stray"].state is S.BOOTING
    after = lifecycle.applied({r.label: r for r in rows}, out.values(), cloud, "workers", NOW)
    assert after["stray"].instance_id == "i-9" and after["w-2"].main_ip == "2"


def test_every_tagged_instance_gets_a_ledger_label_of_its_own() -> None:
    def v(iid: str, label: str) -> VInstance:
        return VInstance(iid, label=label, status="active", server_status="ok")

    rows = {
        "w-1": row(S.RUNNING, 60),  # knows i-1 as w-1
        "renamed": row(S.RUNNING, 60, label="renamed", instance_id="i-5"),
        "w-intent": row(S.CREATING, 10, label="w-intent"),  # no id yet: its POST's instance
        "w-old": row(S.RUNNING, 60, label="w-old", instance_id="i-gone"),
    }
    keyed = lifecycle.by_label(
        [
            v("i-1", "w-1"),
            v("i-2", "w-1"),  # a namesake of a known one
            v("i-3", ""),
            v("i-4", ""),
            v("i-5", "label-changed-at-vultr"),
            v("i-6", "twin"),
            v("i-7", "twin"),
            v("i-8", "w-intent"),
            v("i-9", "w-old"),  # the ledger's w-old is another instance
            v("i-10", "solo"),
        ],
        rows,
    )
    assert {label: x.id for label, x in keyed.items()} == {
        "w-1": "i-1",
        "w-1@i-2": "i-2",
        "unlabelled@i-3": "i-3",
        "unlabelled@i-4": "i-4",
        "renamed": "i-5",
        "twin@i-6": "i-6",
        "twin@i-7": "i-7",
        "w-intent": "i-8",
        "w-old@i-9": "i-9",
        "solo": "i-10",
    }
    # The next pass, with the strangers adopted under those labels, keys them the same way.
    adopted = {k: row(S.BOOTING, 0, label=k, instance_id=x.id) for k, x in keyed.items()}
    assert {k: x.id for k, x in lifecycle.by_label(keyed.values(), adopted).items()} == {
        k: x.id for k, x in keyed.items()
    }


TIMEOUT = timedelta(minutes=10)
GRACE = timedelta(minutes=3)
LONG = TIMEOUT + lifecycle.DRAIN_MARGIN + timedelta(seconds=1)
SHORT = timedelta(seconds=30)

# (what is-active said or why it was not asked, waited, live leases) -> the step
DRAIN_VERDICTS = [
    pytest.param(
        ServiceState.INACTIVE,
        SHORT,
        0,
        Verdict.DELETE,
        False,
        "worker inactive",
        id="stopped-no-lease-delete",
    ),  # fmt: skip
    pytest.param(
        ServiceState.FAILED,
        SHORT,
        0,
        Verdict.DELETE,
        False,
        "worker failed",
        id="failed-counts-as-stopped",
    ),  # fmt: skip
    pytest.param(
        ServiceState.INACTIVE,
        SHORT,
        2,
        Verdict.WAIT,
        False,
        "2 live lease(s)",
        id="stopped-with-live-lease-waits",
    ),  # fmt: skip
    pytest.param(
        ServiceState.INACTIVE,
        SHORT,
        None,
        Verdict.WAIT,
        False,
        "queue unreadable",
        id="stopped-queue-unreadable-waits",
    ),  # fmt: skip
    pytest.param(
        ServiceState.DEACTIVATING,
        SHORT,
        1,
        Verdict.WAIT,
        False,
        "draining",
        id="stop-in-progress-waits",
    ),  # fmt: skip
    pytest.param(
        ServiceState.ACTIVE,
        SHORT,
        0,
        Verdict.WAIT,
        True,
        "draining: worker active",
        id="still-active-sends-the-stop-again",
    ),  # fmt: skip
    pytest.param(
        ServiceState.ACTIVE,
        LONG,
        0,
        Verdict.DELETE,
        False,  # no stop is sent to a host about to be deleted
        "past its deadline",
        id="past-deadline-no-lease-delete",
    ),  # fmt: skip
    pytest.param(
        ServiceState.DEACTIVATING,
        LONG,
        1,
        Verdict.WAIT,
        False,
        "still holds 1",
        id="past-deadline-live-lease-waits",
    ),  # fmt: skip
    pytest.param(
        ServiceState.DEACTIVATING,
        LONG,
        None,
        Verdict.WAIT,
        False,
        "unreadable",
        id="past-deadline-queue-unreadable-waits",
    ),  # fmt: skip
    pytest.param(
        "host key mismatch",
        SHORT,
        0,
        Verdict.ERROR,
        False,
        "host key mismatch",
        id="unreachable-within-grace-is-an-error",
    ),  # fmt: skip
    pytest.param(
        "timed out",
        GRACE + SHORT,
        0,
        Verdict.DELETE,
        False,
        "unreachable past",
        id="unreachable-past-grace-delete",
    ),  # fmt: skip
    pytest.param(
        "timed out",
        GRACE + SHORT,
        3,
        Verdict.WAIT,
        False,
        "still holds 3",
        id="unreachable-past-grace-live-lease-waits",
    ),  # fmt: skip
    pytest.param(
        lifecycle.NO_TARGET,
        SHORT,
        0,
        Verdict.ERROR,
        False,
        "no address",
        id="no-target-within-grace-is-an-error",
    ),  # fmt: skip
]


@pytest.mark.parametrize(("service", "waited", "live", "verdict", "restop", "why"), DRAIN_VERDICTS)
def test_drain_verdict(
    service: ServiceState | str,
    waited: timedelta,
    live: int | None,
    verdict: Verdict,
    restop: bool,
    why: str,
) -> None:
    step = lifecycle.drain_step(
        "w-1", service, waited, live, timeout=TIMEOUT, unreachable_grace=GRACE
    )
    assert isinstance(step, DrainStep)
    assert (step.verdict, step.restop) == (verdict, restop)
    assert why in step.why


_GONE_AT = datetime(2026, 5, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("holder", "own_gone", "expected"),
    [
        (None, False, lifecycle.Adoption("w", None, False)),
        (None, True, lifecycle.Adoption("w", None, True)),
        (
            lifecycle.LabelHolder(InstanceState.GONE, "old", _GONE_AT),
            False,
            lifecycle.Adoption("w", "w@old", False),
        ),
        (
            lifecycle.LabelHolder(InstanceState.GONE, None, _GONE_AT),
            True,
            lifecycle.Adoption("w", f"w@gone-{_GONE_AT.timestamp():.6f}", True),
        ),
        (
            lifecycle.LabelHolder(InstanceState.GONE, "new", _GONE_AT),
            True,
            lifecycle.Adoption("w", None, True),
        ),
        (
            lifecycle.LabelHolder(InstanceState.RUNNING, "other-fleet", None),
            False,
            lifecycle.Adoption("w@new", None, False),
        ),
        (
            lifecycle.LabelHolder(InstanceState.RUNNING, "other-fleet", None),
            True,
            lifecycle.Adoption("w@new", None, True),
        ),
    ],
    ids=[
        "free-label",
        "own-gone-row-revived",
        "another-gone-row-retired",
        "another-gone-row-without-id-retired-by-time",
        "own-gone-row-under-the-label",
        "live-row-of-another-fleet-left-alone",
        "revived-beside-a-live-row-of-another-fleet",
    ],
)
def test_adoption_keeps_gone_rows_and_never_takes_a_live_label(
    holder: lifecycle.LabelHolder | None, own_gone: bool, expected: lifecycle.Adoption
) -> None:
    assert lifecycle.adoption("w", "new", holder, own_gone=own_gone) == expected
