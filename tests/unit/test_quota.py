"""GpuQuota: parsing with field-and-rule errors, and the usage arithmetic (pure core)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.claims.devices import device_name
from tessera.errors import SpecError
from tessera.model.clusterspec import make_cards
from tessera.model.types import (
    Assignment,
    CardSlice,
    ContainerAssignment,
    ContainerRequest,
    GpuRequest,
    PodRequest,
)
from tessera.quota.book import QuotaBook, loosened
from tessera.quota.claims import claim_holding
from tessera.quota.spec import parse_quota
from tessera.quota.usage import QuotaUsage, Usage, demand_on, holding, why_over


def quota(*limits: dict[str, Any], ns: str = "team-a", name: str = "gpus") -> dict[str, Any]:
    return {
        "apiVersion": "tessera.io/v1alpha1",
        "kind": "GpuQuota",
        "metadata": {"namespace": ns, "name": name, "resourceVersion": "7"},
        "spec": {"limits": list(limits)},
    }


ROOT = Path(__file__).resolve().parents[2]
CHART_CRD = Path("charts/tessera/crds/gpuquota-crd.yaml")
A100 = {"name": "a100", "models": ["A100"], "memoryMiB": 81920, "coresPercent": 200, "cards": 1}


def test_parses_pools_of_models_and_their_caps() -> None:
    q = parse_quota(quota(A100, {"name": "small", "models": ["T4", "L4"], "memoryMiB": 1000}))
    assert q.key == "team-a/gpus" and q.resource_version == "7"
    a100, small = q.limits
    assert (a100.memory_mib, a100.cores_percent, a100.cards) == (81920, 200, 1)
    assert small.models == frozenset({"T4", "L4"}) and small.cards is None
    assert small.covers("L4") and not small.covers("A100")
    anything = parse_quota(quota({"name": "all", "models": ["*"], "cards": 2})).limits[0]
    assert anything.covers("H100")


DNS_LABEL = "must be a DNS label (a-z, 0-9, '-'; at most 63)"
MODEL_NAME = "must be a non-empty model name of at most 128 characters"
ANY_ALONE = '"*" (any model) is allowed only in a quota of one limit'


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ([], "spec.limits: must list at least one limit (got [])"),
        ([5], "spec.limits[0]: must be an object (got 5)"),
        ([{"models": ["A100"], "cards": 1}], f"spec.limits[0].name: {DNS_LABEL}"),
        ([{"name": "A_100", "models": ["A100"], "cards": 1}],
         f"spec.limits[0].name: {DNS_LABEL} (got 'A_100')"),
        ([{"name": "x" * 64, "models": ["A100"], "cards": 1}],
         f"spec.limits[0].name: {DNS_LABEL} (got '{'x' * 64}')"),
        ([{"name": "a", "models": [], "cards": 1}],
         'spec.limits[0].models: must list at least one card model (or "*") (got [])'),
        ([{"name": "a", "models": "A100", "cards": 1}],
         "spec.limits[0].models: must list at least one card model (or \"*\") (got 'A100')"),
        ([{"name": "a", "models": [""], "cards": 1}],
         f"spec.limits[0].models[0]: {MODEL_NAME} (got '')"),
        ([{"name": "a", "models": ["A" * 129], "cards": 1}],
         f"spec.limits[0].models[0]: {MODEL_NAME} (got '{'A' * 129}')"),
        ([{"name": "a", "models": ["A100", "T4", "A100"], "cards": 1}],
         "spec.limits[0].models[2]: must not repeat a model (a set) (got 'A100')"),
        ([{"name": "a", "models": [f"m{i}" for i in range(17)], "cards": 1}],
         "spec.limits[0].models: at most 16 models (got 17)"),
        ([{"name": f"l{i}", "models": [f"m{i}"], "cards": 1} for i in range(17)],
         "spec.limits: at most 16 limits (got 17)"),
        ([{"name": "a", "models": ["A100"]}],
         "spec.limits[0]: must cap at least one of memoryMiB, coresPercent, cards"),
        ([{"name": "a", "models": ["A100"], "cards": -1}],
         "spec.limits[0].cards: must be >= 0 (got -1)"),
        ([{"name": "a", "models": ["A100"], "memoryMiB": "8Gi"}],
         "spec.limits[0].memoryMiB: must be an integer (got '8Gi')"),
        ([{"name": "a", "models": ["A100"], "cards": 1, "gpus": 2}],
         "spec.limits[0].gpus: is not a field of a limit"),
        ([A100, {**A100, "models": ["T4"]}],
         "spec.limits[1].name: must be unique in the quota (got 'a100')"),
        ([A100, {"name": "b", "models": ["T4", "A100"], "cards": 1}],
         "spec.limits[1].models: a model may be in one limit only; 'A100' is also in limit "
         "'a100'"),
        ([A100, {"name": "b", "models": ["*"], "cards": 1}], f"spec.limits[1].models: {ANY_ALONE}"),
        ([{"name": "b", "models": ["*"], "cards": 1}, A100], f"spec.limits[0].models: {ANY_ALONE}"),
    ],
)  # fmt: skip
def test_refuses_a_malformed_quota_naming_the_field_the_rule_and_the_value(
    limits: list[Any], message: str
) -> None:
    with pytest.raises(SpecError) as info:
        parse_quota(quota(*limits))
    assert str(info.value) == message
    assert message.startswith(f"{info.value.field}: {info.value.rule}")


@pytest.mark.parametrize(("spec", "message"), [
    (5, "spec: must be an object (got 5)"),
    ({"limits": 5}, "spec.limits: must list at least one limit (got 5)"),
])  # fmt: skip
def test_refuses_a_spec_that_is_not_an_object_of_limits(spec: Any, message: str) -> None:
    obj = quota(A100)
    obj["spec"] = spec
    with pytest.raises(SpecError) as info:
        parse_quota(obj)
    assert str(info.value) == message


def test_the_parser_allows_what_the_crd_allows_at_its_bounds() -> None:
    # Sixteen limits of sixteen models of 128 characters, names of 63, caps of 0: the
    # CRD's bounds (both copies of it, deploy/ and the chart's, say the same).
    for path in (ROOT / "deploy" / "gpuquota-crd.yaml", ROOT / CHART_CRD):
        spec = yaml.safe_load(path.read_text())["spec"]["versions"][0]["schema"]
        limits = spec["openAPIV3Schema"]["properties"]["spec"]["properties"]["limits"]
        models = limits["items"]["properties"]["models"]
        assert (limits["maxItems"], models["maxItems"]) == (16, 16)
        assert models["items"]["maxLength"] == 128

    def model(i: int, j: int) -> str:
        return f"{i:02}{j:02}".ljust(128, "x")

    most = [{"name": f"l{i:02}".ljust(63, "x"), "models": [model(i, j) for j in range(16)],
             "cards": 0} for i in range(16)]  # fmt: skip
    limits = parse_quota(quota(*most)).limits
    assert len(limits) == 16 and {lim.cards for lim in limits} == {0}  # 0: no whole card


@pytest.mark.parametrize("namespace", [None, "", 7])
def test_a_quota_is_namespaced(namespace: Any) -> None:
    obj = quota(A100)
    obj["metadata"]["namespace"] = namespace
    with pytest.raises(SpecError) as info:
        parse_quota(obj)
    got = "" if namespace is None else f" (got {namespace!r})"
    assert str(info.value) == f"metadata.namespace: a GpuQuota is namespaced{got}"


@pytest.mark.parametrize("name", [None, "", 7])
def test_a_quota_is_named(name: Any) -> None:
    obj = quota(A100)
    obj["metadata"]["name"] = name
    with pytest.raises(SpecError) as info:
        parse_quota(obj)
    assert str(info.value) == "metadata.name: must be set" + (
        "" if name is None else f" (got {name!r})"
    )


def test_a_relist_names_the_namespaces_it_loosened_and_the_quotas_it_refused() -> None:
    book = QuotaBook()
    small = {"name": "a100", "models": ["A100"], "memoryMiB": 1000}
    assert book.replace([quota(small), quota(small, ns="team-b")]) == (set(), {})
    loose = quota({**small, "memoryMiB": 2000})  # team-a's cap up; team-b's quota gone
    broken = quota({"name": "a100"}, ns="team-c")
    loosened, refused = book.replace([loose, quota(small, ns="team-d"), broken])
    assert loosened == {"team-a", "team-b"}  # team-d's quota is new: it only restricts
    assert list(refused) == ["team-c/gpus"] and "spec.limits[0].models" in refused["team-c/gpus"]
    assert sorted(book.in_force()) == [("team-a", "team-a/gpus"), ("team-d", "team-d/gpus")]


def test_a_loosened_limit_after_a_new_one_is_seen() -> None:
    small = {"name": "a100", "models": ["A100"], "memoryMiB": 1000}
    new_limit = {"name": "t4", "models": ["T4"], "cards": 1}
    old = parse_quota(quota(small))
    assert loosened(old, parse_quota(quota(new_limit, {**small, "memoryMiB": 2000})))
    assert not loosened(old, parse_quota(quota(new_limit, small)))


def test_the_book_forgets_a_refusal_once_the_quota_is_mended_deleted_or_gone() -> None:
    book = QuotaBook()
    good, broken = quota(A100), quota({"name": "a100"}, name="other")
    assert book.apply(good) == (False, "")
    for mend in (
        lambda: book.apply(quota(A100, name="other")),
        lambda: book.apply(broken, deleted=True),
        lambda: book.replace([good]),
    ):
        loosened_, why = book.apply(broken)
        assert not loosened_ and why.startswith("spec.limits[0].models: ")
        assert list(book.refused) == ["team-a/other"]
        mend()
        assert book.refused == {}
    assert book.apply(quota(A100, name="other"), deleted=True) == (False, "")  # not in force
    assert book.apply(good, deleted=True) == (True, "")
    assert book.in_force() == []


def _pod(*containers: ContainerRequest, ns: str = "team-a") -> PodRequest:
    return PodRequest(ns, "p", containers)


def test_demand_counts_exclusive_cards_percent_memory_and_init_containers() -> None:
    whole = ContainerRequest("main", GpuRequest(count=2, exclusive=True))
    assert demand_on(_pod(whole), 81920) == Usage(163840, 200, 2)
    part = ContainerRequest("main", GpuRequest(count=1, memory_percent=25, cores_percent=30))
    assert demand_on(_pod(part), 40000) == Usage(10000, 30, 0)
    init = ContainerRequest("setup", GpuRequest(count=1, memory_mib=30000, cores_percent=5), True)
    app = ContainerRequest("main", GpuRequest(count=1, memory_mib=8000, cores_percent=50))
    assert demand_on(_pod(init, app), 40000) == Usage(30000, 50, 0)


def test_holding_is_the_footprint_per_model() -> None:
    a = Assignment(
        "n1",
        (
            ContainerAssignment("main", (CardSlice("u1", 8000, 20), CardSlice("u2", 8000, 20))),
            ContainerAssignment("side", (CardSlice("u3", 40960, 100),), exclusive=True),
        ),
    )
    models = {"u1": "A100", "u2": "T4", "u3": "A100"}
    assert holding(a, models.__getitem__) == {
        "A100": Usage(48960, 120, 1),
        "T4": Usage(8000, 20, 0),
    }


def test_usage_adds_replaces_and_drops_pods_and_sums_a_pool() -> None:
    q = parse_quota(quota({"name": "pool", "models": ["A100", "H100"], "memoryMiB": 100000}))
    lim = q.limits[0]
    u = QuotaUsage()
    u.set_pod("team-a/p1", "team-a", {"A100": Usage(30000, 10, 0)})
    u.set_pod("team-a/p2", "team-a", {"H100": Usage(50000, 100, 1), "T4": Usage(1, 1, 0)})
    u.set_pod("team-b/p3", "team-b", {"A100": Usage(99999, 0, 0)})
    assert u.of("team-a", lim) == Usage(80000, 110, 1)
    assert u.holders("team-a", lim) == ["team-a/p1", "team-a/p2"]
    assert why_over([q], u, "A100", Usage(20000, 0, 0)) == ""
    assert why_over([q], u, "T4", Usage(10**9, 0, 0)) == ""  # T4 is not in the pool
    assert why_over([q], u, "H100", Usage(20001, 0, 0)) == (
        "quota: team-a/gpus pool (H100) memory 80000 of 100000 MiB used, the pod asks 20001"
    )
    assert why_over([q], None, "H100", Usage(100001, 0, 0)) == (
        "quota: team-a/gpus pool (H100) allows 100000 MiB of memory, the pod alone asks 100001"
    )
    u.set_pod("team-a/p1", "team-a", {"A100": Usage(10000, 0, 0)})  # replaced
    u.set_pod("team-a/p2", "team-a", None)  # gone
    assert u.of("team-a", lim) == Usage(10000, 0, 0)
    assert u.holders("team-a", lim) == ["team-a/p1"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.sampled_from(["a", "b"]),
                          st.sets(st.sampled_from(["A100", "H100", "T4"])))))  # fmt: skip
def test_holders_per_namespace_agree_with_every_pod_read(ops: list[Any]) -> None:
    """Pods set, replaced (in another namespace too) and dropped in any order: a
    namespace's holders, per model and per limit, are those of a pass over every pod."""
    q = parse_quota(quota({"name": "pool", "models": ["A100", "H100"], "memoryMiB": 1}))
    u, truth = QuotaUsage(), {}
    for i, ns, models in ops:
        key = f"{ns}/p{i}"
        for other in ("a", "b"):  # a name lives in one namespace at a time here
            truth.pop(f"{other}/p{i}", None)
            u.set_pod(f"{other}/p{i}", other, None)
        u.set_pod(key, ns, {m: Usage(1, 1, 0) for m in models})
        if models:
            truth[key] = (ns, models)
    for ns in ("a", "b"):
        for model in ("A100", "H100", "T4"):
            assert u.holding_model(ns, model) == sorted(
                k for k, (n, ms) in truth.items() if n == ns and model in ms
            )
        assert u.holders(ns, q.limits[0]) == sorted(
            k for k, (n, ms) in truth.items() if n == ns and ms & {"A100", "H100"}
        )


