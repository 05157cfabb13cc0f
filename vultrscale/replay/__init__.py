"""``vultrscale simulate``: replay a workload through the real pass and compare policies."""
