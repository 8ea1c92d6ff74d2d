from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.errors import SpecError
from tessera.model import (
    ComputePolicy,
    ContainerRequest,
    GpuRequest,
    PodRequest,
    ResourceNames,
    podspec,
)
from tessera.model.names import PLACEMENT_POLICIES
from tessera.model.podspec import Compat, gpu_resource_names, parse_pod

FIXED = ComputePolicy.FIXED_SHARE
BURST = ComputePolicy.BURST_SHARE
BEST = ComputePolicy.BEST_EFFORT
HAMI = Compat(hami=True)
GM = Compat(gpu_manager=True)
BOTH = Compat.all()
UUID_A = "GPU-6f1f3c1e-7a52-4d0e-9a35-2b0c1c7e5a11"
UUID_B = "GPU-0a1b2c3d-0000-1111-2222-333344445555"
MIG = "MIG-4f0e2a1c-9b8d-5e6f-a1b2-c3d4e5f60718"


def ctr(
    name: str = "main",
    limits: dict[str, Any] | None = None,
    requests: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    return {"name": name, "image": "x", "resources": resources, **extra}


def pod(
    *containers: dict[str, Any],
    init: tuple[dict[str, Any], ...] = (),
    annotations: dict[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {"containers": list(containers), **spec}
    if init:
        body["initContainers"] = list(init)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "namespace": "ns",
            "name": "p",
            "uid": "u-1",
            "annotations": annotations or {},
        },
        "spec": body,
    }


def want(
    *containers: ContainerRequest, cpu: int = 0, mem: int = 0, placement: str | None = None
) -> PodRequest:
    return PodRequest("ns", "p", containers, cpu, mem, placement, "u-1")


def gpu(name: str = "main", init: bool = False, **kw: Any) -> ContainerRequest:
    return ContainerRequest(name, GpuRequest(**kw), init)


def plain(name: str, init: bool = False) -> ContainerRequest:
    return ContainerRequest(name, None, init)


G = "tessera.io/gpu"
MEM = "tessera.io/gpu-memory"
PCT = "tessera.io/gpu-memory-percent"
CORES = "tessera.io/gpu-cores"
L0 = "spec.containers[0].resources.limits"
R0 = "spec.containers[0].resources.requests"
ANN = "metadata.annotations"

GOOD: list[tuple[str, dict[str, Any], Compat, PodRequest]] = [
    (
        "gpu alone is whole exclusive cards",
        pod(ctr(limits={G: "2"})),
        Compat.off(),
        want(gpu(count=2, exclusive=True)),
    ),
    (
        "memory alone: one card, no cores reserved, best-effort",
        pod(ctr(limits={MEM: "8192"})),
        Compat.off(),
        want(gpu(count=1, memory_mib=8192, policy=BEST)),
    ),
    (
        "cores alone: memory percent follows cores, fixed-share",
        pod(ctr(limits={CORES: "30"})),
        Compat.off(),
        want(gpu(count=1, memory_percent=30, cores_percent=30, policy=FIXED)),
    ),
    (
        "slice over several cards, requests equal to limits, canonical 1k form",
        pod(ctr(limits={G: "2", MEM: "1k", CORES: "50"}, requests={G: "2", MEM: "1000"})),
        Compat.off(),
        want(gpu(count=2, memory_mib=1000, cores_percent=50, policy=FIXED)),
    ),
    (
        "memory percent with cores, burst-share by annotation",
        pod(
            ctr(limits={PCT: "25", CORES: "20"}),
            annotations={"tessera.io/compute-policy": " burst-share "},
        ),
        Compat.off(),
        want(gpu(count=1, memory_percent=25, cores_percent=20, policy=BURST)),
    ),
    (
        "best-effort annotation with cores keeps the reservation",
        pod(
            ctr(limits={MEM: "100", CORES: "10"}),
            annotations={"tessera.io/compute-policy": "best-effort"},
        ),
        Compat.off(),
        want(gpu(count=1, memory_mib=100, cores_percent=10, policy=BEST)),
    ),
    (
        "policy annotation does not touch whole-card containers",
        pod(ctr(limits={G: 1}), annotations={"tessera.io/compute-policy": "burst-share"}),
        Compat.off(),
        want(gpu(count=1, exclusive=True)),
    ),
    (
        "constraints and placement annotations apply to every GPU container",
        pod(
            ctr("a", limits={MEM: "512"}),
            ctr("b", limits={G: "1"}),
            annotations={
                "tessera.io/gpu-model": "A100, H100",
                "tessera.io/gpu-model-exclude": "T4",
                "tessera.io/gpu-uuid": f"{UUID_A},{MIG}",
                "tessera.io/gpu-uuid-exclude": UUID_B,
                "tessera.io/placement": "spread/binpack",
            },
        ),
        Compat.off(),
        want(
            gpu(
                "a",
                count=1,
                memory_mib=512,
                policy=BEST,
                models=frozenset({"A100", "H100"}),
                models_exclude=frozenset({"T4"}),
                uuids=frozenset({UUID_A, MIG}),
                uuids_exclude=frozenset({UUID_B}),
            ),
            gpu(
                "b",
                count=1,
                exclusive=True,
                models=frozenset({"A100", "H100"}),
                models_exclude=frozenset({"T4"}),
                uuids=frozenset({UUID_A, MIG}),
                uuids_exclude=frozenset({UUID_B}),
            ),
            placement="spread/binpack",
        ),
    ),
    (
        "cpu and memory: sum of app containers beats the init container",
        pod(
            ctr("a", limits={G: "1"}, requests={"cpu": "500m", "memory": "1Gi"}),
            ctr("b", requests={"cpu": "1.5", "memory": "512Mi"}),
            init=(ctr("setup", requests={"cpu": "1", "memory": "1G"}),),
        ),
        Compat.off(),
        want(
            plain("setup", init=True),
            gpu("a", count=1, exclusive=True),
            plain("b"),
            cpu=2000,
            mem=1536,
        ),
    ),
    (
        "cpu and memory: a large init container wins; limits alone are the request",
        pod(
            ctr("a", limits={G: "1", "cpu": "1"}),
            init=(
                ctr("fetch", limits={MEM: "2048", "cpu": "4", "memory": "8Gi"}),
                ctr("warm", requests={"cpu": "2"}),
            ),
        ),
        Compat.off(),
        want(
            gpu("fetch", init=True, count=1, memory_mib=2048, policy=BEST),
            plain("warm", init=True),
            gpu("a", count=1, exclusive=True),
            cpu=4000,
            mem=8192,
        ),
    ),
    (
        "sidecar init containers count with the app containers and are not init",
        pod(
            ctr("app", limits={CORES: "40"}, requests={"cpu": "1", "memory": "1Gi"}),
            init=(
                ctr("proxy", requests={"cpu": "500m", "memory": "256Mi"}, restartPolicy="Always"),
                ctr("migrate", requests={"cpu": "1", "memory": "2Gi"}),
            ),
        ),
        Compat.off(),
        want(
            plain("proxy"),
            plain("migrate", init=True),
            gpu("app", count=1, memory_percent=40, cores_percent=40, policy=FIXED),
            cpu=1500,  # max(1 + 0.5, 1 + 0.5 for migrate beside proxy)
            mem=2304,  # migrate 2048 runs beside proxy 256
        ),
    ),
    (
        "an init container after a GPU sidecar runs beside it: counted as an app container",
        pod(
            ctr("app", limits={MEM: "1000"}),
            init=(
                ctr("warm", limits={MEM: "3000"}),  # before the sidecar: alone
                ctr("proxy", limits={MEM: "2000"}, restartPolicy="Always"),
                ctr("load", limits={MEM: "8000"}),  # beside proxy
            ),
        ),
        Compat.off(),
        want(
            gpu("warm", init=True, count=1, memory_mib=3000, policy=BEST),
            gpu("proxy", count=1, memory_mib=2000, policy=BEST),
            gpu("load", count=1, memory_mib=8000, policy=BEST),
            gpu("app", count=1, memory_mib=1000, policy=BEST),
        ),
    ),
    (
        "a sidecar without a GPU changes nothing for the init containers after it",
        pod(
            ctr("app", limits={MEM: "1000"}),
            init=(
                ctr("proxy", requests={"cpu": "1"}, restartPolicy="Always"),
                ctr("load", limits={MEM: "8000"}),
            ),
        ),
        Compat.off(),
        want(
            plain("proxy"),
            gpu("load", init=True, count=1, memory_mib=8000, policy=BEST),
            gpu("app", count=1, memory_mib=1000, policy=BEST),
            cpu=1000,
        ),
    ),
    (
        "pod overhead is added",
        pod(
            ctr(limits={G: "1"}, requests={"cpu": "1", "memory": "1Gi"}),
            overhead={"cpu": "250m", "memory": "64Mi"},
        ),
        Compat.off(),
        want(gpu(count=1, exclusive=True), cpu=1250, mem=1088),
    ),
    (
        "HAMi: nvidia.com/gpu alone is whole cards",
        pod(ctr(limits={"nvidia.com/gpu": "2"})),
        HAMI,
        want(gpu(count=2, exclusive=True)),
    ),
    (
        "HAMi: gpumem and gpucores over two cards, model and uuid annotations",
        pod(
            ctr(
                limits={
                    "nvidia.com/gpu": "2",
                    "nvidia.com/gpumem": "3k",
                    "nvidia.com/gpucores": "30",
                }
            ),
            annotations={
                "nvidia.com/use-gputype": "A100",
                "nvidia.com/nouse-gputype": "T4,V100",
                "nvidia.com/nouse-gpuuuid": UUID_B,
            },
        ),
        HAMI,
        want(
            gpu(
                count=2,
                memory_mib=3000,
                cores_percent=30,
                policy=FIXED,
                models=frozenset({"A100"}),
                models_exclude=frozenset({"T4", "V100"}),
                uuids_exclude=frozenset({UUID_B}),
            )
        ),
    ),
    (
        "HAMi: gpucores alone keeps HAMi's default of all memory",
        pod(ctr(limits={"nvidia.com/gpucores": "20"})),
        HAMI,
        want(gpu(count=1, memory_percent=100, cores_percent=20, policy=FIXED)),
    ),
    (
        "HAMi: gpumem-percentage alone, count defaults to 1, best-effort",
        pod(ctr(limits={"nvidia.com/gpumem-percentage": "50"})),
        HAMI,
        want(gpu(count=1, memory_percent=50, policy=BEST)),
    ),
    (
        "GPU-manager: a share of one card, memory in 256 MiB units, burst without a limit",
        pod(
            ctr(
                limits={"tencent.com/vcuda-core": "30", "tencent.com/vcuda-memory": "30"},
                requests={"tencent.com/vcuda-core": "30", "tencent.com/vcuda-memory": "30"},
            )
        ),
        GM,
        want(gpu(count=1, memory_mib=7680, cores_percent=30, policy=BURST)),
    ),
    (
        "GPU-manager: vcuda-core-limit equal to the share is fixed-share",
        pod(
            ctr(limits={"tencent.com/vcuda-core": "50", "tencent.com/vcuda-memory": "4"}),
            annotations={"tencent.com/vcuda-core-limit": "50"},
        ),
        GM,
        want(gpu(count=1, memory_mib=1024, cores_percent=50, policy=FIXED)),
    ),
    (
        "GPU-manager: 200 is two whole cards (memory units ignored)",
        pod(ctr(limits={"tencent.com/vcuda-core": "200", "tencent.com/vcuda-memory": "60"})),
        GM,
        want(gpu(count=2, exclusive=True)),
    ),
    (
        "GPU-manager: share without memory gets the same percent of memory",
        pod(ctr(limits={"tencent.com/vcuda-core": "25"})),
        GM,
        want(gpu(count=1, memory_percent=25, cores_percent=25, policy=BURST)),
    ),
    (
        "Tessera and HAMi in different containers of one pod",
        pod(ctr("a", limits={G: "1"}), ctr("b", limits={"nvidia.com/gpumem": "100"})),
        HAMI,
        want(gpu("a", count=1, exclusive=True), gpu("b", count=1, memory_mib=100, policy=BEST)),
    ),
    (
        "compat off: foreign names are ignored beside ours",
        pod(ctr("a", limits={G: "1"}), ctr("b", limits={"nvidia.com/gpu": "1"})),
        Compat.off(),
        want(gpu("a", count=1, exclusive=True), plain("b")),
    ),
    (
        "YAML-loaded ints are accepted",
        pod(ctr(limits={G: 1, MEM: 2048}, requests={"cpu": 2, "memory": 1073741824})),
        Compat.off(),
        want(gpu(count=1, memory_mib=2048, policy=BEST), cpu=2000, mem=1024),
    ),
    (
        "cores at 100, the top of the range: the card's whole compute",
        pod(ctr(limits={MEM: "8192", CORES: "100"})),
        Compat.off(),
        want(gpu(count=1, memory_mib=8192, cores_percent=100, policy=FIXED)),
    ),
    (
        "memory percent at 100, the top of the range",
        pod(ctr(limits={PCT: "100", CORES: "20"})),
        Compat.off(),
        want(gpu(count=1, memory_percent=100, cores_percent=20, policy=FIXED)),
    ),
    (
        "GPU-manager: vcuda-core-limit 100, the top of the range, lets the share burst",
        pod(
            ctr(limits={"tencent.com/vcuda-core": "50", "tencent.com/vcuda-memory": "4"}),
            annotations={"tencent.com/vcuda-core-limit": "100"},
        ),
        GM,
        want(gpu(count=1, memory_mib=1024, cores_percent=50, policy=BURST)),
    ),
    (
        "GPU-manager: vcuda-core-limit 1, the bottom of the range",
        pod(
            ctr(limits={"tencent.com/vcuda-core": "1", "tencent.com/vcuda-memory": "4"}),
            annotations={"tencent.com/vcuda-core-limit": "1"},
        ),
        GM,
        want(gpu(count=1, memory_mib=1024, cores_percent=1, policy=FIXED)),
    ),
    (
        "GPU-manager: vcuda-core 100 is one whole card",
        pod(ctr(limits={"tencent.com/vcuda-core": "100"})),
        GM,
        want(gpu(count=1, exclusive=True)),
    ),
    (
        "HAMi names in two containers of one pod",
        pod(
            ctr("a", limits={"nvidia.com/gpu": "1"}), ctr("b", limits={"nvidia.com/gpumem": "1000"})
        ),
        HAMI,
        want(gpu("a", count=1, exclusive=True), gpu("b", count=1, memory_mib=1000, policy=BEST)),
    ),
    (
        "a sidecar's CPU and memory add to the app containers'",
        pod(
            ctr("main", limits={G: "1"}, requests={"cpu": "1"}),
            init=(
                ctr("side", requests={"cpu": "500m", "memory": "256Mi"}, restartPolicy="Always"),
            ),
        ),
        Compat.off(),
        want(plain("side"), gpu(count=1, exclusive=True), cpu=1500, mem=256),
    ),
    (
        "a container with no resources at all asks for no GPU",
        pod({"name": "side", "image": "x"}, ctr(limits={G: "1"})),
        Compat.off(),
        want(plain("side"), gpu(count=1, exclusive=True)),
    ),
    (
        "every sidecar adds to the app containers'",
        pod(
            ctr("main", limits={G: "1"}, requests={"cpu": "1"}),
            init=(
                ctr("log", requests={"cpu": "500m"}, restartPolicy="Always"),
                ctr("mesh", requests={"cpu": "250m"}, restartPolicy="Always"),
            ),
        ),
        Compat.off(),
        want(plain("log"), plain("mesh"), gpu(count=1, exclusive=True), cpu=1750),
    ),
    (
        "an init container after two sidecars runs beside both",
        pod(
            ctr("main", limits={G: "1"}, requests={"cpu": "100m"}),
            init=(
                ctr("log", requests={"cpu": "500m"}, restartPolicy="Always"),
                ctr("mesh", requests={"cpu": "250m"}, restartPolicy="Always"),
                ctr("migrate", requests={"cpu": "2"}),
            ),
        ),
        Compat.off(),
        want(
            plain("log"),
            plain("mesh"),
            plain("migrate", init=True),
            gpu(count=1, exclusive=True),
            cpu=2750,
        ),
    ),
    (
        "HAMi's annotations are not read without its compatibility",
        pod(
            ctr(limits={G: "1"}),
            annotations={
                "nvidia.com/use-gputype": "A100",
                "nvidia.com/nouse-gputype": "T4",
                "nvidia.com/use-gpuuuid": UUID_A,
                "nvidia.com/nouse-gpuuuid": UUID_B,
            },
        ),
        Compat.off(),
        want(gpu(count=1, exclusive=True)),
    ),
]


@pytest.mark.parametrize(("case", "spec", "compat", "expected"), GOOD, ids=[g[0] for g in GOOD])
def test_good(case: str, spec: dict[str, Any], compat: Compat, expected: PodRequest) -> None:
    assert parse_pod(spec, compat=compat) == expected


BAD: list[tuple[str, Any, Compat, str, str]] = [
    ("pod not an object", [], Compat.off(), "pod", "must be an object"),
    (
        "spec not an object",
        {"metadata": {}, "spec": "x"},
        Compat.off(),
        "spec",
        "must be an object",
    ),
    ("spec missing", {"metadata": {}}, Compat.off(), "spec", "must be an object"),
    (
        "containers not a list",
        {"spec": {"containers": {"name": "a"}}},
        Compat.off(),
        "spec.containers",
        "must be a list of containers",
    ),
    (
        "init containers not a list",
        {"spec": {"containers": [], "initContainers": "x"}},
        Compat.off(),
        "spec.initContainers",
        "must be a list of containers",
    ),
    ("container not an object", pod("a"), Compat.off(), "spec.containers[0]", "must be an object"),
    (
        "container without a name",
        pod(ctr(limits={G: "1"}), {"resources": {}}),
        Compat.off(),
        "spec.containers[1].name",
        "is required: a non-empty string",
    ),
    (
        "duplicate container name",
        pod(ctr("a"), init=(ctr("a"),)),
        Compat.off(),
        "spec.containers[0].name",
        "must be unique in the pod (spec.initContainers[0])",
    ),
    (
        "limits not an object",
        pod({"name": "a", "resources": {"limits": ["x"]}}),
        Compat.off(),
        "spec.containers[0].resources.limits",
        "must be an object",
    ),
    (
        "resource name not a string",
        pod({"name": "a", "resources": {"limits": {1: "1"}}}),
        Compat.off(),
        "spec.containers[0].resources.limits",
        "must map resource names (strings) to quantities",
    ),
    (
        "zero cards",
        pod(ctr(limits={G: "0"})),
        Compat.off(),
        f"{L0}[{G}]",
        "must be greater than 0 (leave the resource out instead)",
    ),
    (
        "negative memory",
        pod(ctr(limits={MEM: "-5"})),
        Compat.off(),
        f"{L0}[{MEM}]",
        "must be greater than 0 (leave the resource out instead)",
    ),
    (
        "fractional extended resource",
        pod(ctr(limits={G: "1.5"})),
        Compat.off(),
        f"{L0}[{G}]",
        "must be a whole number (extended resources are)",
    ),
    (
        "milli extended resource",
        pod(ctr(limits={CORES: "500m"})),
        Compat.off(),
        f"{L0}[{CORES}]",
        "must be a whole number (extended resources are)",
    ),
    (
        "malformed extended quantity",
        pod(ctr(limits={G: "one"})),
        Compat.off(),
        f"{L0}[{G}]",
        "must be a Kubernetes quantity such as 500m, 2, 1.5, 512Mi, 1G or 1e3",
    ),
    (
        "cores over 100",
        pod(ctr(limits={CORES: "150"})),
        Compat.off(),
        f"{L0}[{CORES}]",
        "must be an integer between 1 and 100",
    ),
    (
        "memory percent over 100",
        pod(ctr(limits={PCT: "101"})),
        Compat.off(),
        f"{L0}[{PCT}]",
        "must be an integer between 1 and 100",
    ),
    (
        "both MiB and percent",
        pod(ctr(limits={MEM: "100", PCT: "10"})),
        Compat.off(),
        f"{L0}[{PCT}]",
        f"cannot be combined with {MEM}: give MiB or percent",
    ),
    (
        "memory with a binary suffix",
        pod(ctr(limits={MEM: "8Gi"})),
        Compat.off(),
        f"{L0}[{MEM}]",
        "counts MiB: write a plain number (e.g. 8192), not Ki/Mi/Gi",
    ),
    (
        "requests differ from limits",
        pod(ctr(limits={G: "2"}, requests={G: "1"})),
        Compat.off(),
        f"{R0}[{G}]",
        "must equal limits[tessera.io/gpu] (2): extended resources are not overcommitted",
    ),
    (
        "requests without limits",
        pod(ctr(requests={CORES: "10"})),
        Compat.off(),
        f"{R0}[{CORES}]",
        "must also be set in limits: Kubernetes requires limits for extended resources",
    ),
    (
        "unknown Tessera resource (typo)",
        pod(ctr(limits={"tessera.io/gpus": "1"})),
        Compat.off(),
        f"{L0}[tessera.io/gpus]",
        (
            "is not a Tessera resource (tessera.io/gpu, tessera.io/gpu-memory, tessera.io/gpu-"
            "memory-percent, tessera.io/gpu-cores)"
        ),
    ),
    (
        "malformed cpu quantity",
        pod(ctr(limits={G: "1"}, requests={"cpu": "lots"})),
        Compat.off(),
        f"{R0}[cpu]",
        "must be a Kubernetes quantity such as 500m, 2, 1.5, 512Mi, 1G or 1e3",
    ),
    (
        "negative memory request",
        pod(ctr(limits={G: "1", "memory": "-1Gi"})),
        Compat.off(),
        f"{L0}[memory]",
        "must not be negative",
    ),
    (
        "init container errors carry their own path",
        pod(ctr("a"), init=(ctr("i", limits={CORES: "0"}),)),
        Compat.off(),
        f"spec.initContainers[0].resources.limits[{CORES}]",
        "must be greater than 0 (leave the resource out instead)",
    ),
    (
        "errors name the right container",
        pod(ctr("a", limits={G: "1"}), ctr("b", limits={CORES: "101"})),
        Compat.off(),
        f"spec.containers[1].resources.limits[{CORES}]",
        "must be an integer between 1 and 100",
    ),
    (
        "unknown compute policy",
        pod(ctr(limits={CORES: "10"}), annotations={"tessera.io/compute-policy": "greedy"}),
        Compat.off(),
        f"{ANN}[tessera.io/compute-policy]",
        "must be one of fixed-share, burst-share, best-effort",
    ),
    (
        "fixed-share without cores",
        pod(ctr(limits={MEM: "100"}), annotations={"tessera.io/compute-policy": "fixed-share"}),
        Compat.off(),
        f"{ANN}[tessera.io/compute-policy]",
        f"fixed-share needs a compute share: set {CORES} on container 'main'",
    ),
    (
        "burst-share without cores",
        pod(ctr(limits={PCT: "10"}), annotations={"tessera.io/compute-policy": "burst-share"}),
        Compat.off(),
        f"{ANN}[tessera.io/compute-policy]",
        "burst-share needs a compute share: set tessera.io/gpu-cores on container 'main'",
    ),
    (
        "HAMi: burst-share without gpucores names HAMi's resource",
        pod(
            ctr(limits={"nvidia.com/gpumem": "1000"}),
            annotations={"tessera.io/compute-policy": "burst-share"},
        ),
        HAMI,
        f"{ANN}[tessera.io/compute-policy]",
        "burst-share needs a compute share: set nvidia.com/gpucores on container 'main'",
    ),
    (
        "an unknown Tessera resource in requests alone",
        pod(ctr(limits={G: "1"}, requests={G: "1", "tessera.io/gpu-mem": "1"})),
        Compat.off(),
        f"{R0}[tessera.io/gpu-mem]",
        "is not a Tessera resource (tessera.io/gpu, tessera.io/gpu-memory, "
        "tessera.io/gpu-memory-percent, tessera.io/gpu-cores)",
    ),
    (
        "requests not an object",
        pod(ctr(limits={G: "1"}, requests=["a"])),
        Compat.off(),
        "spec.containers[0].resources.requests",
        "must be an object",
    ),
    (
        "a request that is no quantity",
        pod(ctr(limits={G: "1"}, requests={G: "one"})),
        Compat.off(),
        f"{R0}[{G}]",
        "must be a Kubernetes quantity such as 500m, 2, 1.5, 512Mi, 1G or 1e3",
    ),
    (
        "a list where a quantity goes",
        pod(ctr(limits={G: ["1"]})),
        Compat.off(),
        f"{L0}[{G}]",
        "must be a Kubernetes quantity such as 500m, 2, 1.5, 512Mi, 1G or 1e3",
    ),
    (
        "HAMi: gpumem with a binary suffix",
        pod(ctr(limits={"nvidia.com/gpumem": "1Gi"})),
        HAMI,
        f"{L0}[nvidia.com/gpumem]",
        "counts MiB: write a plain number (e.g. 8192), not Ki/Mi/Gi",
    ),
    (
        "metadata not an object",
        {**pod(ctr(limits={G: "1"})), "metadata": []},
        Compat.off(),
        "metadata",
        "must be an object",
    ),
    (
        "annotations not an object",
        pod(ctr(limits={G: "1"}), annotations=["a"]),
        Compat.off(),
        ANN,
        "must be an object",
    ),
    (
        "overhead not an object",
        pod(ctr(limits={G: "1"}), overhead="1"),
        Compat.off(),
        "spec.overhead",
        "must be an object",
    ),
    (
        "malformed cpu overhead",
        pod(ctr(limits={G: "1"}), overhead={"cpu": "x"}),
        Compat.off(),
        "spec.overhead[cpu]",
        "must be a Kubernetes quantity such as 500m, 2, 1.5, 512Mi, 1G or 1e3",
    ),
    (
        "malformed memory overhead",
        pod(ctr(limits={G: "1"}), overhead={"memory": "x"}),
        Compat.off(),
        "spec.overhead[memory]",
        "must be a Kubernetes quantity such as 500m, 2, 1.5, 512Mi, 1G or 1e3",
    ),
    (
        "unknown placement policy",
        pod(ctr(limits={G: "1"}), annotations={"tessera.io/placement": "tetris"}),
        Compat.off(),
        f"{ANN}[tessera.io/placement]",
        (
            "must be one of binpack, spread, topology, fragmentation, random, best-fit, or "
            "NODE/CARD with two of them (e.g. spread/binpack)"
        ),
    ),
    (
        "placement with three levels",
        pod(ctr(limits={G: "1"}), annotations={"tessera.io/placement": "spread/binpack/random"}),
        Compat.off(),
        f"{ANN}[tessera.io/placement]",
        (
            "must be one of binpack, spread, topology, fragmentation, random, best-fit, or "
            "NODE/CARD with two of them (e.g. spread/binpack)"
        ),
    ),
    (
        "placement with an empty card level",
        pod(ctr(limits={G: "1"}), annotations={"tessera.io/placement": "spread/"}),
        Compat.off(),
        f"{ANN}[tessera.io/placement]",
        (
            "must be one of binpack, spread, topology, fragmentation, random, best-fit, or "
            "NODE/CARD with two of them (e.g. spread/binpack)"
        ),
    ),
    (
        "empty item in a model list",
        pod(ctr(limits={G: "1"}), annotations={"tessera.io/gpu-model": "A100,,H100"}),
        Compat.off(),
        f"{ANN}[tessera.io/gpu-model]",
        "must be a comma-separated list without empty items",
    ),
    (
        "empty model list",
        pod(ctr(limits={G: "1"}), annotations={"tessera.io/gpu-model-exclude": " "}),
        Compat.off(),
        f"{ANN}[tessera.io/gpu-model-exclude]",
        "must be a comma-separated list without empty items",
    ),
    (
        "duplicate model",
        pod(ctr(limits={G: "1"}), annotations={"tessera.io/gpu-model": "A100, A100"}),
        Compat.off(),
        f"{ANN}[tessera.io/gpu-model]",
        "must not repeat an item ('A100' appears twice)",
    ),
    (
        "model both allowed and refused",
        pod(
            ctr(limits={G: "1"}),
            annotations={"tessera.io/gpu-model": "A100,T4", "tessera.io/gpu-model-exclude": "T4"},
        ),
        Compat.off(),
        f"{ANN}[tessera.io/gpu-model-exclude]",
        "must not refuse 'T4', which tessera.io/gpu-model allows",
    ),
    (
        "uuid both allowed and refused",
        pod(
            ctr(limits={G: "1"}),
            annotations={"tessera.io/gpu-uuid": UUID_A, "tessera.io/gpu-uuid-exclude": UUID_A},
        ),
        Compat.off(),
        f"{ANN}[tessera.io/gpu-uuid-exclude]",
        (
            "must not refuse 'GPU-6f1f3c1e-7a52-4d0e-9a35-2b0c1c7e5a11', which tessera.io/gpu-"
            "uuid allows"
        ),
    ),
    (
        "malformed uuid",
        pod(ctr(limits={G: "1"}), annotations={"tessera.io/gpu-uuid": "card-0"}),
        Compat.off(),
        f"{ANN}[tessera.io/gpu-uuid]",
        "must list GPU UUIDs (GPU-<hex> or MIG-...); 'card-0' is not one",
    ),
    (
        "uuid with a non-hex body",
        pod(ctr(limits={G: "1"}), annotations={"tessera.io/gpu-uuid-exclude": "GPU-xyz"}),
        Compat.off(),
        f"{ANN}[tessera.io/gpu-uuid-exclude]",
        "must list GPU UUIDs (GPU-<hex> or MIG-...); 'GPU-xyz' is not one",
    ),
    (
        "annotation not a string",
        pod(ctr(limits={G: "1"}), annotations={"tessera.io/placement": 3}),
        Compat.off(),
        f"{ANN}[tessera.io/placement]",
        "must be a string",
    ),
    (
        "Tessera and HAMi names in one container",
        pod(ctr(limits={G: "1", "nvidia.com/gpumem": "100"})),
        HAMI,
        f"{L0}[nvidia.com/gpumem]",
        f"cannot be mixed with {G} in one container: use Tessera or HAMi names, not both",
    ),
    (
        "HAMi and GPU-manager in one pod",
        pod(
            ctr("a", limits={"nvidia.com/gpu": "1"}),
            ctr("b", limits={"tencent.com/vcuda-core": "10"}),
        ),
        BOTH,
        "spec.containers[1].resources.limits[tencent.com/vcuda-core]",
        (
            "cannot be used in a pod whose container 'a' uses HAMi names: one compatibility "
            "family per pod"
        ),
    ),
    (
        "GPU-manager and HAMi in one pod, the field named is the second's own",
        pod(
            ctr("a", limits={"tencent.com/vcuda-core": "10"}),
            ctr("b", limits={"nvidia.com/gpumem": "1000"}),
        ),
        BOTH,
        "spec.containers[1].resources.limits[nvidia.com/gpumem]",
        (
            "cannot be used in a pod whose container 'a' uses GPU-manager names: one "
            "compatibility family per pod"
        ),
    ),
    (
        "HAMi: gpumem and gpumem-percentage together",
        pod(ctr(limits={"nvidia.com/gpumem": "100", "nvidia.com/gpumem-percentage": "10"})),
        HAMI,
        f"{L0}[nvidia.com/gpumem-percentage]",
        "cannot be combined with nvidia.com/gpumem: give one",
    ),
    (
        "HAMi: gpucores over 100",
        pod(ctr(limits={"nvidia.com/gpucores": "101"})),
        HAMI,
        f"{L0}[nvidia.com/gpucores]",
        "must be an integer between 1 and 100",
    ),
    (
        "HAMi and Tessera model annotations together",
        pod(
            ctr(limits={"nvidia.com/gpu": "1"}),
            annotations={"tessera.io/gpu-model": "A100", "nvidia.com/use-gputype": "A100"},
        ),
        HAMI,
        f"{ANN}[nvidia.com/use-gputype]",
        "cannot be combined with tessera.io/gpu-model; use one",
    ),
    (
        "HAMi uuid allowed and refused",
        pod(
            ctr(limits={"nvidia.com/gpu": "1"}),
            annotations={"nvidia.com/use-gpuuuid": UUID_A, "nvidia.com/nouse-gpuuuid": UUID_A},
        ),
        HAMI,
        f"{ANN}[nvidia.com/nouse-gpuuuid]",
        (
            "must not refuse 'GPU-6f1f3c1e-7a52-4d0e-9a35-2b0c1c7e5a11', which nvidia.com/use-"
            "gpuuuid allows"
        ),
    ),
    (
        "GPU-manager: fractional share over several cards",
        pod(ctr(limits={"tencent.com/vcuda-core": "150"})),
        GM,
        f"{L0}[tencent.com/vcuda-core]",
        (
            "must be below 100 (a share of one card) or a multiple of 100 (whole cards); a "
            "fractional share over several cards is not allowed"
        ),
    ),
    (
        "GPU-manager: memory without cores",
        pod(ctr(limits={"tencent.com/vcuda-memory": "4"})),
        GM,
        f"{L0}[tencent.com/vcuda-core]",
        "is required with tencent.com/vcuda-memory",
    ),
    (
        "GPU-manager: core limit below the share",
        pod(
            ctr(limits={"tencent.com/vcuda-core": "50"}),
            annotations={"tencent.com/vcuda-core-limit": "20"},
        ),
        GM,
        f"{ANN}[tencent.com/vcuda-core-limit]",
        "must be at least tencent.com/vcuda-core of container 'main' (50)",
    ),
    (
        "GPU-manager: core limit not a percent",
        pod(
            ctr(limits={"tencent.com/vcuda-core": "50"}),
            annotations={"tencent.com/vcuda-core-limit": "0.5"},
        ),
        GM,
        f"{ANN}[tencent.com/vcuda-core-limit]",
        "must be an integer between 1 and 100",
    ),
    (
        "GPU-manager: memory units with a binary suffix",
        pod(ctr(limits={"tencent.com/vcuda-core": "50", "tencent.com/vcuda-memory": "1Ki"})),
        GM,
        f"{L0}[tencent.com/vcuda-memory]",
        "counts 256 MiB units: write a plain number (e.g. 8192), not Ki/Mi/Gi",
    ),
    (
        "container without a name",
        pod({"image": "x"}),
        Compat.off(),
        "spec.containers[0].name",
        "is required: a non-empty string",
    ),
    (
        "container with an empty name",
        pod(ctr(""), ctr("b")),
        Compat.off(),
        "spec.containers[0].name",
        "is required: a non-empty string",
    ),
    (
        "container resources not an object",
        pod({"name": "a", "image": "x", "resources": [1]}),
        Compat.off(),
        "spec.containers[0].resources",
        "must be an object",
    ),
    (
        "GPU-manager: core limit above 100",
        pod(
            ctr(limits={"tencent.com/vcuda-core": "50"}),
            annotations={"tencent.com/vcuda-core-limit": "101"},
        ),
        GM,
        f"{ANN}[tencent.com/vcuda-core-limit]",
        "must be an integer between 1 and 100",
    ),
    (
        "GPU-manager: core limit 0",
        pod(
            ctr(limits={"tencent.com/vcuda-core": "50"}),
            annotations={"tencent.com/vcuda-core-limit": "0"},
        ),
        GM,
        f"{ANN}[tencent.com/vcuda-core-limit]",
        "must be an integer between 1 and 100",
    ),
    (
        "metadata name not a string",
        {"metadata": {"name": 7}, "spec": {"containers": []}},
        Compat.off(),
        "metadata.name",
        "must be a string",
    ),
]


# What each refusal shows of what was written, after its rule: "(got VALUE)".
SHOWN: dict[str, object] = {
    "pod not an object": "list", "spec not an object": "x", "containers not a list": "dict",
    "init containers not a list": "x", "container not an object": "a",
    "duplicate container name": "a", "limits not an object": "list",
    "resource name not a string": 1, "zero cards": "0", "negative memory": "-5",
    "fractional extended resource": "1.5", "milli extended resource": "500m",
    "malformed extended quantity": "one", "cores over 100": "150",
    "memory percent over 100": "101", "both MiB and percent": "10",
    "memory with a binary suffix": "8Gi", "requests differ from limits": "1",
    "requests without limits": "10", "malformed cpu quantity": "lots",
    "negative memory request": "-1Gi", "init container errors carry their own path": "0",
    "errors name the right container": "101", "unknown compute policy": "greedy",
    "fixed-share without cores": "fixed-share", "burst-share without cores": "burst-share",
    "unknown placement policy": "tetris", "placement with three levels": "spread/binpack/random",
    "placement with an empty card level": "spread/", "empty item in a model list": "A100,,H100",
    "empty model list": " ", "duplicate model": "A100, A100",
    "model both allowed and refused": "T4", "uuid both allowed and refused": UUID_A,
    "malformed uuid": "card-0", "uuid with a non-hex body": "GPU-xyz",
    "annotation not a string": 3, "HAMi: gpumem and gpumem-percentage together": "10",
    "HAMi: gpucores over 100": "101", "HAMi uuid allowed and refused": UUID_A,
    "GPU-manager: fractional share over several cards": "150",
    "GPU-manager: core limit below the share": "20",
    "GPU-manager: core limit not a percent": "0.5",
    "GPU-manager: memory units with a binary suffix": "1Ki",
    "container with an empty name": "", "container resources not an object": "list",
    "GPU-manager: core limit above 100": "101", "GPU-manager: core limit 0": "0",
    "metadata name not a string": 7,
    "HAMi: burst-share without gpucores names HAMi's resource": "burst-share",
    "metadata not an object": "list", "annotations not an object": "list",
    "overhead not an object": "1", "malformed cpu overhead": "x",
    "malformed memory overhead": "x",
    "requests not an object": "list", "a request that is no quantity": "one",
    "a list where a quantity goes": ["1"], "HAMi: gpumem with a binary suffix": "1Gi",
}  # fmt: skip


@pytest.mark.parametrize(("case", "spec", "compat", "field", "rule"), BAD, ids=[b[0] for b in BAD])
def test_bad(case: str, spec: dict[str, Any], compat: Compat, field: str, rule: str) -> None:
    """The whole message: the field, the rule, and what was written when there is one
    thing to show (a refusal of something missing shows nothing)."""
    with pytest.raises(SpecError) as exc:
        parse_pod(spec, compat=compat)
    assert (exc.value.field, exc.value.rule, exc.value.value) == (field, rule, SHOWN.get(case))


def test_an_error_shows_a_bad_scalar_as_written_and_a_container_by_its_type() -> None:
    with pytest.raises(SpecError) as scalar:
        parse_pod(pod({"name": 7, "image": "x"}), compat=Compat.off())
    assert str(scalar.value).endswith("(got 7)")
    with pytest.raises(SpecError) as listed:
        parse_pod(pod({"name": "a", "resources": [{"limits": {}}]}), compat=Compat.off())
    assert str(listed.value).endswith("(got 'list')")


def test_at_least_thirty_bad_inputs() -> None:
    assert len(BAD) >= 30


@pytest.mark.parametrize(
    ("spec", "compat"),
    [
        (pod(ctr(requests={"cpu": "1"})), Compat.off()),
        (pod(ctr(limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "100"})), Compat.off()),
        (pod(ctr(limits={"tencent.com/vcuda-core": "50"})), HAMI),
        # not ours, so its other mistakes are the API server's to report
        (
            pod(ctr(requests={"cpu": "lots"}), annotations={"tessera.io/placement": "x"}),
            Compat.off(),
        ),
        ({"spec": {"containers": []}}, Compat.off()),
    ],
)
def test_not_ours_is_none(spec: dict[str, Any], compat: Compat) -> None:
    assert parse_pod(spec, compat=compat) is None


