"""Placement: filter reasons, card picking, policies, determinism. Snapshots from plain lists."""

from __future__ import annotations

import numpy as np
import pytest

from tessera.cluster import ClusterState
from tessera.errors import PlacementError, SpecError
from tessera.model.types import (
    Assignment,
    Card,
    ContainerRequest,
    GpuRequest,
    NodeInventory,
    PodRequest,
)
from tessera.placement import (
    POLICIES,
    WorkloadMix,
    filter_nodes,
    make_policy,
    pick_cards,
    place,
    score_nodes,
)


def node(
    name: str,
    cards: int = 2,
    memory: int = 16000,
    cpu: int = 8000,
    model: str = "T4",
    healthy: bool = True,
    slots: int = 16,
) -> NodeInventory:
    return NodeInventory(
        name=name,
        cards=tuple(
            Card(f"{name}-g{i}", i, model, memory, healthy=healthy, slots=slots)
            for i in range(cards)
        ),
        cpu_milli=cpu,
        memory_mib=64000,
    )


def gpu_pod(name: str = "p", cpu: int = 1000, **gpu: object) -> PodRequest:
    request = GpuRequest(**gpu)  # type: ignore[arg-type]
    return PodRequest(
        "ns", name, (ContainerRequest("main", request),), cpu_milli=cpu, memory_mib=1000
    )


def share(mem: int = 4000, cores: int = 30, count: int = 1, **kw: object) -> PodRequest:
    return gpu_pod(count=count, memory_mib=mem, cores_percent=cores, **kw)


def book(
    state: ClusterState, p: PodRequest, policy: str = "binpack", node_name: str | None = None
) -> Assignment:
    snap = state.snapshot()
    if node_name is None:
        a = place(snap, p, make_policy(policy)).assignment
    else:
        a = pick_cards(snap, p, node_name, make_policy(policy))
    state.assign(p, a)
    return a


@pytest.mark.parametrize(
    ("nodes", "pod", "reason"),
    [
        ([node("n", cards=0)], share(), "no GPU on node"),
        ([node("n", healthy=False)], share(), "no healthy card"),
        ([node("n")], share(models_exclude=frozenset({"T4"})), "model T4 excluded"),
        ([node("n")], share(models=frozenset({"A100"})), "model T4 not in A100"),
        ([node("n")], share(uuids=frozenset({"other"})), "no card with an allowed UUID"),
        ([node("n", cpu=500)], share(), "insufficient cpu"),
        ([node("n")], share(mem=20000), "no card with 20000 MiB and 30% cores free"),
        ([node("n")], share(count=3), "fewer than 3 healthy cards"),
        (
            [node("n", cards=4, memory=3000)],
            share(count=3),
            "fewer than 3 cards with 4000 MiB and 30% cores free",
        ),
        (
            [node("n")],
            gpu_pod(
                count=1, memory_mib=1, models=frozenset({"T4"}), models_exclude=frozenset({"T4"})
            ),
            "model T4 excluded",
        ),
        ([node("n")], gpu_pod(count=1, memory_percent=50), None),
    ],
)
def test_filter_gives_a_groupable_reason_per_failed_node(
    nodes: list[NodeInventory], pod: PodRequest, reason: str | None
) -> None:
    result = filter_nodes(ClusterState(nodes).snapshot(), pod)
    if reason is None:
        assert result.feasible == ["n"] and result.reasons == {}
    else:
        assert result.feasible == [] and result.reasons == {"n": reason}


def mixed(name: str, *models: str, cordoned: tuple[int, ...] = ()) -> NodeInventory:
    """A node with one card of each model, those at ``cordoned`` taken out of service."""
    cards = tuple(
        Card(f"{name}-g{i}", i, m, 16000, cordoned=i in cordoned) for i, m in enumerate(models)
    )
    return NodeInventory(name=name, cards=cards, cpu_milli=8000, memory_mib=64000)


