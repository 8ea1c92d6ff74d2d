"""A Pod spec (Kubernetes JSON form) read into a normalised ``PodRequest``.

``parse_pod`` is what the webhook and the extender call on a Pod as the API returns it
(camelCase). It returns None for a pod that asks for no GPU resource Tessera manages,
and raises ``SpecError`` -- naming the exact field and the rule -- for a pod that asks
for one badly. The user-facing rules and every default are in docs/api.md.

Errors: the first one found is raised, in a fixed order -- the pod's shape, then its
annotations, then each container in the order they start (``initContainers``, then
``containers``), each container's GPU resources before its CPU and memory, then the
rules that tie containers together.
"""

from __future__ import annotations

import enum
import functools
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from tessera.errors import SpecError
from tessera.model import annotations as keys
from tessera.model.names import PLACEMENT_POLICIES, ResourceNames
from tessera.model.quantity import cpu_milli, memory_mib, parse_quantity
from tessera.model.types import ComputePolicy, ContainerRequest, GpuRequest, PodRequest

__all__ = [
    "GPU_MANAGER_MEMORY_UNIT_MIB",
    "TERMINAL_PHASES",
    "Compat",
    "gpu_resource_names",
    "parse_pod",
]

GPU_MANAGER_MEMORY_UNIT_MIB = 256  # one tencent.com/vcuda-memory
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})  # a pod in these holds no cards
_PERCENT_RULE = "must be an integer between 1 and 100"
_UUID = re.compile(r"GPU-[0-9a-fA-F]+(?:-[0-9a-fA-F]+)*|MIG-[0-9A-Za-z][0-9A-Za-z/-]*")


@dataclass(frozen=True, slots=True)
class Compat:
    """Which foreign manifests are read as Tessera requests (both off by default)."""

    hami: bool = False
    gpu_manager: bool = False

    @classmethod
    def off(cls) -> Compat:
        return cls()

    @classmethod
    def all(cls) -> Compat:
        return cls(hami=True, gpu_manager=True)


_NO_COMPAT = Compat()
_DEFAULT_NAMES = ResourceNames()


class _Family(enum.Enum):
    TESSERA = "Tessera"
    HAMI = "HAMi"
    GPU_MANAGER = "GPU-manager"


_HAMI_RESOURCES = (
    keys.HAMI_GPU,
    keys.HAMI_GPU_MEMORY,
    keys.HAMI_GPU_MEMORY_PERCENT,
    keys.HAMI_GPU_CORES,
)
_GPU_MANAGER_RESOURCES = (keys.GPU_MANAGER_CORE, keys.GPU_MANAGER_MEMORY)


def gpu_resource_names(
    names: ResourceNames = _DEFAULT_NAMES, compat: Compat = _NO_COMPAT
) -> tuple[str, ...]:
    """The extended resources Tessera manages under ``compat`` (the extender's
    managedResources), Tessera's first, in a stable order."""
    out = list(names.all())
    if compat.hami:
        out += _HAMI_RESOURCES
    if compat.gpu_manager:
        out += _GPU_MANAGER_RESOURCES
    return tuple(out)


@functools.cache  # a process has one or two (names, compat): the webhook's, the extender's
def _families(names: ResourceNames, compat: Compat) -> Mapping[str, _Family]:
    out = dict.fromkeys(names.all(), _Family.TESSERA)
    if compat.hami:
        out.update(dict.fromkeys(_HAMI_RESOURCES, _Family.HAMI))
    if compat.gpu_manager:
        out.update(dict.fromkeys(_GPU_MANAGER_RESOURCES, _Family.GPU_MANAGER))
    return out


@functools.cache
def _domains(names: ResourceNames) -> frozenset[str]:
    """The prefixes of Tessera's resource names: another name under one is a mistake."""
    return frozenset(n.split("/", 1)[0] for n in names.all() if "/" in n)


# --- shape ------------------------------------------------------------------------


