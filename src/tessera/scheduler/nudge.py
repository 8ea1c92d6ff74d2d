"""The one write to a waiting pod that makes kube-scheduler try it again.

kube-scheduler keeps a pod it could not place among its unschedulable pods until a
cluster event it watches for moves it, or for minutes. What frees room for Tessera's pods
-- a quota raised, cards back in service, a preemption's victims gone -- is not such an
event; an update of the pod is. So the scheduler sets ``tessera.io/quota-retry`` (the
time, Unix seconds; nothing reads it), the one change to a pod besides
``tessera.io/preempting`` its service account may make (deploy/admission-policy.yaml).
"""

from __future__ import annotations

import logging
import time

from tessera.kube.errors import ApiError, NotFound
from tessera.kube.kinds import PODS
from tessera.kube.port import KubeApi
from tessera.model.annotations import QUOTA_RETRY

__all__ = ["nudge"]

log = logging.getLogger(__name__)


def nudge(api: KubeApi, key: str, why: str, when: float | None = None) -> bool:
    """Annotate pod ``key`` (namespace/name); False when it is gone or the write failed
    (logged, with ``why`` it was nudged)."""
    ns, _, name = key.partition("/")
    stamp = f"{time.time() if when is None else when:.3f}"
    try:
        api.merge_patch(PODS, name, {"metadata": {"annotations": {QUOTA_RETRY: stamp}}}, ns)
    except NotFound:
        return False  # gone meanwhile
    except ApiError as exc:
        log.warning("pod %s: cannot nudge it to try again (%s): %s", key, why, exc)
        return False
    return True