def test_first_error_follows_start_order() -> None:
    spec = pod(ctr("a", limits={G: "0"}), init=(ctr("i", limits={CORES: "200"}),))
    with pytest.raises(SpecError) as exc:
        parse_pod(spec)
    assert exc.value.field == f"spec.initContainers[0].resources.limits[{CORES}]"


def test_custom_resource_names() -> None:
    names = ResourceNames(
        gpu="example.com/card",
        memory="example.com/card-mib",
        memory_percent="example.com/card-percent",
        cores="example.com/card-cores",
    )
    got = parse_pod(pod(ctr(limits={"example.com/card-mib": "64"})), names=names)
    assert got == want(gpu(count=1, memory_mib=64, policy=BEST))
    assert parse_pod(pod(ctr(limits={G: "1"})), names=names) is None
    # The same pod read with other names is read afresh, not answered from the memo.
    both = pod(ctr(limits={G: "1", MEM: "64"}))
    assert parse_pod(both) == want(gpu(count=1, memory_mib=64, policy=BEST))
    renamed = ResourceNames(memory="tessera.io/gpu-mib")
    with pytest.raises(SpecError, match=r"\[tessera\.io/gpu-memory\]: is not a Tessera resource"):
        parse_pod(both, names=renamed)


def test_whole_cards_from_gpu_manager_are_counted_in_whole_numbers() -> None:
    got = parse_pod(pod(ctr(limits={"tencent.com/vcuda-core": "200"})), compat=GM)
    assert got is not None and got.containers[0].gpu is not None
    assert type(got.containers[0].gpu.count) is int and got.containers[0].gpu.count == 2