@pytest.mark.parametrize(
    ("inv", "pod", "reason"),
    [
        (mixed("n", "A100", "T4"), share(count=2, models_exclude=frozenset({"T4"})),
         "fewer than 2 cards of an allowed model"),
        (mixed("n", "A100", "T4"), share(models_exclude=frozenset({"A100", "T4"})),
         "model A100,T4 excluded"),
        (mixed("n", "A100", "T4"), share(models=frozenset({"L4", "H100"})),
         "model A100,T4 not in H100,L4"),
        (mixed("n", "T4", "T4"), share(count=2, uuids=frozenset({"n-g0"})),
         "no card with an allowed UUID"),
        (mixed("n", "T4", "T4", "T4", "T4", cordoned=(0, 1)),
         share(count=2, uuids=frozenset({"n-g0", "n-g1"})), "card n-g0,n-g1 cordoned"),
    ],
    ids=["some-excluded", "all-excluded", "not-listed", "too-few-pinned", "pinned-cordoned"],
)  # fmt: skip
def test_a_model_or_uuid_reason_names_every_card_or_model_in_the_way(
    inv: NodeInventory, pod: PodRequest, reason: str
) -> None:
    result = filter_nodes(ClusterState([inv]).snapshot(), pod)
    assert result.feasible == [] and result.reasons == {"n": reason}


def test_each_node_gets_its_own_reason() -> None:
    """A node without cards among nodes with cards is told so, not "no healthy card"."""
    nodes = [node("cpu-only", cards=0), node("broken", healthy=False), node("ok")]
    result = filter_nodes(ClusterState(nodes).snapshot(), share())
    assert result.feasible == ["ok"]
    assert result.reasons == {"cpu-only": "no GPU on node", "broken": "no healthy card"}


def test_a_memory_share_is_described_as_a_share() -> None:
    state = ClusterState([node("a", cards=1)])
    book(state, share(name="x", mem=12000, cores=10))
    result = filter_nodes(state.snapshot(), gpu_pod(count=1, memory_percent=50, cores_percent=10))
    assert result.reasons == {"a": "no card with 50% memory and 10% cores free"}


def test_filter_reasons_depend_on_occupancy_and_unknown_names() -> None:
    state = ClusterState([node("a"), node("b")])
    book(state, share(name="x", mem=15000, cores=10), node_name="a")
    book(state, share(name="y", mem=15000, cores=10), node_name="a")
    result = filter_nodes(state.snapshot(), share(mem=2000), ["a", "b", "ghost"])
    assert result.feasible == ["b"]
    assert result.reasons == {
        "a": "no card with 2000 MiB and 30% cores free",
        "ghost": "node not in the cluster state",
    }


def test_exclusive_holders_block_everyone_and_need_an_empty_card() -> None:
    state = ClusterState([node("a", cards=1)])
    book(state, share(name="x", mem=100, cores=0))  # best-effort: memory only
    assert filter_nodes(state.snapshot(), gpu_pod(count=1, exclusive=True)).feasible == []
    state.release("ns/x")
    book(state, gpu_pod(name="w", count=1, exclusive=True))
    assert filter_nodes(state.snapshot(), share(mem=1, cores=0)).feasible == []
    assert filter_nodes(state.snapshot(), gpu_pod(count=1, exclusive=True)).reasons == {
        "a": "no free whole card"
    }


def test_best_effort_takes_only_memory() -> None:
    state = ClusterState([node("a", cards=1)])
    book(state, share(name="x", mem=1000, cores=100))
    assert filter_nodes(state.snapshot(), share(mem=1000, cores=0)).feasible == ["a"]
    assert filter_nodes(state.snapshot(), share(mem=1000, cores=1)).feasible == []


def test_percent_memory_resolves_per_card() -> None:
    big = node("big", cards=1, memory=80000, model="A100")
    state = ClusterState([node("small", cards=1), big])
    a = pick_cards(
        state.snapshot(), gpu_pod(count=1, memory_percent=50), "big", make_policy("binpack")
    )
    assert a.containers[0].slices[0].memory_mib == 40000


