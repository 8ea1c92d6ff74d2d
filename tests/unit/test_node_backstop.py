"""The memory backstop: tracing a process to its container, and the decision per card."""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from tessera.model import annotations
from tessera.model.annotations import encode_assignment
from tessera.model.types import Assignment, CardSlice, ContainerAssignment
from tessera.node.backstop import MIB, REASON, Backstop, BackstopMode, Breach, container_of
from tessera.node.fakes import MemoryEvents, MemoryPods
from tessera.node.ports import GpuProcess

UID = "0b5e9c1e-3f0d-4d5e-9a8b-1c2d3e4f5a6b"
CID = "a" * 64
OTHER_CID = "b" * 64
U0, U1 = "GPU-00000000-0000-0000-0000-000000000001", "GPU-00000000-0000-0000-0000-000000000002"


@pytest.mark.parametrize(
    "text",
    [
        f"4:memory:/tessera-node-x/kubepods/besteffort/pod{UID}/{CID}\n",
        f"5:pids:/kubepods/pod{UID}/{CID}\n0::/\n",
        "0::/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n",
    ],
    ids=["cgroupfs-v1", "guaranteed", "systemd-v2"],
)
def test_a_process_is_traced_to_its_pod_and_container(text: str) -> None:
    assert container_of(text) == (UID, CID)


@pytest.mark.parametrize(
    "text",
    ["0::/user.slice/session-1.scope\n", f"4:memory:/kubepods/besteffort/pod{UID}\n", ""],
    ids=["host-process", "pod-level-only", "empty"],
)
def test_a_process_outside_any_container_is_not_traced(text: str) -> None:
    assert container_of(text) is None


class Procs:
    """The discovery port's processes() only, as the driver would report them."""

    def __init__(self) -> None:
        self.by_card: dict[str, list[GpuProcess]] = {}

    def processes(self, uuid: str) -> list[GpuProcess]:
        return list(self.by_card.get(uuid, []))


class World:
    def __init__(
        self,
        tmp: Path,
        mode: BackstopMode,
        claim_slices: Callable[[], Mapping[tuple[str, str], tuple[CardSlice, ...]]] | None = None,
    ) -> None:
        self.proc = tmp / "proc"
        self.pods = MemoryPods("tessera.io/gpu", frozenset({U0, U1}))
        self.events = MemoryEvents()
        self.driver = Procs()
        self.killed: list[tuple[int, int]] = []
        self.gone: set[int] = set()  # pids that exited before the kill reached them
        self.now = 100.0
        self.backstop = Backstop(
            "n", self.driver, (U0, U1), self.pods, self.events, mode=mode,
            proc=self.proc, kill=self._kill, clock=lambda: self.now, claim_slices=claim_slices,
        )  # fmt: skip
        a = Assignment(
            node="n",
            containers=(ContainerAssignment("main", (CardSlice(U0, 1000, 30),)),),
        )
        self.pods.put(
            {
                "metadata": {"name": "p", "namespace": "ns", "uid": UID,
                             "annotations": {annotations.ASSIGNMENT: encode_assignment(a)}},
                "spec": {"nodeName": "n", "containers": [
                    {"name": "main", "resources": {"limits": {"tessera.io/gpu": "1"}}}]},
                "status": {"phase": "Running", "containerStatuses": [
                    {"name": "main", "containerID": f"containerd://{CID}"}]},
            }
        )  # fmt: skip

    def _kill(self, pid: int, sig: int) -> None:
        self.killed.append((pid, sig))
        if pid in self.gone:
            raise ProcessLookupError(pid)

    def process(
        self, pid: int, card: str, mib: int, cid: str = CID, uid: str = UID, cgroup: str = ""
    ) -> None:
        d = self.proc / str(pid)
        d.mkdir(parents=True, exist_ok=True)
        (d / "cgroup").write_text(cgroup or f"4:memory:/kubepods/besteffort/pod{uid}/{cid}\n")
        self.driver.by_card.setdefault(card, []).append(GpuProcess(pid, mib * MIB))


def test_within_cap_plus_the_context_slack_nothing_happens(tmp_path: Path) -> None:
    w = World(tmp_path, BackstopMode.KILL)
    w.process(10, U0, 1000 + 512)  # its cap, plus what the driver counts for its context
    assert w.backstop.tick() == []
    assert w.killed == [] and w.events.events == []


def test_each_process_of_the_container_brings_its_own_context_slack(tmp_path: Path) -> None:
    # Two processes, each with a context the driver counts: cap + 2 x 512 MiB is fine.
    w = World(tmp_path, BackstopMode.KILL)
    w.process(10, U0, 400 + 512)
    w.process(11, U0, 600 + 512)
    assert w.backstop.tick() == []
    w.process(12, U0, 512 + 1)  # a third: its own slack, and one MiB past the cap
    assert len(w.backstop.tick()) == 1


