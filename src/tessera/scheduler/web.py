"""The GPU map page (``--web``, off by default): /gpus and the data behind it, /gpus.json.

The map is the extender's own view -- the inventories it holds, the assignments its pods'
annotations say, its refused inventories, the GPU pods still waiting and those bound
without an assignment it can read, the nodes it holds for preempting pods -- copied
under the state lock (references only) and drawn by the same ``tessera.view.gpumap`` as
``kubectl tessera top``, outside the lock, so a page load never holds up a filter for
long. The claims path (this driver's ResourceSlices and the claims allocated on them)
comes from the claims book (``claims_book``), as ``kubectl tessera top`` draws it.

Drawing the map takes a while on a large cluster (0.3 s at 1,000 full nodes and 40,000
pods, 1.8 s at 5,000 and 200,000; bench/map_load.py), so the server builds it on a thread
of its own, not on the event loop that serves filter and bind (``Offload``), and
``MapCache`` shares one build among the requests that come while it is fresh. The build
is kept gzip-encoded only (a 38 MB map is 1.8 MB so), as browsers take it: over
``kubectl port-forward`` the bytes are what a page load waits for. A client that does not
take gzip gets the JSON unpacked for it, a piece at a time.
"""

from __future__ import annotations

import json
import threading
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from tessera.kube.reflector import let_go
from tessera.model.types import Assignment
from tessera.scheduler.claims_book import ClaimsBook
from tessera.scheduler.heap import collector_paused
from tessera.scheduler.holds import Hold
from tessera.scheduler.state import SchedulerState
from tessera.view.gpumap import GpuMap, Pending, assemble, map_parts, summary, unassigned

__all__ = ["MapBody", "MapCache", "accepts_gzip", "gpu_map", "map_body", "page"]


def gpu_map(state: SchedulerState, claims: ClaimsBook | None = None) -> GpuMap:
    with state.lock:
        inventories = [state.cluster.node(n) for n in state.cluster.node_names()]
        bad = dict(state.bad_nodes)
        pods = list(state.pods.values())
        observed = dict(state.observed)  # a copy in one call: 200,000 pods in ~5 ms
        held_for: dict[str, list[str]] = {}  # node -> the preempting pods it is held for
        for hold in state.holds:
            held_for.setdefault(hold.node, []).append(_held_for(state, hold))
    held: dict[str, Assignment] = {}
    pending, problems = [], []
    for p in pods:
        if p.node_name and p.key in observed:
            held[p.key] = observed[p.key].assignment
        elif p.node_name and p.request is not None:
            undecoded = p.assignment_digest is not None  # an annotation, not read
            problems.append((p.key, unassigned(p.node_name, undecoded=undecoded)))
        elif p.request is not None:
            ns, _, name = p.key.partition("/")
            pending.append(Pending(ns, name, summary(p.request)))
    return assemble(
        inventories,
        held,
        node_problems=bad,
        pending=pending,
        pod_problems=problems,
        slices=claims.slices() if claims else (),
        claims=claims.claims() if claims else (),
        held_nodes={node: "held for " + "; ".join(sorted(pods)) for node, pods in held_for.items()},
    )


def _held_for(state: SchedulerState, hold: Hold) -> str:
    """Whom a node is held for, and what of it (lock held): the cards of the pod's
    placement by index, or the whole node when the placement is not known."""
    who = f"{hold.key} (priority {hold.priority})"
    if hold.decision is None or hold.request is None or hold.node not in state.cluster:
        return f"{who}: the whole node"
    index = {c.uuid: c.index for c in state.cluster.node(hold.node).cards}
    cards = sorted(index.get(u, -1) for u in hold.decision.footprint())
    return f"{who}: card{'s' if len(cards) > 1 else ''} {', '.join(map(str, cards))}"


def map_body(state: SchedulerState, claims: ClaimsBook | None = None) -> MapBody:
    """One build of the map. The build makes millions of short-lived objects, none in a
    cycle: the collector's passes over them would hold every thread, the event loop
    serving filter too, for ~170 ms each at 5,000 nodes; reference counting frees them
    all the same."""
    with collector_paused():
        gmap = gpu_map(state, claims)
        body = MapBody(_gzip_json(map_parts(gmap)))
        # Freed at once, a map of 5,000 full nodes is one call into C that holds the
        # interpreter ~70 ms; 500 nodes at a time let the loop in between.
        nodes = list(gmap.nodes)
        del gmap
        let_go(nodes)
    return body


