"""Random interleavings of verbs and watch events through ``SchedulerState``.

Properties, after every step: the cluster state books, for each pod, exactly what it
should hold -- its reservation if it has one, else what its annotation says -- and
nothing for a pod that holds nothing; and no card is over its memory, cores or slots.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessera.errors import PlacementError
from tessera.model import annotations as keys
from tessera.model.types import Assignment
from tessera.placement.place import pick_cards
from tessera.scheduler.filter import filter_pod
from tessera.scheduler.placer import Placer
from tessera.scheduler.state import SchedulerState
from tessera.scheduler.wire import ExtenderArgs
from tests.unit._scheduler_world import node_obj, pod_obj

PODS = 5
NODES = ("n0", "n1")
OPS = (
    "filter",  # kube-scheduler offers the pod: a reservation
    "bind-lands",  # the watch shows the pod bound with its reservation's assignment
    "bind-fails",  # the write failed: the reservation goes
    "bind-in-doubt",  # the write's outcome is unknown
    "stale-event",  # the watch repeats the pod as it was
    "peer-binds",  # another replica bound the pod, to other cards
    "hand-annotated",  # an annotation written by hand on the pod, unbound
    "annotation-off",  # someone takes the annotation off
    "delete",  # the pod goes; a new one of the same name comes
    "expire",  # 31 s pass
    "relist",
    "node-gone",
    "node-back",
)


class _Run:
    def __init__(self) -> None:
        self.now = 0.0
        self.state = SchedulerState(reservation_ttl_s=30, doubt_s=90, clock=lambda: self.now)
        self.placer = Placer()
        self.nodes = {n: node_obj(n, 2) for n in NODES}
        self.pods: dict[int, dict[str, Any]] = {}
        self.generation = [0] * PODS
        for i in range(PODS):
            self._new_pod(i)
        with self.state.lock:
            for obj in self.nodes.values():
                self.state.apply_node(obj)

    def _new_pod(self, i: int) -> None:
        self.generation[i] += 1
        obj = pod_obj(f"p{i}", gpu=1, memory=15000 + 5000 * i, cores=20)
        obj["metadata"]["uid"] = f"uid-{i}-{self.generation[i]}"
        obj["metadata"]["resourceVersion"] = str(self.generation[i])
        self.pods[i] = obj

    def step(self, op: str, i: int) -> None:
        s, key, obj = self.state, f"default/p{i}", self.pods[i]
        uid = obj["metadata"]["uid"]
        with s.lock:
            res = s.reservations.get(key)
            if op == "filter":
                bound = bool(obj["spec"].get("nodeName"))
                if not bound:
                    filter_pod(s, self.placer, ExtenderArgs(pod=obj, node_names=list(NODES)))
            elif op == "bind-lands" and res is not None and res.uid == uid:
                obj = copy.deepcopy(obj)
                obj["spec"]["nodeName"] = res.node
                obj["metadata"]["annotations"][keys.ASSIGNMENT] = keys.encode_assignment(
                    res.assignment
                )
                self.pods[i] = obj
                s.apply_pod(obj)
            elif op == "bind-fails" and res is not None:
                s.unreserve(key, res.assignment)
            elif op == "bind-in-doubt" and res is not None:
                s.doubt(key, res.assignment)
            elif op in ("peer-binds", "hand-annotated") and not obj["spec"].get("nodeName"):
                node = NODES[(i + int(self.now)) % 2]
                assignment = self._fitting(obj, node)
                if assignment is not None:
                    obj = copy.deepcopy(obj)
                    if op == "peer-binds":
                        obj["spec"]["nodeName"] = node
                    obj["metadata"]["annotations"][keys.ASSIGNMENT] = keys.encode_assignment(
                        assignment
                    )
                    self.pods[i] = obj
                    s.apply_pod(obj)
            elif op == "stale-event":
                s.apply_pod(obj)
            elif op == "annotation-off":
                obj = copy.deepcopy(obj)
                obj["metadata"]["annotations"].pop(keys.ASSIGNMENT, None)
                self.pods[i] = obj
                s.apply_pod(obj)
            elif op == "delete":
                s.apply_pod(obj, deleted=True)
                self._new_pod(i)
            elif op == "expire":
                self.now += 31
                s.expire_reservations()
            elif op == "node-gone":
                s.apply_node(self.nodes[NODES[i % 2]], deleted=True)
            elif op == "node-back":
                s.apply_node(self.nodes[NODES[i % 2]])
        if op == "relist":
            s.replace_pods(list(self.pods.values()))

    def _fitting(self, obj: dict[str, Any], node: str) -> Assignment | None:
        """Cards on ``node`` that fit the pod now (as another writer would pick them)."""
        request = self.state.parse(obj)
        assert request is not None
        try:
            return pick_cards(
                self.state.cluster.snapshot(), request, node, self.placer.policy(request)
            )
        except PlacementError:
            return None

    def check(self) -> None:
        s = self.state
        with s.lock:
            assert s.cluster.check_invariants() == []
            for key, booking in s.cluster.bookings().items():
                res = s.reservations.get(key)
                want = (res.uid, res.assignment) if res else None
                if want is None and key in s.observed:
                    want = (s.observed[key].uid, s.observed[key].assignment)
                assert (booking.pod.uid, booking.assignment) == want, key
            for i, obj in self.pods.items():
                key = f"default/p{i}"
                text = obj["metadata"]["annotations"].get(keys.ASSIGNMENT)
                if obj["spec"].get("nodeName") and text:  # bound: the annotation is the truth
                    assert key not in s.reservations, key
                    assert s.held(key) == keys.decode_assignment(key, text), key
                elif not text and not obj["spec"].get("nodeName") and key not in s.reservations:
                    assert s.held(key) is None, key  # unbound, nothing asked for it
            for i in range(PODS):
                key = f"default/p{i}"
                wanted = s.held(key)
                if wanted is None or wanted.node not in s.cluster:
                    continue
                booked = s.cluster.booking(key) is not None
                assert booked or s.problems["conflicting-assignment"], key


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, PODS - 1)), max_size=60))
def test_the_cluster_books_the_reservation_else_the_observed_assignment(
    steps: list[tuple[str, int]],
) -> None:
    run = _Run()
    for op, i in steps:
        run.step(op, i)
        run.check()
