"""Which placement policy decides for a pod, and the workload mix it learns from.

One ``WorkloadMix`` is shared by every policy of the process (``PolicySet``); each pod is
observed once (the first time the extender sees its UID), in the order the scheduler
offers pods, so a replay of the same sequence through ``tessera.placement.place`` makes
the same decisions. A pod's ``tessera.io/placement`` overrides the default policy.
"""

from __future__ import annotations

from collections import OrderedDict

from tessera.model.types import PodRequest
from tessera.placement.base import Policy
from tessera.placement.policies import PolicySet

__all__ = ["Placer"]


class Placer:
    """Not thread-safe on its own: called with the scheduler state's lock held."""

    def __init__(self, default: str = "binpack", seed: int = 0, remember: int = 100_000) -> None:
        self.policies = PolicySet(default, seed)  # every policy reads its one mix
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._remember = remember

    def policy(self, request: PodRequest) -> Policy:
        return self.policies.for_pod(request)

    def observe(self, uid: str, request: PodRequest) -> None:
        """Count ``request`` in the workload mix the first time its pod is seen; the
        ``remember`` pods seen last are remembered."""
        if uid in self._seen:
            return
        self._seen[uid] = None
        if len(self._seen) > self._remember:
            self._seen.popitem(last=False)
        self.policies.mix.observe(request)
