"""The heap after sync: garbage collected first, the survivors frozen out of full passes."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from tessera.scheduler.heap import freeze_long_lived


class _Node:
    def __init__(self) -> None:
        self.peer: _Node | None = None


@pytest.fixture
def clean_heap() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # the rest of the test session keeps a plain heap


def test_garbage_is_collected_and_the_survivors_frozen(clean_heap: None) -> None:
    garbage = _Node()
    garbage.peer = _Node()
    garbage.peer.peer = garbage  # a cycle: only the collector can free it
    gone = weakref.ref(garbage)
    del garbage
    state = [_Node() for _ in range(100)]

    frozen = freeze_long_lived()

    assert gone() is None  # collected before freezing, not frozen for ever
    assert frozen == gc.get_freeze_count() >= len(state)
    tracked = {id(o) for o in gc.get_objects()}  # the three generations, not the frozen
    assert not any(id(n) in tracked for n in state)
