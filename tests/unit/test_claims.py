"""The claims core: a node's cards as DRA devices, an allocated claim as an assignment."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tessera.claims.allocation import allocated_pools, claim_grant
from tessera.claims.cdi import cdi_device_id, cdi_spec
from tessera.claims.devices import (
    CORDONED_TAINT,
    DRIVER,
    UNHEALTHY_TAINT,
    claims_pool,
    nvlink_islands,
    resource_slice,
    semver,
    slice_cards,
)
from tessera.errors import SpecError
from tessera.model.clusterspec import make_cards
from tessera.model.types import Card, ComputePolicy
from tessera.node.isolation import Isolation, Visibility, container_edits

CARDS = make_cards("n1", 4, "A100-SXM4-80GB", memory_mib=81920, nvlink="pairs")
BY_NAME = {f"gpu-{c.index}": c for c in CARDS}


# --- the ResourceSlice ----------------------------------------------------------------


def test_slice_has_one_shareable_device_per_card_with_its_capacities() -> None:
    s = resource_slice("n1", reversed(CARDS), generation=3, driver_version="535.104.05",
                       node_uid="u-1")  # fmt: skip
    spec = s["spec"]
    assert (s["apiVersion"], s["kind"]) == ("resource.k8s.io/v1", "ResourceSlice")
    assert s["metadata"]["ownerReferences"][0] == {
        "apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u-1"
    }  # fmt: skip
    assert spec["driver"] == DRIVER and spec["nodeName"] == "n1"
    assert spec["pool"] == {"name": "n1", "generation": 3, "resourceSliceCount": 1}
    assert [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    d1 = spec["devices"][1]
    assert d1["allowMultipleAllocations"] is True
    assert d1["attributes"]["uuid"] == {"string": CARDS[1].uuid}
    assert d1["attributes"]["driverVersion"] == {"version": "535.104.5"}
    assert d1["attributes"]["nvlinkIsland"] == {"int": 0}  # pairs: 0-1, 2-3
    assert spec["devices"][3]["attributes"]["nvlinkIsland"] == {"int": 2}
    cap = d1["capacity"]
    assert cap["memory"]["value"] == "81920Mi"
    assert cap["memory"]["requestPolicy"]["default"] == "81920Mi"  # unnamed: whole card
    assert cap["compute"]["requestPolicy"]["default"] == "0"
    assert cap["slots"] == {"value": "16", "requestPolicy": {"default": "1", "validValues": ["1"]}}
    assert "taints" not in d1


def test_a_device_is_published_as_docs_protocol_md_lists_it() -> None:
    """Every field kube-scheduler's allocator reads, whole: a misspelt key would be
    ignored by it, not refused."""
    card = replace(CARDS[1], numa_node=1, nvlink_peers=(0, 3), slots=8, healthy=False,
                   cordoned=True)  # fmt: skip
    [device] = resource_slice("n1", [card], 1, driver_version="550.54")["spec"]["devices"]
    assert device == {
        "name": "gpu-1",
        "attributes": {
            "uuid": {"string": card.uuid},
            "model": {"string": "A100-SXM4-80GB"},
            "index": {"int": 1},
            "numaNode": {"int": 1},
            "nvlinkIsland": {"int": 1},  # its peers are not in the slice
            "nvlinkPeers": {"string": "0,3"},
            "driverVersion": {"version": "550.54.0"},
        },
        "allowMultipleAllocations": True,
        "capacity": {
            "memory": {
                "value": "81920Mi",
                "requestPolicy": {
                    "default": "81920Mi",
                    "validRange": {"min": "1Mi", "max": "81920Mi", "step": "1Mi"},
                },
            },
            "compute": {
                "value": "100",
                "requestPolicy": {
                    "default": "0",
                    "validRange": {"min": "0", "max": "100", "step": "1"},
                },
            },
            "slots": {"value": "8", "requestPolicy": {"default": "1", "validValues": ["1"]}},
        },
        "taints": [
            {"key": UNHEALTHY_TAINT, "value": "true", "effect": "NoSchedule"},
            {"key": CORDONED_TAINT, "value": "true", "effect": "NoSchedule"},
        ],
    }


def test_a_sick_card_is_tainted_not_dropped() -> None:
    cards = (CARDS[0], replace(CARDS[1], healthy=False))
    devices = resource_slice("n1", cards, 1)["spec"]["devices"]
    assert "taints" not in devices[0]
    assert devices[1]["taints"] == [
        {"key": UNHEALTHY_TAINT, "value": "true", "effect": "NoSchedule"}
    ]
    assert "driverVersion" not in devices[0]["attributes"]  # unknown: not published


@pytest.mark.parametrize(
    ("raw", "want"),
    [("535.104.05", "535.104.5"), ("550.54", "550.54.0"), ("470", "470.0.0"), ("n/a", None)],
)
def test_driver_versions_become_semver(raw: str, want: str | None) -> None:
    assert semver(raw) == want


def test_nvlink_islands_are_connected_components() -> None:
    cards = make_cards("n", 8, "V100M32", nvlink="cube-mesh")  # one island
    assert set(nvlink_islands(cards).values()) == {0}
    assert nvlink_islands(make_cards("n", 3, "T4")) == {0: 0, 1: 1, 2: 2}
    # Card 0 is not offered to claims: its pair, card 1, is an island of its own.
    assert nvlink_islands(CARDS[1:]) == {1: 1, 2: 2, 3: 2}


def test_claims_pool() -> None:
    assert claims_pool("all", range(4)) == {0, 1, 2, 3}
    assert claims_pool("none", range(4)) == frozenset()
    assert claims_pool("2,3", range(4)) == {2, 3}
    assert claims_pool("1-3", range(4)) == {1, 2, 3}
    assert claims_pool("0_2-3", range(4)) == {0, 2, 3}  # a label value cannot hold a comma
    with pytest.raises(SpecError, match=r"--claims-cards: names card 9"):
        claims_pool("1,9", range(4))
    rule = r"--claims-cards: must be all, none, or card indices and ranges"
    with pytest.raises(SpecError, match=rule):
        claims_pool("first", range(4))


def test_a_published_slice_reads_back_as_its_cards() -> None:
    cards = (CARDS[0], replace(CARDS[1], healthy=False, slots=4), replace(CARDS[2], cordoned=True))
    node, back = slice_cards(resource_slice("n1", reversed(cards), generation=3))
    assert node == "n1"

    def fields(c: Card) -> tuple[object, ...]:
        return (c.uuid, c.index, c.model, c.memory_mib, c.healthy, c.slots, c.cordoned)

    assert [fields(c) for c in back] == [fields(c) for c in cards]


def test_a_slices_node_is_its_node_name_or_else_its_pools_name() -> None:
    obj = resource_slice("n1", CARDS[:1], generation=1)
    del obj["spec"]["nodeName"]
    assert slice_cards(obj)[0] == obj["spec"]["pool"]["name"]
    for bad in ({"nodeName": 5}, {"nodeName": "", "pool": {"name": ""}}, {"pool": None}):
        edited = resource_slice("n1", CARDS[:1], generation=1)
        edited["spec"].pop("nodeName")
        edited["spec"].update(bad)
        with pytest.raises(SpecError, match=r"spec\.nodeName: must name the node"):
            slice_cards(edited)


def _device_1(edit: Callable[[dict[str, Any]], object]) -> Callable[[dict[str, Any]], object]:
    return lambda spec: edit(spec["devices"][1])


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_device_1(lambda d: d["attributes"].pop("uuid")),
         "spec.devices[1].attributes.uuid: is missing"),
        (_device_1(lambda d: d["capacity"]["memory"].update(value="lots")),
         "spec.devices[1].capacity.memory.value: must be a Kubernetes quantity such as 500m, "
         "2, 1.5, 512Mi, 1G or 1e3 (got 'lots')"),
        (_device_1(lambda d: d["attributes"]["index"].update(int="one")),
         "spec.devices[1].attributes.index.int: must be a whole number (got 'one')"),
        (_device_1(lambda d: d["attributes"]["index"].update(int=True)),
         "spec.devices[1].attributes.index.int: must be a whole number (got True)"),
        (_device_1(lambda d: d["capacity"]["slots"].update(value="1.5")),
         "spec.devices[1].capacity.slots.value: must be a whole number (got '1.5')"),
        (_device_1(lambda d: d["capacity"]["slots"].update(value="\u00b2")),
         "spec.devices[1].capacity.slots.value: must be a whole number (got '\u00b2')"),
        (lambda spec: spec["devices"].__setitem__(1, "gpu"),
         "spec.devices[1]: must be an object (got 'gpu')"),
        (lambda spec: spec.pop("nodeName") and spec.pop("pool"),
         "spec.nodeName: must name the node"),
    ],
    ids=["no-uuid", "bad-memory", "bad-index", "bool-index", "bad-slots", "superscript-slots",
         "not-object", "no-node"],
)  # fmt: skip
def test_a_slice_that_does_not_read_is_refused_naming_the_field(
    edit: Callable[[dict[str, Any]], object], message: str
) -> None:
    obj = resource_slice("n1", CARDS[:2], generation=1)
    edit(obj["spec"])
    with pytest.raises(SpecError) as refused:
        slice_cards(obj)
    assert str(refused.value) == message
    obj["spec"] = ["x"]
    with pytest.raises(SpecError, match=r"^spec: must be an object \(got \['x'\]\)$"):
        slice_cards(obj)


# --- an allocated claim ---------------------------------------------------------------


def _claim(
    results: list[dict[str, Any]], config: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    alloc: dict[str, Any] = {"devices": {"results": results}}
    if config is not None:
        alloc["devices"]["config"] = config
    return {
        "metadata": {"name": "c1", "namespace": "team", "uid": "uid-1"},
        "status": {"allocation": alloc},
    }


def _result(device: str, request: str = "gpu", **consumed: str) -> dict[str, Any]:
    out: dict[str, Any] = {"request": request, "driver": DRIVER, "pool": "n1", "device": device}
    if consumed:
        out["consumedCapacity"] = consumed
    return out


def _ours(parameters: dict[str, Any]) -> dict[str, Any]:
    """A configuration entry of this driver with these parameters, as written."""
    return {"opaque": {"driver": DRIVER, "parameters": parameters}}


def _config(
    policy: str, source: str = "FromClass", requests: list[str] | None = None
) -> dict[str, Any]:
    params = {"apiVersion": f"{DRIVER}/v1alpha1", "kind": "GpuConfig", "computePolicy": policy}
    out: dict[str, Any] = {"source": source, **_ours(params)}
    if requests is not None:
        out["requests"] = requests
    return out


def test_a_slice_claim_becomes_a_capped_assignment() -> None:
    claim = _claim([
        _result("gpu-2", memory="8Gi", compute="30", slots="1"),
        {"request": "nic", "driver": "other.example.com", "pool": "n1", "device": "x"},
    ])  # fmt: skip
    grant = claim_grant(claim, "n1", BY_NAME)
    assert (grant.uid, grant.namespace, grant.name) == ("uid-1", "team", "c1")
    assert [(d.request, d.device) for d in grant.devices] == [("gpu", "gpu-2")]
    [s] = grant.assignment.slices
    assert (s.uuid, s.memory_mib, s.cores_percent) == (CARDS[2].uuid, 8192, 30)
    assert grant.assignment.policy is ComputePolicy.FIXED_SHARE
    assert not grant.assignment.exclusive


def test_a_claim_with_no_capacity_is_a_whole_card() -> None:
    for consumed in ({}, {"memory": "81920Mi", "compute": "0", "slots": "1"}):
        grant = claim_grant(_claim([_result("gpu-0", **consumed)]), "n1", BY_NAME)
        assert grant.assignment.exclusive
        assert grant.assignment.slices[0].memory_mib == 81920
    # Whole only when every card is: a share of the first leaves both open to others.
    both = _claim([_result("gpu-0", "a", memory="1Gi"), _result("gpu-1", "b")])
    assert not claim_grant(both, "n1", BY_NAME).assignment.exclusive


def test_the_claims_config_wins_over_the_class() -> None:
    config = [_config("fixed-share"), _config("burst-share", source="FromClaim")]
    grant = claim_grant(_claim([_result("gpu-0", memory="1Gi")], config), "n1", BY_NAME)
    assert grant.assignment.policy is ComputePolicy.BURST_SHARE
    other = [_config("best-effort", requests=["other"])]
    grant = claim_grant(_claim([_result("gpu-0", memory="1Gi")], other), "n1", BY_NAME)
    assert grant.assignment.policy is ComputePolicy.FIXED_SHARE  # not for request "gpu"


def test_two_requests_on_one_card_add_up() -> None:
    claim = _claim([_result("gpu-1", "a", memory="1Gi", compute="10"),
                    _result("gpu-1", "b", memory="2Gi", compute="20")])  # fmt: skip
    grant = claim_grant(claim, "n1", BY_NAME)
    [s] = grant.assignment.slices
    assert (s.memory_mib, s.cores_percent) == (3072, 30)
    assert len(grant.devices) == 2


def test_two_requests_may_fill_a_card_to_100_percent_and_no_further() -> None:
    full = _claim([_result("gpu-1", "a", memory="1Gi", compute="60"),
                   _result("gpu-1", "b", memory="1Gi", compute="40")])  # fmt: skip
    assert claim_grant(full, "n1", BY_NAME).assignment.slices[0].cores_percent == 100
    over = _claim([_result("gpu-1", "a", memory="1Gi", compute="60"),
                   _result("gpu-1", "b", memory="1Gi", compute="41")])  # fmt: skip
    with pytest.raises(SpecError, match="must not take more than card"):
        claim_grant(over, "n1", BY_NAME)


def test_a_devices_share_id_is_kept_and_its_absence_is_none() -> None:
    claim = _claim([{**_result("gpu-1", "a", memory="1Gi"), "shareID": "7f3c"},
                    _result("gpu-2", "b", memory="1Gi")])  # fmt: skip
    devices = claim_grant(claim, "n1", BY_NAME).devices
    assert [(d.device, d.share_id) for d in devices] == [("gpu-1", "7f3c"), ("gpu-2", None)]


def test_allocated_pools_are_the_nodes_holding_this_drivers_devices() -> None:
    other = {"request": "nic", "driver": "nic.example.com", "pool": "n9", "device": "x"}
    claim = _claim([_result("gpu-0"), {**_result("gpu-1"), "pool": "n2"}, other, "junk"])
    assert allocated_pools(claim) == {"n1", "n2"}
    for unallocated in ({}, {"status": None}, {"status": {}}, {"status": {"allocation": None}},
                        {"status": {"allocation": {"devices": None}}}):  # fmt: skip
        assert allocated_pools(unallocated) == set()


def test_another_drivers_config_is_not_ours_to_read() -> None:
    theirs = {"opaque": {"driver": "nic.example.com", "parameters": {"speed": "fast"}}}
    config = [theirs, _config("burst-share", source="FromClaim")]
    grant = claim_grant(_claim([_result("gpu-0", memory="1Gi")], config), "n1", BY_NAME)
    assert grant.assignment.policy is ComputePolicy.BURST_SHARE


def test_a_node_that_offers_no_card_says_so() -> None:
    with pytest.raises(SpecError, match=r"must be a card this node offers \(none\)"):
        claim_grant(_claim([_result("gpu-0")]), "n1", {})


@pytest.mark.parametrize(
    ("consumed", "mib", "cores"),
    [
        ({"memory": "1Mi", "compute": "100"}, 1, 100),  # the ends of both ranges
        ({"memory": "1Gi"}, 1024, 0),  # no compute recorded: no cores reserved
    ],
)
def test_consumed_capacity_at_its_edges(consumed: dict[str, str], mib: int, cores: int) -> None:
    [s] = claim_grant(_claim([_result("gpu-0", **consumed)]), "n1", BY_NAME).assignment.slices
    assert (s.memory_mib, s.cores_percent) == (mib, cores)


DEVICES = "status.allocation.devices"
RESULT = f"{DEVICES}.results[0]"
PARAMS = f"{DEVICES}.config[0].opaque.parameters"


@pytest.mark.parametrize(
    ("claim", "message"),
    [
        (
            _claim([_result("gpu-0", memory="0")]),
            f"{RESULT}.consumedCapacity.memory: must be within 1..81920 MiB of the card (got '0')",
        ),
        (
            _claim([_result("gpu-0", compute="101")]),
            f"{RESULT}.consumedCapacity.compute: must be a whole percent within 0..100 (got '101')",
        ),
        (
            _claim(
                [_result("gpu-0", memory="1Gi")],
                [_ours({"apiVersion": f"{DRIVER}/v1alpha1", "kind": "NicConfig"})],
            ),
            f"{PARAMS}: "
            "must be apiVersion gpu.tessera.io/v1alpha1, kind GpuConfig"
            " (got 'gpu.tessera.io/v1alpha1/NicConfig')",
        ),
        (
            _claim(
                [_result("gpu-0", memory="1Gi")],
                [_ours({"apiVersion": f"{DRIVER}/v2", "kind": "GpuConfig"})],
            ),
            f"{PARAMS}: "
            "must be apiVersion gpu.tessera.io/v1alpha1, kind GpuConfig"
            " (got 'gpu.tessera.io/v2/GpuConfig')",
        ),
        (
            {"metadata": {"name": "c"}, "status": {}},
            "status.allocation: the claim is not allocated",
        ),
        (
            _claim([_result("gpu-9")]),
            f"{RESULT}.device: "
            "must be a card this node offers (gpu-0, gpu-1, gpu-2, gpu-3) (got 'gpu-9')",
        ),
        (
            _claim([_result("gpu-0", memory="200Gi")]),
            f"{RESULT}.consumedCapacity.memory: "
            "must be within 1..81920 MiB of the card (got '200Gi')",
        ),
        (
            _claim([_result("gpu-0", compute="2.5")]),
            f"{RESULT}.consumedCapacity.compute: must be a whole percent within 0..100 (got '2.5')",
        ),
        (
            _claim([_result("gpu-0", memory="lots")]),
            f"{RESULT}.consumedCapacity.memory: "
            "must be a Kubernetes quantity such as 500m, 2, 1.5, 512Mi, 1G or 1e3 (got 'lots')",
        ),
        (
            _claim([_result("gpu-0", compute="fast")]),
            f"{RESULT}.consumedCapacity.compute: "
            "must be a Kubernetes quantity such as 500m, 2, 1.5, 512Mi, 1G or 1e3 (got 'fast')",
        ),
        (
            _claim(
                [_result("gpu-0", "a", memory="1Gi"), _result("gpu-1", "b", memory="1Gi")],
                [_config("best-effort", requests=["a"])],
            ),
            f"{DEVICES}.config: "
            "must give every request of a claim on one node the same computePolicy"
            " (got ['best-effort', 'fixed-share'])",
        ),
        (
            _claim([_result("gpu-0", memory="1Gi")], [_config("turbo")]),
            f"{PARAMS}.computePolicy: "
            "must be one of fixed-share, burst-share, best-effort (got 'turbo')",
        ),
        (
            _claim(
                [_result("gpu-0", memory="1Gi")],
                [{"opaque": {"driver": DRIVER, "parameters": {"kind": "Gpu"}}}],
            ),
            f"{PARAMS}: "
            "must be apiVersion gpu.tessera.io/v1alpha1, kind GpuConfig (got 'None/Gpu')",
        ),
        (
            _claim(
                [_result("gpu-0", memory="1Gi")],
                [
                    {
                        "opaque": {
                            "driver": DRIVER,
                            "parameters": {
                                "apiVersion": f"{DRIVER}/v1alpha1",
                                "kind": "GpuConfig",
                                "memory": "1",
                            },
                        }
                    }
                ],
            ),
            f"{PARAMS}.memory: is not a field of GpuConfig",
        ),
        (
            _claim([{**_result("gpu-0"), "pool": "n2"}]),
            "status.allocation.devices.results: has no device of pool n1",
        ),
        (
            _claim([_result("gpu-0", "a", memory="60Gi"), _result("gpu-0", "b", memory="30Gi")]),
            f"{DEVICES}.results: "
            f"must not take more than card {CARDS[0].uuid} has (81920 MiB, 100 %)"
            " (got '92160 MiB, 0 %')",
        ),
    ],
)
def test_bad_allocations_are_refused_naming_the_field(claim: dict[str, Any], message: str) -> None:
    """The whole refusal: the field's full path, the rule, and the value refused."""
    with pytest.raises(SpecError) as refused:
        claim_grant(claim, "n1", BY_NAME)
    assert str(refused.value) == message