@pytest.mark.parametrize(("taken", "fits"), [(8000, True), (8001, False)])
def test_a_memory_share_rounds_down_to_whole_mib(taken: int, fits: bool) -> None:
    """Half of a 15999 MiB card is 7999 MiB: it fits in 7999 free, not in 7998."""
    state = ClusterState([node("a", cards=1, memory=15999)])
    book(state, share(name="x", mem=taken, cores=0))
    result = filter_nodes(state.snapshot(), gpu_pod(count=1, memory_percent=50))
    assert result.feasible == (["a"] if fits else [])


def test_place_raises_with_reasons_when_nothing_fits() -> None:
    state = ClusterState([node("a", cpu=500), node("b", cpu=500), node("c", model="P100")])
    with pytest.raises(PlacementError) as err:
        place(state.snapshot(), share(models=frozenset({"T4"})), make_policy("binpack"))
    assert err.value.reasons == {
        "a": "insufficient cpu",
        "b": "insufficient cpu",
        "c": "model P100 not in T4",
    }
    assert "0/3 nodes fit: 2 insufficient cpu, 1 model P100 not in T4" in str(err.value)


def test_binpack_fills_the_busiest_node_and_card() -> None:
    state = ClusterState([node("a"), node("b")])
    first = book(state, share(name="x"))
    second = book(state, share(name="y"))
    assert first.node == second.node
    assert first.containers[0].slices[0].uuid == second.containers[0].slices[0].uuid


def test_spread_goes_to_the_idlest_node_and_card() -> None:
    state = ClusterState([node("a"), node("b")])
    first = book(state, share(name="x"), "spread")
    second = book(state, share(name="y"), "spread")
    assert first.node != second.node
    third = book(state, share(name="z"), "spread")
    assert third.containers[0].slices[0].uuid not in {
        first.containers[0].slices[0].uuid,
        second.containers[0].slices[0].uuid,
    }


def test_node_and_card_halves_combine() -> None:
    state = ClusterState([node("a"), node("b")])
    book(state, share(name="x"), "spread/binpack")
    a = book(state, share(name="y"), "spread/binpack")
    b = book(state, share(name="z"), "spread/binpack")
    assert a.node != b.node or a.containers[0].slices[0].uuid == b.containers[0].slices[0].uuid


def test_best_fit_prefers_the_tightest_node() -> None:
    state = ClusterState([node("roomy", memory=32000), node("tight", memory=8000)])
    assert book(state, share(mem=6000, cores=10), "best-fit").node == "tight"


def test_random_is_deterministic_per_seed() -> None:
    nodes = [node(f"n{i}") for i in range(20)]

    def run(seed: int) -> list[str]:
        state = ClusterState(nodes)
        policy = make_policy("random", seed=seed)
        out = []
        for i in range(10):
            d = place(state.snapshot(), share(name=f"p{i}"), policy)
            state.assign(share(name=f"p{i}"), d.assignment)
            out.append(d.node)
        return out

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_two_gpu_containers_may_share_a_card_and_init_reuses_app_slices() -> None:
    state = ClusterState([node("a", cards=1)])
    gpu = GpuRequest(count=1, memory_mib=6000, cores_percent=40)
    pod = PodRequest(
        "ns",
        "p",
        (
            ContainerRequest(
                "setup", GpuRequest(count=1, memory_mib=14000, cores_percent=90), init=True
            ),
            ContainerRequest("one", gpu),
            ContainerRequest("two", gpu),
        ),
    )
    d = place(state.snapshot(), pod, make_policy("binpack"))
    assert [c.slices[0].uuid for c in d.assignment.containers] == ["a-g0"] * 3
    state.assign(pod, d.assignment)
    card = state.snapshot().cards_free("a")[0]
    assert (card.memory_mib, card.cores_percent) == (2000, 10)  # max(init 14000, 12000)
    assert state.check_invariants() == []


def pod_of(*containers: ContainerRequest) -> PodRequest:
    return PodRequest("ns", "p", containers)


