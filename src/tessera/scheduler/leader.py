"""Leader election on a coordination.k8s.io/v1 Lease (client-go's algorithm, small).

Every ``retry_s`` each replica reads the Lease:

* no Lease: create it naming itself (a 409 means another replica won the race);
* held by another replica whose record changed less than ``lease_s`` ago (by *this*
  replica's monotonic clock, so clock skew between machines does not matter): stand by;
* held by itself, or expired: write it (PUT with the resourceVersion read: of two
  replicas writing at once, one gets 409 and stands by).

``is_leader()`` is true only while the last successful renewal is younger than
``renew_deadline_s`` (< ``lease_s``): a leader that cannot reach the API server stops
acting before another replica may take over. On shutdown the leader gives the Lease up
(empty holder) so a standby takes over at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from tessera.kube.errors import ApiError, NotFound
from tessera.kube.kinds import LEASES
from tessera.kube.port import KubeApi

__all__ = ["LeaderElector"]

log = logging.getLogger(__name__)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        name: str,
        identity: str,
        *,
        lease_s: float,
        renew_deadline_s: float,
        retry_s: float,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        if not retry_s < renew_deadline_s < lease_s:
            raise ValueError("need retry_s < renew_deadline_s < lease_s")
        self._api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self._lease_s = lease_s
        self._renew_deadline = renew_deadline_s
        self._retry = retry_s
        self._clock = clock
        self._on_change = on_change
        self._renewed_at: float | None = None  # last successful write as leader
        self._observed: tuple[str, str] | None = None  # (holder, renewTime) last seen
        self._observed_at = 0.0
        self._stop = threading.Event()
        self._was_leader = False
        self.holder = ""

    def is_leader(self) -> bool:
        r = self._renewed_at
        return r is not None and self._clock() - r < self._renew_deadline

    def _spec(self, old: dict[str, Any] | None) -> dict[str, Any]:
        old = old or {}
        now = _now()
        same = old.get("holderIdentity") == self.identity
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self._lease_s),
            "acquireTime": old.get("acquireTime") if same and old.get("acquireTime") else now,
            "renewTime": now,
            "leaseTransitions": int(old.get("leaseTransitions") or 0)
            + (0 if same or not old else 1),
        }

    def try_acquire_or_renew(self) -> bool:
        """One round; returns whether this replica leads after it."""
        now = self._clock()
        try:
            lease = self._api.get(LEASES, self.name, self.namespace)
        except NotFound:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(None),
            }
            try:
                self._api.create(LEASES, body, self.namespace)
            except ApiError as exc:
                self._refused("not created", exc)
                return self._round(self.is_leader())
            self.holder = self.identity
            self._renewed_at = now
            return self._round(True)
        except ApiError as exc:
            # As for a write that fails below: a leader leads until renew_deadline_s has
            # passed without a renewal, whatever one round could not do.
            log.warning("lease %s/%s: cannot read (%s)", self.namespace, self.name, exc)
            return self._round(self.is_leader())
        spec = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        record = (holder, str(spec.get("renewTime") or ""))
        if record != self._observed:
            self._observed, self._observed_at = record, now
        duration = float(spec.get("leaseDurationSeconds") or self._lease_s)
        if holder and holder != self.identity and now - self._observed_at < duration:
            self.holder = holder
            self._renewed_at = None
            return self._round(False)
        lease["spec"] = self._spec(spec)
        try:
            self._api.replace(LEASES, lease, self.namespace)
        except ApiError as exc:
            # Conflict: someone wrote the Lease between our read and write -- if it was
            # a takeover, the next round sees the new holder. Either way, a leader keeps
            # leading until renew_deadline_s has passed without a renewal.
            self._refused("not renewed this round", exc)
            return self._round(self.is_leader())
        self.holder = self.identity
        self._renewed_at = now
        return self._round(True)

    def _refused(self, what: str, exc: ApiError) -> None:
        """A write that did not land: a Conflict is the race with another replica, the
        protocol working; anything else (Forbidden, a missing namespace, an API server
        out of reach) keeps this replica from leading, and an operator must see it."""
        level = logging.INFO if exc.status == 409 else logging.WARNING
        log.log(level, "lease %s/%s: %s (%s)", self.namespace, self.name, what, exc)

    def _round(self, leading: bool) -> bool:
        leading = leading and self.is_leader()
        if leading != self._was_leader:
            self._was_leader = leading
            log.info("lease %s/%s: %s", self.namespace, self.name,
                     "leading" if leading else f"standing by (holder {self.holder!r})")  # fmt: skip
            if self._on_change is not None:
                self._on_change(leading)
        return leading

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                self.try_acquire_or_renew()
            except Exception:  # a bug here must not end this replica's elections for good
                log.exception("lease %s: election round failed", self.name)
            self._stop.wait(self._retry)

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self.run, name="leader-election", daemon=True)
        t.start()
        return t

    def stop(self, release: bool = True) -> None:
        """Stop renewing; with ``release``, hand the Lease over at once."""
        self._stop.set()
        if release and self.is_leader():
            try:
                lease = self._api.get(LEASES, self.name, self.namespace)
                spec = lease.get("spec") or {}
                if spec.get("holderIdentity") == self.identity:
                    spec["holderIdentity"] = ""
                    spec["leaseDurationSeconds"] = 1
                    lease["spec"] = spec
                    self._api.replace(LEASES, lease, self.namespace)
            except ApiError as exc:
                self._refused("not released", exc)
        self._renewed_at = None
        self._round(False)
