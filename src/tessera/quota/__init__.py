"""Quotas per namespace and pool of card models (the GpuQuota resource): parsing and
usage, pure; the scheduler enforces them (docs/api.md)."""