def test_a_pods_larger_slices_are_placed_first() -> None:
    """6000 + 4000 and 5000 + 5000 MiB fill two 10000 MiB cards; taken smallest first,
    4000 and 5000 would share one and 6000 find no room beside the other 5000."""
    sizes = (4000, 5000, 6000, 5000)
    pod = pod_of(*(ContainerRequest(f"c{i}", GpuRequest(1, memory_mib=m)) for i, m in
                   enumerate(sizes)))  # fmt: skip
    state = ClusterState([node("a", cards=2, memory=10000)])
    d = place(state.snapshot(), pod, make_policy("binpack"))
    state.assign(pod, d.assignment)
    assert [c.memory_mib for c in state.snapshot().cards_free("a")] == [0, 0]


@pytest.mark.parametrize("scarce", ["memory", "cores"])
def test_binpack_weighs_a_card_with_what_the_pods_earlier_containers_took(scarce: str) -> None:
    """Another pod holds a little of a1; the pod's large container fits only on a0 and
    leaves it the fuller card, so its small one joins it there."""

    def ask(size: int) -> dict[str, int]:  # size: percent of a card's scarce resource
        if scarce == "memory":
            return {"count": 1, "memory_mib": size * 160}
        return {"count": 1, "memory_mib": 10, "cores_percent": size}

    state = ClusterState([node("a", cards=2)])
    book(state, gpu_pod("other", **ask(20), uuids=frozenset({"a-g1"})))
    large, small = GpuRequest(**ask(90)), GpuRequest(**ask(5))  # type: ignore[arg-type]
    pod = pod_of(ContainerRequest("large", large), ContainerRequest("small", small))
    d = place(state.snapshot(), pod, make_policy("binpack"))
    assert [c.slices[0].uuid for c in d.assignment.containers] == ["a-g0", "a-g0"]


@pytest.mark.parametrize(
    "gpu",
    [GpuRequest(1, memory_mib=6000), GpuRequest(1, memory_mib=10, cores_percent=40)],
    ids=["memory", "cores"],
)
def test_a_pods_containers_on_one_card_add_up(gpu: GpuRequest) -> None:
    """Two of three 6000 MiB (or 40 % cores) containers fill a card; the third goes on
    the other card, and the booking agrees."""
    pod = pod_of(*(ContainerRequest(f"c{i}", gpu) for i in range(3)))
    state = ClusterState([node("a", cards=2)])
    d = place(state.snapshot(), pod, make_policy("binpack"))
    assert [c.slices[0].uuid for c in d.assignment.containers] == ["a-g0", "a-g0", "a-g1"]
    state.assign(pod, d.assignment)
    assert state.check_invariants() == []


def test_init_containers_on_one_card_take_a_slot_each() -> None:
    """Three init containers and an app container: on a card of two slots, the app and
    two init containers; the third needs another card."""
    small = GpuRequest(1, memory_mib=100)
    pod = pod_of(*(ContainerRequest(f"init-{i}", small, init=True) for i in range(3)),
                 ContainerRequest("main", small))  # fmt: skip
    one = ClusterState([node("a", cards=1, slots=2)])
    assert filter_nodes(one.snapshot(), pod).reasons == {
        "a": "cards cannot hold all GPU containers together"
    }
    two = ClusterState([node("b", cards=2, slots=2)])
    d = place(two.snapshot(), pod, make_policy("binpack"))
    assert d.assignment.slots() == {"b-g0": 2, "b-g1": 1}
    two.assign(pod, d.assignment)  # the booking checks the slots again
    assert two.check_invariants() == []