def _gzip_json(parts: Iterable[tuple[str, Iterable[Any]]]) -> bytes:
    """``{key: [items]}`` as compact JSON, gzip-encoded as it is made: each item encoded
    on its own, and packed 64 KiB of text at a time. So neither the document nor its
    JSON is ever whole: one ``json.dumps`` of a 38 MB map holds the interpreter for the
    whole call, and joining and copying the 38 MB text held it ~400 ms more at 5,000
    nodes (mostly the first touch of freshly mapped memory). zlib lets go of the
    interpreter while it packs."""
    packer = zlib.compressobj(_GZIP_LEVEL, zlib.DEFLATED, _GZIP_WBITS)
    packed: list[bytes] = []
    text, size = ["{"], 0
    for i, (key, items) in enumerate(parts):
        text.append(f"{',' if i else ''}{json.dumps(key)}:[")
        for j, item in enumerate(items):
            piece = json.dumps(item, separators=(",", ":"))
            text.append(f",{piece}" if j else piece)
            size += len(piece)
            if size >= _PACK_CHARS:
                packed.append(packer.compress("".join(text).encode()))
                text, size = [], 0
        text.append("]")
    text.append("}")
    packed.append(packer.compress("".join(text).encode()))
    packed.append(packer.flush())
    return b"".join(packed)


# Level 6, not gzip's 9: half the CPU for ~9 % more bytes (zlib lets go of the
# interpreter while it packs, so either level leaves the loop serving).
_GZIP_LEVEL = 6
_GZIP_WBITS = 16 + zlib.MAX_WBITS  # a gzip header and trailer around the deflate stream
_PACK_CHARS = 64 * 1024
_UNPACK_BYTES = 1024 * 1024


@cache
def page() -> bytes:
    return resources.files("tessera.view").joinpath("page.html").read_bytes()


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an Accept-Encoding header value admits gzip (``gzip;q=0`` does not)."""
    for item in accept_encoding.split(","):
        coding, _, params = item.partition(";")
        if coding.strip().lower() in ("gzip", "x-gzip"):
            q = params.replace(" ", "").lower()
            return not q.startswith("q=") or _weight(q[2:]) > 0
    return False


def _weight(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        return 0.0


@dataclass(frozen=True, slots=True)
class MapBody:
    """One build of the map: its JSON, gzip-encoded. The JSON itself is ~20 times larger
    (38 MB at 5,000 full nodes) and is not kept: a client that does not take gzip gets it
    unpacked a piece at a time."""

    gzip: bytes

    def json_pieces(self, size: int = _UNPACK_BYTES) -> tuple[bytes, ...]:
        """The JSON in pieces of at most ``size`` bytes: no one piece is a large copy."""
        unpacker = zlib.decompressobj(_GZIP_WBITS)
        pieces, data = [], self.gzip
        while not unpacker.eof:
            piece = unpacker.decompress(data, size)
            data = unpacker.unconsumed_tail
            if not piece and not data:
                break  # nothing left to give (an empty body)
            pieces.append(piece)
        return tuple(p for p in pieces if p)


class MapCache:
    """``build()``'s last result, reused for ``max_age_s`` or five times as long as it
    took to build, whichever is longer: however often the page is loaded, the extender
    spends at most a sixth of its time drawing maps (a map of 5,000 full nodes takes ~2 s
    and is then kept ~10 s). Callers wait for a build under way rather than start their
    own (one build at a time)."""

    def __init__(
        self,
        build: Callable[[], MapBody],
        max_age_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._build = build
        self.max_age_s = max_age_s
        self._clock = clock
        self._lock = threading.Lock()
        self._body = MapBody(b"")
        self._built_at = float("-inf")
        self._keep_s = max_age_s

    def get(self) -> MapBody:
        with self._lock:
            if self._clock() - self._built_at >= self._keep_s:
                started = self._clock()
                self._body = self._build()
                self._built_at = self._clock()
                self._keep_s = max(self.max_age_s, 5 * (self._built_at - started))
            return self._body
