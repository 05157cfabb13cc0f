"""vultrscale: scale Vultr queue-worker fleets from zero to a hard cap and back, losing no job."""

__version__ = "0.5.0.dev0"