def _shown(value: object) -> object:
    """What an error shows of a bad value: scalars as they are, containers by type."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return type(value).__name__


def _object(value: object, field: str, *, optional: bool = False) -> Mapping[str, Any]:
    if value is None and optional:
        return {}
    if not isinstance(value, Mapping):
        raise SpecError(field, "must be an object", _shown(value))
    return value


@dataclass(frozen=True, slots=True)
class _Container:
    path: str  # e.g. spec.containers[1]
    name: str
    init: bool
    sidecar: bool  # an init container with restartPolicy: Always
    requests: Mapping[str, Any]
    limits: Mapping[str, Any]


def _resource_map(value: object, field: str) -> Mapping[str, Any]:
    out = _object(value, field, optional=True)
    for key in out:
        if not isinstance(key, str):
            raise SpecError(field, "must map resource names (strings) to quantities", _shown(key))
    return out


def _containers(spec: Mapping[str, Any]) -> list[_Container]:
    out: list[_Container] = []
    seen: dict[str, str] = {}
    for key, init in (("initContainers", True), ("containers", False)):
        raw = spec.get(key)
        if raw is None and init:
            continue
        if not isinstance(raw, list):
            raise SpecError(f"spec.{key}", "must be a list of containers", _shown(raw))
        for i, item in enumerate(raw):
            path = f"spec.{key}[{i}]"
            c = _object(item, path)
            name = c.get("name")
            if not isinstance(name, str) or not name:
                raise SpecError(f"{path}.name", "is required: a non-empty string", _shown(name))
            if name in seen:
                raise SpecError(f"{path}.name", f"must be unique in the pod ({seen[name]})", name)
            seen[name] = path
            resources = _object(c.get("resources"), f"{path}.resources", optional=True)
            out.append(
                _Container(
                    path=path,
                    name=name,
                    init=init,
                    sidecar=init and c.get("restartPolicy") == "Always",
                    requests=_resource_map(resources.get("requests"), f"{path}.resources.requests"),
                    limits=_resource_map(resources.get("limits"), f"{path}.resources.limits"),
                )
            )
    return out


# --- annotations ------------------------------------------------------------------


def _annotation_field(key: str) -> str:
    return f"metadata.annotations[{key}]"


def _text(annotations: Mapping[str, Any], key: str) -> str | None:
    value = annotations.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise SpecError(_annotation_field(key), "must be a string", _shown(value))
    return value


def _list(annotations: Mapping[str, Any], key: str, *, uuids: bool) -> frozenset[str] | None:
    text = _text(annotations, key)
    if text is None:
        return None
    field = _annotation_field(key)
    items = [item.strip() for item in text.split(",")]
    if not all(items):
        raise SpecError(field, "must be a comma-separated list without empty items", text)
    seen: set[str] = set()
    for item in items:
        if item in seen:
            raise SpecError(field, f"must not repeat an item ({item!r} appears twice)", text)
        seen.add(item)
        if uuids and not _UUID.fullmatch(item):
            raise SpecError(
                field, f"must list GPU UUIDs (GPU-<hex> or MIG-...); {item!r} is not one", text
            )
    return frozenset(items)


def _pick_list(
    annotations: Mapping[str, Any], own: str, foreign: str | None, *, uuids: bool
) -> tuple[frozenset[str], str]:
    """The list under Tessera's key ``own``, or a compat key ``foreign`` (not both)."""
    mine = _list(annotations, own, uuids=uuids)
    theirs = _list(annotations, foreign, uuids=uuids) if foreign else None
    if mine is not None and theirs is not None:
        assert foreign is not None
        raise SpecError(_annotation_field(foreign), f"cannot be combined with {own}; use one")
    if theirs is not None:
        assert foreign is not None
        return theirs, foreign
    return mine or frozenset(), own


@dataclass(frozen=True, slots=True)
class _PodWide:
    models: frozenset[str]
    models_exclude: frozenset[str]
    uuids: frozenset[str]
    uuids_exclude: frozenset[str]
    policy: ComputePolicy | None
    placement: str | None
    core_limit: int | None  # tencent.com/vcuda-core-limit


