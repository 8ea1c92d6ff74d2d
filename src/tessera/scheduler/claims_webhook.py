"""The admission webhook for claims' allocations (admission.k8s.io/v1 AdmissionReview of
``resourceclaims/status`` UPDATE): GpuQuota for the claims path.

kube-scheduler writes a claim's allocation to its status in PreBind. The API server
sends that write here (the chart's matchConditions send only writes that give a claim its
first allocation with a device of this driver); the claims book says whether the cards
would pass a GpuQuota of the claim's namespace. A refusal fails kube-scheduler's PreBind:
the allocation is not written, the pod stays Pending with the message in its
``FailedScheduling`` event, and kube-scheduler tries it again after its backoff:

    admission webhook "claims.tessera.io" denied the request: quota: team-a/gpus a100
    (A100) memory 78000 of 81920 MiB used, claim train-gpu-x7 asks 8192

Every other write passes untouched: a claim already allocated (an allocation is never
changed, only removed), one of another driver, a status without an allocation.
"""

from __future__ import annotations

from collections.abc import Callable

from tessera.claims.allocation import allocated_pools
from tessera.kube.port import Obj
from tessera.scheduler.webhook import FORBIDDEN, AdmissionResult, allow, decode_review, refuse

__all__ = ["UNAVAILABLE", "review_claim"]

UNAVAILABLE = (503, "ServiceUnavailable")  # a standby, or not synced: try again


def review_claim(
    body: bytes, admit: Callable[[Obj], str], ready: Callable[[], str]
) -> AdmissionResult:
    """Answer one review. ``admit(claim)``: why its allocation passes a quota, or "" (it
    then counts). ``ready()``: why this replica cannot decide now ("" when it can)."""
    r = decode_review(body)
    uid, api_version, new = r.uid, r.api_version, r.object
    old_status = r.old_object.get("status") or {}
    first = r.sub_resource == "status" and allocated_pools(new) and not old_status.get("allocation")
    if not first:
        return allow(api_version, uid)
    why, code = ready(), UNAVAILABLE
    if not why:
        why, code = admit(new), FORBIDDEN
    if why:
        return refuse(api_version, uid, why, code)
    return allow(api_version, uid)
