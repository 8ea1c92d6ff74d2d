"""filter: the placement core's decision, reserved at once, with reasons for the rest."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tessera.kube import EVENTS
from tessera.model.types import PodRequest
from tessera.placement.place import place
from tessera.placement.policies import make_policy
from tessera.scheduler.prioritize import scale
from tests.unit._scheduler_world import World, add_quota, gpu_quota, node_obj, pod_obj, scraped
from tests.unit._wait import eventually


@pytest.fixture
def world() -> Iterator[World]:
    w = World([node_obj("n1", 1, "A100"), node_obj("n2", 2, "T4")])
    yield w
    w.close()


def test_narrow_filter_returns_the_placement_core_decision(world: World) -> None:
    pod = world.create(pod_obj("p", gpu=1, memory=4000))
    with world.app.state.lock:
        snap = world.app.state.cluster.snapshot()
        request = world.app.state.parse(pod)
        assert isinstance(request, PodRequest)
        expected = place(snap, request, make_policy("binpack"))
    out = world.filter(pod, ["n2", "n1"])  # the order the scheduler offers does not matter
    assert out["NodeNames"] == [expected.node]
    assert world.app.state.reservations.get("default/p") is not None


def test_reservation_is_seen_by_the_next_cycle_before_bind(world: World) -> None:
    a = world.create(pod_obj("a", gpu=1, annotations={"tessera.io/gpu-model": "A100"}))
    b = world.create(pod_obj("b", gpu=1, annotations={"tessera.io/gpu-model": "A100"}))
    assert world.filter(a)["NodeNames"] == ["n1"]
    out = world.filter(b)  # a's bind has not come yet
    assert out["NodeNames"] == []
    assert set(out["FailedNodes"]) == {"n1", "n2"}
    assert "T4" in out["FailedNodes"]["n2"] or "model" in out["FailedNodes"]["n2"]


def test_filtering_a_pod_again_drops_its_earlier_reservation(world: World) -> None:
    a = world.create(pod_obj("a", gpu=1, annotations={"tessera.io/gpu-model": "A100"}))
    assert world.filter(a)["NodeNames"] == ["n1"]
    assert world.filter(a)["NodeNames"] == ["n1"]
    assert world.app.state.held_count() == 1


def test_expired_reservation_is_released() -> None:
    now = [0.0]
    w = World([node_obj("n1", 1)], reservation_ttl_s=5)
    w.app.state.clock = lambda: now[0]
    try:
        a = w.create(pod_obj("a"))
        b = w.create(pod_obj("b"))
        assert w.filter(a)["NodeNames"] == ["n1"]
        assert w.filter(b)["NodeNames"] == []
        now[0] = 6.0  # a's bind never came
        assert w.filter(b)["NodeNames"] == ["n1"]
    finally:
        w.close()


def test_unknown_nodes_and_a_pod_without_gpus(world: World) -> None:
    pod = world.create(pod_obj("p", gpu=8))
    out = world.filter(pod, ["n1", "cpu-node"])
    assert out["NodeNames"] == []
    assert "tessera.io/inventory" in out["FailedNodes"]["cpu-node"]
    plain = world.create(pod_obj("plain", gpu=None))
    assert world.filter(plain, ["n1", "cpu-node"])["NodeNames"] == ["n1", "cpu-node"]


def test_bad_spec_is_unresolvable_on_every_node(world: World) -> None:
    pod = pod_obj("bad", gpu=1, cores=150)
    pod["metadata"]["uid"] = "u"
    out = world.filter(pod, ["n1", "n2"])
    assert out["NodeNames"] == []
    assert set(out["FailedAndUnresolvableNodes"]) == {"n1", "n2"}
    why = out["FailedAndUnresolvableNodes"]["n1"]
    assert "tessera.io/gpu-cores" in why
    assert scraped(world, "tessera_scheduler_failures_total", verb="filter", reason="bad-spec") == 1

    def said() -> list[str]:
        return [e["message"] for e in world.kube.list(EVENTS, "default").items
                if e.get("reason") == "TesseraInvalidSpec"]  # fmt: skip

    assert eventually(said) == [why]


@pytest.mark.parametrize(
    ("scores", "scaled"),
    [
        ({}, {}),
        ({"a": 3.0, "b": 3.0}, {"a": 9, "b": 9}),  # all equal: all at the top
        ({"a": 0.0, "b": 1.0, "c": 4.0}, {"a": 0, "b": 2, "c": 9}),  # lowest 0, highest 9
        ({"a": -2.0, "b": -1.0}, {"a": 0, "b": 9}),
        ({"a": 10.0, "b": 17.0, "c": 20.0}, {"a": 0, "b": 6, "c": 9}),  # 6.3 rounds to 6
    ],
)
def test_policy_scores_are_scaled_from_0_to_9_leaving_10_for_the_reserved_node(
    scores: dict[str, float], scaled: dict[str, int]
) -> None:
    assert scale(scores) == scaled


def test_prioritize_without_a_reservation_gives_no_node_the_top_score() -> None:
    w = World([node_obj("n1", 2), node_obj("n2", 2)], narrow=False)
    try:
        pod = w.create(pod_obj("p", gpu=1, memory=1000))  # no filter first: nothing reserved
        status, scores = w.post("prioritize", {"Pod": pod, "NodeNames": ["n1", "n2", "n9"]})
        assert status == 200
        by_host = {s["Host"]: s["Score"] for s in scores}
        assert set(by_host) == {"n1", "n2", "n9"} and by_host["n9"] == 0  # n9: unknown
        assert max(by_host.values()) == 9
    finally:
        w.close()


def test_scored_mode_returns_every_feasible_node() -> None:
    w = World([node_obj("n1", 2), node_obj("n2", 2)], narrow=False)
    try:
        pod = w.create(pod_obj("p", gpu=1, memory=1000))
        assert w.filter(pod)["NodeNames"] == ["n1", "n2"]
        status, scores = w.post("prioritize", {"Pod": pod, "NodeNames": ["n1", "n2"]})
        assert status == 200
        assert {s["Host"] for s in scores} == {"n1", "n2"}
        assert max(s["Score"] for s in scores) == 10
        assert all(0 <= s["Score"] <= 10 for s in scores)
    finally:
        w.close()


NO_WHOLE_A100 = {"name": "a100", "models": ["A100"], "cards": 0}


def test_prioritize_scores_the_offered_nodes_only() -> None:
    w = World([node_obj("n1", 2), node_obj("n2", 2), node_obj("n3", 2)], narrow=False)
    try:
        pod = w.create(pod_obj("p", gpu=1, memory=1000))
        status, scores = w.post("prioritize", {"Pod": pod, "NodeNames": ["n1", "n2"]})
        assert status == 200 and {s["Host"] for s in scores} == {"n1", "n2"}
    finally:
        w.close()


def test_a_pod_with_a_sidecar_goes_where_its_quota_lets_it(world: World) -> None:
    """default's quota allows no whole A100: the pod (a sidecar beside its GPU container)
    fails on n1 for the quota and is placed on n2's T4s."""
    add_quota(world, gpu_quota("default", NO_WHOLE_A100))
    pod = pod_obj("p", gpu=1, annotations={"tessera.io/gpu-exclusive": "true"})
    pod["spec"]["containers"].insert(0, {"name": "log", "image": "x"})
    pod = world.create(pod)
    out = world.filter(pod, ["n1"])
    assert out["NodeNames"] == [] and out["FailedNodes"]["n1"].startswith("quota: default/gpus")
    assert world.filter(pod, ["n1", "n2"])["NodeNames"] == ["n2"]


