"""The GpuQuota objects in force, by namespace, as the watch delivers them.

A quota that does not parse (written past the CRD's rules: an older CRD, a direct etcd
write) is refused and the namespace keeps the quota's last good version: a broken object
must not lift its limits. ``apply`` and ``replace`` say which namespaces a change
loosened (a cap up or removed, a model taken out of a limit, a limit or a quota gone),
so the scheduler can have the pods waiting there tried again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tessera.errors import SpecError
from tessera.quota.spec import Quota, parse_quota

__all__ = ["QuotaBook", "loosened"]


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    return ns, f"{ns}/{name}"


def loosened(old: Quota, new: Quota) -> bool:
    """Whether ``new`` lets through anything ``old`` did not."""
    before = {lim.name: lim for lim in old.limits}
    for lim in new.limits:
        was = before.pop(lim.name, None)
        if was is None:
            continue  # a new limit only restricts
        if was.models - lim.models:
            return True  # a model left the limit: no longer capped by it
        for a, b in (
            (was.memory_mib, lim.memory_mib),
            (was.cores_percent, lim.cores_percent),
            (was.cards, lim.cards),
        ):
            if a is not None and (b is None or b > a):
                return True
    return bool(before)  # a limit went away


class QuotaBook:
    def __init__(self) -> None:
        self._by_ns: dict[str, dict[str, Quota]] = {}
        self.refused: dict[str, str] = {}  # namespace/name -> why it does not parse

    def of(self, namespace: str) -> list[Quota]:
        return list(self._by_ns.get(namespace, {}).values())

    def get(self, namespace: str, key: str) -> Quota | None:
        return self._by_ns.get(namespace, {}).get(key)

    def in_force(self) -> list[tuple[str, str]]:
        """(namespace, namespace/name) of every quota in force."""
        return [(ns, key) for ns, held in self._by_ns.items() for key in held]

    def __len__(self) -> int:
        return sum(len(held) for held in self._by_ns.values())

    def apply(self, obj: Mapping[str, Any], deleted: bool = False) -> tuple[bool, str]:
        """One quota as the watch delivers it: (whether it loosened its namespace's
        limits against the version known here, why it was refused or "")."""
        ns, key = _key(obj)
        old = self.get(ns, key)
        if deleted:
            self.refused.pop(key, None)
            self._drop(ns, key)
            return old is not None, ""
        try:
            quota = parse_quota(obj)
        except SpecError as exc:
            self.refused[key] = str(exc)
            return False, str(exc)
        self.refused.pop(key, None)
        self._by_ns.setdefault(ns, {})[key] = quota
        # A new quota only restricts. (One loosened while no extender ran is not seen as
        # such: its waiting pods wait for kube-scheduler's own periodic retry.)
        return old is not None and loosened(old, quota), ""

    def replace(self, items: Sequence[Mapping[str, Any]]) -> tuple[set[str], dict[str, str]]:
        """The complete set (after a list): the namespaces loosened, and the refusals."""
        present = {_key(o)[1] for o in items}
        out: set[str] = set()
        for ns, key in self.in_force():
            if key not in present:
                self._drop(ns, key)
                out.add(ns)
        for key in [k for k in self.refused if k not in present]:
            del self.refused[key]
        refusals = {}
        for obj in items:
            more, why = self.apply(obj)
            if more:
                out.add(_key(obj)[0])
            if why:
                refusals[_key(obj)[1]] = why
        return out, refusals

    def _drop(self, ns: str, key: str) -> None:
        held = self._by_ns.get(ns)
        if held is not None:
            held.pop(key, None)
            if not held:
                del self._by_ns[ns]
