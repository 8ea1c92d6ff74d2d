"""1,000 mixed GPU pods through the real kube-scheduler with the Tessera extender.

* Serial: placements equal what the placement core decides for the same sequence;
  every pod that fits is bound, the rest wait with reasons; no card over-committed.
* Burst with the extender SIGKILLed and restarted in the middle: no double booking,
  no pod lost, and every pod that fits ends up bound.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tessera.errors import PlacementError
from tessera.kube import PODS, ApiError, Obj
from tessera.kube.kinds import NAMESPACES
from tessera.placement.place import place
from tessera.placement.policies import make_policy
from tests.e2e.scheduler.checks import (
    assignment_of,
    book_all,
    empty_state,
    events_by_pod,
    fits_now,
    request_of,
)
from tests.e2e.scheduler.harness import Harness, PodView, unschedulable
from tests.e2e.scheduler.workload import mixed_pods
from tests.e2e.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _namespace(h: Harness, name: str) -> str:
    h.admin.create(NAMESPACES, {"metadata": {"name": name}})
    h.ensure_default_service_account(name)
    return name


def _settled(pod: Obj | None) -> bool:
    return pod is not None and (bool(pod["spec"].get("nodeName")) or unschedulable(pod))


def _clear(h: Harness, view: PodView, ns: str) -> None:
    """Delete every pod of ``ns`` and wait until the extender holds no card."""
    for pod in view.all():
        h.admin.delete(PODS, pod["metadata"]["name"], ns)
    wait_for("the pods to go", lambda: not view.all(), 180, 0.5)
    ext = h.extender
    assert ext is not None
    wait_for("the cards to come back",
             lambda: ext.metric("tessera_scheduler_cards_allocated") == 0, 60, 0.5)  # fmt: skip


def test_serial_placements_equal_the_placement_core(harness: Harness) -> None:
    h = harness
    ns = _namespace(h, "serial")
    view = PodView(h.admin, ns)
    pods = mixed_pods(1000, h.nodes, seed=7, prefix="s")
    try:
        for pod in pods:
            name = pod["metadata"]["name"]
            h.admin.create(PODS, pod, ns)
            wait_for(
                f"pod {name} to be bound or refused",
                lambda n=name: _settled(view.get(n)),
                60,
                0.005,
            )
        time.sleep(1.0)  # let the last binds' watch events arrive
        final = {p["metadata"]["name"]: p for p in view.all()}
        assert len(final) == 1000

        # 1. Nothing over-committed, judged from the annotations alone.
        state, problems = book_all(h.admin, list(final.values()))
        assert problems == []

        # 2. The same sequence through the placement core gives the same placements.
        replay = empty_state(h.admin)
        policy = make_policy("binpack")
        bound = pending = 0
        mismatches = []
        for pod in pods:
            name = pod["metadata"]["name"]
            live = final[name]
            request = request_of(live)
            try:
                decision = place(replay.snapshot(), request, policy)
            except PlacementError:
                decision = None
            got = assignment_of(live) if live["spec"].get("nodeName") else None
            if decision is None:
                pending += 1
                if got is not None:
                    mismatches.append(
                        f"{name}: core says no node, scheduler bound it to {got.node}"
                    )
                continue
            bound += 1
            replay.assign(request, decision.assignment)
            if got != decision.assignment:
                mismatches.append(f"{name}: core {decision.assignment}, scheduler {got}")
        assert mismatches == [], mismatches[:5]
        assert bound > 500 and pending > 20, (bound, pending)

        # 3. Every waiting pod cannot fit on the final state, and says why in an event
        # (the extender writes events from a queue: the last may land a moment later).
        waiting = [name for name, live in final.items() if not live["spec"].get("nodeName")]
        for name in waiting:
            assert fits_now(state, final[name]) == [], name

        def explained() -> dict[str, list[str]]:
            events = events_by_pod(h.admin, ns)
            return {
                name: [
                    e["message"]
                    for e in events.get(name, [])
                    if e["reason"] == "TesseraUnschedulable"
                ]
                for name in waiting
            }

        def unexplained() -> str:
            return str([name for name, messages in explained().items() if not messages][:5])

        wait_for("a TesseraUnschedulable event for every waiting pod",
                 lambda: all(explained().values()), 30, 0.5, unexplained)  # fmt: skip
        for name, messages in explained().items():
            assert messages[0].startswith("0/100 nodes fit — "), (name, messages[0])
    finally:
        _clear(h, view, ns)
        view.stop()


def _create_retrying(h: Harness, pod: Obj, ns: str) -> None:
    """Create like a controller: while Tessera is down its webhook (failurePolicy Fail)
    refuses GPU pods, and the creator tries again."""
    for _ in range(120):
        try:
            h.admin.create(PODS, pod, ns)
            return
        except ApiError as exc:
            if "webhook" not in exc.message:
                raise
            time.sleep(0.5)
    raise AssertionError(f"{pod['metadata']['name']}: refused for a minute")


def test_burst_with_extender_killed_midway(harness: Harness) -> None:
    h = harness
    assert h.extender is not None
    ns = _namespace(h, "burst")
    view = PodView(h.admin, ns)
    pods = mixed_pods(1000, h.nodes, seed=11, prefix="b")
    try:
        with ThreadPoolExecutor(16) as pool:
            futures = [pool.submit(_create_retrying, h, p, ns) for p in pods]
            wait_for("300 pods bound", lambda: sum(
                1 for p in view.all() if p["spec"].get("nodeName")) >= 300, 300, 0.05)  # fmt: skip
            h.extender.kill()
            time.sleep(2.0)  # binds the dead process had sent land (or not) meanwhile
            bound_at_kill = sum(1 for p in view.all() if p["spec"].get("nodeName"))
            h.extender.start()
            for f in futures:
                f.result()

        def done() -> bool:
            live = view.all()
            if len(live) < 1000:
                return False
            state, problems = book_all(h.admin, live)
            assert problems == []  # checked on every round, not only at the end
            return all(p["spec"].get("nodeName") or not fits_now(state, p) for p in live)

        wait_for("every pod that fits to be bound", done, 420, 2.0)
        live = view.all()
        assert len(live) == 1000  # no pod lost
        _state, problems = book_all(h.admin, live)
        assert problems == []
        bound = sum(1 for p in live if p["spec"].get("nodeName"))
        assert bound > 500, bound
        # The restarted process, rebuilt from the annotations, placed the rest.
        assert bound > bound_at_kill
        assert h.extender.metric("tessera_scheduler_placements_total") >= bound - bound_at_kill
    finally:
        _clear(h, view, ns)
        view.stop()
