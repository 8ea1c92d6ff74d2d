"""The GpuQuota resource (``tessera.io/v1alpha1``), parsed: limits per pool of card models.

A namespace's ``GpuQuota`` objects each list ``spec.limits``; a limit names a pool of
models (``models``: card model names as the node agent reports them, or ``"*"`` for any
model) and caps, over every pod of the namespace that holds cards of those models, any
of: device memory (``memoryMiB``), compute (``coresPercent``, percent-points: 100 is one
whole card's compute) and whole cards (``cards``: exclusive cards). A model is in at most
one limit of a namespace (the CRD's CEL rules and this parser refuse overlaps), so every
slice counts against one limit at most. docs/api.md has the resource, docs/protocol.md
the fields byte for byte.

The CRD refuses malformed objects at the API server; this parser repeats its rules so
that an object written past them (an older CRD, a direct etcd write) is refused here
with the same field-and-rule message instead of being half-applied.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tessera.errors import SpecError

__all__ = ["ANY_MODEL", "GROUP_VERSION", "KIND", "Limit", "Quota", "parse_quota"]

GROUP_VERSION = "tessera.io/v1alpha1"
KIND = "GpuQuota"
ANY_MODEL = "*"
MAX_LIMITS = 16  # the CRD's maxItems, here and below: one set of rules
MAX_MODELS = 16
MAX_MODEL_NAME = 128
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True, slots=True)
class Limit:
    """One pool of models and its caps (None: not capped)."""

    name: str
    models: frozenset[str]
    memory_mib: int | None = None
    cores_percent: int | None = None
    cards: int | None = None

    def covers(self, model: str) -> bool:
        return ANY_MODEL in self.models or model in self.models


@dataclass(frozen=True, slots=True)
class Quota:
    """One GpuQuota object."""

    namespace: str
    name: str
    limits: tuple[Limit, ...]
    resource_version: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _int(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(field, "must be an integer", value)
    if value < 0:
        raise SpecError(field, "must be >= 0", value)
    return value


def _limit(raw: Any, i: int) -> Limit:
    at = f"spec.limits[{i}]"
    if not isinstance(raw, Mapping):
        raise SpecError(at, "must be an object", raw)
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME.match(name) or len(name) > 63:
        raise SpecError(f"{at}.name", "must be a DNS label (a-z, 0-9, '-'; at most 63)", name)
    models = raw.get("models")
    if not isinstance(models, list) or not models:
        raise SpecError(f"{at}.models", 'must list at least one card model (or "*")', models)
    if len(models) > MAX_MODELS:
        raise SpecError(f"{at}.models", f"at most {MAX_MODELS} models", len(models))
    for j, m in enumerate(models):
        if not isinstance(m, str) or not m.strip() or len(m) > MAX_MODEL_NAME:
            rule = f"must be a non-empty model name of at most {MAX_MODEL_NAME} characters"
            raise SpecError(f"{at}.models[{j}]", rule, m)
        if m in models[:j]:
            raise SpecError(f"{at}.models[{j}]", "must not repeat a model (a set)", m)
    caps = {
        key: _int(raw[key], f"{at}.{key}")
        for key in ("memoryMiB", "coresPercent", "cards")
        if key in raw and raw[key] is not None
    }
    if not caps:
        raise SpecError(at, "must cap at least one of memoryMiB, coresPercent, cards")
    unknown = sorted(set(raw) - {"name", "models", "memoryMiB", "coresPercent", "cards"})
    if unknown:
        raise SpecError(f"{at}.{unknown[0]}", "is not a field of a limit")
    return Limit(
        name=name,
        models=frozenset(models),
        memory_mib=caps.get("memoryMiB"),
        cores_percent=caps.get("coresPercent"),
        cards=caps.get("cards"),
    )


def parse_quota(obj: Mapping[str, Any]) -> Quota:
    """A GpuQuota object (Kubernetes JSON form); SpecError names the field and the rule."""
    meta = obj.get("metadata") or {}
    namespace, name = meta.get("namespace"), meta.get("name")
    if not isinstance(namespace, str) or not namespace:
        raise SpecError("metadata.namespace", "a GpuQuota is namespaced", namespace)
    if not isinstance(name, str) or not name:
        raise SpecError("metadata.name", "must be set", name)
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise SpecError("spec", "must be an object", spec)
    raw = spec.get("limits")
    if not isinstance(raw, list) or not raw:
        raise SpecError("spec.limits", "must list at least one limit", raw)
    if len(raw) > MAX_LIMITS:
        raise SpecError("spec.limits", f"at most {MAX_LIMITS} limits", len(raw))
    limits = tuple(_limit(x, i) for i, x in enumerate(raw))
    for i, lim in enumerate(limits):
        if ANY_MODEL in lim.models and len(limits) > 1:
            raise SpecError(
                f"spec.limits[{i}].models",
                f'"{ANY_MODEL}" (any model) is allowed only in a quota of one limit',
            )
        for j in range(i):
            other = limits[j]
            if other.name == lim.name:
                raise SpecError(f"spec.limits[{i}].name", "must be unique in the quota", lim.name)
            shared = lim.models & other.models
            if shared:
                raise SpecError(
                    f"spec.limits[{i}].models",
                    f"a model may be in one limit only; {sorted(shared)[0]!r} is also in "
                    f"limit {other.name!r}",
                )
    return Quota(namespace, name, limits, str(meta.get("resourceVersion") or ""))