def _pod_wide(annotations: Mapping[str, Any], compat: Compat) -> _PodWide:
    hami = compat.hami
    models, models_key = _pick_list(
        annotations, keys.GPU_MODEL, keys.HAMI_GPU_TYPE if hami else None, uuids=False
    )
    models_exclude, models_exclude_key = _pick_list(
        annotations,
        keys.GPU_MODEL_EXCLUDE,
        keys.HAMI_GPU_TYPE_EXCLUDE if hami else None,
        uuids=False,
    )
    uuids, uuids_key = _pick_list(
        annotations, keys.GPU_UUID, keys.HAMI_GPU_UUID if hami else None, uuids=True
    )
    uuids_exclude, uuids_exclude_key = _pick_list(
        annotations, keys.GPU_UUID_EXCLUDE, keys.HAMI_GPU_UUID_EXCLUDE if hami else None, uuids=True
    )
    for inc, inc_key, exc, exc_key in (
        (models, models_key, models_exclude, models_exclude_key),
        (uuids, uuids_key, uuids_exclude, uuids_exclude_key),
    ):
        both = sorted(inc & exc)
        if both:
            raise SpecError(
                _annotation_field(exc_key),
                f"must not refuse {both[0]!r}, which {inc_key} allows",
                annotations[exc_key],
            )

    policy: ComputePolicy | None = None
    text = _text(annotations, keys.COMPUTE_POLICY)
    if text is not None:
        try:
            policy = ComputePolicy(text.strip())
        except ValueError:
            allowed = ", ".join(p.value for p in ComputePolicy)
            raise SpecError(
                _annotation_field(keys.COMPUTE_POLICY), f"must be one of {allowed}", text
            ) from None

    placement = _text(annotations, keys.PLACEMENT)
    if placement is not None:
        parts = placement.strip().split("/")
        if len(parts) > 2 or not all(p in PLACEMENT_POLICIES for p in parts):
            raise SpecError(
                _annotation_field(keys.PLACEMENT),
                f"must be one of {', '.join(PLACEMENT_POLICIES)}, or NODE/CARD with two of "
                "them (e.g. spread/binpack)",
                placement,
            )
        placement = "/".join(parts)

    core_limit: int | None = None
    if compat.gpu_manager:
        text = _text(annotations, keys.GPU_MANAGER_CORE_LIMIT)
        if text is not None:
            stripped = text.strip()
            if not stripped.isdigit() or not 1 <= int(stripped) <= 100:
                raise SpecError(_annotation_field(keys.GPU_MANAGER_CORE_LIMIT), _PERCENT_RULE, text)
            core_limit = int(stripped)

    return _PodWide(models, models_exclude, uuids, uuids_exclude, policy, placement, core_limit)


# --- GPU resources of one container -----------------------------------------------


@dataclass(frozen=True, slots=True)
class _Amount:
    value: int
    field: str
    raw: object
    binary: bool  # written with Ki, Mi, Gi, ...


def _amount(c: _Container, name: str) -> _Amount:
    """One extended resource, by Kubernetes' rules: whole, positive, limits = requests."""
    lim_field = f"{c.path}.resources.limits[{name}]"
    req_field = f"{c.path}.resources.requests[{name}]"
    if name not in c.limits:
        raise SpecError(
            req_field,
            "must also be set in limits: Kubernetes requires limits for extended resources",
            _shown(c.requests[name]),
        )
    raw = c.limits[name]
    q = parse_quantity(raw, lim_field)
    if name in c.requests:
        req_raw = c.requests[name]
        if parse_quantity(req_raw, req_field).value != q.value:
            raise SpecError(
                req_field,
                f"must equal limits[{name}] ({_shown(raw)}): extended resources are not "
                "overcommitted",
                _shown(req_raw),
            )
    if not q.is_integer:
        raise SpecError(lim_field, "must be a whole number (extended resources are)", _shown(raw))
    if q.value <= 0:
        raise SpecError(
            lim_field, "must be greater than 0 (leave the resource out instead)", _shown(raw)
        )
    return _Amount(int(q.value), lim_field, _shown(raw), q.binary)


def _percent(a: _Amount | None) -> int | None:
    if a is not None and a.value > 100:
        raise SpecError(a.field, _PERCENT_RULE, a.raw)
    return None if a is None else a.value


def _plain(a: _Amount | None, unit: str) -> int | None:
    if a is not None and a.binary:
        raise SpecError(
            a.field, f"counts {unit}: write a plain number (e.g. 8192), not Ki/Mi/Gi", a.raw
        )
    return None if a is None else a.value


@dataclass(frozen=True, slots=True)
class _Slice:
    """A container's GPU need before the pod-wide constraints are applied."""

    count: int
    memory_mib: int | None = None
    memory_percent: int | None = None
    cores: int = 0
    exclusive: bool = False
    policy: ComputePolicy = ComputePolicy.FIXED_SHARE
    cores_name: str = ""  # the resource that would give it a compute share


def _default_policy(cores: int) -> ComputePolicy:
    return ComputePolicy.FIXED_SHARE if cores else ComputePolicy.BEST_EFFORT