def test_what_preemption_holds_counts_as_used_on_the_models_a_limit_covers() -> None:
    q = parse_quota(quota({"name": "pool", "models": ["A100", "H100"], "memoryMiB": 100000}))
    u = QuotaUsage()
    u.set_pod("team-a/p1", "team-a", {"A100": Usage(60000, 10, 0)})
    held = {"H100": Usage(30000, 0, 0), "T4": Usage(10**9, 0, 0)}  # T4: not in the pool
    assert why_over([q], u, "A100", Usage(10000, 0, 0), held=held) == ""
    assert why_over([q], u, "A100", Usage(10001, 0, 0), held=held) == (
        "quota: team-a/gpus pool (A100) memory 90000 of 100000 MiB used (30000 of it held "
        "for a preempting pod), the pod asks 10001"
    )


def test_the_documented_example_parses_as_documented() -> None:
    import re
    from pathlib import Path

    import yaml

    text = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    blocks = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", text, re.S)]
    (example,) = [b for b in blocks if b.get("kind") == "GpuQuota"]
    q = parse_quota(example)
    assert q.key == "team-a/gpus"
    a100, small = q.limits
    assert a100.models == frozenset({"A100", "A100-80G"})
    assert (a100.memory_mib, a100.cores_percent, a100.cards) == (81920, 400, 2)
    assert (small.memory_mib, small.cores_percent, small.cards) == (30000, None, None)


