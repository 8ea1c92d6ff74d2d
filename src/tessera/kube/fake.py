"""``FakeKube``: an in-memory API server speaking the ``KubeApi`` contract (port.py).

For unit tests of everything above the port. It keeps what the real server guarantees
and Tessera relies on: a cluster-wide resourceVersion; ``Conflict`` on a stale
resourceVersion or a PUT's, Binding's or eviction's UID precondition, and 422 for a
patch that changes ``metadata.uid`` (each in the real server's words, the resource named
as it names it: ``leases.coordination.k8s.io``); a PUT without a resourceVersion taken
or refused per kind, and a PUT of a missing Lease or Event creating it; a create with no
name refused (422); a UID and creation time set by the server, whatever the body says; a
Node's allocatable defaulted to its capacity; a budget's or custom resource's
``generation`` kept by the server; ``Conflict`` when binding a bound,
terminating or gated pod, and a binding's PodScheduled condition; a pod's deletion as a
MODIFIED (``deletionTimestamp``) before its DELETED; watches that deliver every change
after a resourceVersion, in order (with a selector, an object coming into it ADDED and
leaving it DELETED), and ``Gone`` once that version has left the (bounded) history, or,
from no version, an ADDED for each object there is; paged lists (``limit``) read from
one snapshot, their continue tokens ``Gone`` on the same terms and a malformed one
refused (400); label selectors in every form ``labels.Parse`` reads, and one it cannot
read refused (400), as is a field selector on a label the real server does not index; a
namespaced object written with no namespace in the call, or naming another than the
call's, refused (405, 400); a written body whose ``apiVersion`` or ``kind`` is not the
resource's refused (400; absent, they are the resource's, but a custom resource's body
must name both); a created object's status the
server's own, not the body's (Pods Pending, and so on), where the kind has a status
subresource -- ``seed`` writes one as a test's cluster would hold it.
``fail_next`` injects an error into the next call of an operation, the way a flaky server
would. What it does not keep: namespaces (the real server refuses a write into one that
does not exist, 404) and a deleted pod's grace period (it goes at once, as if its
kubelet had stopped it; ``graceful_evictions`` keeps an evicted one terminating).
tests/e2e/test_kube_fake_vs_real.py sends the same calls to both and compares.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from tessera.kube.errors import MANY_BUDGETS, ApiError, Conflict, Gone, NotFound, error_from_status
from tessera.kube.kinds import (
    EVENTS,
    GPUQUOTAS,
    LEASES,
    NAMESPACES,
    NODES,
    POD_DISRUPTION_BUDGETS,
    PODS,
    RESOURCE_CLAIMS,
    Kind,
)
from tessera.kube.port import ListResult, Obj, WatchEvent
from tessera.kube.selectors import parse_label_selector, selects
from tessera.model.quantity import parse_quantity

__all__ = ["FakeKube"]

_Key = tuple[str, str, str]  # plural, namespace ("" if cluster-scoped), name
_Items = list[Obj]  # (inside FakeKube, ``list`` is its method)


# Kinds with a status subresource: a write to the object itself leaves the status as
# stored, as the API server's update strategies do (GpuQuota: its CRD's subresources).
WITH_STATUS = frozenset({GPUQUOTAS, NAMESPACES, NODES, POD_DISRUPTION_BUDGETS, PODS,
                         RESOURCE_CLAIMS})  # fmt: skip
# ...and of those, the kinds whose create sets the status itself (a Node keeps the status
# kubelet creates it with).
STATUS_SET_ON_CREATE = WITH_STATUS - {NODES}
# The kinds whose update strategy refuses a PUT without metadata.resourceVersion (the
# others take it as "whatever is stored"), and those whose PUT of a missing name creates
# it (AllowUnconditionalUpdate, AllowCreateOnUpdate; a custom resource allows neither).
CONDITIONAL_UPDATE = frozenset({GPUQUOTAS, LEASES, POD_DISRUPTION_BUDGETS})
CREATE_ON_UPDATE = frozenset({EVENTS, LEASES})
CUSTOM = frozenset({GPUQUOTAS})  # served from a CRD: a body must name its type
# The kinds whose metadata.generation the server keeps (their controllers report the
# generation they have observed).
GENERATED = frozenset({GPUQUOTAS, POD_DISRUPTION_BUDGETS})


def _resource(kind: Kind) -> str:
    """The resource as the API server names it in its messages: ``pods``,
    ``leases.coordination.k8s.io``."""
    return f"{kind.plural}.{kind.group}" if kind.group else kind.plural


def _type(kind: Kind) -> str:
    """The type as a validation message names it: ``Pod``, ``Lease.coordination.k8s.io``."""
    return f"{kind.kind}.{kind.group}" if kind.group else kind.kind


def _utc(after_s: float = 0) -> str:
    """A time as the API server writes it, to the second: now, or ``after_s`` from now."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + after_s))


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


