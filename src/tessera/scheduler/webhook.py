"""The admission webhook for Pods (admission.k8s.io/v1 AdmissionReview).

``mutate`` (Pod CREATE): a pod that asks for a GPU resource -- Tessera's names, or
HAMi's / GPU-manager's when compatibility is on -- gets

* ``spec.schedulerName`` set to Tessera's scheduler,
* its GPU resources rewritten in Tessera's canonical form (``tessera.io/gpu`` made
  explicit, foreign names translated, requests equal to limits) so the kubelet and the
  node agent see one vocabulary -- only when the rewritten pod parses to exactly the
  same request (annotations are left as they are: the parser reads them either way).

``validate`` re-reads the final object (other webhooks may have changed it) and refuses
an impossible spec, a pod that brings its own ``tessera.io/assignment``, or a pod whose
request alone is larger than its namespace's GpuQuota allows on every card model it
could use (it could never be placed; the message names the quota, the limit and the cap).

Both refuse with the parser's message, which names the field and the rule, e.g.
``spec.containers[1].resources.limits[tessera.io/gpu-cores]: must be an integer between
1 and 100 (got '150')``. A pod asking for no GPU passes untouched (no patch at all).
Nothing here does I/O.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tessera.errors import SpecError
from tessera.kube.port import Obj
from tessera.model import annotations as keys
from tessera.model.names import ResourceNames
from tessera.model.podspec import Compat, gpu_resource_names, parse_pod
from tessera.model.types import GpuRequest, PodRequest
from tessera.scheduler.wire import WireError

__all__ = [
    "FORBIDDEN",
    "AdmissionResult",
    "Review",
    "Webhook",
    "allow",
    "decode_review",
    "refuse",
    "review_answer",
]


INVALID = (422, "Invalid")  # a spec that breaks a rule
FORBIDDEN = (403, "Forbidden")  # over a quota, as the API server's own quota answers


@dataclass(frozen=True, slots=True)
class AdmissionResult:
    body: bytes  # the AdmissionReview answer
    allowed: bool  # the two read for tessera_scheduler_admissions_total
    mutated: bool


@dataclass(frozen=True, slots=True)
class Review:
    """One AdmissionReview request, as both webhooks read it."""

    uid: str
    api_version: str
    operation: str
    sub_resource: str
    object: Obj  # as written (on CREATE, with the request's namespace filled in)
    old_object: Obj  # before the write ({} on CREATE)


def decode_review(body: bytes) -> Review:
    """The review's request; a WireError naming the field for anything malformed."""
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise WireError(f"AdmissionReview: body is not valid JSON: {exc}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("request"), dict):
        raise WireError("AdmissionReview: a 'request' object is required")
    req = obj["request"]
    uid = req.get("uid")
    if not isinstance(uid, str) or not uid:
        raise WireError("AdmissionReview.request.uid: must be a non-empty string")
    new = req.get("object")
    if not isinstance(new, dict):
        raise WireError("AdmissionReview.request.object: must be an object")
    old = req.get("oldObject")
    old = {} if old is None else old
    if not isinstance(old, dict):
        raise WireError("AdmissionReview.request.oldObject: must be an object")
    if not (new.get("metadata") or {}).get("namespace") and isinstance(req.get("namespace"), str):
        # On CREATE the object may not carry its namespace yet; the request does.
        new = {**new, "metadata": {**(new.get("metadata") or {}), "namespace": req["namespace"]}}
    return Review(
        uid=uid,
        api_version=str(obj.get("apiVersion") or "admission.k8s.io/v1"),
        operation=str(req.get("operation") or ""),
        sub_resource=str(req.get("subResource") or ""),
        object=new,
        old_object=old,
    )


def review_answer(
    api_version: str,
    uid: str,
    allowed: bool,
    message: str = "",
    patch: list[Any] | None = None,
    code: tuple[int, str] = INVALID,
) -> bytes:
    """An AdmissionReview response; a refusal carries ``code`` (HTTP status, reason)."""
    response: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if not allowed:
        response["status"] = {"code": code[0], "reason": code[1], "message": message}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    return json.dumps(
        {"apiVersion": api_version, "kind": "AdmissionReview", "response": response}
    ).encode()


def refuse(
    api_version: str, uid: str, message: str, code: tuple[int, str] = INVALID
) -> AdmissionResult:
    """Refuse the review's object with ``message`` (it names the field and the rule, or
    the quota)."""
    return AdmissionResult(review_answer(api_version, uid, False, message, code=code), False, False)


def allow(api_version: str, uid: str, patch: list[Any] | None = None) -> AdmissionResult:
    return AdmissionResult(review_answer(api_version, uid, True, patch=patch), True, bool(patch))


class Webhook:
    def __init__(
        self,
        scheduler_name: str,
        names: ResourceNames | None = None,
        compat: Compat | None = None,
        quota_check: Callable[[PodRequest], str] | None = None,
    ) -> None:
        self.scheduler_name = scheduler_name
        # Why a pod could never fit its namespace's quota ("" if it could): read from the
        # scheduler's state, so the webhook itself still does no I/O.
        self.quota_check = quota_check
        self.names = names or ResourceNames()
        self.compat = compat or Compat()
        self._gpu_names = frozenset(gpu_resource_names(self.names, self.compat))

    def _parse(self, pod: Mapping[str, Any]) -> PodRequest | None:
        return parse_pod(pod, names=self.names, compat=self.compat)

    # --- mutate -------------------------------------------------------------------------

    def _read(self, body: bytes) -> tuple[Review, PodRequest | None, AdmissionResult | None]:
        """The review, its pod's request, and the answer when both verbs answer alike: any
        operation but CREATE is allowed, a pod spec that does not parse refused."""
        r = decode_review(body)
        if r.operation not in ("CREATE", ""):
            return r, None, allow(r.api_version, r.uid)
        try:
            return r, self._parse(r.object), None
        except SpecError as exc:
            return r, None, refuse(r.api_version, r.uid, str(exc))

    def mutate(self, body: bytes) -> AdmissionResult:
        r, request, answer = self._read(body)
        if answer is not None:
            return answer
        if request is None:
            return allow(r.api_version, r.uid)
        return allow(r.api_version, r.uid, self._patch(r.object, request))

    def _canonical(self, gpu: GpuRequest) -> dict[str, str]:
        n = self.names
        out = {n.gpu: str(gpu.count)}
        if not gpu.exclusive:
            if gpu.memory_mib is not None:
                out[n.memory] = str(gpu.memory_mib)
            if gpu.memory_percent is not None:
                out[n.memory_percent] = str(gpu.memory_percent)
            if gpu.cores_percent:
                out[n.cores] = str(gpu.cores_percent)
        return out

    def _patch(self, pod: Mapping[str, Any], request: PodRequest) -> list[dict[str, Any]]:
        spec = pod.get("spec") or {}
        route: list[dict[str, Any]] = []  # the pod to Tessera's scheduler
        if spec.get("schedulerName") != self.scheduler_name:
            route.append({"op": "add", "path": "/spec/schedulerName", "value": self.scheduler_name})
        rewrites: list[dict[str, Any]] = []
        by_name = {(c.name, c.init): c for c in request.containers}
        for field, init in (("initContainers", True), ("containers", False)):
            for i, c in enumerate(spec.get(field) or []):
                name = c.get("name")
                cr = by_name.get((name, init)) or by_name.get((name, False))
                if cr is None or cr.gpu is None:
                    continue
                resources = dict(c.get("resources") or {})
                canonical = self._canonical(cr.gpu)
                old_limits = dict(resources.get("limits") or {})
                old_requests = dict(resources.get("requests") or {})
                limits = {k: v for k, v in old_limits.items() if k not in self._gpu_names}
                limits.update(canonical)
                requests = {k: v for k, v in old_requests.items() if k not in self._gpu_names}
                if any(k in self._gpu_names for k in old_requests):
                    requests.update(canonical)  # extended resources: requests == limits
                value = dict(resources)
                value["limits"] = limits
                if "requests" in resources:
                    value["requests"] = requests
                if value != resources:
                    path = f"/spec/{field}/{i}/resources"
                    rewrites.append({"op": "add", "path": path, "value": value})
        if rewrites and not self._same_request(pod, rewrites, request):
            rewrites = []  # normalising must never change what the pod gets
        return route + rewrites

    def _same_request(
        self, pod: Mapping[str, Any], ops: list[dict[str, Any]], request: PodRequest
    ) -> bool:
        """Whether the rewritten pod still parses to ``request`` (else keep the original
        resources: normalising must never change what a pod gets)."""
        out = json.loads(json.dumps(pod))
        for op in ops:
            parts = op["path"].strip("/").split("/")
            cur = out
            for p in parts[:-1]:
                cur = cur[int(p)] if isinstance(cur, list) else cur[p]
            cur[parts[-1]] = op["value"]
        try:
            return self._parse(out) == request
        except SpecError:
            return False

    # --- validate -----------------------------------------------------------------------

    def validate(self, body: bytes) -> AdmissionResult:
        r, request, answer = self._read(body)
        if answer is not None:
            return answer
        uid, pod, api_version = r.uid, r.object, r.api_version
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        if isinstance(annotations, dict) and keys.ASSIGNMENT in annotations:
            message = (
                f"metadata.annotations[{keys.ASSIGNMENT}]: is written by the Tessera scheduler "
                "when it binds the pod; a new pod must not carry it"
            )
            return refuse(api_version, uid, message)
        spec = pod.get("spec") or {}
        if request is not None and spec.get("nodeName"):
            # No scheduler would see it, so no cards would be assigned: kubelet would fail
            # it at admission (the agent refuses a pod without an assignment).
            message = (
                "spec.nodeName: a pod asking for GPU resources must be placed by the "
                f"scheduler, which picks its cards (got {spec['nodeName']!r}); to pin it "
                "to a node, use a nodeSelector on kubernetes.io/hostname"
            )
            return refuse(api_version, uid, message)
        if request is not None and spec.get("schedulerName") != self.scheduler_name:
            message = (
                "spec.schedulerName: a pod asking for GPU resources must use "
                f"{self.scheduler_name!r} (the mutating webhook sets it; is it installed?)"
            )
            return refuse(api_version, uid, message)
        if request is not None and self.quota_check is not None:
            why = self.quota_check(request)
            if why:
                return refuse(api_version, uid, why, FORBIDDEN)
        return allow(api_version, uid)
