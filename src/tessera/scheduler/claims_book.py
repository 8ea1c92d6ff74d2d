"""The claims path as the scheduler keeps it: this driver's ResourceSlices, the claims
allocated on them, and what each claim holds against its namespace's GpuQuotas.

kube-scheduler allocates claims without the extender; the API server asks the claims
webhook (``admit``) before an allocation of this driver's cards is written. A claim
counts in the same ``QuotaUsage`` as the extender's pods, under the key
``<namespace>/claim/<name>``, so one GpuQuota caps both paths together. Two records per
claim, kept apart as for pods:

* **assumed**: what ``admit`` let through. It counts at once, because the watch shows
  the allocation only after the write; it goes when the watch shows that allocation, when
  the claim is deleted, or after ``assume_ttl_s`` (the write can still fail after
  admission: a conflict, another webhook's refusal).
* **observed**: what the watch shows allocated, counted once per claim UID (an allocation
  never changes) with the cards its slices publish, and kept if the slice goes later.

Every change is made under the scheduler state's lock, so a claim's admission and a
pod's filter read and take the same quota one at a time; a re-list decodes and counts
outside it and applies in chunks. Slices and claims of other drivers are not
kept, so a cluster's other claims cost no memory; whole objects are kept only for the
GPU map page (``keep_objects``) and for claims whose slice has not come yet.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tessera.claims.allocation import allocated_pools
from tessera.claims.devices import DRIVER, slice_devices
from tessera.errors import SpecError
from tessera.kube.port import Obj, WatchEvent, object_name
from tessera.model.types import Card
from tessera.quota.claims import claim_holding, claim_key
from tessera.quota.usage import Usage, why_over
from tessera.scheduler.state import RELIST_CHUNK, RELIST_PAUSE_S, SchedulerState

__all__ = ["ClaimsBook"]

log = logging.getLogger(__name__)


def _meta(obj: Obj) -> tuple[str, str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or ""), str(meta.get("uid") or "")


@dataclass(frozen=True, slots=True)
class _ParsedSlice:
    name: str
    obj: Obj
    pool: str = ""
    cards: dict[str, Card] = field(default_factory=dict)  # device name -> card
    error: str = ""


def _parse_slice(obj: Obj) -> _ParsedSlice:
    name = object_name(obj)
    try:
        pool, cards = slice_devices(obj)
    except SpecError as exc:
        return _ParsedSlice(name, obj, error=str(exc))
    return _ParsedSlice(name, obj, pool, cards)


def _holding_or_none(obj: Obj, cards: dict[str, dict[str, Card]]) -> dict[str, Usage] | None:
    try:
        return claim_holding(obj, cards.get)
    except SpecError:
        return None  # counted again under the lock, where a slice may have come


@dataclass(frozen=True, slots=True)
class _Assumed:
    uid: str
    per_model: dict[str, Usage]
    deadline: float


class _Handler:
    """A reflector handler made of two functions."""

    def __init__(self, replace: Callable[[list[Obj]], None], apply: Callable[[WatchEvent], None]):
        self.replace = replace
        self.apply = apply


class ClaimsBook:
    def __init__(
        self,
        state: SchedulerState,
        *,
        assume_ttl_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        keep_objects: bool = False,
    ) -> None:
        self._s = state
        self._ttl = assume_ttl_s
        self._clock = clock
        self._keep = keep_objects
        self._slices: dict[str, Obj] = {}  # slice name -> object (keep_objects)
        self._cards: dict[str, dict[str, Card]] = {}  # pool -> device name -> card
        self._pool_of: dict[str, str] = {}  # slice name -> its pool
        self._claims: dict[str, Obj] = {}  # key -> claim allocated here (keep_objects)
        self._observed: dict[str, tuple[str, dict[str, Usage]]] = {}  # key -> (uid, held)
        self._unread: dict[str, Obj] = {}  # key -> a claim not counted yet (no slice)
        self._assumed: dict[str, _Assumed] = {}
        # Told the namespace where a counted claim let go of its cards: pods waiting there
        # for quota may fit now (kube-scheduler does not retry them on a claim's change).
        self.on_release: Callable[[str], None] | None = None
        self.slices_handler = _Handler(self._replace_slices, self._apply_slice)
        self.claims_handler = _Handler(self._replace_claims, self._apply_claim)

    # --- what the page draws ----------------------------------------------------------

    def slices(self) -> list[Obj]:
        with self._s.lock:
            return list(self._slices.values())

    def claims(self) -> list[Obj]:
        with self._s.lock:
            return list(self._claims.values())

    def pools(self) -> list[str]:
        """The pools (nodes) whose cards are known from their slices."""
        with self._s.lock:
            return sorted(self._cards)

    def assumed(self) -> int:
        with self._s.lock:
            return len(self._assumed)

    # --- admission --------------------------------------------------------------------

    def admit(self, claim: Obj) -> str:
        """Why writing ``claim``'s allocation would pass a GpuQuota of its namespace, or ""
        (then it counts from now on). A claim not allocated on this driver passes."""
        ns, name, uid = _meta(claim)
        key = claim_key(ns, name)
        with self._s.lock:
            self._expire()
            quotas = self._s.quotas.book.of(ns)
            if not quotas:
                return ""  # nothing to count against (the watch counts it all the same)
            try:
                per_model = claim_holding(claim, self._cards.get)
            except SpecError as exc:
                return f"claim {ns}/{name}: {exc}"
            usage = self._s.quotas.usage
            usage.set_pod(key, ns, None)  # its own earlier admission (a retry) is not in its way
            taken: dict[str, Usage] = {}
            for model, demand in sorted(per_model.items()):
                why = why_over(quotas, usage, model, demand, asker=f"claim {name}")
                if why:
                    self._settle(key)
                    return why
                taken[model] = demand  # a limit over several models sums them
                usage.set_pod(key, ns, taken)
            self._assumed[key] = _Assumed(uid, per_model, self._clock() + self._ttl)
            self._settle(key)
            return ""

    # --- slices -----------------------------------------------------------------------

    # Slices and claims are decoded outside the lock (a re-list of 5,000 slices or 50,000
    # claims would otherwise hold every verb for seconds) and applied under it.

    def _replace_slices(self, items: list[Obj]) -> None:
        parsed = [_parse_slice(o) for o in items if (o.get("spec") or {}).get("driver") == DRIVER]
        with self._s.lock:
            self._slices.clear()
            self._cards.clear()
            self._pool_of.clear()
            for one in parsed:
                self._put_slice(one)
            self._recount_unread()

    def _apply_slice(self, event: WatchEvent) -> None:
        name = object_name(event.object)
        gone = event.type == "DELETED" or (event.object.get("spec") or {}).get("driver") != DRIVER
        parsed = None if gone else _parse_slice(event.object)
        with self._s.lock:
            self._slices.pop(name, None)
            pool = self._pool_of.pop(name, None)
            if pool is not None:
                self._cards.pop(pool, None)
            if parsed is not None:
                self._put_slice(parsed)
            self._recount_unread()

    def _put_slice(self, parsed: _ParsedSlice) -> None:
        if self._keep:
            self._slices[parsed.name] = parsed.obj
        if parsed.error:
            self._s.problems["bad-slice"] += 1
            log.warning("ResourceSlice %s does not read, its cards are not known: %s",
                        parsed.name, parsed.error)  # fmt: skip
            return
        self._pool_of[parsed.name] = parsed.pool
        self._cards[parsed.pool] = parsed.cards

    # --- claims -----------------------------------------------------------------------

    def _replace_claims(self, items: list[Obj], chunk: int = RELIST_CHUNK) -> None:
        """The complete set of claims (after a list): counted outside the lock against
        the slices known now, then applied ``chunk`` at a time, as pods are."""
        with self._s.lock:
            cards = dict(self._cards)  # a pool's cards are replaced, never changed in place
        counted: list[tuple[str, Obj, dict[str, Usage] | None]] = []
        for obj in items:
            if allocated_pools(obj):
                ns, name, _ = _meta(obj)
                counted.append((claim_key(ns, name), obj, _holding_or_none(obj, cards)))
        present = {key for key, _, _ in counted}
        with self._s.lock:
            for key in (set(self._observed) | set(self._unread)) - present:
                self._forget(key)
        for start in range(0, len(counted), chunk):
            with self._s.lock:
                for key, obj, held in counted[start : start + chunk]:
                    self._observe(key, obj, held)
                    self._settle(key)
            time.sleep(RELIST_PAUSE_S)  # let a waiting verb in (see replace_pods)
        with self._s.lock:
            self._expire()

    def _apply_claim(self, event: WatchEvent) -> None:
        ns, name, uid = _meta(event.object)
        key = claim_key(ns, name)
        with self._s.lock:
            if event.type != "DELETED" and allocated_pools(event.object):
                self._observe(key, event.object)
            else:
                self._forget(key)
                assumed = self._assumed.get(key)
                if event.type == "DELETED" and assumed is not None and assumed.uid == uid:
                    del self._assumed[key]  # it will never be allocated
            self._expire()
            self._settle(key)

    def _observe(self, key: str, obj: Obj, held: dict[str, Usage] | None = None) -> None:
        """The claim's allocation as listed or watched; ``held``: its count, when made
        outside the lock (else, or when that found no slice, it is counted here)."""
        uid = _meta(obj)[2]
        if self._keep:
            self._claims[key] = obj
        assumed = self._assumed.get(key)
        if assumed is not None and assumed.uid == uid:
            del self._assumed[key]  # its allocation is in: the observed record takes over
        known = self._observed.get(key)
        if known is not None and known[0] == uid:
            return  # an allocation never changes: counted already
        if held is not None:
            self._unread.pop(key, None)
            self._observed[key] = (uid, held)
            return
        self._count(key, obj)

    def _count(self, key: str, obj: Obj) -> None:
        try:
            per_model = claim_holding(obj, self._cards.get)
        except SpecError as exc:
            self._observed.pop(key, None)
            if key not in self._unread:
                log.info("claim %s is not counted yet: %s", key, exc)
            self._unread[key] = obj
            return
        self._unread.pop(key, None)
        self._observed[key] = (_meta(obj)[2], per_model)

    def _recount_unread(self) -> None:
        for key, obj in list(self._unread.items()):
            self._count(key, obj)
            self._settle(key)

    def _forget(self, key: str) -> None:
        self._claims.pop(key, None)
        held = self._observed.pop(key, None)
        self._unread.pop(key, None)
        self._settle(key)
        ns = key.partition("/")[0]
        if held and held[1] and self.on_release is not None and self._s.quotas.book.of(ns):
            self.on_release(ns)

    # --- the count --------------------------------------------------------------------

    def expire(self) -> None:
        """Drop admitted allocations that never showed (also done on every event)."""
        with self._s.lock:
            self._expire()

    def _expire(self) -> None:
        now = self._clock()
        for key in [k for k, a in self._assumed.items() if a.deadline <= now]:
            del self._assumed[key]
            log.info("claim %s: its admitted allocation did not show within %.0f s", key, self._ttl)
            self._settle(key)

    def _settle(self, key: str) -> None:
        """Count what ``key`` holds: the assumed record if any (the newer decision), else
        the observed one."""
        assumed = self._assumed.get(key)
        if assumed is not None:
            held: dict[str, Usage] | None = assumed.per_model
        else:
            observed = self._observed.get(key)
            held = observed[1] if observed is not None else None
        self._s.quotas.usage.set_pod(key, key.partition("/")[0], held)