def test_missing_metadata_gives_empty_identity() -> None:
    got = parse_pod({"spec": {"containers": [ctr(limits={G: "1"})]}})
    assert got is not None
    assert (got.namespace, got.name, got.uid) == ("", "", "")


def test_gpu_resource_names() -> None:
    assert gpu_resource_names() == (G, MEM, PCT, CORES)
    assert gpu_resource_names(compat=BOTH) == (
        G,
        MEM,
        PCT,
        CORES,
        "nvidia.com/gpu",
        "nvidia.com/gpumem",
        "nvidia.com/gpumem-percentage",
        "nvidia.com/gpucores",
        "tencent.com/vcuda-core",
        "tencent.com/vcuda-memory",
    )
    assert gpu_resource_names(compat=GM)[-1] == "tencent.com/vcuda-memory"


def test_every_placement_policy_is_accepted_at_both_levels() -> None:
    for node in PLACEMENT_POLICIES:
        for card in (None, *PLACEMENT_POLICIES):
            value = node if card is None else f"{node}/{card}"
            got = parse_pod(pod(ctr(limits={G: "1"}), annotations={"tessera.io/placement": value}))
            assert got is not None and got.placement == value


def test_docs_examples_parse_as_documented() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    blocks = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", text, re.S)]
    got = [parse_pod(b, compat=BOTH) for b in blocks if b.get("kind") != "GpuQuota"]
    assert [g.containers[0].gpu if g else None for g in got] == [
        GpuRequest(1, 10240, None, 30, policy=BURST, models=frozenset({"A100", "H100"})),
        GpuRequest(2, exclusive=True),
        GpuRequest(2, 3000, None, 30, policy=FIXED),
        GpuRequest(1, 7680, None, 50, policy=FIXED),
    ]
    assert got[1] is not None and got[1].placement == "spread/binpack"


