"""Offerings (docs/offerings.md): the pure rules, and the pass over in-memory ports with the
first offering sold out, the account at its limit, an unclear create, a refusal remembered."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_reconcile_pass import CountingCloud
from vultrscale import config as config_mod
from vultrscale import status
from vultrscale.config import Config, ConfigError, Offering
from vultrscale.core.clock import FakeClock
from vultrscale.core.model import (
    ActionKind,
    Instance,
    InstanceState,
    Observation,
    OfferingMark,
    PlanPrice,
    Signals,
    WorkerView,
)
from vultrscale.errors import EXIT_RUNTIME, EXIT_USAGE, UsageError
from vultrscale.memory import (
    PLAN,
    SNAPSHOT,
    MemoryCloud,
    MemoryDrain,
    MemoryLedger,
    MemorySignals,
    memory_parts,
)
from vultrscale.ports import Parts, PassCache
from vultrscale.reconcile import PassResult, run_pass
from vultrscale.rules import offerings, policy
from vultrscale.vultr.errors import (
    AmbiguousCreate,
    BadRequest,
    InstanceLimit,
    OfferingUnavailable,
    create_refusal,
)
from vultrscale.vultr.models import VPlan

NOW = datetime(2026, 5, 10, 9, 0, tzinfo=UTC)
BIG = VPlan("vc2-2c-4gb", vcpu_count=2, ram=4096, monthly_cost=20.0, hourly_cost=0.03)
FIRST, SECOND = Offering("ewr", PLAN.id), Offering("fra", PLAN.id)

# --- config ----------------------------------------------------------------------------------


def _load(tmp_path: Path, text: str) -> Config:
    path = tmp_path / "vultrscale.toml"
    path.write_text(text)
    return config_mod.load(path, env={})


def test_a_fleet_without_offerings_has_the_one_of_its_region_and_plan(tmp_path: Path) -> None:
    cfg = _load(tmp_path, '[fleet]\nregion = "fra"\nplan = "vc2-2c-4gb"\n')
    assert offerings.of(cfg) == (Offering("fra", "vc2-2c-4gb"),)
    assert cfg.fleet.unavailable_for == timedelta(minutes=3)


def test_offerings_are_read_in_order_with_their_own_jobs_per_instance(tmp_path: Path) -> None:
    cfg = _load(
        tmp_path,
        '[fleet]\nunavailable_for = "5m"\n'
        '[[fleet.offerings]]\nregion = "ewr"\nplan = "vc2-1c-2gb"\n'
        '[[fleet.offerings]]\nregion = "fra"\nplan = "vc2-2c-4gb"\njobs_per_instance = 8\n',
    )
    assert offerings.of(cfg) == (Offering("ewr", "vc2-1c-2gb"), Offering("fra", "vc2-2c-4gb", 8))
    assert offerings.jobs_per_instance(cfg, "fra", "vc2-2c-4gb") == 8
    assert offerings.jobs_per_instance(cfg, "ewr", "vc2-1c-2gb") == cfg.queue.jobs_per_instance
    assert cfg.fleet.unavailable_for == timedelta(minutes=5)


def test_offerings_with_fleet_region_or_plan_is_an_error_that_says_which_to_keep(
    tmp_path: Path,
) -> None:
    with pytest.raises(ConfigError) as caught:
        _load(
            tmp_path,
            '[fleet]\nregion = "ewr"\n[[fleet.offerings]]\nregion = "EWR"\nplan = "vc2"\n'
            'colour = 1\n[[fleet.offerings]]\nregion = "ams"\nplan = "vc2-1c-2gb"\n'
            '[[fleet.offerings]]\nregion = "ams"\nplan = "vc2-1c-2gb"\njobs_per_instance = 0.5\n',
        )
    problems = caught.value.problems
    assert any(
        "given together with fleet.region: keep [[fleet.offerings]] and delete fleet.region" in p
        for p in problems
    )
    assert any(p.startswith("fleet.offerings[0].region: 'EWR' is not") for p in problems)
    assert any(p.startswith("fleet.offerings[0].colour: unknown key") for p in problems)
    assert any(
        "fleet.offerings[2].jobs_per_instance: expected a whole number" in p for p in problems
    )


def test_the_same_offering_twice_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"offerings\[1\]: ams/vc2-1c-2gb is listed twice"):
        _load(tmp_path, '[[fleet.offerings]]\nregion = "ams"\nplan = "vc2-1c-2gb"\n' * 2)


def test_vpcs_with_offerings_in_several_regions_are_an_error(tmp_path: Path) -> None:
    vpc = "cb676a46-66fd-4dfb-b839-443f2e6c0b60"
    with pytest.raises(ConfigError, match="fleet.vpc_ids: a VPC belongs to one region"):
        _load(
            tmp_path,
            f'[fleet]\nvpc_ids = ["{vpc}"]\n'
            '[[fleet.offerings]]\nregion = "ewr"\nplan = "vc2-1c-2gb"\n'
            '[[fleet.offerings]]\nregion = "ord"\nplan = "vc2-1c-2gb"\n',
        )


def test_a_fleet_with_offerings_shows_and_writes_no_region_or_plan_it_does_not_use(
    tmp_path: Path,
) -> None:
    # `config check` showed fleet.region/plan's defaults (ewr, vc2-1c-2gb) beside offerings in
    # ams and fra; and the settings written back (the demo's pass config) were refused.
    from vultrscale import demo

    cfg = _load(
        tmp_path,
        '[[fleet.offerings]]\nregion = "ams"\nplan = "vc2-2c-4gb"\n'
        '[[fleet.offerings]]\nregion = "fra"\nplan = "vc2-1c-2gb"\njobs_per_instance = 2\n',
    )
    fleet = cfg.masked()["fleet"]
    assert "region" not in fleet and "plan" not in fleet and len(fleet["offerings"]) == 2
    back = tmp_path / "back"
    back.mkdir()
    (back / "vultrscale.toml").write_text(demo.config_toml(cfg))
    assert config_mod.load(back / "vultrscale.toml", env={}).fleet == cfg.fleet


# --- pure rules ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "demand, running, new, want",
    [
        (0, [4, 4], 4, 0),
        (9, [], 4, 3),  # ceil(9 / 4): every instance alike
        (8, [4, 4], 4, 2),
        (9, [4, 4], 4, 3),
        (8, [8, 4], 4, 1),  # the big one holds it alone
        (13, [8, 4], 2, 3),  # 12 held, one more slot from a new small one
        (20, [8], 8, 3),
    ],
    ids=["idle", "alike", "exact", "one-more", "big-alone", "mixed", "big-new"],
)
def test_desired_instances_count_each_instance_at_its_offerings_jobs(
    demand: int, running: list[int], new: int, want: int
) -> None:
    assert offerings.desired_instances(demand, running, new) == want


def _cfg(**fleet: Any) -> Config:
    f = dataclasses.replace(Config().fleet, **{"offerings": (FIRST, SECOND), **fleet})
    return dataclasses.replace(Config(), fleet=f)


def _checks(*listed: bool, price: PlanPrice | None = None) -> dict[tuple[str, str], Any]:
    p = price or PlanPrice(PLAN.id, 10.0, 0.015)
    return {
        (o.region, o.plan): offerings.OfferingCheck.of(o.region, o.plan, p, ok)
        for o, ok in zip((FIRST, SECOND), listed, strict=True)
    }


def test_an_offering_its_region_does_not_list_is_skipped_with_why() -> None:
    views = offerings.views(_cfg(), _checks(False, True), (), NOW)
    assert [v.usable for v in views] == [False, True]
    assert views[0].skip == "plan 'vc2-1c-2gb' is not offered in region 'ewr'"


def test_a_remembered_refusal_skips_the_offering_until_it_ends() -> None:
    mark = OfferingMark("ewr", PLAN.id, NOW + timedelta(seconds=100), "sold out", 3)
    (first, second) = offerings.views(_cfg(), _checks(True, True), (mark,), NOW)
    assert not first.usable and second.usable
    assert first.skip == "create refused: sold out" and first.left_s(NOW) == 100
    assert (first.until, first.refusals, first.checked) == (mark.until, 3, True)
    later = offerings.views(_cfg(), _checks(True, True), (mark,), NOW + timedelta(seconds=100))
    assert later[0].usable and later[0].refusals == 3  # expired: used again, still counted


def test_an_offering_dearer_than_the_ceiling_is_skipped() -> None:
    cfg = dataclasses.replace(
        _cfg(), budget=dataclasses.replace(Config().budget, monthly_ceiling_usd=15)
    )
    views = offerings.views(cfg, _checks(True, True, price=PlanPrice(PLAN.id, 20.0)), (), NOW)
    assert not any(v.usable for v in views)
    assert "lower than one instance-month" in views[0].skip


def _running(label: str, offering: Offering, monthly: float, leases: int = 0) -> Instance:
    return Instance(
        label,
        InstanceState.RUNNING,
        id=label,
        created_at=NOW - timedelta(minutes=30),
        live_leases=leases,
        hourly_rate=monthly / 672,
        monthly_cost=monthly,
        plan=offering.plan,
        region=offering.region,
    )


def test_each_choice_is_bounded_by_the_budget_at_the_dearest_price_tried_so_far() -> None:
    obs = Observation(instances=(), signals=Signals(40, 0), price=PlanPrice("a", 10.0))
    cheap = offerings.OfferingView(Offering("ewr", "a"), PlanPrice("a", 10.0))
    dear = offerings.OfferingView(Offering("fra", "b"), PlanPrice("b", 25.0))
    cfg = dataclasses.replace(
        Config(), budget=dataclasses.replace(Config().budget, monthly_ceiling_usd=50.0)
    )
    picks = offerings.choices(cfg, obs, [cheap, dear, cheap], 5, (), 40, 0, NOW)
    # $50 holds 5 at $10, 2 at $25; after the dear one, never more than 2 in all.
    assert [c.upto for c in picks] == [5, 2, 2]


@pytest.mark.parametrize("floor, want", [(0, [4, 2]), (3, [4, 3])], ids=["demand", "floor-holds"])
def test_each_choice_is_bounded_by_what_the_demand_asks_at_its_own_jobs(
    floor: int, want: list[int]
) -> None:
    cfg = _cfg(offerings=(FIRST, Offering("fra", BIG.id, 8)))
    obs = Observation(instances=(), signals=Signals(16, 0), price=PlanPrice(PLAN.id, 10.0))
    views = [offerings.OfferingView(o, PlanPrice(o.plan, 10.0)) for o in offerings.of(cfg)]
    picks = offerings.choices(cfg, obs, views, 4, (), 16, floor, NOW)
    assert [c.upto for c in picks] == want


def test_scale_in_drains_the_least_preferred_offering_first() -> None:
    pol = dataclasses.replace(
        Config().policy, billing_hour_aware=False, idle_before_scale_down=timedelta(0)
    )
    cfg = dataclasses.replace(_cfg(), policy=pol)
    fleet = (
        _running("a-old", FIRST, 10.0),
        _running("b-young", SECOND, 10.0),
        _running("a-young", FIRST, 10.0),
    )
    obs = Observation(
        instances=fleet,
        signals=Signals(0, 0),
        price=PlanPrice(PLAN.id, 10.0),
        idle_since=NOW - timedelta(hours=1),
    )
    plan = policy.decide(
        obs, dataclasses.replace(cfg, policy=dataclasses.replace(pol, min_instances=2)), NOW
    )
    assert [a.label for a in plan.actions if a.kind is ActionKind.DRAIN] == ["b-young"]


@pytest.mark.parametrize(
    "text, kind",
    [
        (
            "Plan is not available in the selected datacenter. This could mean you have chosen "
            "the wrong plan for this datacenter, or the location you have selected does not "
            "have any more capacity.",
            OfferingUnavailable,
        ),
        ("Invalid plan chosen.", OfferingUnavailable),
        ("Out of capacity in this location", OfferingUnavailable),
        (
            "You have reached the maximum number of active virtual machines for this account",
            InstanceLimit,
        ),
        ("Server add failed: instance limit reached", InstanceLimit),
        ("Server add failed: Invalid snapshot ID", BadRequest),
    ],
    ids=["v1-sold-out", "invalid-plan", "capacity", "v1-limit", "limit", "unknown"],
)
def test_a_refused_create_is_classified_by_vultrs_words(text: str, kind: type) -> None:
    assert create_refusal(text) is kind


# --- the pass over in-memory ports -----------------------------------------------------------


class World:
    """A fleet of two offerings (ewr, then fra) on in-memory ports; 4 jobs per instance."""

    def __init__(
        self, tmp_path: Path, second_plan: VPlan = PLAN, second_jobs: int = 0, **policy_: Any
    ) -> None:
        self.clock = FakeClock(NOW)
        self.cloud = MemoryCloud(
            self.clock,
            plans=(PLAN, BIG),
            regions={"ewr": {PLAN.id, BIG.id}, "fra": {PLAN.id, BIG.id}},
        )
        self.ledger = MemoryLedger("workers")
        self.signals = MemorySignals()
        key = tmp_path / "id_ed25519"
        key.write_text("unread\n")
        key.chmod(0o600)
        pol = {"max_instances": 5, "billing_hour_aware": False, "scale_up_cooldown": "0s"}
        pol.update(policy_)
        lines = "".join(f"{k} = {_toml(v)}\n" for k, v in pol.items())
        (tmp_path / "vultrscale.toml").write_text(
            f'[fleet]\nsnapshot_id = "{SNAPSHOT}"\nssh_key = "{key}"\n'
            f'[[fleet.offerings]]\nregion = "ewr"\nplan = "{PLAN.id}"\n'
            f'[[fleet.offerings]]\nregion = "fra"\nplan = "{second_plan.id}"\n'
            + (f"jobs_per_instance = {second_jobs}\n" if second_jobs else "")
            + f"[policy]\n{lines}[budget]\nmonthly_ceiling_usd = 200.0\n"
        )
        env = {"VULTR_API_KEY": "k" * 32, "WORKER_DATABASE_URL": "postgresql://w@nowhere/db"}
        self.cfg = config_mod.load(tmp_path / "vultrscale.toml", env=env)
        self.parts = memory_parts(self.clock, self.cloud, self.ledger, self.signals, MemoryDrain())

    def run(self, parts: Parts | None = None) -> PassResult:
        return run_pass(self.cfg, parts or self.parts)

    def queue(self, ready: int) -> None:
        self.signals.signals = Signals(ready=ready, in_flight=0)

    def regions(self) -> list[str]:
        return sorted(v.region for v in self.cloud.instances.values())


def _toml(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return f'"{v}"' if isinstance(v, str) else str(v)


def cron(world: World) -> tuple[Parts, CountingCloud]:
    """The parts of a new process (cron): an empty in-process cache, a counted cloud."""
    counting = CountingCloud(world.cloud)
    return dataclasses.replace(world.parts, cloud=counting, cache=PassCache()), counting


def test_a_sold_out_first_offering_sends_the_creates_to_the_next_in_the_same_pass(
    tmp_path: Path,
) -> None:
    world = World(tmp_path)
    world.cloud.sell_out("ewr", PLAN.id)  # still listed: only the create says so
    world.queue(12)
    result = world.run()
    assert result.exit_code == 0, result.errors
    assert world.regions() == ["fra", "fra", "fra"]
    assert (world.cloud.refused, world.cloud.posts) == (1, 3)  # one refusal, then the next
    assert result.refusals == [("ewr/vc2-1c-2gb", "unavailable")]
    mark = world.ledger.marks[("ewr", PLAN.id)]
    assert mark.until == NOW + timedelta(minutes=3) and "not available" in mark.reason
    texts = [r["result"] for r in result.results]
    assert any(
        t.startswith("create refused on ewr/vc2-1c-2gb (unavailable: Server add failed: Plan is")
        for t in texts
    )
    assert sum(t.endswith("on fra/vc2-1c-2gb") and t.startswith("created ") for t in texts) == 3
    intents = [r for r in world.ledger.instances.values() if r.region == "ewr"]
    assert [r.state for r in intents] == [InstanceState.GONE]  # the refused intent, settled


def test_a_remembered_refusal_is_skipped_by_the_next_process_until_it_expires(
    tmp_path: Path,
) -> None:
    world = World(tmp_path)
    world.cloud.sell_out("ewr", PLAN.id)
    world.queue(4)
    assert world.run().exit_code == 0 and world.regions() == ["fra"]
    world.cloud.restock("ewr", PLAN.id)
    world.clock.advance(60)
    world.queue(8)
    parts, cloud = cron(world)
    result = world.run(parts)
    assert world.regions() == ["fra", "fra"]  # ewr not asked: remembered for 3 minutes
    assert cloud.calls.count("create_instance") == 1
    skipped = [r for r in result.results if r["label"] == "offering ewr/vc2-1c-2gb"]
    assert skipped and skipped[0]["result"].startswith(
        "skipped: create refused: Server add failed: Plan is not"
    )
    assert skipped[0]["result"].endswith("capacity.; skipped 120s more")
    assert result.decision is not None
    shown = [t.plain for t in status.offering_lines(result.decision.offerings, world.clock.now())]
    assert shown[1].startswith("  1. ewr/vc2-1c-2gb $10.00/month: skipped [unavailable 2m more]")
    assert shown[1].endswith("capacity.; 1 refusal(s) so far")
    assert shown[2] == "  2. fra/vc2-1c-2gb $10.00/month: usable"
    assert result.decision is not None and not result.decision.offerings[0].usable
    world.clock.advance(121)  # the 3 minutes are over
    world.queue(12)
    assert world.run(cron(world)[0]).exit_code == 0
    assert world.regions() == ["ewr", "fra", "fra"]  # the preferred offering again


def test_the_instance_limit_stops_creates_on_every_offering(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.cloud.instance_limit = 1
    world.queue(12)
    result = world.run()
    assert world.regions() == ["ewr"] and world.cloud.refused == 1  # fra never asked
    assert result.exit_code == EXIT_RUNTIME
    assert any("the account is at its instance limit" in e for e in result.errors)
    assert world.ledger.marks == {}  # the limit is the account's, not an offering's
    assert result.refusals == [("ewr/vc2-1c-2gb", "instance_limit")]


def test_an_unclear_create_is_never_retried_on_another_offering(tmp_path: Path) -> None:
    world = World(tmp_path)
    posts: list[str] = []

    def unclear(**kw: Any) -> Any:
        posts.append(kw["region"])
        raise AmbiguousCreate("POST /v2/instances: no answer (timed out)", label=kw["label"])

    world.cloud.create_instance = unclear  # type: ignore[method-assign]
    world.queue(12)
    result = world.run()
    assert posts == ["ewr"]
    assert any("create outcome unknown on ewr/vc2-1c-2gb" in e for e in result.errors)
    assert world.ledger.marks == {}


def test_a_refusal_in_words_not_known_is_reported_and_counts_as_unavailable(
    tmp_path: Path,
) -> None:
    world = World(tmp_path)
    create = world.cloud.create_instance

    def odd(**kw: Any) -> Any:
        if kw["region"] == "ewr":
            raise BadRequest(
                "POST /v2/instances failed: 400 Zone maintenance",
                status=400,
                api_message="Zone maintenance",
            )
        return create(**kw)

    world.cloud.create_instance = odd  # type: ignore[method-assign]
    world.queue(4)
    result = world.run()
    assert world.regions() == ["fra"]
    assert result.exit_code == EXIT_RUNTIME  # said, with Vultr's own words
    assert any(
        e.endswith("create refused on ewr/vc2-1c-2gb: Zone maintenance") for e in result.errors
    )
    assert world.ledger.marks[("ewr", PLAN.id)].reason == "Zone maintenance"
    assert result.refusals == [("ewr/vc2-1c-2gb", "unclassified")]


def test_a_steady_cron_pass_with_an_unlisted_first_offering_makes_one_request(
    tmp_path: Path,
) -> None:
    world = World(tmp_path)
    world.cloud.sell_out("ewr", PLAN.id, unlist=True)  # gone from the availability too
    world.queue(4)
    assert world.run().exit_code == 0 and world.regions() == ["fra"]
    assert world.cloud.refused == 0  # skipped before any POST
    world.clock.advance(30)
    parts, cloud = cron(world)
    result = world.run(parts)
    assert result.exit_code == 0 and result.plan is not None and not result.plan.actions
    assert cloud.calls == ["list_instances"]


def test_no_usable_offering_refuses_the_pass_naming_each_and_why(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.cloud.regions = {"ewr": set(), "fra": set()}
    world.queue(4)
    with pytest.raises(UsageError) as caught:
        world.run()
    assert caught.value.exit_code == EXIT_USAGE
    assert caught.value.message == (
        "no offering of the fleet can be created on: ewr/vc2-1c-2gb: plan 'vc2-1c-2gb' is not "
        "offered in region 'ewr'; fra/vc2-1c-2gb: plan 'vc2-1c-2gb' is not offered in region 'fra'"
    )


def test_every_offering_refused_a_moment_ago_holds_the_creates_and_says_so(
    tmp_path: Path,
) -> None:
    world = World(tmp_path)
    world.cloud.sell_out("ewr", PLAN.id)
    world.cloud.sell_out("fra", PLAN.id)
    world.queue(4)
    first = world.run()
    assert world.cloud.refused == 2 and world.regions() == []
    world.clock.advance(30)
    second = world.run()
    assert world.cloud.refused == 2  # nothing asked again while both are remembered
    assert second.exit_code == EXIT_RUNTIME
    assert any("no offering is usable now" in e for e in second.errors)
    assert first.refusals and not second.refusals


def test_a_fallback_to_a_dearer_plan_creates_no_more_than_the_budget_allows_at_its_price(
    tmp_path: Path,
) -> None:
    world = World(tmp_path, second_plan=BIG, max_instances=10)
    ceiling = dataclasses.replace(world.cfg.budget, monthly_ceiling_usd=50.0)
    world.cfg = dataclasses.replace(world.cfg, budget=ceiling)
    world.cloud.sell_out("ewr", PLAN.id)
    world.queue(40)  # 10 wanted; $50 holds 5 at $10 but 2 at $20
    result = world.run()
    assert result.exit_code == 0, result.errors
    assert [v.plan for v in world.cloud.instances.values()] == [BIG.id, BIG.id]
    rows = [r for r in world.ledger.instances.values() if r.state is not InstanceState.GONE]
    assert {r.monthly_cost for r in rows} == {20.0}  # each billed at its own plan's price


def test_an_instance_adopted_on_another_offering_is_billed_at_its_plan_unasked(
    tmp_path: Path,
) -> None:
    world = World(tmp_path, second_plan=BIG)
    assert world.run().exit_code == 0  # the offerings checked, and kept
    made = world.cloud.create_instance(
        region="fra", plan=BIG.id, label="by-hand", tags=[world.cfg.fleet.tag]
    )
    world.clock.advance(30)
    parts, cloud = cron(world)
    assert world.run(parts).exit_code == 0
    assert cloud.calls == ["list_instances"]  # its plan's price is an offering's: not asked
    row = world.ledger.instances["by-hand"]
    assert (row.instance_id, row.monthly_cost, row.hourly_rate) == (made.id, 20.0, 0.03)


def test_the_end_of_a_remembered_refusal_is_a_moment_the_decision_may_change(
    tmp_path: Path,
) -> None:
    from vultrscale.rules.decision import next_change

    world = World(tmp_path)
    world.cloud.sell_out("ewr", PLAN.id)
    world.queue(4)
    assert world.run().exit_code == 0
    world.clock.advance(150)  # booted; the refusal has 30 s left
    for label in list(world.ledger.instances):
        world.ledger.workers_by_label[label] = WorkerView(label, world.clock.now(), False, 0, True)
    world.run()
    world.clock.advance(1)
    decision = world.run().decision
    assert decision is not None and decision.steady and not decision.errors
    until = NOW + timedelta(minutes=3)
    assert decision.offerings[0].until == until
    assert next_change(world.cfg, decision) == until
    forgotten = dataclasses.replace(
        decision, offerings=tuple(dataclasses.replace(v, until=None) for v in decision.offerings)
    )
    assert next_change(world.cfg, forgotten) > until  # the refusal's end is what brings it


def test_a_fallback_to_a_bigger_plan_creates_the_fewer_instances_it_needs(tmp_path: Path) -> None:
    world = World(tmp_path, second_plan=BIG, second_jobs=8)
    world.cloud.sell_out("ewr", PLAN.id)
    world.queue(16)  # 4 small instances, or 2 big ones
    result = world.run()
    assert result.exit_code == 0, result.errors
    assert [v.plan for v in world.cloud.instances.values()] == [BIG.id, BIG.id]
    world.clock.advance(30)
    result = world.run()
    assert result.plan is not None and result.plan.desired == 2 and not result.plan.actions


def test_an_instance_of_an_offering_with_its_own_jobs_runs_that_many_at_once(
    tmp_path: Path,
) -> None:
    from vultrscale import cloudinit
    from vultrscale.cloudinit import worker_env

    world = World(tmp_path, second_plan=BIG, second_jobs=8)
    rendered: list[tuple[str, int | None]] = []

    def render(label: str, private: str, public: str, concurrency: int | None = None) -> str:
        rendered.append((label, concurrency))
        return "#cloud-config\n"

    world.parts = dataclasses.replace(world.parts, render_user_data=render)
    world.cloud.sell_out("ewr", PLAN.id)
    world.queue(8)
    assert world.run().exit_code == 0
    assert [c for _, c in rendered] == [None, 8]  # ewr refused (the queue's 4), fra's 8
    env = worker_env(world.cfg, "w-1", show_secrets=False, concurrency=8)
    assert 'VULTRSCALE_WORKER_CONCURRENCY="8"\n' in env
    assert 'VULTRSCALE_WORKER_CONCURRENCY="4"\n' in cloudinit.worker_env(
        world.cfg, "w-1", show_secrets=False
    )


def test_a_secret_in_vultrs_refusal_words_is_masked_in_the_mark_and_the_pass_results(
    tmp_path: Path,
) -> None:
    # Vultr's words are stored (offering_marks.reason), shown by status and recorded in the
    # pass's results (fleet_events): an adapter that echoes a secret must not carry it there.
    world = World(tmp_path)
    password = "Hunter2-worker-pw"
    env = {
        "VULTR_API_KEY": "k" * 32,
        "WORKER_DATABASE_URL": f"postgresql://w:{password}@nowhere/db",
    }
    world.cfg = config_mod.load(tmp_path / "vultrscale.toml", env=env)
    create = world.cloud.create_instance

    def echoing(**kw: Any) -> Any:
        if kw["region"] == "ewr":
            words = f"Plan is not available (user_data: postgresql://w:{password}@nowhere/db)"
            raise OfferingUnavailable(
                f"POST /v2/instances failed: 400 {words}", status=400, api_message=words
            )
        return create(**kw)

    world.cloud.create_instance = echoing  # type: ignore[method-assign]
    world.queue(4)
    result = world.run()
    assert world.regions() == ["fra"]
    mark = world.ledger.marks[("ewr", PLAN.id)]
    assert "not available" in mark.reason and password not in mark.reason
    assert not [r for r in result.results if password in str(r)]
    assert not [e for e in result.errors if password in e]
    assert not [r for r in world.ledger.instances.values() if password in (r.last_error or "")]


def test_a_create_forbidden_to_the_api_key_marks_no_offering_and_tries_no_other(
    tmp_path: Path,
) -> None:
    # A 403 (the key's ACL lacks the create) says nothing of the offering: marking each one
    # unavailable in turn would show a stock-out in status and hide the key's problem.
    world = World(tmp_path)
    posts: list[str] = []

    def forbidden(**kw: Any) -> Any:
        posts.append(kw["region"])
        raise BadRequest(
            "POST /v2/instances failed: 403 Unauthorized action",
            status=403,
            api_message="Unauthorized action",
            hint="The API key may lack the permission (ACL) for this action.",
        )

    world.cloud.create_instance = forbidden  # type: ignore[method-assign]
    world.queue(12)
    result = world.run()
    assert posts == ["ewr"]
    assert world.ledger.marks == {}
    assert result.exit_code == EXIT_RUNTIME
    assert any(
        "create refused on ewr/vc2-1c-2gb: POST /v2/instances failed: 403" in e
        for e in result.errors
    )
