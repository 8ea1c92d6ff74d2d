"""The workload mix the fragmentation policy reads (placement/mix.py): learned online,
frozen after 32, 256, 2048, ... observations (docs/placement.md), kinds of the same GPU
shape merged with their CPU and memory averaged, weights summing to one."""

from __future__ import annotations

import dataclasses

import pytest

from tessera.model.types import ComputePolicy, ContainerRequest, GpuRequest, PodRequest
from tessera.placement import WorkloadMix
from tessera.placement.mix import RequestClass


def task(name: str, percent: int = 50, cpu: int = 1000, memory: int = 1024) -> PodRequest:
    gpu = GpuRequest(count=1, memory_percent=percent, cores_percent=percent)
    return PodRequest(
        "ns", name, (ContainerRequest("main", gpu),), cpu_milli=cpu, memory_mib=memory
    )


def test_the_mix_is_frozen_after_32_256_and_2048_observations() -> None:
    mix = WorkloadMix()
    versions = []
    for i in range(1, 2049):
        mix.observe(task(f"t{i}"))
        versions.append(mix.version)
    assert mix.seen == 2048
    bumps = [i + 1 for i in range(1, len(versions)) if versions[i] != versions[i - 1]]
    assert [versions[0], *bumps] == [0, 32, 256, 2048]
    assert mix.weights() and versions[30] == 0 and mix.version == 3


def test_a_mix_built_from_pods_is_frozen_at_once() -> None:
    assert WorkloadMix().weights() == ()
    mix = WorkloadMix([task("a")])
    assert mix.version == 1 and len(mix.weights()) == 1


def test_kinds_of_one_gpu_shape_are_merged_their_cpu_and_memory_averaged() -> None:
    mix = WorkloadMix([
        task("a", 50, cpu=1000, memory=1000), task("b", 50, cpu=3000, memory=3000),
        task("c", 50, cpu=2002, memory=2002), task("d", 20, cpu=500, memory=100),
    ])  # fmt: skip
    weights = dict(mix.weights())
    half = RequestClass.of(task("x", 50))
    assert len(weights) == 2
    merged = next(c for c in weights if c.gpu == half.gpu)
    assert (merged.cpu_milli, merged.memory_mib) == (2000, 2000)  # 6002 // 3, rounded down
    assert weights[merged] == pytest.approx(0.75)
    assert sum(weights.values()) == pytest.approx(1.0)


def test_only_the_most_common_shapes_are_kept() -> None:
    pods = [task(f"c{p}-{i}", p) for p in range(1, 11) for i in range(p)]  # shape p seen p times
    weights = WorkloadMix(pods, max_classes=3).weights()
    assert [c.gpu.memory_percent for c, _ in weights if c.gpu] == [10, 9, 8]
    assert sum(w for _, w in weights) == pytest.approx(1.0)


def test_card_uuids_and_compute_policy_do_not_make_a_class() -> None:
    plain = task("a", 50)
    gpu = plain.containers[0].gpu
    assert gpu is not None
    pinned = dataclasses.replace(
        plain,
        containers=(
            ContainerRequest(
                "main",
                dataclasses.replace(
                    gpu,
                    uuids=frozenset({"GPU-1"}),
                    uuids_exclude=frozenset({"GPU-2"}),
                    policy=ComputePolicy.BURST_SHARE,
                ),
            ),
        ),
    )
    assert RequestClass.of(pinned) == RequestClass.of(plain)
    assert len(WorkloadMix([plain, pinned]).weights()) == 1


def test_equally_common_shapes_are_kept_in_one_order_whatever_came_first() -> None:
    shapes = [task(f"t{p}", p) for p in (10, 20, 30)]  # each seen once
    kept = [
        [c.gpu.memory_percent for c, _ in WorkloadMix(order, max_classes=2).weights() if c.gpu]
        for order in (shapes, shapes[::-1], [shapes[1], shapes[2], shapes[0]])
    ]
    assert kept[0] == kept[1] == kept[2]


def test_by_default_the_64_most_common_shapes_are_kept() -> None:
    pods = [task(f"t{p}", p) for p in range(1, 66)]  # 65 shapes
    assert len(WorkloadMix(pods).weights()) == 64