# --- the memo: a parse answers as a fresh one would -------------------------------

# Each pod is a few choices; a sequence changes one choice at a time, so pods that differ
# in one thing the parser reads follow each other, as the memo's key must tell them apart.
_CHOICES: dict[str, list[Any]] = {
    "limits": [{G: "1", CORES: "50"}, {MEM: "8000", CORES: "10"}, {"nvidia.com/gpu": "1"},
               {"tencent.com/vcuda-core": "50"}, {"cpu": "1"}],
    "count": ["1", 1, True, 1.0, "2"],  # 1, True and 1.0 hash alike
    "requests": [None, {"cpu": "1"}, {"cpu": 1}, {G: "1"}],
    "init": [None, {}, {"restartPolicy": "Always"}],
    "init_limits": [{}, {G: "1"}, {"cpu": "2"}],
    "annotations": [{}, {"tessera.io/placement": "spread"}, {"tessera.io/placement": "x"},
                    {"tessera.io/compute-policy": "fixed-share"}, {"nvidia.com/use-gputype": "T4"},
                    {"tencent.com/vcuda-core-limit": "50"}, {"tessera.io/gpu-model": 3},
                    {"example.com/other": "1"}],
    "overhead": [{}, {"overhead": {"cpu": "100m"}}, {"overhead": {"cpu": 1}}, {"overhead": "x"}],
    "compat": [Compat.off(), HAMI, GM, BOTH],
    "name": ["p", "q"],
}  # fmt: skip


