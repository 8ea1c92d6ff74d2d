"""The claims path as the GPU map page (``--web``) draws it: this driver's ResourceSlices
and the ResourceClaims allocated on them.

kube-scheduler places claims without the extender, so nothing the extender decides reads
these. Two reflectors keep them only while the page is served, and a claim is kept only
once an allocation names a device of this driver: a cluster's other claims cost no memory.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from tessera.claims.allocation import allocated_pools
from tessera.claims.devices import DRIVER
from tessera.kube.kinds import RESOURCE_CLAIMS, RESOURCE_SLICES
from tessera.kube.port import KubeApi, Obj, WatchEvent
from tessera.kube.reflector import Reflector

__all__ = ["ClaimsView"]


def _key(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


class _Kept:
    """A reflector's objects that ``keep`` accepts, by namespace/name."""

    def __init__(self, keep: Callable[[Obj], bool]) -> None:
        self._keep = keep
        self._lock = threading.Lock()
        self._objs: dict[str, Obj] = {}

    def replace(self, items: list[Obj]) -> None:
        kept = {_key(o): o for o in items if self._keep(o)}
        with self._lock:
            self._objs = kept

    def apply(self, event: WatchEvent) -> None:
        key = _key(event.object)
        with self._lock:
            if event.type == "DELETED" or not self._keep(event.object):
                self._objs.pop(key, None)
            else:
                self._objs[key] = event.object

    def items(self) -> list[Obj]:
        with self._lock:
            return list(self._objs.values())


def _own_slice(obj: Obj) -> bool:
    return (obj.get("spec") or {}).get("driver") == DRIVER


def _allocated_here(obj: Obj) -> bool:
    return bool(allocated_pools(obj))


class ClaimsView:
    """Slices and allocated claims of driver gpu.tessera.io, kept current by watches."""

    def __init__(self, api: KubeApi, watch_timeout_s: int = 300) -> None:
        self._slices = _Kept(_own_slice)
        self._claims = _Kept(_allocated_here)
        # absent_ok: a cluster without resource.k8s.io/v1 has no claims path to draw.
        self._reflectors = [
            Reflector(api, RESOURCE_SLICES, self._slices, field_selector=f"spec.driver={DRIVER}",
                      watch_timeout_s=watch_timeout_s, absent_ok=True),
            Reflector(api, RESOURCE_CLAIMS, self._claims, watch_timeout_s=watch_timeout_s,
                      absent_ok=True),
        ]  # fmt: skip

    def start(self) -> None:
        for r in self._reflectors:
            r.start()

    def stop(self) -> None:
        for r in self._reflectors:
            r.stop()

    def slices(self) -> list[Obj]:
        return self._slices.items()

    def claims(self) -> list[Obj]:
        return self._claims.items()
