"""The extender protocol's bodies (kube-scheduler's extender/v1 types): what is read from
them, what a malformed one is told (the field and the rule), and what is written back."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tessera.scheduler.wire import (
    WireError,
    decode_binding_args,
    decode_extender_args,
    encode_binding_result,
    encode_filter_result,
    encode_priorities,
)

POD = {"metadata": {"name": "p", "namespace": "ns"}, "spec": {}}


def _body(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def test_filter_args_name_the_nodes_by_name_or_as_objects() -> None:
    args = decode_extender_args(_body({"Pod": POD, "NodeNames": ["a", "b"]}))
    assert (args.pod, args.node_names) == (POD, ["a", "b"])
    nodes = {"items": [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}]}
    assert decode_extender_args(_body({"Pod": POD, "Nodes": nodes})).node_names == ["a", "b"]
    # NodeNames wins when both come (nodeCacheCapable sends names only).
    both = decode_extender_args(_body({"Pod": POD, "NodeNames": ["c"], "Nodes": nodes}))
    assert both.node_names == ["c"]
    assert decode_extender_args(_body({"Pod": POD, "NodeNames": []})).node_names == []


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{", "ExtenderArgs: body is not valid JSON: "),
        (b"\xff", "ExtenderArgs: body is not valid JSON: "),
        (b"[]", "ExtenderArgs: body must be a JSON object"),
        (_body({"NodeNames": ["a"]}), "ExtenderArgs.Pod: must be a Pod object with metadata"),
        (_body({"Pod": {"spec": {}}, "NodeNames": ["a"]}), "ExtenderArgs.Pod: must be a Pod"),
        (_body({"Pod": {"metadata": {}}, "NodeNames": []}),
         "ExtenderArgs.Pod.metadata.name: must be a non-empty string"),
        (_body({"Pod": {"metadata": {"name": ""}}, "NodeNames": []}),
         "ExtenderArgs.Pod.metadata.name: must be a non-empty string"),
        (_body({"Pod": POD}), "ExtenderArgs: NodeNames (a list of names) or Nodes is required"),
        (_body({"Pod": POD, "Nodes": {"items": None}}), "ExtenderArgs: NodeNames (a list of"),
        (_body({"Pod": POD, "Nodes": {"items": [{"metadata": {"name": "a"}}, {}]}}),
         "ExtenderArgs.Nodes.items[1].metadata.name: must be a string"),
        (_body({"Pod": POD, "Nodes": {"items": ["a"]}}),
         "ExtenderArgs.Nodes.items[0].metadata.name: must be a string"),
        (_body({"Pod": POD, "NodeNames": "a"}), "ExtenderArgs.NodeNames: must be a list of str"),
        (_body({"Pod": POD, "NodeNames": ["a", 3]}), "ExtenderArgs.NodeNames: must be a list of"),
    ],
)  # fmt: skip
def test_malformed_filter_args_name_the_field_and_the_rule(body: bytes, message: str) -> None:
    with pytest.raises(WireError) as err:
        decode_extender_args(body)
    assert str(err.value).startswith(message), str(err.value)


def test_binding_args_are_read_and_an_empty_pod_uid_is_allowed() -> None:
    full = {"PodName": "p", "PodNamespace": "ns", "PodUID": "u1", "Node": "n1"}
    args = decode_binding_args(_body(full))
    assert (args.pod_name, args.pod_namespace, args.pod_uid, args.node) == ("p", "ns", "u1", "n1")
    assert args.key == "ns/p"
    assert decode_binding_args(_body({**full, "PodUID": ""})).pod_uid == ""


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"PodName": ""}, "ExtenderBindingArgs.PodName: must be a non-empty string"),
        ({"PodNamespace": None}, "ExtenderBindingArgs.PodNamespace: must be a non-empty string"),
        ({"Node": 7}, "ExtenderBindingArgs.Node: must be a non-empty string"),
        ({"PodUID": None}, "ExtenderBindingArgs.PodUID: must be a string"),
    ],
)
def test_malformed_binding_args_name_the_field(change: dict[str, Any], message: str) -> None:
    full = {"PodName": "p", "PodNamespace": "ns", "PodUID": "u1", "Node": "n1", **change}
    with pytest.raises(WireError, match=f"^{message}$".replace(".", r"\.")):
        decode_binding_args(_body(full))
    with pytest.raises(WireError, match="ExtenderBindingArgs: body must be a JSON object"):
        decode_binding_args(b"3")


def test_answers_use_the_protocols_field_names() -> None:
    out = json.loads(encode_filter_result(["a"], {"b": "no card"}, {"c": "cordoned"}, "e"))
    assert out == {"NodeNames": ["a"], "FailedNodes": {"b": "no card"},
                   "FailedAndUnresolvableNodes": {"c": "cordoned"}, "Error": "e"}  # fmt: skip
    # No error unless one is given: kube-scheduler takes any Error as the extender failing.
    assert encode_filter_result(["a"], {}) == (
        b'{"NodeNames":["a"],"FailedNodes":{},"FailedAndUnresolvableNodes":{},"Error":""}'
    )
    assert json.loads(encode_priorities({"a": 10, "b": 0})) == [
        {"Host": "a", "Score": 10}, {"Host": "b", "Score": 0}]  # fmt: skip
    assert encode_binding_result() == b'{"Error":""}'
    assert json.loads(encode_binding_result("gone")) == {"Error": "gone"}