def _pod_of(choice: dict[str, int]) -> tuple[dict[str, Any], Compat]:
    c = {k: _CHOICES[k][i] for k, i in choice.items()}
    init = ()
    if c["init"] is not None:
        init = (ctr("i", limits=c["init_limits"], **c["init"]),)
    limits = {**c["limits"], G: c["count"]}
    p = pod(ctr(limits=limits, requests=c["requests"]), init=init,
            annotations=c["annotations"], **c["overhead"])  # fmt: skip
    p["metadata"]["name"] = c["name"]
    return p, c["compat"]


@st.composite
def _neighbours(draw: st.DrawFn) -> list[tuple[dict[str, Any], Compat]]:
    choice = {k: draw(st.integers(0, len(v) - 1)) for k, v in _CHOICES.items()}
    out = [_pod_of(choice)]
    for _ in range(draw(st.integers(1, 6))):
        k = draw(st.sampled_from(sorted(_CHOICES)))
        choice = {**choice, k: draw(st.integers(0, len(_CHOICES[k]) - 1))}
        out.append(_pod_of(choice))
    return out


def _outcome(spec: dict[str, Any], compat: Compat) -> object:
    try:
        return parse_pod(spec, compat=compat)
    except SpecError as exc:
        return (exc.field, exc.rule)


