"""The Vultr API v2 simulator: a spec-faithful fake, in process or over loopback HTTP."""

from vultrscale.fake_vultr.app import (
    IpAllocator,
    RequestRecord,
    SeededIps,
    SequentialIps,
    SimRequest,
    SimResponse,
    Simulator,
    SimulatorError,
    Timings,
)
from vultrscale.fake_vultr.server import ServerHandle, SimTransport, serving, start_server

__all__ = [
    "IpAllocator",
    "RequestRecord",
    "SeededIps",
    "SequentialIps",
    "ServerHandle",
    "SimRequest",
    "SimResponse",
    "SimTransport",
    "Simulator",
    "SimulatorError",
    "Timings",
    "serving",
    "start_server",
]