# --- the CDI spec ---------------------------------------------------------------------


def test_cdi_spec_carries_the_device_plugin_paths_edits(tmp_path: Path) -> None:
    grant = claim_grant(_claim([_result("gpu-2", memory="8Gi", compute="30")]), "n1", BY_NAME)
    edits = container_edits(grant.assignment, tmp_path / "claim", tmp_path / "lib",
                            Isolation.HOOK, Visibility.ENV, tmp_path / "mps",
                            alloc_id="claim-uid-1")  # fmt: skip
    spec = json.loads(cdi_spec("uid-1", edits))
    assert cdi_device_id("uid-1") == "gpu.tessera.io/claim=uid-1"
    assert spec["kind"] == "gpu.tessera.io/claim" and spec["cdiVersion"] == "0.6.0"
    [device] = spec["devices"]
    assert device["name"] == "uid-1"
    env = device["containerEdits"]["env"]
    assert f"NVIDIA_VISIBLE_DEVICES={CARDS[2].uuid}" in env
    mounts = {m["containerPath"]: m for m in device["containerEdits"]["mounts"]}
    assert mounts["/etc/tessera"]["hostPath"] == str(tmp_path / "claim" / "etc")
    assert "ro" in mounts["/etc/tessera"]["options"]  # the limits cannot be raised
    assert "ro" in mounts["/etc/ld.so.preload"]["options"]
    assert "rw" in mounts["/var/run/tessera/usage"]["options"]