@settings(max_examples=400, deadline=None)
@given(_neighbours())
def test_a_remembered_parse_answers_as_a_fresh_one(
    pods: list[tuple[dict[str, Any], Compat]],
) -> None:
    warm = podspec._MEMO = podspec._Memo()
    try:
        for spec, compat in pods:
            remembered = _outcome(spec, compat)  # after the pods before it: the memo is warm
            podspec._MEMO = podspec._Memo()
            assert _outcome(spec, compat) == remembered
            podspec._MEMO = warm
    finally:
        podspec._MEMO = podspec._Memo()


@pytest.mark.parametrize("values", [(1, True), (True, 1), (1.0, 1), ("1", 1, True, "1")])
def test_values_equal_in_python_are_not_one_request(
    values: tuple[Any, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """1, 1.0 and True are one dict key; the memo must not answer True with 1's request
    (Kubernetes has no boolean quantity)."""
    monkeypatch.setattr(podspec, "_MEMO", podspec._Memo())  # restored after the test
    fresh = []
    for v in values:
        podspec._MEMO = podspec._Memo()
        fresh.append(_outcome(pod(ctr(limits={G: v})), Compat.off()))
    podspec._MEMO = podspec._Memo()
    assert [_outcome(pod(ctr(limits={G: v})), Compat.off()) for v in values] == fresh


def _sized(mib: int, name: str = "p") -> dict[str, Any]:
    p = pod(ctr(limits={MEM: str(mib), CORES: "10"}))
    p["metadata"].update(name=name, uid=f"u-{name}")
    return p


def test_the_memo_is_used_and_keeps_each_pods_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    memo = podspec._Memo()
    monkeypatch.setattr(podspec, "_MEMO", memo)
    a, b = parse_pod(_sized(8000, "a")), parse_pod(_sized(8000, "b"))
    assert a is not None and b is not None
    assert (len(memo.entries), memo.hits) == (1, 1)
    assert (b.name, b.uid, a.name, a.uid) == ("b", "u-b", "a", "u-a")
    assert a.containers is b.containers  # the second was not parsed again
    assert b == replace(a, name="b", uid="u-b")


def test_the_memo_rests_when_pods_do_not_repeat(monkeypatch: pytest.MonkeyPatch) -> None:
    memo = podspec._Memo(size=4, rest=10)
    monkeypatch.setattr(podspec, "_MEMO", memo)
    for mib in range(1000, 1005):  # five sizes, no repeat: the fifth finds it full, no hit
        parse_pod(_sized(mib))
    assert (memo.resting, len(memo.entries)) == (10, 1)
    for _ in range(10):
        got = parse_pod(_sized(1004))  # resting: parsed, not looked up
        assert got is not None and got.containers[0].gpu is not None
        assert got.containers[0].gpu.memory_mib == 1004
    assert (memo.resting, memo.hits) == (0, 0)
    for mib in (1004, 3000, 3000, 3001, 3001, 3002, 3002):  # awake again: four hits
        parse_pod(_sized(mib))
    assert (len(memo.entries), memo.hits) == (4, 4)
    parse_pod(_sized(4000))  # the fill had as many hits as entries: it stays awake
    assert (memo.resting, len(memo.entries), memo.hits) == (0, 1, 0)
