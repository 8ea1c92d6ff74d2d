"""The model's arithmetic: what a request takes on a card, and what an assignment holds."""

from __future__ import annotations

from tessera.model.types import (
    Assignment,
    Card,
    CardSlice,
    ContainerAssignment,
    GpuRequest,
)


def test_a_percent_of_memory_is_taken_of_the_card_rounded_down() -> None:
    third = GpuRequest(count=1, memory_percent=33)
    assert third.memory_for(16000) == 5280
    assert third.memory_for(15) == 4  # 4.95 MiB: never more than the share
    assert GpuRequest(count=1, memory_percent=100).memory_for(16000) == 16000
    assert GpuRequest(count=1, memory_mib=3000).memory_for(16000) == 3000
    assert GpuRequest(count=1, exclusive=True).memory_for(16000) == 16000


def test_could_fit_on_weighs_the_model_and_a_fixed_size_together() -> None:
    t4_only = GpuRequest(count=1, memory_mib=16000, models=frozenset({"T4"}))
    assert t4_only.could_fit_on("T4", 16000)  # the last MiB fits
    assert not t4_only.could_fit_on("T4", 15999)
    assert not t4_only.could_fit_on("A100", 40960)  # room enough, the wrong model
    no_a10 = GpuRequest(count=1, memory_percent=90, models_exclude=frozenset({"A10"}))
    assert no_a10.could_fit_on("T4", 1)  # a share fits any card
    assert not no_a10.could_fit_on("A10", 24576)


def test_allows_weighs_the_cards_model_and_uuid() -> None:
    a100 = Card("GPU-a", 0, "A100", 40960)
    t4 = Card("GPU-t", 1, "T4", 16000)
    assert GpuRequest(count=1, models=frozenset({"A100"})).allows(a100)
    assert not GpuRequest(count=1, models=frozenset({"A100"})).allows(t4)
    assert not GpuRequest(count=1, models_exclude=frozenset({"T4"})).allows(t4)
    assert not GpuRequest(count=1, uuids=frozenset({"GPU-a"})).allows(t4)
    assert not GpuRequest(count=1, uuids_exclude=frozenset({"GPU-a"})).allows(a100)
    assert GpuRequest(count=1).allows(t4)


def _container(name: str, *slices: tuple[str, int, int], init: bool = False) -> ContainerAssignment:
    return ContainerAssignment(name, tuple(CardSlice(*s) for s in slices), init=init)


def test_footprint_holds_the_larger_of_one_init_container_and_the_apps_together() -> None:
    a = Assignment(
        "n",
        (
            _container("init-big", ("g0", 6000, 20), init=True),
            _container("init-hot", ("g0", 2000, 50), ("g1", 1000, 0), init=True),
            _container("app", ("g0", 3000, 10), ("g2", 500, 0)),
            _container("side", ("g0", 2000, 10)),
        ),
    )
    assert a.footprint() == {
        "g0": (6000, 50, False),  # init-big's memory, init-hot's compute; apps: 5000, 20
        "g1": (1000, 0, False),  # held by an init container only
        "g2": (500, 0, False),  # best-effort: no compute booked
    }
    assert a.slots() == {"g0": 2, "g1": 1, "g2": 1}
    # The apps together over every init container, in memory and in compute.
    apps = Assignment(
        "n",
        (
            _container("init", ("g0", 4000, 40), init=True),
            _container("app", ("g0", 3000, 30)),
            _container("side", ("g0", 2000, 30)),
        ),
    )
    assert apps.footprint() == {"g0": (5000, 60, False)}


def test_footprint_marks_cards_held_whole() -> None:
    whole = ContainerAssignment("main", (CardSlice("g0", 16000, 100),), exclusive=True)
    assert Assignment("n", (whole,)).footprint() == {"g0": (16000, 100, True)}
    assert Assignment("n").footprint() == {} and Assignment("n").slots() == {}