def whole_card_pod(w: World) -> dict[str, object]:
    return w.create(pod_obj("p", gpu=1, annotations={"tessera.io/gpu-exclusive": "true"}))


def test_scored_mode_keeps_to_the_offered_nodes_and_says_why_for_the_rest() -> None:
    w = World([node_obj("n1", 1, "A100"), node_obj("n2", 2, "T4"), node_obj("n3", 2, "T4")],
              narrow=False)  # fmt: skip
    try:
        add_quota(w, gpu_quota("default", NO_WHOLE_A100))
        pod = whole_card_pod(w)
        out = w.filter(pod, ["n1", "n2"])
        assert out["NodeNames"] == ["n2"]
        assert list(out["FailedNodes"]) == ["n1"]
        assert out["FailedNodes"]["n1"].startswith("quota: default/gpus a100 (A100)")
        res = w.app.state.reservations.get("default/p")
        assert res is not None and (res.node, res.uid) == ("n2", pod["metadata"]["uid"])
    finally:
        w.close()


def test_a_node_refused_for_its_quota_says_so_after_an_unknown_one(world: World) -> None:
    add_quota(world, gpu_quota("default", NO_WHOLE_A100))
    out = world.filter(whole_card_pod(world), ["ghost", "n1"])
    assert out["FailedNodes"]["ghost"].startswith("no tessera.io/inventory annotation")
    assert out["FailedNodes"]["n1"].startswith("quota: default/gpus a100 (A100)")