def test_memory_slot_and_capacity_reasons_are_per_node() -> None:
    def host(name: str, memory: int, card_memory: int = 16000) -> NodeInventory:
        return NodeInventory(name, node(name, memory=card_memory).cards, 8000, memory)

    # "exact" has the pod's 1000 MiB of host memory, just enough; its cards are too small.
    nodes = [node("ok"), host("low-mem", 999), node("no-slot", slots=1), node("full"),
             host("exact", 1000, card_memory=1000)]  # fmt: skip
    state = ClusterState(nodes)
    for i in range(2):
        book(state, share(name=f"s{i}", mem=100, cores=0), node_name="no-slot")
        book(state, share(name=f"f{i}", mem=15000, cores=10), node_name="full")
    result = filter_nodes(state.snapshot(), share(mem=2000))
    assert result.feasible == ["ok"]
    assert result.reasons == {
        "low-mem": "insufficient memory",
        "no-slot": "no card with a free slot",
        "full": "no card with 2000 MiB and 30% cores free",
        "exact": "no card with 2000 MiB and 30% cores free",
    }


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize(
    ("request_", "count"),
    [
        (GpuRequest(count=1, memory_mib=100), 17),  # best effort: memory alone never binds
        (GpuRequest(count=1, memory_mib=100, cores_percent=5), 20),
    ],
)
def test_a_card_takes_no_more_containers_than_its_slots(
    policy: str, request_: GpuRequest, count: int
) -> None:
    state = ClusterState([node("a", cards=1)])
    for i in range(16):
        book(state, gpu_pod(f"p{i}", cpu=0, **_fields(request_)), policy)
    for i in range(16, count):
        result = filter_nodes(state.snapshot(), gpu_pod(f"p{i}", cpu=0, **_fields(request_)))
        assert result.reasons == {"a": "no card with a free slot"}
    assert state.check_invariants() == []


def _fields(gpu: GpuRequest) -> dict[str, object]:
    return {"count": gpu.count, "memory_mib": gpu.memory_mib, "cores_percent": gpu.cores_percent}


def test_slots_count_each_container_and_init_containers_like_the_footprint() -> None:
    gpu = GpuRequest(count=1, memory_mib=100)
    pod = PodRequest(
        "ns",
        "p",
        (
            ContainerRequest("setup", gpu, init=True),
            ContainerRequest("one", gpu),
            ContainerRequest("two", gpu),
        ),
    )
    # Two slots: the app containers share the card, the init container takes no third.
    d = place(ClusterState([node("a", cards=1, slots=2)]).snapshot(), pod, make_policy("binpack"))
    assert d.assignment.slots() == {"a-g0": 2}
    # One slot per card: each app container gets its own card.
    state = ClusterState([node("b", cards=2, slots=1)])
    d = place(state.snapshot(), pod, make_policy("binpack"))
    state.assign(pod, d.assignment)
    assert sorted(state.booking("ns/p").slots.values()) == [1, 1]  # type: ignore[union-attr]
    assert filter_nodes(state.snapshot(), gpu_pod("q", count=1, memory_mib=100)).reasons == {
        "b": "no card with a free slot"
    }
    single = ClusterState([node("c", cards=1, slots=1)]).snapshot()
    assert filter_nodes(single, pod).reasons == {
        "c": "cards cannot hold all GPU containers together"
    }


def test_gpu_containers_that_do_not_fit_together_fail_with_a_reason() -> None:
    state = ClusterState([node("a", cards=1)])
    gpu = GpuRequest(count=1, memory_mib=9000, cores_percent=10)
    pod = PodRequest("ns", "p", (ContainerRequest("one", gpu), ContainerRequest("two", gpu)))
    result = filter_nodes(state.snapshot(), pod)
    assert result.reasons == {"a": "cards cannot hold all GPU containers together"}
    with pytest.raises(PlacementError, match=r"^container two does not fit on a$") as err:
        pick_cards(state.snapshot(), pod, "a", make_policy("binpack"))  # as bind asks
    assert err.value.reasons == result.reasons
    with pytest.raises(PlacementError) as err:
        place(state.snapshot(), pod, make_policy("binpack"))
    assert err.value.reasons == result.reasons