def _tessera(a: dict[str, _Amount], names: ResourceNames) -> _Slice:
    gpu, mem, pct, cores = (a.get(n) for n in names.all())
    if mem is not None and pct is not None:
        raise SpecError(
            pct.field, f"cannot be combined with {names.memory}: give MiB or percent", pct.raw
        )
    mib = _plain(mem, "MiB")
    percent = _percent(pct)
    share = _percent(cores)
    count = gpu.value if gpu else 1
    if mib is None and percent is None and share is None:
        return _Slice(count, exclusive=True)
    if mib is None and percent is None:
        percent = share  # a 30% compute slice gets 30% of memory: every tenant has a cap
    share = share or 0
    return _Slice(count, mib, percent, share, policy=_default_policy(share), cores_name=names.cores)


def _hami(a: dict[str, _Amount]) -> _Slice:
    gpu, mem, pct, cores = (a.get(n) for n in _HAMI_RESOURCES)
    if mem is not None and pct is not None:
        raise SpecError(
            pct.field, f"cannot be combined with {keys.HAMI_GPU_MEMORY}: give one", pct.raw
        )
    mib = _plain(mem, "MiB")
    percent = _percent(pct)
    share = _percent(cores) or 0
    count = gpu.value if gpu else 1
    if mib is None and percent is None and cores is None:
        return _Slice(count, exclusive=True)  # HAMi: all memory of each card
    if mib is None and percent is None:
        percent = 100  # HAMi's default memory is the whole card
    return _Slice(
        count, mib, percent, share, policy=_default_policy(share), cores_name=keys.HAMI_GPU_CORES
    )


