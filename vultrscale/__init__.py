"""vultrscale: scale Vultr queue-worker fleets from zero to a hard cap and back without losing a job."""

__version__ = "0.1.0"
