"""The Vultr API v2 simulator: a spec-faithful fake, in process or over loopback HTTP."""

from vultrscale.fake_vultr.app import Simulator, Timings
from vultrscale.fake_vultr.ips import IpAllocator, SeededIps, SequentialIps
from vultrscale.fake_vultr.server import ServerHandle, SimTransport, serving, start_server
from vultrscale.fake_vultr.wire import RequestRecord, SimRequest, SimResponse, SimulatorError

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
