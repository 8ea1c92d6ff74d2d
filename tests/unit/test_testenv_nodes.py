"""node_manifest: what a kwok GPU node advertises, and the inventory it carries."""

from __future__ import annotations

from tessera.model.annotations import INVENTORY, decode_inventory
from tessera.model.clusterspec import make_cards, synthetic_nodes
from tessera.model.names import ResourceNames
from tessera.model.types import Card, NodeInventory
from tessera.testenv.nodes import KWOK_ANNOTATION, MODEL_LABEL, label_value, node_manifest


def test_gpu_node_advertises_totals_of_its_cards() -> None:
    (inv,) = synthetic_nodes(1, 8, "V100M32", cpu_milli=64000, memory_mib=262144)
    m = node_manifest(inv)
    cap = m["status"]["capacity"]
    assert cap == m["status"]["allocatable"]
    assert cap["cpu"] == "64000m"
    assert cap["memory"] == "262144Mi"
    assert cap["tessera.io/gpu"] == "8"
    assert cap["tessera.io/gpu-memory"] == str(8 * 32768)
    assert cap["tessera.io/gpu-memory-percent"] == "800"
    assert cap["tessera.io/gpu-cores"] == "800"
    assert m["metadata"]["labels"][MODEL_LABEL] == "V100M32"
    assert m["metadata"]["annotations"][KWOK_ANNOTATION[0]] == KWOK_ANNOTATION[1]


def test_inventory_annotation_round_trips_through_the_core_codec() -> None:
    (inv,) = synthetic_nodes(1, 4, "A100", prefix="rt")
    text = node_manifest(inv)["metadata"]["annotations"][INVENTORY]
    assert decode_inventory(inv.name, text, inv.cpu_milli, inv.memory_mib) == inv


def test_unhealthy_cards_are_not_advertised_but_stay_in_the_inventory() -> None:
    cards = make_cards("n", 2, "T4")
    sick = (
        cards[0],
        Card(**{**{s: getattr(cards[1], s) for s in Card.__slots__}, "healthy": False}),
    )
    m = node_manifest(NodeInventory("n", sick, 1000, 1024))
    assert m["status"]["capacity"]["tessera.io/gpu"] == "1"
    assert m["status"]["capacity"]["tessera.io/gpu-memory"] == "15360"
    assert '"healthy":false' in m["metadata"]["annotations"][INVENTORY]


def test_cpu_node_has_no_gpu_resources_label_or_inventory() -> None:
    m = node_manifest(NodeInventory("cpu", (), 8000, 16384))
    assert not [k for k in m["status"]["capacity"] if k.startswith("tessera.io/")]
    assert MODEL_LABEL not in m["metadata"]["labels"]
    assert INVENTORY not in m["metadata"]["annotations"]


def test_resource_names_are_configurable() -> None:
    names = ResourceNames(
        gpu="example.com/gpu",
        memory="example.com/mem",
        memory_percent="example.com/pct",
        cores="example.com/cores",
    )
    (inv,) = synthetic_nodes(1, 2, "T4")
    cap = node_manifest(inv, names)["status"]["capacity"]
    assert cap["example.com/gpu"] == "2"
    assert "tessera.io/gpu" not in cap


def test_mixed_models_get_no_model_label() -> None:
    cards = (*make_cards("m", 1, "T4"), Card("GPU-x", 1, "A10", 24576))
    assert MODEL_LABEL not in node_manifest(NodeInventory("m", cards, 1, 1))["metadata"]["labels"]


def test_label_value_is_made_valid() -> None:
    assert label_value("A100-SXM4-80GB") == "A100-SXM4-80GB"
    assert label_value("Tesla V100 (32GB)") == "Tesla_V100__32GB"
    assert len(label_value("x" * 100)) == 63
    assert label_value("--") == ""
