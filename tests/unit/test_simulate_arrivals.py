from __future__ import annotations

import pytest

from tessera.errors import SpecError
from tessera.simulate.arrivals import arrival_stream
from tessera.simulate.trace import TraceTask

X = TraceTask("x", 1, 1, 1, 500)
Y = TraceTask("y", 1, 1, 1, 500)
Z = TraceTask("z", 1, 1, 0, 0)  # no GPU: adds nothing to the requested total


def requested(stream: list[TraceTask]) -> int:
    return sum(t.gpu_milli_total for t in stream)


def test_pads_with_copies_up_to_the_target() -> None:
    # 2 cards = 2000 milli; 150% = 3000; the list requests 1000, so four 500-milli copies.
    stream = arrival_stream([X, Y, Z], capacity_milli=2000, arrival=1.5, seed=42)
    assert sorted(t.name for t in stream[:3]) == ["x", "y", "z"]
    assert requested(stream) == 3000
    assert sum(1 for t in stream if t.num_gpu) == 6
    copies = stream[3:]
    assert [t.name.rsplit("-copy-", 1)[1] for t in copies] == [str(i) for i in range(len(copies))]
    assert {t.name.split("-copy-")[0] for t in copies} <= {"x", "y", "z"}


def test_stops_before_overshooting() -> None:
    # target 2500; the list requests 2000 and every copy would add 1000: no copies.
    a, b = TraceTask("a", 1, 1, 1, 1000), TraceTask("b", 1, 1, 1, 1000)
    stream = arrival_stream([a, b], 2000, 1.25, seed=7)
    assert sorted(t.name for t in stream) == ["a", "b"]


def test_truncates_when_the_list_requests_more() -> None:
    w = TraceTask("w", 1, 1, 1, 500)
    stream = arrival_stream([X, Y, Z, w], 2000, 0.5, seed=3)
    assert requested(stream) == 1000
    assert sum(1 for t in stream if t.num_gpu) == 2
    assert all("-copy-" not in t.name for t in stream)


def test_same_seed_same_stream_other_seed_other_order() -> None:
    tasks = [TraceTask(f"t{i}", 1, 1, 1, 100 * (i % 9 + 1)) for i in range(40)]
    a = arrival_stream(tasks, 10_000, 2.0, seed=42)
    assert a == arrival_stream(tasks, 10_000, 2.0, seed=42)
    assert a != arrival_stream(tasks, 10_000, 2.0, seed=43)


def test_no_gpu_tasks_never_loop() -> None:
    assert arrival_stream([Z], 1000, 1.3, seed=1) == [Z]


def test_arrival_must_be_positive() -> None:
    with pytest.raises(SpecError) as caught:
        arrival_stream([X], 1000, -0.5, seed=1)
    assert str(caught.value) == "arrival: must be > 0 (got -0.5)"