def test_ties_go_to_the_first_node_for_a_pod_whose_best_nodes_cannot_hold_it() -> None:
    """The even nodes score alike and above the odd ones (a CPU-only pod on each). The
    pod's two 9000 MiB containers pass the per-container test everywhere, but only
    two-card nodes hold both: of the even ones, n04 and n06, and n04 comes first."""
    two_cards = {4, 6} | set(range(1, 20, 2))
    state = ClusterState([node(f"n{i:02d}", cards=2 if i in two_cards else 1) for i in range(20)])
    for i in range(0, 20, 2):
        book(state, PodRequest("ns", f"cpu-{i}", (), cpu_milli=1000), node_name=f"n{i:02d}")
    gpu = GpuRequest(count=1, memory_mib=9000, cores_percent=10)
    pod = pod_of(ContainerRequest("one", gpu), ContainerRequest("two", gpu))
    snap = state.snapshot()
    d = place(snap, pod, make_policy("binpack"))
    assert d.node == "n04"
    assert d.score == score_nodes(snap, pod, None, make_policy("binpack"))["n04"]


def test_cpu_only_pod_is_placed_without_cards() -> None:
    state = ClusterState([node("a", cpu=500), node("b")])
    pod = PodRequest("ns", "p", (ContainerRequest("main"),), cpu_milli=1000)
    d = place(state.snapshot(), pod, make_policy("fragmentation"))
    assert d.node == "b" and d.assignment.containers == ()


