"""Main IP addresses for simulated instances: seeded at random, or one after another."""

from __future__ import annotations

import ipaddress
import random
from typing import Protocol

from vultrscale.fake_vultr.wire import SimulatorError


class IpAllocator(Protocol):
    """Hands out main IPs; ``release`` returns one when its instance is deleted."""

    def allocate(self) -> str: ...

    def release(self, ip: str) -> None: ...


class SeededIps:
    """Random, unique hosts of ``network`` drawn from an RNG seeded with ``seed``."""

    def __init__(self, seed: int = 0, network: str = "10.0.0.0/8") -> None:
        self._net = ipaddress.ip_network(network)
        self._rng = random.Random(f"{seed}:ips")
        self._used: set[str] = set()

    def allocate(self) -> str:
        size = self._net.num_addresses
        if len(self._used) >= size - 2:
            raise SimulatorError(f"no free address left in {self._net}")
        while True:
            ip = str(self._net.network_address + self._rng.randrange(1, size - 1))
            if ip not in self._used:
                self._used.add(ip)
                return ip

    def release(self, ip: str) -> None:
        self._used.discard(ip)


class SequentialIps:
    """The lowest free host of ``network`` from ``first`` on (the demo uses 127.0.0.x)."""

    def __init__(self, network: str = "127.0.0.0/24", first: int = 2) -> None:
        self._net = ipaddress.ip_network(network)
        self._first = first
        self._used: set[int] = set()

    def allocate(self) -> str:
        for offset in range(self._first, self._net.num_addresses - 1):
            if offset not in self._used:
                self._used.add(offset)
                return str(self._net.network_address + offset)
        raise SimulatorError(f"no free address left in {self._net}")

    def release(self, ip: str) -> None:
        self._used.discard(int(ipaddress.ip_address(ip)) - int(self._net.network_address))
