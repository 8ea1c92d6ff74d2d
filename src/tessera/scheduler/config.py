"""The scheduler's settings (the CLI fills them; tests build them directly). Where it
listens and its certificate are the CLI's alone (scheduler/cli.py): the app serves no port."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from tessera.model.names import ResourceNames
from tessera.model.podspec import Compat

__all__ = ["SchedulerConfig"]


def _identity() -> str:
    return f"{socket.gethostname()}_{os.getpid()}"


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    scheduler_name: str = "tessera-scheduler"  # the kube-scheduler profile pods are sent to
    policy: str = "binpack"  # default placement policy (a pod may override it)
    seed: int = 0
    narrow: bool = True  # filter returns only the node the placement core chose
    names: ResourceNames = field(default_factory=ResourceNames)
    compat: Compat = field(default_factory=Compat)
    reservation_ttl_s: float = 30.0
    # A bind whose write may have landed (no answer, a timeout) keeps its cards this long
    # unless the watch shows the pod first: past the API server's own request timeout (60 s).
    bind_doubt_s: float = 90.0
    leader_elect: bool = True
    lease_namespace: str = "kube-system"
    lease_name: str = "tessera-scheduler"
    identity: str = field(default_factory=_identity)
    lease_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_s: float = 2.0
    watch_timeout_s: int = 300
    quota_status_s: float = 5.0  # how often GpuQuota statuses are brought up to date
    web: bool = False  # serve the GPU map page (/gpus, /gpus.json) on the extender port
    preemption: bool = True  # evict lower-priority GPU pods for a pod that finds no cards
    # Freeze the state read by each (re)list out of full GC passes (scheduler/heap.py). A
    # process-wide setting: the CLI turns it on; tests, which run many apps, leave it off.
    # (The collector's pause while a list is decoded and booked is always on.)
    freeze_heap: bool = False
