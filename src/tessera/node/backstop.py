"""The memory backstop: device memory checked from outside the container.

libvgpu enforces a container's memory cap from inside it, with figures kept in a usage
region the container can write. A tenant that corrupts that region, or reaches the
driver by a path libvgpu does not hook, can allocate past its cap, and nothing inside
the container would notice. The backstop reads what the driver itself reports for each
process (NVML's running-processes query on a GPU node; the fake cards' files otherwise),
traces each process to its container (``/proc/<pid>/cgroup`` names the pod UID and the
runtime's container ID, which the pod's status maps to a container name), and compares
the container's total on each card with its cap. The cap is the container's slice on the
extender path, or on the claims path the sum of the slices of the prepared claims the
container uses (``claim_slices``); a container with neither is not Tessera's to judge.

A container is over when its memory on a card passes its cap plus ``slack_mib`` for each
of its processes there: NVML counts a process's CUDA context (a few hundred MiB on real
cards), which libvgpu does not charge. Then, by mode:

* ``kill`` (the default): SIGKILL its processes on that card, largest first, until the
  rest fit; a Warning Event ``TesseraMemoryBackstop`` on the pod says who and why;
* ``warn``: the Event only (once per episode: while it stays over, no repeat);

and ``actions`` counts what was done per container. What this cannot promise is in
docs/node-agent.md, "Memory backstop".
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import re
import signal
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tessera.model.types import CardSlice
from tessera.node.pods import PodInfo
from tessera.node.ports import Discovery, EventSink, GpuProcess, PodSource, warn_best_effort

__all__ = ["Backstop", "BackstopMode", "Breach", "container_of"]

log = logging.getLogger(__name__)

MIB = 1 << 20
REASON = "TesseraMemoryBackstop"
_POD = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
_CONTAINER = re.compile(r"([0-9a-f]{64})(?:\.scope)?$")


class BackstopMode(enum.StrEnum):
    KILL = "kill"
    WARN = "warn"
    OFF = "off"


def container_of(cgroup_text: str) -> tuple[str, str] | None:
    """(pod UID, runtime container ID) from a ``/proc/<pid>/cgroup``, or None.

    Understands the cgroupfs layout (``.../kubepods/<qos>/pod<uid>/<id>``) and the
    systemd one (``...-pod<uid_with_underscores>.slice/cri-containerd-<id>.scope``), on
    cgroup v1 and v2.
    """
    for line in cgroup_text.splitlines():
        path = line.split(":", 2)[-1]
        pod = _POD.search(path)
        container = _CONTAINER.search(path.rsplit("/", 1)[-1])
        if pod and container:
            return pod.group(1).replace("_", "-"), container.group(1)
    return None


@dataclass(frozen=True, slots=True)
class Breach:
    """A container over its cap on one card, and what was done."""

    pod: str  # namespace/name
    container: str
    uuid: str
    used_bytes: int
    cap_bytes: int
    allowed_bytes: int  # cap plus the per-process slack
    killed: tuple[int, ...]  # host pids
    detected_at: float  # monotonic


class Backstop:
    def __init__(
        self,
        node: str,
        discovery: Discovery,
        cards: tuple[str, ...],
        pods: PodSource,
        events: EventSink,
        mode: BackstopMode = BackstopMode.KILL,
        slack_mib: int = 512,
        proc: Path = Path("/proc"),
        kill: Callable[[int, int], None] = os.kill,
        clock: Callable[[], float] = time.monotonic,
        claim_slices: Callable[[], Mapping[tuple[str, str], tuple[CardSlice, ...]]] | None = None,
    ) -> None:
        self.node = node
        self.discovery = discovery
        self.cards = cards
        self.pods = pods
        self.events = events
        self.mode = mode
        self.slack = slack_mib * MIB
        self.proc = proc
        self.kill = kill
        self.clock = clock
        # Prepared claims' slices by (namespace, name): the caps on the claims path.
        self.claim_slices = claim_slices
        self.actions: Counter[tuple[str, str, str]] = Counter()  # (pod, container, action)
        self._over: set[tuple[str, str, str]] = set()  # (pod uid, container, uuid) now over
        self._killed: set[int] = set()  # pids killed that the driver still lists (dying)

    def _owner(self, pid: int) -> tuple[str, str] | None:
        try:
            return container_of((self.proc / str(pid) / "cgroup").read_text())
        except OSError:
            return None  # gone meanwhile

    def tick(self) -> list[Breach]:
        """One pass over every card; the breaches found (and acted on)."""
        if self.mode is BackstopMode.OFF:
            return []
        now = self.clock()
        pods = {p.uid: p for p in self.pods.pods() if p.node == self.node}
        claimed = self.claim_slices() if self.claim_slices is not None else {}
        found: list[Breach] = []
        over: set[tuple[str, str, str]] = set()
        listed: set[int] = set()
        for uuid in self.cards:
            mine: dict[tuple[str, str], list[GpuProcess]] = {}
            for gp in self.discovery.processes(uuid):
                listed.add(gp.pid)
                if gp.pid in self._killed:
                    continue  # killed on an earlier tick; its memory goes with it
                owner = self._owner(gp.pid)
                if owner is None:
                    continue
                pod = pods.get(owner[0])
                cname = dict(pod.container_ids).get(owner[1]) if pod is not None else None
                if pod is not None and cname is not None:
                    mine.setdefault((pod.uid, cname), []).append(gp)
            for (uid, cname), procs in mine.items():
                slices = _slices(pods[uid], cname, claimed)
                if slices is None:
                    continue  # a container Tessera gave no card (no slice to hold it to)
                breach = self._check(pods[uid], cname, uuid, slices, procs, now)
                if breach is not None:
                    over.add((uid, cname, uuid))
                    found.append(breach)
        self._over = over
        self._killed &= listed
        return found

    def _check(
        self,
        pod: PodInfo,
        cname: str,
        uuid: str,
        slices: tuple[CardSlice, ...],
        procs: list[GpuProcess],
        now: float,
    ) -> Breach | None:
        # A card the container was not given (seen through a privileged container or a
        # misconfigured runtime) is a cap of 0 there.
        cap = sum(s.memory_mib for s in slices if s.uuid == uuid)
        cap_bytes = cap * MIB
        used = sum(p.memory_bytes for p in procs)
        allowed = cap_bytes + self.slack * len(procs)
        if used <= allowed:
            return None
        killed: list[int] = []
        if self.mode is BackstopMode.KILL:
            left = used
            for p in sorted(procs, key=lambda p: p.memory_bytes, reverse=True):
                if left <= cap_bytes + self.slack * (len(procs) - len(killed)):
                    break
                with contextlib.suppress(ProcessLookupError):  # exited meanwhile
                    self.kill(p.pid, signal.SIGKILL)
                killed.append(p.pid)
                self._killed.add(p.pid)
                left -= p.memory_bytes
        elif (pod.uid, cname, uuid) in self._over:
            return Breach(pod.key, cname, uuid, used, cap_bytes, allowed, (), now)
        action = "killed" if killed else "warned"
        self.actions[(pod.key, cname, action)] += 1
        did = (
            f"killed pid {', '.join(map(str, killed))}"
            if killed
            else "not killed (--backstop warn)"
        )
        message = (
            f"container {cname!r} uses {used // MIB} MiB of device memory on card {uuid}, "
            f"past its cap of {cap} MiB (plus {self.slack // MIB} MiB per process for driver "
            f"contexts, {allowed // MIB} MiB in all): the memory was not allocated through "
            f"libvgpu's accounting; {did}"
        )
        log.warning("backstop: %s: %s", pod.key, message)
        warn_best_effort(self.events, pod, REASON, message)
        return Breach(pod.key, cname, uuid, used, cap_bytes, allowed, tuple(killed), now)


def _slices(
    pod: PodInfo, cname: str, claimed: Mapping[tuple[str, str], tuple[CardSlice, ...]]
) -> tuple[CardSlice, ...] | None:
    """What Tessera gave the container: its assignment's slices, else those of the
    prepared claims it uses; None when it gave it nothing (another driver's claim)."""
    ca = pod.container(cname)
    if ca is not None:
        return ca.slices
    names = dict(pod.container_claims).get(cname, ())
    prepared = [claimed[(pod.namespace, n)] for n in names if (pod.namespace, n) in claimed]
    return tuple(s for slices in prepared for s in slices) if prepared else None
