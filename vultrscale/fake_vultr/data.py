"""Catalogue data the simulator serves: regions, plans, operating systems.

Figures follow Vultr's public catalogue (Cloud Compute ``vc2`` and High Frequency ``vhf``
plans, 2023-2024 prices). ``hourly_cost`` is ``monthly_cost / 672`` rounded to four places,
which is what Vultr's invoices show as ``unit_price`` (e.g. 0.0595 for the $40 plan).
"""

from __future__ import annotations

from typing import Any

REGIONS: list[dict[str, Any]] = [
    {"id": "ams", "city": "Amsterdam", "country": "NL", "continent": "Europe"},
    {"id": "atl", "city": "Atlanta", "country": "US", "continent": "North America"},
    {"id": "cdg", "city": "Paris", "country": "FR", "continent": "Europe"},
    {"id": "dfw", "city": "Dallas", "country": "US", "continent": "North America"},
    {"id": "ewr", "city": "New Jersey", "country": "US", "continent": "North America"},
    {"id": "fra", "city": "Frankfurt", "country": "DE", "continent": "Europe"},
    {"id": "lax", "city": "Los Angeles", "country": "US", "continent": "North America"},
    {"id": "lhr", "city": "London", "country": "GB", "continent": "Europe"},
    {"id": "mia", "city": "Miami", "country": "US", "continent": "North America"},
    {"id": "nrt", "city": "Tokyo", "country": "JP", "continent": "Asia"},
    {"id": "ord", "city": "Chicago", "country": "US", "continent": "North America"},
    {"id": "sea", "city": "Seattle", "country": "US", "continent": "North America"},
    {"id": "sgp", "city": "Singapore", "country": "SG", "continent": "Asia"},
    {"id": "sjc", "city": "Silicon Valley", "country": "US", "continent": "North America"},
    {"id": "syd", "city": "Sydney", "country": "AU", "continent": "Australia"},
    {"id": "yto", "city": "Toronto", "country": "CA", "continent": "North America"},
]
for _r in REGIONS:
    _r["options"] = ["ddos_protection", "block_storage_storage_opt", "kubernetes", "load_balancers"]

_ALL = [r["id"] for r in REGIONS]
_LARGE = ["ewr", "ord", "ams", "fra", "lax"]  # the biggest plans are not sold everywhere
_HF = [r for r in _ALL if r not in ("syd", "mia")]


def _plan(
    pid: str, vcpu: int, ram: int, disk: int, bandwidth: int, monthly: int, locations: list[str]
) -> dict[str, Any]:
    return {
        "id": pid,
        "vcpu_count": vcpu,
        "ram": ram,
        "disk": disk,
        "disk_count": 1,
        "bandwidth": bandwidth,
        "monthly_cost": monthly,
        "hourly_cost": round(monthly / 672, 4),
        "type": pid.split("-", 1)[0],
        "locations": list(locations),
    }


PLANS: list[dict[str, Any]] = [
    _plan("vc2-1c-1gb", 1, 1024, 25, 1024, 5, _ALL),
    _plan("vc2-1c-2gb", 1, 2048, 55, 2048, 10, _ALL),
    _plan("vc2-2c-2gb", 2, 2048, 65, 3072, 15, _ALL),
    _plan("vc2-2c-4gb", 2, 4096, 80, 3072, 20, _ALL),
    _plan("vc2-4c-8gb", 4, 8192, 160, 4096, 40, _ALL),
    _plan("vc2-6c-16gb", 6, 16384, 320, 5120, 80, _ALL),
    _plan("vc2-8c-32gb", 8, 32768, 640, 6144, 160, _LARGE),
    _plan("vc2-16c-64gb", 16, 65536, 1280, 10240, 320, _LARGE),
    _plan("vc2-24c-96gb", 24, 98304, 1600, 15360, 640, _LARGE[:3]),
    _plan("vhf-1c-1gb", 1, 1024, 32, 1024, 6, _HF),
    _plan("vhf-2c-4gb", 2, 4096, 128, 3072, 24, _HF),
]

#: os_id -> name, as ``GET /os`` reports them. 164 is the id Vultr gives snapshot deploys.
OPERATING_SYSTEMS: dict[int, str] = {
    164: "Snapshot",
    477: "Debian 11 x64 (bullseye)",
    1743: "Ubuntu 22.04 LTS x64",
    2136: "Debian 12 x64 (bookworm)",
    2284: "Ubuntu 24.04 LTS x64",
}
SNAPSHOT_OS_ID = 164

PRODUCT_NAMES = {"vc2": "Vultr Cloud Compute", "vhf": "Vultr High Frequency Compute"}
