"""Which placement policy decides for a pod, and the workload mix it learns from.

One ``WorkloadMix`` is shared by every policy of the process; each pod is observed once
(the first time the extender sees its UID), in the order the scheduler offers pods, so
a replay of the same sequence through ``tessera.placement.place`` makes the same
decisions. A pod's ``tessera.io/placement`` overrides the default policy.
"""

from __future__ import annotations

from collections import OrderedDict

from tessera.model.types import PodRequest
from tessera.placement.base import Policy
from tessera.placement.mix import WorkloadMix
from tessera.placement.policies import make_policy

__all__ = ["Placer"]


class Placer:
    """Not thread-safe on its own: called with the scheduler state's lock held."""

    def __init__(self, default: str = "binpack", seed: int = 0, remember: int = 100_000) -> None:
        self.mix = WorkloadMix()
        self.seed = seed
        self.default = make_policy(default, seed, self.mix).name
        self._policies: dict[str, Policy] = {}
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._remember = remember

    def policy(self, request: PodRequest) -> Policy:
        name = request.placement or self.default
        policy = self._policies.get(name)
        if policy is None:
            policy = self._policies[name] = make_policy(name, self.seed, self.mix)
        return policy

    def observe(self, uid: str, request: PodRequest) -> None:
        """Count ``request`` in the workload mix the first time its pod is seen."""
        if uid in self._seen:
            return
        self._seen[uid] = None
        if len(self._seen) > self._remember:
            self._seen.popitem(last=False)
        self.mix.observe(request)
