"""Per-node reasons folded into one line an operator can read.

``summarise({"n1": "no card with 20000 MiB free", ...})`` gives
"0/15 nodes fit — 12 nodes: no card with 20000 MiB free; 3 nodes: model T4 excluded" --
most common first, then alphabetical, at most ``limit`` groups.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

__all__ = ["summarise"]


def _nodes(n: int) -> str:
    return f"{n} node" if n == 1 else f"{n} nodes"


def summarise(
    reasons: Mapping[str, str], total: int | None = None, limit: int = 8, head: str = ""
) -> str:
    """``head`` replaces the leading "0/N nodes fit"."""
    counts = sorted(Counter(reasons.values()).items(), key=lambda kv: (-kv[1], kv[0]))
    parts = [f"{_nodes(n)}: {why}" for why, n in counts[:limit]]
    rest = sum(n for _, n in counts[limit:])
    if rest:
        parts.append(f"{_nodes(rest)}: other reasons")
    head = head or f"0/{_nodes(total if total is not None else len(reasons))} fit"
    return head + (" — " + "; ".join(parts) if parts else "")
