"""Workload variants: same GPU demand, another mix, built from the list's own tasks."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest

from tessera.errors import SpecError
from tessera.simulate.trace import TraceTask
from tessera.simulate.variants import demand_share, make_variant, parse_variant
from tessera.simulate.workload import synthetic_tasks


def shape(t: TraceTask) -> tuple[int, int, int, int, frozenset[str]]:
    return (t.num_gpu, t.gpu_milli, t.cpu_milli, t.memory_mib, t.gpu_spec)


@pytest.mark.parametrize(("kind", "share"), [("shared", 0.5), ("shared", 0.75), ("multi", 0.3)])
def test_a_variant_moves_demand_into_its_kind_and_keeps_the_total(kind: str, share: float) -> None:
    tasks = synthetic_tasks()
    total = sum(t.gpu_milli_total for t in tasks)
    v = make_variant(tasks, kind, share, seed=1)
    assert demand_share(v, kind) == pytest.approx(share, abs=0.002)
    assert abs(sum(t.gpu_milli_total for t in v) - total) < 1000  # within one card
    original = {t.name: t for t in tasks}
    kept = [t for t in v if t.name in original]
    gone = set(original) - {t.name for t in kept}
    # Only single whole cards leave; every new task copies one of the list's own shapes.
    assert gone and all(original[n].num_gpu == 1 and original[n].gpu_milli == 1000 for n in gone)
    new = [t for t in v if t.name not in original]
    assert new and {shape(t) for t in new} <= {shape(t) for t in tasks}
    assert all(t.name.split(f"-{kind}-")[0] in original for t in new)
    assert len({t.name for t in v}) == len(v)
    # CPU-only tasks and the other classes stay as they were.
    untouched = Counter(shape(t) for t in tasks if t.num_gpu == 0)
    assert Counter(shape(t) for t in v if t.num_gpu == 0) == untouched


def test_a_variant_adds_the_fewest_copies_that_reach_the_share() -> None:
    """One donor, so the counts are exact: copies until the kind has gained the GPU the
    share asks, single cards out while the GPU added exceeds the GPU removed."""
    singles = [TraceTask(f"w{i}", 1, 1, 1, 1000) for i in range(10)]
    tasks = [*singles, TraceTask("s", 1, 1, 1, 500), TraceTask("m", 1, 1, 2, 1000)]
    total = 12_500
    assert demand_share(tasks, "shared") == 500 / total
    assert demand_share(tasks, "multi") == 2000 / total  # two cards are multi-card
    assert (demand_share([], "shared"), demand_share(tasks[:1], "shared")) == (0.0, 0.0)
    # 2,000.5 milli to move: four copies of 500 fall half a milli short, five reach it.
    v = make_variant(tasks, "shared", (500 + 2000.5) / total)
    assert [t.name for t in v if t.name.startswith("s-")] == [f"s-shared-{n}" for n in range(5)]
    # 2,500 milli added: three single cards out (3,000 >= 2,500), seven stay.
    assert len([t for t in v if t.name.startswith("w")]) == 7


def test_variants_are_seeded() -> None:
    tasks = synthetic_tasks()
    assert make_variant(tasks, "shared", 0.6) == make_variant(tasks, "shared", 0.6, seed=0)
    assert make_variant(tasks, "shared", 0.6, seed=3) == make_variant(tasks, "shared", 0.6, seed=3)
    assert make_variant(tasks, "shared", 0.6, seed=3) != make_variant(tasks, "shared", 0.6, seed=4)
    same = make_variant(tasks, "multi", demand_share(tasks, "multi"))
    assert same == list(tasks)  # the list's own share changes nothing
    # The most a variant can reach: every single whole card swapped.
    total = sum(t.gpu_milli_total for t in tasks)
    singles = sum(t.gpu_milli_total for t in tasks if t.num_gpu == 1 and t.gpu_milli == 1000)
    most = make_variant(tasks, "shared", demand_share(tasks, "shared") + singles / total)
    assert not [t for t in most if t.num_gpu == 1 and t.gpu_milli == 1000]


def _error(call: Callable[[], object]) -> str:
    with pytest.raises(SpecError) as err:
        call()
    return str(err.value)


def test_bad_variants_name_the_rule() -> None:
    tasks = synthetic_tasks()
    assert _error(lambda: make_variant(tasks, "shared", 0.1)).startswith(
        "variant share: must be between 0.290 (the list's) and "
    )
    assert _error(lambda: make_variant(tasks, "shared", 0.1)).endswith(" (got 0.1)")
    assert _error(lambda: make_variant(tasks, "multi", 0.99)).startswith(
        "variant share: must be between"
    )
    assert _error(lambda: make_variant(tasks, "cpu", 0.5)) == (
        "variant: must be one of multi, shared (got 'cpu')"
    )
    assert _error(lambda: make_variant([TraceTask("a", 1, 1, 1, 1000)], "shared", 0.5)) == (
        "variant: the task list has no shared task to copy (got 'shared')"
    )
    assert parse_variant("shared:0.6") == ("shared", 0.6)
    for text in ("shared", "cpu:0.5", ":0.5"):
        assert _error(lambda t=text: parse_variant(t)) == (
            f"variant: must be KIND:SHARE with KIND one of multi, shared (got {text!r})"
        )
    for text in ("multi:lots", "shared:0.6:1"):
        assert _error(lambda t=text: parse_variant(t)) == (
            f"variant: SHARE must be a number between 0 and 1 (got {text!r})"
        )