def _gpu_manager(c: _Container, a: dict[str, _Amount], core_limit: int | None) -> _Slice:
    core, mem = (a.get(n) for n in _GPU_MANAGER_RESOURCES)
    units = _plain(mem, f"{GPU_MANAGER_MEMORY_UNIT_MIB} MiB units")
    if core is None:
        raise SpecError(
            f"{c.path}.resources.limits[{keys.GPU_MANAGER_CORE}]",
            f"is required with {keys.GPU_MANAGER_MEMORY}",
        )
    if core.value >= 100:
        if core.value % 100:
            raise SpecError(
                core.field,
                "must be below 100 (a share of one card) or a multiple of 100 (whole cards); "
                "a fractional share over several cards is not allowed",
                core.raw,
            )
        return _Slice(core.value // 100, exclusive=True)
    policy = ComputePolicy.BURST_SHARE
    if core_limit is not None:
        if core_limit < core.value:
            raise SpecError(
                _annotation_field(keys.GPU_MANAGER_CORE_LIMIT),
                f"must be at least {keys.GPU_MANAGER_CORE} of container {c.name!r} ({core.value})",
                str(core_limit),
            )
        if core_limit == core.value:
            policy = ComputePolicy.FIXED_SHARE
    return _Slice(
        1,
        memory_mib=None if units is None else units * GPU_MANAGER_MEMORY_UNIT_MIB,
        memory_percent=core.value if units is None else None,
        cores=core.value,
        policy=policy,
        cores_name=keys.GPU_MANAGER_CORE,
    )


def _gpu(
    c: _Container,
    families: Mapping[str, _Family],
    domains: frozenset[str],
    names: ResourceNames,
    pod: _PodWide,
) -> tuple[_Family, _Slice] | None:
    present = [n for n in families if n in c.limits or n in c.requests]
    for n in sorted(set(c.limits) | set(c.requests)):
        if n not in families and n.split("/", 1)[0] in domains:
            known = ", ".join(names.all())
            where = "limits" if n in c.limits else "requests"
            raise SpecError(
                f"{c.path}.resources.{where}[{n}]", f"is not a Tessera resource ({known})"
            )
    if not present:
        return None
    first = families[present[0]]
    for n in present:
        if families[n] is not first:
            raise SpecError(
                f"{c.path}.resources.limits[{n}]",
                f"cannot be mixed with {present[0]} in one container: use {first.value} "
                f"or {families[n].value} names, not both",
            )
    amounts = {n: _amount(c, n) for n in present}
    if first is _Family.TESSERA:
        return first, _tessera(amounts, names)
    if first is _Family.HAMI:
        return first, _hami(amounts)
    return first, _gpu_manager(c, amounts, pod.core_limit)


def _request(c: _Container, s: _Slice, pod: _PodWide) -> GpuRequest:
    policy = ComputePolicy.FIXED_SHARE
    if not s.exclusive:
        policy = s.policy
        if pod.policy is not None:
            if pod.policy is not ComputePolicy.BEST_EFFORT and s.cores == 0:
                raise SpecError(
                    _annotation_field(keys.COMPUTE_POLICY),
                    f"{pod.policy.value} needs a compute share: set {s.cores_name} on "
                    f"container {c.name!r}",
                    pod.policy.value,
                )
            policy = pod.policy
    return GpuRequest(
        count=s.count,
        memory_mib=s.memory_mib,
        memory_percent=s.memory_percent,
        cores_percent=s.cores,
        exclusive=s.exclusive,
        models=pod.models,
        models_exclude=pod.models_exclude,
        uuids=pod.uuids,
        uuids_exclude=pod.uuids_exclude,
        policy=policy,
    )


# --- CPU and memory ---------------------------------------------------------------


def _cpu_memory(c: _Container) -> tuple[int, int]:
    """The container's CPU (milli) and memory (MiB) requests; a limit alone is the request."""
    out = []
    for resource, convert in (("cpu", cpu_milli), ("memory", memory_mib)):
        if resource in c.requests:
            out.append(convert(c.requests[resource], f"{c.path}.resources.requests[{resource}]"))
        elif resource in c.limits:
            out.append(convert(c.limits[resource], f"{c.path}.resources.limits[{resource}]"))
        else:
            out.append(0)
    return out[0], out[1]


def _pod_need(needs: list[tuple[_Container, tuple[int, int]]]) -> list[int]:
    """kubelet's rule: max(any init container with the sidecars started before it,
    app containers plus all sidecars), per resource."""
    app = [0, 0]
    sidecars = [0, 0]
    init_peak = [0, 0]
    for c, need in needs:
        for k in (0, 1):
            if c.sidecar:
                app[k] += need[k]
                sidecars[k] += need[k]
                init_peak[k] = max(init_peak[k], sidecars[k])
            elif c.init:
                init_peak[k] = max(init_peak[k], need[k] + sidecars[k])
            else:
                app[k] += need[k]
    return [max(app[k], init_peak[k]) for k in (0, 1)]


# --- the pod ----------------------------------------------------------------------


# The annotations the parser reads. It is handed only these, so the memo below, which
# keys on them, cannot miss one that a later change starts reading.
_READ_ANNOTATIONS = (
    keys.GPU_MODEL,
    keys.GPU_MODEL_EXCLUDE,
    keys.GPU_UUID,
    keys.GPU_UUID_EXCLUDE,
    keys.COMPUTE_POLICY,
    keys.PLACEMENT,
    keys.HAMI_GPU_TYPE,
    keys.HAMI_GPU_TYPE_EXCLUDE,
    keys.HAMI_GPU_UUID,
    keys.HAMI_GPU_UUID_EXCLUDE,
    keys.GPU_MANAGER_CORE_LIMIT,
)


class _Memo:
    """Parsed requests by everything the parser read but the pod's identity.

    Pods come from a few templates: a re-list of 200,000 pods holds a handful of distinct
    requests, and a hit costs a quarter of a parse. Refusals are not kept (each is parsed
    again, so its error is raised fresh). When pods do not repeat (each with sizes of its
    own), a miss costs a third more than a parse: a memo that filled with fewer hits than
    entries rests for ``rest`` parses, then tries again.
    """

    def __init__(self, size: int = 4096, rest: int = 65536) -> None:
        self.size, self.rest = size, rest
        self.entries: dict[tuple[Any, ...], PodRequest] = {}
        self.hits = 0
        self.resting = 0

    def awake(self) -> bool:
        if self.resting:
            self.resting -= 1
            return False
        return True

    def get(self, key: tuple[Any, ...]) -> PodRequest | None:
        found = self.entries.get(key)  # TypeError for an unhashable value
        if found is not None:
            self.hits += 1
        return found

    def put(self, key: tuple[Any, ...], request: PodRequest) -> None:
        if len(self.entries) >= self.size:
            if self.hits < self.size:
                self.resting = self.rest
            self.entries.clear()
            self.hits = 0
        self.entries[key] = request


_MEMO = _Memo()


def _memo_key(
    names: ResourceNames,
    compat: Compat,
    annotations: Mapping[str, Any],
    containers: list[_Container],
    overhead: object,
) -> tuple[Any, ...]:
    """What the parse of a GPU pod depends on. Each value's type goes with it: 1, 1.0 and
    True are equal keys, but only the first two are quantities."""
    parts: list[Any] = [names, compat, *_items(annotations), *_items(overhead)]
    for c in containers:
        parts += (c.path, c.name, c.sidecar, *_items(c.limits), *_items(c.requests))
    return tuple(parts)


def _items(m: object) -> tuple[object, object]:
    if not isinstance(m, Mapping):
        return m, type(m)
    return tuple(m.items()), tuple(map(type, m.values()))


def parse_pod(
    pod: Mapping[str, Any],
    *,
    names: ResourceNames = _DEFAULT_NAMES,
    compat: Compat = _NO_COMPAT,
) -> PodRequest | None:
    """The normalised request of ``pod`` (Kubernetes JSON form), or None when it asks
    for no GPU resource Tessera manages. Raises ``SpecError`` on the first broken rule."""
    pod = _object(pod, "pod")
    metadata = _object(pod.get("metadata"), "metadata", optional=True)
    spec = _object(pod.get("spec"), "spec")
    annotations = _object(metadata.get("annotations"), "metadata.annotations", optional=True)
    meta: dict[str, str] = {}
    for key in ("namespace", "name", "uid"):
        value = metadata.get(key, "")
        if not isinstance(value, str):
            raise SpecError(f"metadata.{key}", "must be a string", _shown(value))
        meta[key] = value
    containers = _containers(spec)

    families = _families(names, compat)
    domains = _domains(names)

    def ours(c: _Container) -> bool:
        return any(n in families or n.split("/", 1)[0] in domains for n in (*c.limits, *c.requests))

    if not any(ours(c) for c in containers):
        return None

    read = {k: annotations[k] for k in _READ_ANNOTATIONS if k in annotations}
    overhead = spec.get("overhead")
    memo_key = _memo_key(names, compat, read, containers, overhead) if _MEMO.awake() else None
    if memo_key is not None:
        try:
            known = _MEMO.get(memo_key)
        except TypeError:  # a value that cannot be hashed (a list): the parse refuses it
            memo_key, known = None, None
        if known is not None:
            namespace = sys.intern(meta["namespace"])  # repeated by every pod of it
            return replace(known, namespace=namespace, name=meta["name"], uid=meta["uid"])
    request = _request_of(containers, read, overhead, families, domains, names, compat, meta)
    if memo_key is not None:
        _MEMO.put(memo_key, request)
    return request


def _request_of(
    containers: list[_Container],
    annotations: Mapping[str, Any],
    overhead_field: object,
    families: Mapping[str, _Family],
    domains: frozenset[str],
    names: ResourceNames,
    compat: Compat,
    meta: dict[str, str],
) -> PodRequest:
    """The request of a GPU pod whose namespace, name and uid are ``meta``'s."""
    wide = _pod_wide(annotations, compat)
    out: list[ContainerRequest] = []
    needs: list[tuple[_Container, tuple[int, int]]] = []
    compat_user: tuple[_Family, _Container] | None = None
    # Once a GPU sidecar has started, a later init container runs beside it, not alone:
    # counted as an app container (its slice adds to the card's rather than sharing the
    # app containers' room), since the footprint has no place for "the sidecars before".
    beside_gpu_sidecar = False
    for c in containers:
        found = _gpu(c, families, domains, names, wide)
        gpu: GpuRequest | None = None
        if found is not None:
            family, s = found
            if family is not _Family.TESSERA:
                if compat_user is not None and compat_user[0] is not family:
                    other, first = compat_user
                    name = next(n for n in families if families[n] is family and n in c.limits)
                    raise SpecError(
                        f"{c.path}.resources.limits[{name}]",
                        f"cannot be used in a pod whose container {first.name!r} uses "
                        f"{other.value} names: one compatibility family per pod",
                    )
                compat_user = compat_user or (family, c)
            gpu = _request(c, s, wide)
        needs.append((c, _cpu_memory(c)))
        alone = c.init and not c.sidecar and not beside_gpu_sidecar
        out.append(ContainerRequest(name=c.name, gpu=gpu, init=alone))
        beside_gpu_sidecar = beside_gpu_sidecar or (c.sidecar and gpu is not None)

    cpu, mem = _pod_need(needs)
    overhead = _object(overhead_field, "spec.overhead", optional=True)
    if "cpu" in overhead:
        cpu += cpu_milli(overhead["cpu"], "spec.overhead[cpu]")
    if "memory" in overhead:
        mem += memory_mib(overhead["memory"], "spec.overhead[memory]")
    return PodRequest(
        namespace=sys.intern(meta["namespace"]),
        name=meta["name"],
        containers=tuple(out),
        cpu_milli=cpu,
        memory_mib=mem,
        placement=wide.placement,
        uid=meta["uid"],
    )