def test_past_the_cap_the_largest_process_is_killed_and_the_pod_told(tmp_path: Path) -> None:
    w = World(tmp_path, BackstopMode.KILL)
    w.process(10, U0, 300)
    w.process(11, U0, 2500)  # the one that bypassed libvgpu
    [breach] = w.backstop.tick()
    assert breach.killed == (11,) and w.killed == [(11, signal.SIGKILL)]
    assert breach.used_bytes == 2800 * MIB and breach.cap_bytes == 1000 * MIB
    [(key, reason, message)] = w.events.events
    assert key == "ns/p" and reason == REASON
    assert "2800 MiB" in message and "cap of 1000 MiB" in message and "killed pid 11" in message
    assert w.backstop.actions[("ns/p", "main", "killed")] == 1
    assert breach.detected_at == 100.0
    # The killed process is still listed while it dies: not killed or reported again.
    assert w.backstop.tick() == [] and len(w.killed) == 1 and len(w.events.events) == 1
    w.process(12, U0, 2600)  # another episode
    assert [b.killed for b in w.backstop.tick()] == [(12,)]
    assert w.backstop.actions == {("ns/p", "main", "killed"): 2}


@pytest.mark.parametrize(
    ("sizes", "killed"),
    [
        # 3600 MiB against 1000 + 3 x 512; without the largest, 2300 against 1000 + 2 x 512
        # is still over; without the next, 1100 against 1000 + 512 fits.
        ({10: 1300, 11: 1100, 12: 1200}, (10, 12)),
        # 2600 against 1000 + 3 x 512; without the largest, 1600 fits 1000 + 2 x 512.
        ({10: 1000, 11: 800, 12: 800}, (10,)),
    ],
)
def test_the_largest_are_killed_until_the_rest_fit_with_their_own_slack(
    tmp_path: Path, sizes: dict[int, int], killed: tuple[int, ...]
) -> None:
    w = World(tmp_path, BackstopMode.KILL)
    for pid, mib in sizes.items():
        w.process(pid, U0, mib)
    [breach] = w.backstop.tick()
    assert breach.killed == killed
    assert w.killed == [(pid, signal.SIGKILL) for pid in killed]
    [(_, _, message)] = w.events.events
    used, allowed = sum(sizes.values()), 1000 + 3 * 512
    assert message == (
        f"container 'main' uses {used} MiB of device memory on card {U0}, past its cap of "
        f"1000 MiB (plus 512 MiB per process for driver contexts, {allowed} MiB in all): the "
        f"memory was not allocated through libvgpu's accounting; killed pid "
        + ", ".join(map(str, killed))
    )


def test_warn_mode_reports_once_per_episode_and_kills_nothing(tmp_path: Path) -> None:
    w = World(tmp_path, BackstopMode.WARN)
    w.process(10, U0, 3000)
    for tick in range(3):
        w.now = 100.0 + tick
        [breach] = w.backstop.tick()
        assert breach == Breach("ns/p", "main", U0, 3000 * MIB, 1000 * MIB, 1512 * MIB, (), w.now)
    assert w.killed == [] and len(w.events.events) == 1
    assert w.events.events[0][2].endswith("accounting; not killed (--backstop warn)")
    assert w.backstop.actions == {("ns/p", "main", "warned"): 1}


def test_processes_of_containers_tessera_does_not_know_are_left_alone(tmp_path: Path) -> None:
    w = World(tmp_path, BackstopMode.KILL)
    w.process(20, U0, 9000, cid=OTHER_CID)  # not a container of a known pod
    assert w.backstop.tick() == [] and w.killed == []


def test_a_card_the_container_was_not_assigned_is_a_cap_of_zero(tmp_path: Path) -> None:
    w = World(tmp_path, BackstopMode.KILL)
    w.process(21, U1, 600)
    [breach] = w.backstop.tick()
    assert breach.uuid == U1 and breach.cap_bytes == 0 and breach.killed == (21,)


def test_off_does_nothing(tmp_path: Path) -> None:
    w = World(tmp_path, BackstopMode.OFF)
    w.process(10, U0, 9000)
    assert w.backstop.tick() == [] and w.killed == []


CLAIM_UID = "1c6f0d2f-4a1e-4e6f-8b9c-2d3e4f5a6b7c"
OTHER_UID = "2d7a1e3b-5b2f-4f7a-9cad-3e4f5a6b7c8d"
MAIN_CID, SIDE_CID = "c" * 64, "d" * 64