def test_topology_picks_linked_cards_on_one_numa_node() -> None:
    # 8 cards, two NUMA nodes; NVLink only inside pairs (0,1) (2,3) ...
    cards = tuple(
        Card(f"t-g{i}", i, "V100", 32000, numa_node=i // 4, nvlink_peers=(i ^ 1,)) for i in range(8)
    )
    state = ClusterState([NodeInventory("t", cards, 64000, 256000)])
    book(state, share(name="x", mem=4000, cores=10), node_name="t")  # lands on card 0
    a = pick_cards(state.snapshot(), share(count=2, mem=30000), "t", make_policy("topology"))
    picked = sorted(int(s.uuid.rsplit("g", 1)[1]) for s in a.containers[0].slices)
    assert picked in ([2, 3], [4, 5], [6, 7])


def test_fragmentation_keeps_whole_cards_for_whole_card_work() -> None:
    # The mix is mostly whole-card work: a small share must not break a fresh card.
    mix = WorkloadMix(
        [gpu_pod(name=f"w{i}", count=1, exclusive=True) for i in range(9)] + [share(name="s")]
    )
    state = ClusterState([node("a"), node("b")])
    book(state, share(name="x", mem=8000, cores=50), node_name="a")
    policy = make_policy("fragmentation", mix=mix)
    d = place(state.snapshot(), share(mem=4000, cores=30), policy)
    assert d.node == "a"
    assert d.assignment.containers[0].slices[0].uuid == "a-g0"


def test_score_nodes_covers_feasible_nodes_only() -> None:
    state = ClusterState([node("a"), node("b", cpu=10)])
    book(state, share(name="x"), node_name="a")
    scores = score_nodes(state.snapshot(), share(), ["a", "b"], make_policy("binpack"))
    assert set(scores) == {"a"}
    state.add_node(node("c"))  # feasible, but not among the nodes asked about
    assert set(score_nodes(state.snapshot(), share(), ["a"], make_policy("binpack"))) == {"a"}


def test_cards_on_a_node_the_state_does_not_have_are_refused_with_a_reason() -> None:
    state = ClusterState([node("a")])
    with pytest.raises(PlacementError, match=r"^node ghost is not in the cluster state$") as err:
        pick_cards(state.snapshot(), share(), "ghost", make_policy("binpack"))
    assert err.value.reasons == {"ghost": "node not in the cluster state"}


def test_no_node_at_all_is_summarised_without_reasons() -> None:
    with pytest.raises(PlacementError, match=r"^pod ns/p: 0/0 nodes fit$"):
        place(ClusterState([]).snapshot(), share(), make_policy("binpack"))


def test_policy_names_match_what_the_pod_spec_parser_accepts() -> None:
    from tessera.model.names import PLACEMENT_POLICIES

    assert set(PLACEMENT_POLICIES) == POLICIES
    for name in POLICIES:
        assert make_policy(name).name == name


def test_make_policy_refuses_unknown_names() -> None:
    assert {"binpack", "spread", "topology", "fragmentation", "random", "best-fit"} == POLICIES
    with pytest.raises(SpecError, match="placement: must be one of"):
        make_policy("tetris")
    for name in ("binpack/spread/random", "binpack/tetris", "tetris/binpack", "binpack/", ""):
        with pytest.raises(SpecError, match="placement: must be one of"):
            make_policy(name)
    both = make_policy("spread/binpack")
    assert both.name == "spread/binpack"
    assert type(both.node) is type(make_policy("spread").node)
    assert type(both.card) is type(make_policy("binpack").card)
    assert type(both.card) is not type(make_policy("spread").card)


def test_public_names() -> None:
    import tessera.cluster
    import tessera.placement

    assert set(tessera.cluster.__all__) == {"Booking", "CardFree", "ClusterState", "Snapshot"}
    assert {
        "place",
        "filter_nodes",
        "score_nodes",
        "pick_cards",
        "make_policy",
        "Decision",
        "FilterResult",
        "POLICIES",
        "WorkloadMix",
        "fragmentation_rate",
    } <= set(tessera.placement.__all__)
    for name in tessera.placement.__all__:
        assert hasattr(tessera.placement, name), name


def test_policy_set_honours_the_pod_override_and_keeps_each_policy() -> None:
    from dataclasses import replace

    from tessera.placement import PolicySet

    mix = WorkloadMix()
    policies = PolicySet("binpack", seed=3, mix=mix)
    assert policies.mix is mix  # the one the scheduler observes pods into
    plain = share()
    assert policies.for_pod(plain) is policies.default
    assert policies.default.name == "binpack"
    spread = policies.for_pod(replace(plain, placement="spread/binpack"))
    assert spread.name == "spread/binpack"
    assert policies.for_pod(replace(plain, placement="spread/binpack")) is spread
    with pytest.raises(SpecError, match="placement: must be one of"):
        policies.for_pod(replace(plain, placement="nope"))


def test_topology_prefers_the_node_that_can_give_linked_cards() -> None:
    plain = node("plain", cards=4)  # no NVLink, NUMA unknown
    linked = NodeInventory(
        "linked",
        tuple(
            Card(f"l-g{i}", i, "T4", 16000, numa_node=0, nvlink_peers=(i ^ 1,)) for i in range(4)
        ),
        8000,
        64000,
    )
    state = ClusterState([plain, linked])
    assert place(state.snapshot(), share(count=2), make_policy("topology")).node == "linked"
    assert place(state.snapshot(), share(count=2), make_policy("binpack")).node == "plain"


def test_topology_counts_nvlink_apart_from_numa() -> None:
    """Both nodes keep their cards on one NUMA node; only NVLink tells them apart (a peer
    index that is not on the node, 9, is ignored)."""

    def on_numa_0(name: str, linked: bool) -> NodeInventory:
        cards = tuple(
            Card(
                f"{name}-g{i}",
                i,
                "T4",
                16000,
                numa_node=0,
                nvlink_peers=(i ^ 1, 9) if linked else (),
            )
            for i in range(4)
        )
        return NodeInventory(name, cards, 8000, 64000)

    state = ClusterState([on_numa_0("plain", False), on_numa_0("linked", True)])
    assert place(state.snapshot(), share(count=2), make_policy("topology")).node == "linked"


def test_binpack_takes_the_busiest_card_not_the_first() -> None:
    state = ClusterState([node("a")])
    book(state, share(name="x", uuids=frozenset({"a-g1"})))
    assert book(state, share(name="y")).containers[0].slices[0].uuid == "a-g1"


def cpu_hog(name: str, cpu: int) -> PodRequest:
    return PodRequest("ns", name, (ContainerRequest("main"),), cpu_milli=cpu)


def test_gpu_use_decides_binpack_and_spread_cpu_use_only_breaks_ties() -> None:
    # a: GPU 0.25 used, CPU 78 %; b: GPU 0.30 used, CPU idle; c: as a, CPU idle.
    state = ClusterState([node("a"), node("b"), node("c")])
    book(state, share(name="ga", mem=8000, cores=50), node_name="a")
    book(state, share(name="gb", mem=9600, cores=60), node_name="b")
    book(state, share(name="gc", mem=8000, cores=50), node_name="c")
    state.assign(cpu_hog("hog", 5200), Assignment("a", ()))
    snap = state.snapshot()
    pod = share(mem=1000, cores=5)
    binpack = score_nodes(snap, pod, None, make_policy("binpack"))
    spread = score_nodes(snap, pod, None, make_policy("spread"))
    assert max(binpack, key=binpack.__getitem__) == "b"
    assert binpack["a"] > binpack["c"]  # the same GPU use: the busier CPU packs
    assert max(spread, key=spread.__getitem__) == "c"  # the least used GPU, idle CPU
    assert spread["c"] > spread["a"]
    assert spread["a"] > spread["b"]  # less GPU used, though its CPU is busy


def test_used_fractions_of_gpu_and_cpu() -> None:
    from tessera.placement.base import cpu_used_fraction, gpu_used_fraction

    state = ClusterState([node("none", cards=0), node("one", cards=1), node("two")])
    book(state, share(name="h", mem=8000, cores=50), node_name="one")
    book(state, gpu_pod(name="w", count=1, exclusive=True, cpu=6000), node_name="two")
    snap = state.snapshot()
    rows = np.asarray([snap.rows[n] for n in ("none", "one", "two")])
    # A node without cards counts as fully used, so CPU-only work packs there first.
    assert gpu_used_fraction(snap, rows).tolist() == pytest.approx([1.0, 0.5, 0.5])
    assert cpu_used_fraction(snap, rows).tolist() == pytest.approx([0.0, 0.125, 0.75])


def test_a_cards_free_fraction_is_the_scarcer_of_its_compute_and_memory() -> None:
    from tessera.placement.base import CardView

    state = ClusterState([node("a")])
    cards = state.node("a").cards
    view = CardView(state.snapshot(), "a", cards, free_mem=(9600, 4800), free_cores=(30, 80))
    assert view.free_fraction(0) == pytest.approx(0.3)  # compute is scarcer
    assert view.free_fraction(1) == pytest.approx(0.3)  # memory is: 4,800 of 16,000


def test_best_fit_scores_the_gpu_and_cpu_left_each_over_the_nodes_capacity() -> None:
    # GPU left in cards over the node's cards, plus CPU left over its CPU; minus the sum.
    state = ClusterState([node("one", cards=1, cpu=4000), node("two", cpu=8000),
                          node("four", cards=4, cpu=16000)])  # fmt: skip
    pod = share(mem=4000, cores=30)  # 0.3 of a card (compute is the larger share), 1,000 m
    scores = score_nodes(state.snapshot(), pod, None, make_policy("best-fit"))
    assert scores["one"] == pytest.approx(-((1 - 0.3) / 1 + 3000 / 4000))
    assert scores["two"] == pytest.approx(-((2 - 0.3) / 2 + 7000 / 8000))
    assert scores["four"] == pytest.approx(-((4 - 0.3) / 4 + 15000 / 16000))


def test_a_refused_policy_name_is_named_with_the_rule() -> None:
    with pytest.raises(SpecError) as err:
        make_policy("binpack/tetris")
    assert str(err.value) == (
        "placement: must be one of best-fit, binpack, fragmentation, random, spread, topology,"
        " or NODE/CARD of two of them (got 'binpack/tetris')"
    )
    assert (err.value.field, err.value.value) == ("placement", "binpack/tetris")


def test_a_random_card_half_follows_the_seed() -> None:
    state = ClusterState([node("a", cards=8)])

    def cards(seed: int) -> list[str]:
        policy = make_policy("spread/random", seed=seed)
        return [pick_cards(state.snapshot(), share(name=f"p{i}"), "a", policy)
                .containers[0].slices[0].uuid for i in range(8)]  # fmt: skip

    assert cards(1) == cards(1)
    assert cards(1) != cards(2)
