"""The kube-scheduler extender protocol (k8s.io/kube-scheduler/extender/v1) on the wire.

Go's encoding/json writes struct fields under their declared names, so the JSON keys are
``Pod``, ``Nodes``, ``NodeNames``, ``FailedNodes``, ``FailedAndUnresolvableNodes``,
``Error``, ``Host``, ``Score``, ``PodName``, ``PodNamespace``, ``PodUID``, ``Node``.
With ``nodeCacheCapable: true`` the scheduler sends ``NodeNames`` and expects
``NodeNames`` back; ``Nodes`` (whole Node objects) is accepted too, by name.

Decoding refuses anything malformed with ``WireError`` (the HTTP layer answers 400);
it never lets a KeyError or TypeError through.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tessera.errors import TesseraError

__all__ = [
    "MAX_EXTENDER_PRIORITY",
    "BindingArgs",
    "ExtenderArgs",
    "WireError",
    "decode_binding_args",
    "decode_extender_args",
    "encode_binding_result",
    "encode_filter_result",
    "encode_priorities",
]

MAX_EXTENDER_PRIORITY = 10  # extenderv1.MaxExtenderPriority


class WireError(TesseraError, ValueError):
    """A request body that is not what the extender protocol says; answered with 400."""


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    pod: dict[str, Any]
    node_names: list[str]


@dataclass(frozen=True, slots=True)
class BindingArgs:
    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str

    @property
    def key(self) -> str:
        return f"{self.pod_namespace}/{self.pod_name}"


def _object(body: bytes, what: str) -> Mapping[str, Any]:
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise WireError(f"{what}: body is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise WireError(f"{what}: body must be a JSON object")
    return obj


def decode_extender_args(body: bytes) -> ExtenderArgs:
    """ExtenderArgs (filter and prioritize)."""
    obj = _object(body, "ExtenderArgs")
    pod = obj.get("Pod")
    if not isinstance(pod, dict) or not isinstance(pod.get("metadata"), dict):
        raise WireError("ExtenderArgs.Pod: must be a Pod object with metadata")
    meta = pod["metadata"]
    if not isinstance(meta.get("name"), str) or not meta["name"]:
        raise WireError("ExtenderArgs.Pod.metadata.name: must be a non-empty string")
    names = obj.get("NodeNames")
    if names is None:
        nodes = obj.get("Nodes")
        if not isinstance(nodes, dict) or not isinstance(nodes.get("items"), list):
            raise WireError("ExtenderArgs: NodeNames (a list of names) or Nodes is required")
        names = []
        for i, node in enumerate(nodes["items"]):
            meta = node.get("metadata") if isinstance(node, dict) else None
            name = meta.get("name") if isinstance(meta, dict) else None
            if not isinstance(name, str):
                raise WireError(f"ExtenderArgs.Nodes.items[{i}].metadata.name: must be a string")
            names.append(name)
    if not isinstance(names, list) or not _all_strings(names):
        raise WireError("ExtenderArgs.NodeNames: must be a list of strings")
    return ExtenderArgs(pod=pod, node_names=names)


def _all_strings(values: list[Any]) -> bool:
    # str.join type-checks in C: 17 us for 5,000 names, against 170 us for a generator
    # of isinstance calls -- this runs on every filter.
    try:
        "".join(values)
    except TypeError:
        return False
    return True


def decode_binding_args(body: bytes) -> BindingArgs:
    """ExtenderBindingArgs."""
    obj = _object(body, "ExtenderBindingArgs")
    values: dict[str, str] = {}
    for key in ("PodName", "PodNamespace", "PodUID", "Node"):
        value = obj.get(key)
        if not isinstance(value, str):
            rule = "a string" if key == "PodUID" else "a non-empty string"
            raise WireError(f"ExtenderBindingArgs.{key}: must be {rule}")
        if not value and key != "PodUID":  # kube-scheduler may send no UID
            raise WireError(f"ExtenderBindingArgs.{key}: must be a non-empty string")
        values[key] = value
    return BindingArgs(values["PodName"], values["PodNamespace"], values["PodUID"], values["Node"])


def encode_filter_result(
    node_names: list[str],
    failed: Mapping[str, str],
    unresolvable: Mapping[str, str] | None = None,
    error: str = "",
) -> bytes:
    return json.dumps(
        {
            "NodeNames": node_names,
            "FailedNodes": dict(failed),
            "FailedAndUnresolvableNodes": dict(unresolvable or {}),
            "Error": error,
        },
        separators=(",", ":"),
    ).encode()


def encode_priorities(scores: Mapping[str, int]) -> bytes:
    return json.dumps(
        [{"Host": host, "Score": score} for host, score in scores.items()], separators=(",", ":")
    ).encode()


def encode_binding_result(error: str = "") -> bytes:
    return json.dumps({"Error": error}, separators=(",", ":")).encode()
