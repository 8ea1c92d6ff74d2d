"""The placer: each pod counted once in the workload mix, however often kube-scheduler
offers it, with a bounded memory of whom it has counted; a pod's own policy."""

from __future__ import annotations

import dataclasses

from tessera.placement.base import Policy
from tessera.placement.policies import make_policy
from tessera.scheduler.placer import Placer
from tests.unit.test_scheduler_holds import pod


def test_a_pod_offered_again_is_counted_once() -> None:
    placer = Placer()
    request = pod("p", memory=1000)
    for _ in range(5):  # one filter call each scheduling cycle it stays pending
        placer.observe("uid-p", request)
    placer.observe("uid-q", pod("q", memory=1000))
    assert placer.policies.mix.seen == 2


def test_the_memory_of_counted_pods_is_bounded_and_forgets_the_oldest() -> None:
    placer = Placer(remember=2)
    for uid in ("a", "b"):
        placer.observe(uid, pod(uid, memory=1000))
    assert placer.policies.mix.seen == 2
    placer.observe("a", pod("a", memory=1000))  # within the bound: still remembered
    assert placer.policies.mix.seen == 2
    placer.observe("c", pod("c", memory=1000))  # a third: "a", the oldest, is forgotten
    assert placer.policies.mix.seen == 3
    placer.observe("b", pod("b", memory=1000))  # "b" and "c" are remembered
    placer.observe("c", pod("c", memory=1000))
    assert placer.policies.mix.seen == 3
    placer.observe("a", pod("a", memory=1000))  # counted again: forgotten
    assert placer.policies.mix.seen == 4


def test_a_pods_own_policy_overrides_the_default_and_is_made_once() -> None:
    placer = Placer("binpack")
    plain = pod("p", memory=1000)
    spread = dataclasses.replace(plain, placement="spread")
    assert placer.policy(plain).name == "binpack"
    assert placer.policy(spread).name == "spread"
    assert placer.policy(spread) is placer.policy(spread)


def test_every_policy_learns_from_the_mix_the_placer_observes_into() -> None:
    placer = Placer("binpack")
    own = placer.policy(dataclasses.replace(pod("p", memory=1000), placement="fragmentation"))
    assert own.node.mix is placer.policies.mix  # not a fresh, empty mix of its own
    default = Placer("fragmentation").policy(pod("q", memory=1000))
    assert default.node.mix is not placer.policies.mix


def test_the_placers_seed_drives_the_random_policy() -> None:
    asks = dataclasses.replace(pod("p", memory=1000), placement="random")
    gpu = asks.containers[0].gpu

    def picks(policy: Policy) -> list[int]:
        return policy.card.pick(None, gpu, list(range(16)), 16)  # the view is not read

    assert picks(Placer(seed=7).policy(asks)) == picks(make_policy("random", 7))
    assert picks(Placer(seed=7).policy(asks)) != picks(make_policy("random", 8))
