"""Workload variants: same GPU demand, another mix, built from the list's own tasks."""

from __future__ import annotations

from collections import Counter

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


def test_variants_are_seeded() -> None:
    tasks = synthetic_tasks()
    assert make_variant(tasks, "shared", 0.6, seed=3) == make_variant(tasks, "shared", 0.6, seed=3)
    assert make_variant(tasks, "shared", 0.6, seed=3) != make_variant(tasks, "shared", 0.6, seed=4)
    same = make_variant(tasks, "multi", demand_share(tasks, "multi"))
    assert same == list(tasks)  # the list's own share changes nothing
    # The most a variant can reach: every single whole card swapped.
    total = sum(t.gpu_milli_total for t in tasks)
    singles = sum(t.gpu_milli_total for t in tasks if t.num_gpu == 1 and t.gpu_milli == 1000)
    most = make_variant(tasks, "shared", demand_share(tasks, "shared") + singles / total)
    assert not [t for t in most if t.num_gpu == 1 and t.gpu_milli == 1000]


def test_bad_variants_name_the_rule() -> None:
    tasks = synthetic_tasks()
    with pytest.raises(SpecError, match=r"variant share: must be between 0\.290 \(the list's\)"):
        make_variant(tasks, "shared", 0.1)
    with pytest.raises(SpecError, match="variant share: must be between"):
        make_variant(tasks, "multi", 0.99)
    with pytest.raises(SpecError, match="variant: must be one of multi, shared"):
        make_variant(tasks, "cpu", 0.5)
    with pytest.raises(SpecError, match="no shared task to copy"):
        make_variant([TraceTask("a", 1, 1, 1, 1000)], "shared", 0.5)
    assert parse_variant("shared:0.6") == ("shared", 0.6)
    with pytest.raises(SpecError, match="must be KIND:SHARE"):
        parse_variant("shared")
    with pytest.raises(SpecError, match="SHARE must be a number"):
        parse_variant("multi:lots")