def claims_world(tmp: Path, prepared: dict[tuple[str, str], tuple[CardSlice, ...]]) -> World:
    """World, plus a pod on the claims path: "main" uses a claim made from a template
    ("c-gpu-x1", named in the pod's status), "side" another driver's claim ("nic")."""
    w = World(tmp, BackstopMode.KILL, claim_slices=lambda: prepared)
    w.pods.put(
        {
            "metadata": {"name": "c", "namespace": "ns", "uid": CLAIM_UID},
            "spec": {"nodeName": "n",
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"},
                                        {"name": "net", "resourceClaimName": "nic"}],
                     "containers": [{"name": "main", "resources": {"claims": [{"name": "gpu"}]}},
                                    {"name": "side", "resources": {"claims": [{"name": "net"}]}}]},
            "status": {"phase": "Running",
                       "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "c-gpu-x1"}],
                       "containerStatuses": [
                           {"name": "main", "containerID": f"containerd://{MAIN_CID}"},
                           {"name": "side", "containerID": f"containerd://{SIDE_CID}"}]},
        }
    )  # fmt: skip
    return w


def test_a_claim_container_is_held_to_its_prepared_claims_slices(tmp_path: Path) -> None:
    w = claims_world(tmp_path, {("ns", "c-gpu-x1"): (CardSlice(U1, 2000, 20),)})
    w.process(30, U1, 2000 + 512, cid=MAIN_CID, uid=CLAIM_UID)
    assert w.backstop.tick() == [] and w.killed == []
    w.process(31, U1, 3000, cid=MAIN_CID, uid=CLAIM_UID)  # past its claim's 2000 MiB
    [breach] = w.backstop.tick()
    assert (breach.pod, breach.container, breach.uuid) == ("ns/c", "main", U1)
    assert breach.cap_bytes == 2000 * MIB and breach.killed == (31,)
    # A card its claim does not hold is a cap of 0, as on the extender path.
    w.process(32, U0, 700, cid=MAIN_CID, uid=CLAIM_UID)  # past the 512 MiB context slack
    [breach] = w.backstop.tick()
    assert breach.uuid == U0 and breach.cap_bytes == 0 and breach.killed == (32,)


def test_a_container_whose_claims_tessera_did_not_prepare_is_left_alone(tmp_path: Path) -> None:
    w = claims_world(tmp_path, {("ns", "c-gpu-x1"): (CardSlice(U1, 2000, 20),)})
    w.process(40, U1, 9000, cid=SIDE_CID, uid=CLAIM_UID)  # another driver's claim
    assert w.backstop.tick() == [] and w.killed == []
    # Nor is "main" once its claim is unprepared: nothing left to hold it to.
    w.backstop.claim_slices = lambda: {}
    w.process(41, U1, 9000, cid=MAIN_CID, uid=CLAIM_UID)
    assert w.backstop.tick() == [] and w.killed == []


def test_what_a_card_lists_before_an_over_container_does_not_hide_it(tmp_path: Path) -> None:
    """A dying process, a host process, a pod of another node, a container Tessera gave
    nothing and one of another driver's claim, all listed first on the card."""
    w = claims_world(tmp_path, {})
    w.pods.put(
        {
            "metadata": {"name": "plain", "namespace": "ns", "uid": OTHER_UID},
            "spec": {"nodeName": "n", "containers": [{"name": "app"}]},
            "status": {"phase": "Running", "containerStatuses": [
                {"name": "app", "containerID": f"containerd://{OTHER_CID}"}]},
        }
    )  # fmt: skip
    w.process(10, U0, 2500)
    assert [b.killed for b in w.backstop.tick()] == [(10,)]  # dying from here on
    w.process(60, U0, 9000, cgroup="0::/user.slice/session-1.scope\n")
    w.process(61, U0, 9000, uid="9d0c5b1a-0000-4000-8000-000000000099")  # not this node's
    w.process(62, U0, 9000, cid=OTHER_CID, uid=OTHER_UID)  # no card of Tessera's
    w.process(63, U0, 9000, cid=SIDE_CID, uid=CLAIM_UID)  # another driver's claim
    w.process(64, U0, 2600)
    assert [(b.pod, b.killed) for b in w.backstop.tick()] == [("ns/p", (64,))]


def test_a_process_that_exits_before_its_kill_is_counted_killed(tmp_path: Path) -> None:
    w = World(tmp_path, BackstopMode.KILL)
    w.process(10, U0, 2500)
    w.gone.add(10)
    [breach] = w.backstop.tick()
    assert breach.killed == (10,) and w.killed == [(10, signal.SIGKILL)]
    assert w.backstop.tick() == []  # still listed while the driver lets go of it