# --- a claim's holding ------------------------------------------------------------------


def _claim_on(*results: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "team-a", "name": "c1", "uid": "u1"},
        "status": {"allocation": {"devices": {"results": list(results)}}},
    }


def _res(pool: str, device: str, **consumed: str) -> dict[str, Any]:
    out: dict[str, Any] = {"request": "gpu", "driver": "gpu.tessera.io", "pool": pool,
                           "device": device}  # fmt: skip
    if consumed:
        out["consumedCapacity"] = consumed
    return out


def _pools() -> dict[str, dict[str, Any]]:
    return {
        "n1": {device_name(c): c for c in make_cards("n1", 4, "A100")},
        "n2": {device_name(c): c for c in make_cards("n2", 2, "T4")},
    }


def test_a_claim_holds_its_slices_and_whole_cards_per_model() -> None:
    pools = _pools()
    a100 = pools["n1"]["gpu-0"].memory_mib
    t4 = pools["n2"]["gpu-0"].memory_mib
    claim = _claim_on(
        _res("n1", "gpu-0", memory="8Gi", compute="30", slots="1"),
        _res("n1", "gpu-1"),  # no capacity recorded: the whole card
        _res("n2", "gpu-1", memory=f"{t4}Mi", compute="10", slots="1"),  # all its memory
        {"request": "nic", "driver": "nic.example.com", "pool": "n1", "device": "eth0"},
    )
    assert claim_holding(claim, pools.get) == {
        "A100": Usage(8192 + a100, 30 + 100, 1),
        "T4": Usage(t4, 100, 1),
    }
    unallocated = {"metadata": {"name": "c2"}, "status": {}}
    assert claim_holding(unallocated, pools.get) == {}


def test_a_claim_on_an_unknown_pool_or_device_is_refused_naming_the_field() -> None:
    pools = _pools()
    with pytest.raises(SpecError, match=r"status.allocation.devices.results: pool n9"):
        claim_holding(_claim_on(_res("n9", "gpu-0")), pools.get)
    with pytest.raises(SpecError, match=r"results\[0\].device: must be a card this node offers"):
        claim_holding(_claim_on(_res("n2", "gpu-7")), pools.get)
