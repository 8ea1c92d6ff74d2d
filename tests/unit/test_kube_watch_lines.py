"""The watch stream's line splitting, whatever the chunks' cuts."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from tessera.kube.client import watch_lines

# A watch line is one JSON object: no newline inside, never blank.
_line = st.binary(min_size=1, max_size=40).filter(lambda b: b"\n" not in b and b.strip())


def _cut(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(data)) for c in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in pairwise(bounds)]


@given(st.lists(_line, max_size=12), st.lists(st.integers(0, 600), max_size=20), st.booleans())
def test_every_line_comes_out_once_in_order_however_the_stream_is_cut(
    lines: list[bytes], cuts: list[int], final_newline: bool
) -> None:
    data = b"\n".join(lines) + (b"\n" if final_newline and lines else b"")
    assert list(watch_lines(_cut(data, cuts))) == lines


def test_blank_lines_and_empty_chunks_are_skipped() -> None:
    chunks = [b"", b'{"a":1}\n\n  \n{"b"', b"", b":2}", b"\n", b"   "]
    assert list(watch_lines(chunks)) == [b'{"a":1}', b'{"b":2}']


def test_a_line_longer_than_many_chunks_is_joined_whole() -> None:
    big = b"x" * 1000
    chunks = [big[i : i + 7] for i in range(0, len(big), 7)] + [b"\ny"]
    assert list(watch_lines(chunks)) == [big, b"y"]