def test_the_cdi_spec_is_written_as_docs_protocol_md_shows_it(tmp_path: Path) -> None:
    """Keys sorted, two-space indent, a newline at the end; each mount bound with
    nosuid and nodev, and only the usage folder writable."""
    grant = claim_grant(_claim([_result("gpu-2", memory="8Gi", compute="30")]), "n1", BY_NAME)
    edits = container_edits(grant.assignment, tmp_path / "claim", tmp_path / "lib",
                            Isolation.HOOK, Visibility.ENV, tmp_path / "mps",
                            alloc_id="claim-uid-1")  # fmt: skip
    text = cdi_spec("uid-1", edits)
    spec = json.loads(text)
    assert text == json.dumps(spec, indent=2, sort_keys=True) + "\n"
    assert text.startswith('{\n  "cdiVersion": "0.6.0",\n  "devices": [\n')
    mounts = spec["devices"][0]["containerEdits"]["mounts"]
    assert [(m["containerPath"], m["options"]) for m in mounts] == [
        ("/etc/tessera", ["ro", "nosuid", "nodev", "rbind"]),
        ("/var/run/tessera/usage", ["rw", "nosuid", "nodev", "rbind"]),
        ("/var/run/tessera/allowance", ["ro", "nosuid", "nodev", "rbind"]),
        ("/usr/local/tessera/lib", ["ro", "nosuid", "nodev", "rbind"]),
        ("/etc/ld.so.preload", ["ro", "nosuid", "nodev", "rbind"]),
    ]
