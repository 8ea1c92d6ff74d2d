"""Random requests, releases and node events through placement; invariants every step.

Properties: whatever place() decides can be booked; after every step the state passes its
invariant check (no card over memory, cores, slots or exclusivity; no model/UUID constraint
broken; CPU/memory not over; arrays in step with the bookings); place() fails exactly when
filter_nodes finds no node, and then gives a reason per node.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessera.cluster import ClusterState
from tessera.errors import PlacementError
from tessera.model.types import Card, ContainerRequest, GpuRequest, NodeInventory, PodRequest
from tessera.placement import POLICIES, WorkloadMix, filter_nodes, make_policy, place

MODELS = ("T4", "A100")


@st.composite
def inventories(draw: st.DrawFn, name: str) -> NodeInventory:
    n = draw(st.integers(0, 8))
    model = draw(st.sampled_from(MODELS))
    memory = draw(st.sampled_from([8000, 16000, 40000]))
    slots = draw(st.sampled_from([1, 2, 3, 16]))
    cards = tuple(
        Card(
            uuid=f"{name}-g{i}",
            index=i,
            model=model,
            memory_mib=memory,
            numa_node=i * 2 // max(n, 1),
            nvlink_peers=(i ^ 1,) if (i ^ 1) < n else (),
            healthy=draw(st.booleans()) or draw(st.booleans()),  # mostly healthy
            slots=slots,  # small counts so the per-card container cap binds
        )
        for i in range(n)
    )
    return NodeInventory(name, cards, draw(st.sampled_from([4000, 16000, 64000])), 65536)


@st.composite
def gpu_requests(draw: st.DrawFn) -> GpuRequest:
    count = draw(st.integers(1, 3))
    constraint = draw(st.sampled_from(["none", "models", "exclude", "uuid"]))
    extra: dict[str, frozenset[str]] = {}
    if constraint == "models":
        extra["models"] = frozenset({draw(st.sampled_from(MODELS))})
    elif constraint == "exclude":
        extra["models_exclude"] = frozenset({draw(st.sampled_from(MODELS))})
    elif constraint == "uuid":
        extra["uuids_exclude"] = frozenset({f"n{draw(st.integers(0, 3))}-g0"})
    if draw(st.integers(0, 4)) == 0:
        return GpuRequest(count=count, exclusive=True, **extra)  # type: ignore[arg-type]
    cores = draw(st.sampled_from([0, 10, 25, 50, 100]))
    if draw(st.booleans()):
        return GpuRequest(
            count=count,
            memory_mib=draw(st.sampled_from([500, 4000, 9000])),
            cores_percent=cores,
            **extra,
        )  # type: ignore[arg-type]
    return GpuRequest(
        count=count,
        memory_percent=draw(st.sampled_from([10, 30, 50])),
        cores_percent=cores,
        **extra,
    )  # type: ignore[arg-type]


@st.composite
def pods(draw: st.DrawFn, name: str) -> PodRequest:
    shape = draw(st.sampled_from(["cpu", "one", "one", "one", "two", "init"]))
    containers: list[ContainerRequest] = []
    if shape == "cpu":
        containers.append(ContainerRequest("main"))
    else:
        containers.append(ContainerRequest("main", draw(gpu_requests())))
    if shape == "two":
        containers.append(ContainerRequest("side", draw(gpu_requests())))
    if shape == "init":
        containers.insert(0, ContainerRequest("setup", draw(gpu_requests()), init=True))
    return PodRequest(
        "ns",
        name,
        tuple(containers),
        cpu_milli=draw(st.sampled_from([0, 1000, 6000])),
        memory_mib=draw(st.sampled_from([0, 4096, 32768])),
    )


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_placements_keep_every_invariant(data: st.DataObject) -> None:
    nodes = [data.draw(inventories(f"n{i}")) for i in range(data.draw(st.integers(1, 4)))]
    state = ClusterState(nodes)
    mix = WorkloadMix()
    policy_name = data.draw(
        st.sampled_from([*sorted(POLICIES), "spread/binpack", "fragmentation/topology"])
    )
    policy = make_policy(policy_name, seed=data.draw(st.integers(0, 3)), mix=mix)
    placed: list[str] = []
    for step in range(data.draw(st.integers(1, 25))):
        action = data.draw(st.sampled_from(["place"] * 6 + ["release", "sicken", "remove", "add"]))
        if action == "place":
            pod = data.draw(pods(f"p{step}"))
            mix.observe(pod)
            snap = state.snapshot()
            try:
                decision = place(snap, pod, policy)
            except PlacementError as err:
                assert set(err.reasons) == set(snap.node_names())
                assert filter_nodes(snap, pod).feasible == []
            else:
                state.assign(
                    pod, decision.assignment
                )  # never refused: place only offers sound cards
                placed.append(pod.key)
                if len(pod.gpu_containers()) <= 1:  # else the policy's pick may do better
                    assert decision.node in filter_nodes(snap, pod).feasible
        elif action == "release" and placed:
            key = placed.pop(data.draw(st.integers(0, len(placed) - 1)))
            assert state.release(key) in (True, False)  # False if its node was removed
        elif action == "sicken" and len(state):
            name = data.draw(st.sampled_from(state.node_names()))
            inv = state.node(name)
            if inv.cards:
                i = data.draw(st.integers(0, len(inv.cards) - 1))
                cards = list(inv.cards)
                cards[i] = replace(cards[i], healthy=False)
                state.update_node(replace(inv, cards=tuple(cards)))
        elif action == "remove" and len(state) > 1:
            state.remove_node(data.draw(st.sampled_from(state.node_names())))
        elif action == "add":
            name = f"x{step}"
            state.add_node(data.draw(inventories(name)))
        assert state.check_invariants() == [], (action, step)
    # Releasing everything gives every card back whole.
    for key in placed:
        state.release(key)
    snap = state.snapshot()
    for name in snap.node_names():
        for cf in snap.cards_free(name):
            assert (cf.memory_mib, cf.cores_percent, cf.tenants) == (cf.card.memory_mib, 100, 0)
        assert snap.cpu_free(name) == snap.node(name).cpu_milli
