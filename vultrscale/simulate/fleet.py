"""INTERIM: the vultrscale policy over the simulated world (replaced by the real pass)."""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from vultrscale import policy
from vultrscale.config import Config
from vultrscale.model import ActionKind, Instance, InstanceState, Observation, PlanPrice, Signals
from vultrscale.simulate.world import World


class Vultrscale:
    def __init__(self, cfg: Config, price: PlanPrice, epoch: datetime, name: str = "vultrscale") -> None:
        self.cfg = cfg
        self.price = price
        self.epoch = epoch
        self.name = name
        self.last_up: datetime | None = None
        self.last_down: datetime | None = None
        self.idle_since: datetime | None = None
        self.draining: dict[str, datetime] = {}
        self._n = 0

    def start(self, world: World) -> None:
        pass

    def quiet_until(self, world: World) -> float:
        return math.inf if not self.cfg.policy.floor and not self.cfg.policy.min_instances else 0.0

    def tick(self, world: World) -> None:
        now = self.epoch + timedelta(seconds=world.now)
        for label in list(self.draining):
            if world.service_active(label) is False:
                world.delete(label)
                del self.draining[label]
        insts = []
        for inst in world.live.values():
            if inst.label in self.draining:
                st = InstanceState.DRAINING
            elif inst.worker_up(world.now):
                st = InstanceState.RUNNING
            elif world.now >= inst.active_at:
                st = InstanceState.BOOTING
            else:
                st = InstanceState.PENDING
            insts.append(
                Instance(
                    label=inst.label,
                    state=st,
                    id=inst.label,
                    created_at=self.epoch + timedelta(seconds=inst.created),
                    live_leases=len(inst.running),
                )
            )
        obs = Observation(
            instances=tuple(insts),
            signals=Signals(ready=world.ready_count, in_flight=world.in_flight),
            price=self.price,
            last_scale_up=self.last_up,
            last_scale_down=self.last_down,
            idle_since=self.idle_since,
        )
        plan = policy.decide(obs, self.cfg, now)
        for a in plan.actions:
            if a.kind is ActionKind.CREATE:
                self._n += 1
                world.create(f"worker-{self._n}")
                self.last_up = now
            elif a.kind is ActionKind.DRAIN and a.label:
                world.stop(a.label)
                self.draining[a.label] = now
                self.last_down = now
        self.idle_since = plan.idle_since