_BINARY_SUFFIXES = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_DECIMAL_SUFFIXES = ("", "k", "M", "G", "T", "P", "E")


def canonical_quantity(text: str) -> str:
    """A quantity as the API server stores it (apimachinery ``Quantity.String``), for the
    integer and milli values Tessera writes: a binary suffix stays binary at the largest
    unit that divides it (``40960Mi`` -> ``40Gi``), below 1024 it turns decimal, and a
    decimal one takes the largest power of 1000 (``1000`` -> ``1k``)."""
    q = parse_quantity(text, "quantity")
    v = q.value
    if v.denominator != 1:
        milli = v * 1000
        return f"{milli}m" if milli.denominator == 1 else text
    n, unit = int(v), 0
    if q.binary and abs(n) >= 1024:
        while unit < 6 and n % 1024 == 0:
            n, unit = n // 1024, unit + 1
        return f"{n}{_BINARY_SUFFIXES[unit]}"
    while unit < 6 and n != 0 and n % 1000 == 0:
        n, unit = n // 1000, unit + 1
    return f"{n}{_DECIMAL_SUFFIXES[unit]}"


def _canonical_quantities(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _canonical_quantities(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_canonical_quantities(v) for v in value]
    return canonical_quantity(value) if isinstance(value, str) else value


Selector = Callable[[Obj], bool]  # what a list or watch selects

# The field labels the API server lets a list or watch select on, per resource (v1.36:
# pkg/apis/core/v1/conversion.go, pkg/apis/resource/v1/conversion.go); every other
# resource, custom ones included, has the metadata two only.
_META_FIELDS = frozenset({"metadata.name", "metadata.namespace"})
_FIELDS = {
    "pods": _META_FIELDS | {
        "spec.nodeName", "spec.restartPolicy", "spec.schedulerName",
        "spec.serviceAccountName", "spec.hostNetwork", "status.phase", "status.podIP",
        "status.podIPs", "status.nominatedNodeName",
    },
    "nodes": frozenset({"metadata.name", "spec.unschedulable"}),
    "events": _META_FIELDS | {
        "involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
        "involvedObject.uid", "involvedObject.apiVersion", "involvedObject.resourceVersion",
        "involvedObject.fieldPath", "reason", "reportingComponent", "source", "type",
    },
    "resourceslices": frozenset({"metadata.name", "spec.nodeName", "spec.driver"}),
}  # fmt: skip


def _field_terms(field_selector: str | None) -> Iterator[tuple[str, str, bool]]:
    """(label, value, negated) for each term of a field selector (``a=b,c==d,e!=f``)."""
    for term in filter(None, (field_selector or "").split(",")):
        for op in ("!=", "==", "="):  # the longest first: "a==b" is not "a" = "=b"
            if op in term:
                break
        label, _, value = term.partition(op)
        yield label, value, op == "!="


def _selector(kind: Kind, label_selector: str | None, field_selector: str | None) -> Selector:
    """What a list or watch selects; 400 for a selector the API server refuses (a label
    requirement it cannot parse, a field it does not index)."""
    try:
        labels = parse_label_selector(label_selector or "")
    except ValueError as exc:
        raise ApiError(400, "BadRequest", str(exc)) from None
    fields = list(_field_terms(field_selector))
    for label, _, _ in fields:
        if label not in _FIELDS.get(kind.plural, _META_FIELDS):
            raise ApiError(400, "BadRequest", f"field label not supported: {label}")

    def selected(obj: Obj) -> bool:
        if not labels(obj.get("metadata", {}).get("labels") or {}):
            return False
        for k, v, negate in fields:
            cur: Any = obj
            for part in k.split("."):
                cur = cur.get(part, "") if isinstance(cur, dict) else ""
            if (str(cur) == v) == negate:
                return False
        return True

    return selected


def _binding_refusal(pod: Obj) -> str:
    """Why the API server refuses to bind ``pod``, or "" (pkg/registry/core/pod/storage,
    ``setPodNodeAndMetadata``, v1.36)."""
    name, spec = pod["metadata"]["name"], pod.get("spec") or {}
    if pod["metadata"].get("deletionTimestamp"):
        return f"pod {name} is being deleted, cannot be assigned to a host"
    if spec.get("nodeName"):
        return f'pod {name} is already assigned to node "{spec["nodeName"]}"'
    if spec.get("schedulingGates"):
        return f"pod {name} has non-empty .spec.schedulingGates"
    return ""


def _as_selected(
    type_: str, obj: Obj, before: Obj | None, wanted: Callable[[Obj], bool]
) -> WatchEvent | None:
    """A change as a watch with a selector sees it (the watch cache's
    ``convertToWatchEvent``): an object that comes into the selection is ADDED, one that
    leaves it DELETED (its state before, at the change's resourceVersion), one that
    stays MODIFIED; a change outside the selection is not sent."""
    now = type_ != "DELETED" and wanted(obj)
    was = before is not None and wanted(before)
    if now:
        return WatchEvent(type="MODIFIED" if was else "ADDED", object=copy.deepcopy(obj))
    if not was or before is None:
        return None
    if type_ == "DELETED":
        return WatchEvent(type="DELETED", object=copy.deepcopy(obj))
    left = copy.deepcopy(before)
    left["metadata"]["resourceVersion"] = obj["metadata"]["resourceVersion"]
    return WatchEvent(type="DELETED", object=left)


def _uid_refusal(kind: Kind, stored: Obj, uid: str) -> str:
    """The API server's words for a write whose UID precondition (a PUT's metadata.uid, a
    Binding's) fails: its storage layer's, wrapped in the Conflict."""
    meta = stored["metadata"]
    where = "/".join(p for p in (kind.plural, meta.get("namespace"), meta["name"]) if p)
    return (f'Operation cannot be fulfilled on {_resource(kind)} "{meta["name"]}": StorageError: '
            f"invalid object, Code: 4, Key: /registry/{where}, ResourceVersion: 0, "
            f"AdditionalErrorMsg: Precondition failed: UID in precondition: {uid}, UID in "
            f"object meta: {meta['uid']}")  # fmt: skip


def _set_scheduled(pod: Obj) -> None:
    """The condition a binding sets: PodScheduled True, replacing the scheduler's False
    (its reason and message go); the transition time moves only when the status does."""
    conditions = pod.setdefault("status", {}).setdefault("conditions", [])
    old = next((c for c in conditions if c.get("type") == "PodScheduled"), None)
    now = _utc()
    new = {"type": "PodScheduled", "status": "True", "lastProbeTime": None,
           "lastTransitionTime": now}  # fmt: skip
    if old is None:
        conditions.append(new)
        return
    if old.get("status") == "True":
        new["lastTransitionTime"] = old.get("lastTransitionTime")
    conditions[conditions.index(old)] = new


class FakeKube:
    def __init__(self, history: int = 10_000) -> None:
        self._lock = threading.Condition()
        self._objects: dict[_Key, Obj] = {}
        self._rv = 1  # as etcd: a list never answers "0", which a watch reads as "any"
        # (resourceVersion, plural, event type, the object, its state before or None)
        self._history: deque[tuple[int, str, str, Obj, Obj | None]] = deque(maxlen=history)
        self._last: dict[_Key, Obj] = {}  # each object's last recorded state
        # The paged lists: snapshot id -> (its resourceVersion, its items)
        self._snapshots: dict[int, tuple[int, _Items]] = {}
        self._snapshot_ids = itertools.count(1)
        self.graceful_evictions = False  # evict: terminating until deleted (see evict)
        self._failures: dict[str, list[ApiError]] = {}
        self._lost_answers: dict[str, list[ApiError]] = {}
        self._closed = False
        self._watches_held = False
        self.calls: list[tuple[str, str]] = []  # (operation, plural/name), for assertions
        # Resources this server does not serve (a CRD not installed, an API group not
        # enabled): every call on them is NotFound, as the real server's 404.
        self.unserved: set[str] = set()

    # --- test controls ----------------------------------------------------------------

    def fail_next(self, operation: str, error: ApiError) -> None:
        """Make the next call of ``operation`` ("bind", "merge_patch", ...) raise ``error``."""
        with self._lock:
            self._failures.setdefault(operation, []).append(error)

    def lose_answer_of_next(self, operation: str, error: ApiError) -> None:
        """Make the next call of ``operation`` do its write, then raise ``error``: the
        request landed but its answer was lost (a timeout, a reset connection)."""
        with self._lock:
            self._lost_answers.setdefault(operation, []).append(error)

    def _check_lost_answer(self, operation: str) -> None:
        pending = self._lost_answers.get(operation)
        if pending:
            raise pending.pop(0)

    def expire_history(self) -> None:
        """Forget all watch history: every open or new watch gets ``Gone``."""
        with self._lock:
            self._history.clear()
            self._rv += 1
            self._lock.notify_all()

    @contextlib.contextmanager
    def hold_watches(self) -> Iterator[None]:
        """Deliver no watch event until the block ends (a slow watch: writes land, and
        the watchers see them later, in order)."""
        with self._lock:
            self._watches_held = True
        try:
            yield
        finally:
            with self._lock:
                self._watches_held = False
                self._lock.notify_all()

    def close(self) -> None:
        """End every open watch."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()

    def _check_failure(self, operation: str, kind: Kind | None = None) -> None:
        if kind is not None and kind.plural in self.unserved:
            raise NotFound(404, "NotFound", "the server could not find the requested resource")
        queue = self._failures.get(operation)
        if queue:
            raise queue.pop(0)

    # --- helpers ------------------------------------------------------------------------

    @staticmethod
    def _key(kind: Kind, name: str, namespace: str | None) -> _Key:
        return (kind.plural, (namespace or "") if kind.namespaced else "", name)

    def _record(self, kind: Kind, type_: str, obj: Obj) -> None:
        meta = obj["metadata"]
        key = self._key(kind, meta["name"], meta.get("namespace"))
        now = copy.deepcopy(obj)
        # The history's copies are never changed: the state before is the last one kept.
        before = self._last.pop(key, None)
        if type_ != "DELETED":
            self._last[key] = now
        self._history.append((self._rv, kind.plural, type_, now, before))
        self._lock.notify_all()

    @staticmethod
    def _fresh_status(kind: Kind, obj: Obj) -> None:
        """A created object's status is the server's, not the body's: the create
        strategies of Pods (Pending), Namespaces (Active), PodDisruptionBudgets,
        ResourceClaims and CRDs with a status subresource drop what the body carries.
        A Node keeps its status (kubelet creates its Node with one)."""
        if kind not in STATUS_SET_ON_CREATE:
            return
        obj.pop("status", None)
        if kind is PODS:
            obj["status"] = {"phase": "Pending"}
        elif kind is NAMESPACES:
            obj["status"] = {"phase": "Active"}

    @staticmethod
    def _default(kind: Kind, obj: Obj) -> None:
        """What the server's defaulting changes in a written object: a Node's status
        without ``allocatable`` gets its ``capacity`` as allocatable (core/v1
        SetDefaults_NodeStatus); in a ResourceSlice, a device taint without ``timeAdded``
        gets the time of the write, to the second (Kubernetes
        pkg/apis/resource/v1/defaults.go), and capacity quantities are stored in
        canonical form (``40960Mi`` as ``40Gi``)."""
        status = obj.get("status") if kind is NODES else None
        if isinstance(status, dict) and status.get("capacity") and "allocatable" not in status:
            status["allocatable"] = copy.deepcopy(status["capacity"])
        if kind.plural != "resourceslices":
            return
        now = _utc()
        for dev in (obj.get("spec") or {}).get("devices") or []:
            for taint in dev.get("taints") or []:
                taint.setdefault("timeAdded", now)
            if "capacity" in dev:
                dev["capacity"] = _canonical_quantities(dev["capacity"])

    def _stamp(self, obj: Obj) -> None:
        self._rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self._rv)

    # --- the port -------------------------------------------------------------------

    def list(
        self,
        kind: Kind,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
    ) -> ListResult:
        with self._lock:
            self.calls.append(("list", kind.plural))
            self._check_failure("list", kind)
            selected = _selector(kind, label_selector, field_selector)
            if continue_token:
                snapshot, offset = self._continued(continue_token)
            else:
                items = [
                    copy.deepcopy(o)
                    for (plural, ns, _), o in self._objects.items()
                    if plural == kind.plural
                    and (namespace is None or ns == namespace)
                    and selected(o)
                ]
                if not limit or len(items) <= limit:
                    return ListResult(items=items, resource_version=str(self._rv))
                # The pages are read from one snapshot, as etcd serves them at the
                # revision of the first until that revision is compacted.
                for old in [k for k, (rv, _) in self._snapshots.items() if self._compacted(rv)]:
                    del self._snapshots[old]  # abandoned lists' snapshots
                snapshot, offset = next(self._snapshot_ids), 0
                self._snapshots[snapshot] = (self._rv, items)
            rv, items = self._snapshots[snapshot]
            end = offset + limit if limit else len(items)
            token = f"{snapshot}.{end}" if end < len(items) else ""
            if not token:
                del self._snapshots[snapshot]  # its last page is served
            return ListResult(items[offset:end], str(rv), continue_token=token)

    def _continued(self, token: str) -> tuple[int, int]:
        """The snapshot and offset a continue token names (lock held)."""
        snapshot, _, offset = token.partition(".")
        if not (snapshot.isdigit() and offset.isdigit()) or int(snapshot) not in self._snapshots:
            raise ApiError(400, "BadRequest", f"continue key is not valid: {token!r}")
        if self._compacted(self._snapshots[int(snapshot)][0]):
            del self._snapshots[int(snapshot)]
            raise Gone(410, "Expired", "the provided continue parameter is too old; list again")
        return int(snapshot), int(offset)

    def _compacted(self, rv: int) -> bool:
        """Whether changes since ``rv`` have left the history (lock held): a watch from
        it, or a page of a list read at it, gets ``Gone``."""
        oldest = self._history[0][0] if self._history else self._rv + 1
        return rv < self._rv and oldest > rv + 1

    def watch(
        self,
        kind: Kind,
        resource_version: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_s: int = 300,
    ) -> Iterator[WatchEvent]:
        deadline = time.monotonic() + timeout_s
        with self._lock:
            self._check_failure("watch", kind)
            selected = _selector(kind, label_selector, field_selector)

            def wanted(o: Obj) -> bool:
                ns = o.get("metadata", {}).get("namespace")
                return (namespace is None or ns == namespace) and selected(o)

            if resource_version in ("", "0"):
                # No version to start from: the server starts at its latest, with a
                # synthetic ADDED for each object there is; it does not replay history.
                since = self._rv
                there = [o for (plural, _, _), o in self._objects.items() if plural == kind.plural]
                there.sort(key=lambda o: int(o["metadata"]["resourceVersion"]))
                initial = [copy.deepcopy(o) for o in there if wanted(o)]
            else:
                since, initial = int(resource_version), []
        for o in initial:
            yield WatchEvent(type="ADDED", object=o)
        while True:
            with self._lock:
                if self._closed:
                    return
                if self._compacted(since):
                    raise Gone(410, "Expired", f"too old resource version: {since}")
                batch = [
                    (rv, t, o, before)
                    for rv, plural, t, o, before in self._history
                    if rv > since and plural == kind.plural
                ]
                if not batch or self._watches_held:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return
                    self._lock.wait(min(left, 0.5))
                    continue
            for rv, t, o, before in batch:
                since = rv
                seen = _as_selected(t, o, before, wanted)
                if seen is not None:
                    yield seen

    def get(self, kind: Kind, name: str, namespace: str | None = None) -> Obj:
        with self._lock:
            self._check_failure("get", kind)
            self.calls.append(("get", f"{kind.plural}/{name}"))
            obj = self._objects.get(self._key(kind, name, namespace))
            if obj is None:
                raise NotFound(404, "NotFound", f'{_resource(kind)} "{name}" not found')
            return copy.deepcopy(obj)

    def create(self, kind: Kind, body: Obj, namespace: str | None = None) -> Obj:
        with self._lock:
            self.calls.append(("create", kind.plural))
            self._check_failure("create", kind)
            self._check_type(kind, body)
            obj = copy.deepcopy(body)
            meta = obj.setdefault("metadata", {})
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
            if not meta.get("name"):
                raise ApiError(422, "Invalid", f'{_type(kind)} "" is invalid: metadata.name: '
                               "Required value: name or generateName is required")  # fmt: skip
            if kind.namespaced:
                meta["namespace"] = self._namespace_of(kind, namespace, meta)
            key = self._key(kind, meta["name"], meta.get("namespace"))
            if key in self._objects:
                raise Conflict(409, "AlreadyExists",
                               f'{_resource(kind)} "{meta["name"]}" already exists')  # fmt: skip
            return self._insert(kind, key, obj)

    def _insert(self, kind: Kind, key: _Key, obj: Obj) -> Obj:
        """Store a new object (lock held), with what the server sets on a create."""
        meta = obj["metadata"]
        # The server's to set, whatever the body says (apiserver's BeforeCreate).
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _utc()
        self._fresh_status(kind, obj)
        self._default(kind, obj)
        self._generation(kind, obj, None)
        self._stamp(obj)
        self._objects[key] = obj
        self._record(kind, "ADDED", obj)
        return copy.deepcopy(obj)

    @staticmethod
    def _generation(kind: Kind, obj: Obj, stored: Obj | None) -> None:
        """``metadata.generation`` is the server's, whatever a writer sends: 1 at
        create, one more for each write that changes the spec (the update strategies of
        PodDisruptionBudgets and of custom resources with a status subresource)."""
        if kind not in GENERATED:
            return
        generation = 1 if stored is None else int(stored["metadata"].get("generation", 1))
        if stored is not None and obj.get("spec") != stored.get("spec"):
            generation += 1
        obj["metadata"]["generation"] = generation

    def seed(self, kind: Kind, body: Obj, namespace: str | None = None) -> Obj:
        """``body`` as the cluster would hold it, status included: a create, then the
        status written through its subresource, as a controller or kubelet would."""
        created = self.create(kind, body, namespace)
        if "status" not in body or kind not in STATUS_SET_ON_CREATE:
            return created
        meta = created["metadata"]
        return self.merge_patch(kind, meta["name"], {"status": body["status"]},
                                meta.get("namespace"), subresource="status")  # fmt: skip

    @staticmethod
    def _check_type(kind: Kind, body: Obj) -> None:
        """The body of a create or replace names the resource's own type, if any: the
        server takes the path's when it names none, refuses another version (apiserver
        endpoints/handlers create.go and update.go) and fails to decode a kind that is
        not the resource's (400 both). A custom resource's body must name both: the
        server cannot decode one that does not (400)."""
        version, name = body.get("apiVersion"), body.get("kind")
        if kind in CUSTOM and not (version and name):
            missing = "Kind" if not name else "apiVersion"
            raise ApiError(400, "BadRequest", f"the object provided is unrecognized (must be of "
                           f"type {kind.kind}): Object '{missing}' is missing")  # fmt: skip
        if version and version != kind.api_version:
            raise ApiError(400, "BadRequest", f"the API version in the data ({version}) does "
                           f"not match the expected API version ({kind.api_version})")  # fmt: skip
        if name and name != kind.kind:
            raise ApiError(400, "BadRequest", f'{name} in version "{kind.api_version}" cannot '
                           f"be handled as a {kind.kind}: no kind {name!r} is registered "
                           f"for {kind.plural}")  # fmt: skip

    @staticmethod
    def _namespace_of(kind: Kind, namespace: str | None, meta: dict[str, Any]) -> str:
        """The namespace a write of a namespaced object goes to, refused as the API
        server refuses it: no namespace in the path is the all-namespaces collection,
        which takes no writes (405), and the object may not name another (400)."""
        if not namespace:
            raise ApiError(405, "MethodNotAllowed",
                           f"the server does not allow this method on the requested "
                           f"resource ({kind.plural} written with no namespace)")  # fmt: skip
        if meta.get("namespace") not in (None, "", namespace):
            raise ApiError(400, "BadRequest", "the namespace of the provided object does not "
                           "match the namespace sent on the request")  # fmt: skip
        return namespace

    def _precondition(
        self, kind: Kind, stored: Obj, meta: dict[str, Any], patch: bool = False
    ) -> None:
        name = stored["metadata"]["name"]
        rv = meta.get("resourceVersion")
        if rv is not None and rv != stored["metadata"]["resourceVersion"]:
            raise Conflict(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {_resource(kind)} "{name}": the object has '
                "been modified; please apply your changes to the latest version and try again",
            )
        uid = meta.get("uid")
        if uid is not None and uid != stored["metadata"]["uid"]:
            if patch:  # a patch's UID is a change of an immutable field (422), not a check
                raise ApiError(422, "Invalid", f'{_type(kind)} "{name}" is invalid: metadata.uid: '
                               f'Invalid value: "{uid}": field is immutable')  # fmt: skip
            raise Conflict(409, "Conflict", _uid_refusal(kind, stored, uid))

    def replace(self, kind: Kind, body: Obj, namespace: str | None = None) -> Obj:
        with self._lock:
            self.calls.append(("replace", kind.plural))
            self._check_failure("replace", kind)
            self._check_type(kind, body)
            meta = body.get("metadata", {})
            if kind.namespaced:
                namespace = self._namespace_of(kind, namespace, meta)
            key = self._key(kind, meta.get("name", ""), namespace)
            stored = self._objects.get(key)
            if stored is None and kind in CREATE_ON_UPDATE:
                obj = copy.deepcopy(body)
                if kind.namespaced:
                    obj["metadata"]["namespace"] = namespace
                return self._insert(kind, key, obj)
            if stored is None:
                raise NotFound(404, "NotFound", f'{_resource(kind)} "{meta.get("name")}" not found')
            if meta.get("resourceVersion") is None and kind in CONDITIONAL_UPDATE:
                raise ApiError(422, "Invalid", f'{_resource(kind)} "{meta.get("name")}" is '
                               "invalid: metadata.resourceVersion: Invalid value: 0: must be "
                               "specified for an update")  # fmt: skip
            self._precondition(kind, stored, meta)
            obj = copy.deepcopy(body)
            obj["metadata"]["uid"] = stored["metadata"]["uid"]
            obj["metadata"]["namespace"] = stored["metadata"].get("namespace")
            if kind in WITH_STATUS:  # a status is written through its subresource only
                obj.pop("status", None)
                if "status" in stored:
                    obj["status"] = copy.deepcopy(stored["status"])
            self._default(kind, obj)
            self._generation(kind, obj, stored)
            self._stamp(obj)
            self._objects[key] = obj
            self._record(kind, "MODIFIED", obj)
            return copy.deepcopy(obj)

    def merge_patch(
        self,
        kind: Kind,
        name: str,
        patch: Obj,
        namespace: str | None = None,
        subresource: str = "",
    ) -> Obj:
        with self._lock:
            where = f"{kind.plural}/{name}" + (f"/{subresource}" if subresource else "")
            self.calls.append(("merge_patch", where))
            self._check_failure("merge_patch", kind)
            if subresource not in ("", "status"):
                raise NotFound(404, "NotFound", f"no subresource {subresource!r}")
            key = self._key(kind, name, namespace)
            stored = self._objects.get(key)
            if stored is None:
                raise NotFound(404, "NotFound", f'{_resource(kind)} "{name}" not found')
            self._precondition(kind, stored, patch.get("metadata") or {}, patch=True)
            if subresource == "status":  # as the API server does: the status only
                patch = {"status": patch.get("status")} if "status" in patch else {}
            elif kind in WITH_STATUS:  # ...and the main resource keeps the stored status
                patch = {k: v for k, v in patch.items() if k != "status"}
            obj = merge_patch(stored, patch)
            obj["metadata"]["uid"] = stored["metadata"]["uid"]
            self._default(kind, obj)
            self._generation(kind, obj, stored)
            self._stamp(obj)
            self._objects[key] = obj
            self._record(kind, "MODIFIED", obj)
            return copy.deepcopy(obj)

    def delete(self, kind: Kind, name: str, namespace: str | None = None) -> None:
        with self._lock:
            self.calls.append(("delete", f"{kind.plural}/{name}"))
            self._check_failure("delete", kind)
            obj = self._objects.pop(self._key(kind, name, namespace), None)
            if obj is None:
                raise NotFound(404, "NotFound", f'{_resource(kind)} "{name}" not found')
            if kind is PODS:
                self._terminate(obj, grace_s=0)
            self._stamp(obj)
            self._record(kind, "DELETED", obj)

    def _terminate(self, pod: Obj, grace_s: int) -> None:
        """A pod's graceful deletion begins (lock held): the API server writes its
        ``deletionTimestamp`` (now plus the grace period) first, a MODIFIED event, even
        when the period is 0 and the DELETED follows at once (an unbound pod, or a
        bound one once its kubelet has stopped it, which the fake takes as at once)."""
        meta = pod["metadata"]
        if meta.get("deletionTimestamp"):
            return
        meta["deletionTimestamp"] = _utc(grace_s)
        meta["deletionGracePeriodSeconds"] = grace_s
        self._stamp(pod)
        self._record(PODS, "MODIFIED", pod)

    def evict(self, namespace: str, name: str, uid: str) -> None:
        """As the API server: NotFound for no such pod, Conflict for another UID; the
        pod's PodDisruptionBudgets as stored (``_charge_budget``); then the pod goes: at
        once (no kubelet here), or, with ``graceful_evictions``, it only turns terminating
        (``deletionTimestamp``) until the test deletes it, as in its grace period. No
        disruption controller runs here: a test sets a budget's ``status`` itself.
        ``lose_answer_of_next("evict", ...)`` evicts, then raises."""
        with self._lock:
            self.calls.append(("evict", f"{namespace}/{name}"))
            self._check_failure("evict")
            key = self._key(PODS, name, namespace)
            stored = self._objects.get(key)
            if stored is None:
                raise NotFound(404, "NotFound", f'pods "{name}" not found')
            if stored["metadata"]["uid"] != uid:
                raise Conflict(409, "Conflict", f'Operation cannot be fulfilled on Pod "{name}": '
                               f"the UID in the precondition ({uid}) does not match the UID in "
                               f"record ({stored['metadata']['uid']}). The object might have "
                               "been deleted and then recreated")  # fmt: skip
            self._charge_budget(stored)
            if self.graceful_evictions:
                grace = (stored.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
                self._terminate(stored, grace_s=grace)
                self._check_lost_answer("evict")
                return
            self._terminate(stored, grace_s=0)
            del self._objects[key]
            self._stamp(stored)
            self._record(PODS, "DELETED", stored)
            self._check_lost_answer("evict")

    def _charge_budget(self, pod: Obj) -> None:
        """The Eviction API's budget check (kube-apiserver's pod eviction REST, v1.36):
        refuses as it does, and takes one disruption from the budget when it lets a
        healthy pod go (lock held)."""
        status = pod.get("status") or {}
        if status.get("phase") in ("Pending", "Succeeded", "Failed"):
            return
        if pod["metadata"].get("deletionTimestamp"):
            return
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        labels = pod["metadata"].get("labels") or {}
        budgets = [
            b for (plural, bns, _), b in sorted(self._objects.items())
            if plural == "poddisruptionbudgets" and bns == ns
            and selects((b.get("spec") or {}).get("selector"), labels)
        ]  # fmt: skip
        if len(budgets) > 1:
            # A plain error there: a 500 whose Status has no reason, as the client reads it.
            raise error_from_status(500, {"code": 500, "message": MANY_BUDGETS})
        if not budgets:
            return
        budget = budgets[0]
        bstatus = budget.setdefault("status", {})
        ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in status.get("conditions") or [])  # fmt: skip
        if not ready:
            policy = (budget.get("spec") or {}).get("unhealthyPodEvictionPolicy")
            healthy, desired = bstatus.get("currentHealthy", 0), bstatus.get("desiredHealthy", 0)
            if policy == "AlwaysAllow" or (healthy >= desired and desired > 0):
                return
        bname = budget["metadata"]["name"]
        if bstatus.get("observedGeneration", 0) < budget["metadata"].get("generation", 0):
            raise ApiError(429, "TooManyRequests", f"Cannot evict pod as it would violate the "
                           f"pod's disruption budget {bname}.")  # fmt: skip
        allowed = bstatus.get("disruptionsAllowed", 0)
        if allowed < 0:
            raise ApiError(403, "Forbidden", "pdb disruptions allowed is negative")
        if allowed == 0:
            raise ApiError(429, "TooManyRequests", "Cannot evict pod as it would violate the "
                           "pod's disruption budget.")  # fmt: skip
        bstatus["disruptionsAllowed"] = allowed - 1
        bstatus.setdefault("disruptedPods", {})[name] = _utc()
        self._stamp(budget)
        self._record(POD_DISRUPTION_BUDGETS, "MODIFIED", budget)

    def bind(
        self,
        namespace: str,
        name: str,
        uid: str,
        node: str,
        annotations: dict[str, str] | None = None,
    ) -> None:
        with self._lock:
            self.calls.append(("bind", f"{namespace}/{name}"))
            self._check_failure("bind")
            key = self._key(PODS, name, namespace)
            stored = self._objects.get(key)
            if stored is None:
                raise NotFound(404, "NotFound", f'pods "{name}" not found')
            if uid and stored["metadata"]["uid"] != uid:
                raise Conflict(409, "Conflict", _uid_refusal(PODS, stored, uid))
            refusal = _binding_refusal(stored)
            if refusal:
                raise Conflict(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on pods/binding "{name}": {refusal}',
                )
            stored.setdefault("spec", {})["nodeName"] = node
            if annotations:
                meta = stored.setdefault("metadata", {})
                meta["annotations"] = {**(meta.get("annotations") or {}), **annotations}
            _set_scheduled(stored)
            self._stamp(stored)
            self._record(PODS, "MODIFIED", stored)
            self._check_lost_answer("bind")
