"""QuotaGate's answers on their own: preemption's holds counted as used, the pods a
preemption would remove, requests too large for any card model, refused quotas."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from tessera.model.types import (
    Assignment,
    Card,
    CardSlice,
    ContainerAssignment,
    ContainerRequest,
    GpuRequest,
    PodRequest,
)
from tessera.quota.usage import Usage, demand_on
from tessera.scheduler.holds import Hold, HoldBook
from tessera.scheduler.quota_gate import QuotaGate


def quota(*limits: dict[str, Any], ns: str = "team-a") -> dict[str, Any]:
    return {
        "apiVersion": "tessera.io/v1alpha1",
        "kind": "GpuQuota",
        "metadata": {"namespace": ns, "name": "gpus", "resourceVersion": "1"},
        "spec": {"limits": list(limits)},
    }


def request(
    name: str, memory: int, ns: str = "team-a", models: frozenset[str] = frozenset()
) -> PodRequest:
    gpu = GpuRequest(count=1, memory_mib=memory, cores_percent=10, models=models)
    return PodRequest(ns, name, (ContainerRequest("main", gpu),))


def on(uuid: str, memory: int) -> Assignment:
    return Assignment("n1", (ContainerAssignment("main", (CardSlice(uuid, memory, 10),)),))


def gate(holds: HoldBook | None = None) -> QuotaGate:
    g = QuotaGate(HoldBook() if holds is None else holds, Counter())
    # Two A100 cards of different sizes (the larger counts) and a T4.
    g.learn_cards([Card("a1", 0, "A100", 40960), Card("a2", 1, "A100", 81920)])
    g.learn_cards([Card("t1", 0, "T4", 16000)])
    g.apply(quota({"name": "a100", "models": ["A100"], "memoryMiB": 100000}))
    return g


def hold(key: str, priority: int, decision: Assignment | None) -> Hold:
    ns, _, name = key.partition("/")
    return Hold(key, "u", priority, "n1", frozenset({"x/victim"}), until=1e12,
                request=request(name, 1, ns), decision=decision)  # fmt: skip


A100 = frozenset({"A100"})


def test_a_model_is_weighed_by_its_largest_card() -> None:
    g = gate()
    whole = PodRequest(
        "team-a", "w", (ContainerRequest("main", GpuRequest(1, exclusive=True, models=A100)),)
    )
    g.apply(quota({"name": "a100", "models": ["A100"], "memoryMiB": 60000}))
    g.learn_cards([Card("a3", 0, "A100", 40960)])  # a smaller card learned later
    # A whole A100 counts as 81,920 MiB (its largest card), over the 60,000 allowed.
    assert "A100" in g.exclusions(whole)
    assert "allows 60000 MiB" in g.never_fits(whole)


def test_what_preemption_holds_for_pods_as_important_counts_as_used() -> None:
    holds = HoldBook()
    g = gate(holds)
    g.count("team-a/p", on("a1", 60000))
    ask = request("new", 30000)
    assert g.exclusions(ask, priority=100) == {}
    holds.put(hold("team-a/urgent", 100, on("a2", 20000)))  # as important: counted
    assert "20000 of it held for a preempting pod" in g.exclusions(ask, priority=100)["A100"]
    assert g.exclusions(ask, priority=101) == {}  # a more important pod is not held back
    assert g.exclusions(ask) == {}  # no priority given: holds are not weighed
    holds.put(hold("team-a/new", 100, on("a2", 20000)))  # the pod's own hold: not counted
    holds.drop("team-a/urgent")
    assert g.exclusions(ask, priority=100) == {}
    holds.put(hold("team-b/other", 100, on("a2", 20000)))  # another namespace's
    assert g.exclusions(ask, priority=100) == {}
    holds.put(hold("team-a/whole-node", 100, None))  # holds a node, no cards: nothing counted
    assert g.exclusions(ask, priority=100) == {}


def test_the_holds_of_a_namespace_add_up() -> None:
    holds = HoldBook()
    g = gate(holds)
    g.count("team-a/p", on("a1", 60000))
    ask = request("new", 30000)
    holds.put(hold("team-a/urgent-1", 100, on("a2", 5000)))
    assert g.exclusions(ask, priority=100) == {}  # 60,000 + 5,000 + 30,000
    holds.put(hold("team-a/urgent-2", 100, on("a2", 8000)))
    assert "13000 of it held for a preempting pod" in g.exclusions(ask, priority=100)["A100"]


def test_fits_without_counts_the_pods_that_would_go() -> None:
    g = gate()
    g.count("team-a/p1", on("a1", 50000))
    g.count("team-a/p2", on("a2", 40000))
    ask = request("new", 30000)
    assert g.fits_without(ask, 0, "A100", []) is False  # 90,000 used of 100,000
    assert g.fits_without(ask, 0, "A100", ["team-a/p2"]) is True
    assert g.fits_without(ask, 0, "A100", ["team-a/unknown"]) is False


def test_fits_without_and_refusal_count_the_holds_for_pods_as_important() -> None:
    holds = HoldBook()
    g = gate(holds)
    g.count("team-a/p1", on("a1", 50000))
    holds.put(hold("team-a/urgent", 100, on("a2", 25000)))
    ask = request("new", 30000)
    # 50,000 used + 25,000 held + 30,000 asked: over the 100,000 allowed.
    assert g.fits_without(ask, 100, "A100", []) is False
    assert g.fits_without(ask, 101, "A100", []) is True  # held for a less important pod
    assert g.fits_without(ask, 100, "A100", ["team-a/p1"]) is True
    assert "25000 of it held for a preempting pod" in g.refusal(ask, on("a1", 30000), 100)
    assert g.refusal(ask, on("a1", 30000)) == ""  # no priority given: holds not weighed


def test_never_fits_skips_the_models_the_pod_refuses() -> None:
    g = gate()
    g.apply(quota({"name": "a100", "models": ["A100"], "memoryMiB": 1000}))
    assert "allows 1000 MiB" in g.never_fits(request("big", 2000, models=A100))
    assert g.never_fits(request("big", 2000)) == ""  # it may take a T4, no quota there
    with_sidecar = request("big", 2000, models=A100)
    with_sidecar = PodRequest("team-a", "big", (ContainerRequest("log"), *with_sidecar.containers))
    assert "allows 1000 MiB" in g.never_fits(with_sidecar)  # a sidecar takes no card
    assert g.never_fits(request("big", 2000, ns="team-b")) == ""  # no quota at all
    assert g.refusal(request("big", 2000, ns="team-b"), on("a1", 2000)) == ""
    assert "1000 MiB" in g.refusal(request("big", 2000), on("a1", 2000))
    # A model it refuses sorted before one it takes (A100 before T4) is skipped, not the end.
    g.apply(quota({"name": "t4", "models": ["T4"], "memoryMiB": 1000}))
    assert "allows 1000 MiB" in g.never_fits(request("big", 2000, models=frozenset({"T4"})))


def test_a_refused_quota_is_counted_and_the_last_good_one_stays(
    caplog: pytest.LogCaptureFixture,
) -> None:
    problems: Counter[str] = Counter()
    g = QuotaGate(HoldBook(), problems)
    g.learn_cards([Card("a1", 0, "A100", 40960)])
    g.apply(quota({"name": "a100", "models": ["A100"], "memoryMiB": 1000}))
    g.apply(quota({"name": "a100", "models": ["A100"], "memoryMiB": -5}))
    assert problems["bad-quota"] == 1
    assert [r.getMessage() for r in caplog.records] == [
        "GpuQuota team-a/gpus refused, its last good version stays: "
        "spec.limits[0].memoryMiB: must be >= 0 (got -5)"
    ]
    assert "allows 1000 MiB" in g.never_fits(request("big", 2000))
    assert g.replace([quota({"name": "bad", "memoryMiB": "lots"})]) == set()
    assert problems["bad-quota"] == 2
    assert caplog.records[-1].getMessage() == (
        "GpuQuota team-a/gpus refused, its last good version stays: "
        'spec.limits[0].models: must list at least one card model (or "*")'
    )


def test_a_usage_of_cores_or_cards_alone_is_a_usage() -> None:
    assert not Usage()
    assert Usage(0, 10, 0) and Usage(0, 0, 1) and Usage(5, 0, 0)


def test_deleting_one_of_two_quotas_keeps_the_other() -> None:
    g = gate()
    second = quota({"name": "t4", "models": ["T4"], "cards": 1})
    second["metadata"]["name"] = "t4s"
    g.apply(second)
    g.apply(quota({"name": "a100", "models": ["A100"], "memoryMiB": 100000}), deleted=True)
    whole_t4 = PodRequest("team-a", "w", (ContainerRequest("main", GpuRequest(2, exclusive=True)),))
    assert "T4" in g.exclusions(whole_t4)  # two whole T4s against one allowed
    g.apply(second, deleted=True)
    g.apply(second, deleted=True)  # deleted twice (a re-list after the watch): no error
    assert g.exclusions(whole_t4) == {}


def test_init_containers_count_their_largest_cores_and_cards() -> None:
    def init(name: str, gpu: GpuRequest) -> ContainerRequest:
        return ContainerRequest(name, gpu, True)

    pod = PodRequest("team-a", "p", (
        init("a", GpuRequest(1, memory_mib=1000, cores_percent=60)),
        init("b", GpuRequest(1, memory_mib=2000, cores_percent=20)),
        init("c", GpuRequest(2, exclusive=True)),
        init("d", GpuRequest(1, exclusive=True)),
        ContainerRequest("main", GpuRequest(1, memory_mib=500, cores_percent=10)),
    ))  # fmt: skip
    assert demand_on(pod, 16000) == Usage(32000, 200, 2)
    pod = PodRequest("team-a", "p", pod.containers[:2] + pod.containers[4:])
    assert demand_on(pod, 16000) == Usage(2000, 60, 0)
