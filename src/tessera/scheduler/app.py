"""The scheduler process: state + reflectors + verbs + webhook + leader election.

``SchedulerApp.handle(method, path, body, accept_encoding)`` is the whole HTTP surface as
a function of the request (the socket server in ``http.py`` only moves bytes; the one
header it passes on is Accept-Encoding, for the GPU map), so tests drive it
without a socket. ``dispatch`` is the same, except that a bind comes back as a
``BindWrite`` -- decided and reserved, its one API write not yet done -- so the server
can do that write without holding its event loop and then call ``bind_done``:

==========================  ===========================================================
POST /filter                ExtenderArgs -> ExtenderFilterResult
POST /prioritize            ExtenderArgs -> HostPriorityList
POST /bind                  ExtenderBindingArgs -> ExtenderBindingResult
POST /mutate, /validate     AdmissionReview (Pods) -> AdmissionReview
POST /validate-claims       AdmissionReview (resourceclaims/status) -> AdmissionReview
GET  /healthz               200 while the process serves
GET  /readyz                200 once nodes and pods are listed and this replica leads
GET  /metrics               Prometheus text
GET  /gpus, /gpus.json      the GPU map page and its data (only with config.web; the data
                            gzip-encoded for a client that accepts it)
==========================  ===========================================================

A malformed body gets 400 with a message, an unknown path 404; nothing a client sends
produces a 500. A standby replica answers the extender verbs with 503 (they take
reservations or write to the API); the pod webhook, which writes nothing, answers on
both. The claims webhook counts what it admits, so only the leader admits a claim's
allocation; a standby refuses it as unavailable (kube-scheduler tries the pod again).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from tessera.claims.devices import DRIVER
from tessera.kube.binder import bind_once
from tessera.kube.errors import ApiError
from tessera.kube.events import EventRecorder
from tessera.kube.kinds import (
    GPUQUOTAS,
    NODES,
    POD_DISRUPTION_BUDGETS,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
)
from tessera.kube.port import KubeApi
from tessera.kube.reflector import Reflector
from tessera.model.types import PodRequest
from tessera.scheduler import web
from tessera.scheduler.bind import (
    BindError,
    PendingBind,
    begin_bind,
    release_pending,
    write_failed,
)
from tessera.scheduler.budgets import BudgetBook
from tessera.scheduler.claims_book import ClaimsBook
from tessera.scheduler.claims_webhook import review_claim
from tessera.scheduler.config import SchedulerConfig
from tessera.scheduler.filter import filter_pod
from tessera.scheduler.heap import collector_paused, freeze_listed
from tessera.scheduler.heap import listing as heap_listing
from tessera.scheduler.leader import LeaderElector
from tessera.scheduler.metrics import Metrics
from tessera.scheduler.placer import Placer
from tessera.scheduler.preemptor import Preemptor
from tessera.scheduler.prioritize import prioritize_pod
from tessera.scheduler.quota_writer import QuotaWriter
from tessera.scheduler.reasons import summarise
from tessera.scheduler.state import SchedulerState
from tessera.scheduler.webhook import Webhook
from tessera.scheduler.wire import (
    BindingArgs,
    WireError,
    decode_binding_args,
    decode_extender_args,
    encode_binding_result,
    encode_filter_result,
    encode_priorities,
)

__all__ = ["BindWrite", "Response", "SchedulerApp"]

log = logging.getLogger(__name__)

JSON = "application/json"


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes
    content_type: str = JSON
    encoding: str = ""  # Content-Encoding of ``body``, e.g. "gzip"; "" for none
    # A body too large to copy whole (the GPU map's JSON): sent one piece after another,
    # in place of ``body``.
    pieces: tuple[bytes, ...] = ()


@dataclass(frozen=True, slots=True)
class Offload:
    """An answer too slow to build on the event loop that serves the verbs (the GPU map):
    the server runs ``work`` on a thread of its own."""

    work: Callable[[], Response]


@dataclass(frozen=True, slots=True)
class BindWrite:
    """A bind waiting for its API write: a binder's ``bind(*call)``, then ``bind_done``."""

    pending: PendingBind
    started: float  # perf_counter when the request came: the verb's time includes the write

    @property
    def call(self) -> tuple[str, str, str, str, dict[str, str]]:
        a = self.pending.args
        return a.pod_namespace, a.pod_name, a.pod_uid, a.node, self.pending.annotations


def _error(status: int, message: str) -> Response:
    return Response(status, json.dumps({"Error": message}).encode())


class SchedulerApp:
    def __init__(self, config: SchedulerConfig, api: KubeApi) -> None:
        self.config = config
        self.api = api
        self.state = SchedulerState(
            config.names,
            config.compat,
            reservation_ttl_s=config.reservation_ttl_s,
            doubt_s=config.bind_doubt_s,
        )
        self.placer = Placer(config.policy, config.seed)
        self.metrics = Metrics()
        self.events = EventRecorder(api, "tessera-scheduler", config.identity)
        self.webhook = Webhook(
            config.scheduler_name, config.names, config.compat, quota_check=self._quota_check
        )
        self.leader: LeaderElector | None = None
        if config.leader_elect:
            self.leader = LeaderElector(
                api,
                config.lease_namespace,
                config.lease_name,
                config.identity,
                lease_s=config.lease_s,
                renew_deadline_s=config.renew_deadline_s,
                retry_s=config.retry_s,
                on_change=lambda leading: self.metrics.leader.set(1 if leading else 0),
            )
        else:
            self.metrics.leader.set(1)
        # The collector paused while each list is booked (harmless beside other apps in
        # one process: pauses are counted); with freeze_heap, a pass before and a freeze
        # after, inside the pause (scheduler/heap.py).
        after_list = freeze_listed if config.freeze_heap else None
        listing = heap_listing if config.freeze_heap else collector_paused
        self.node_reflector = Reflector(
            api,
            NODES,
            self.state.nodes,
            watch_timeout_s=config.watch_timeout_s,
            after_list=after_list,
            while_listing=listing,
        )
        self.pod_reflector = Reflector(
            api,
            PODS,
            self.state.pods_handler,
            field_selector=f"spec.schedulerName={config.scheduler_name}",
            watch_timeout_s=config.watch_timeout_s,
            after_list=after_list,
            while_listing=listing,
        )
        self.quota_reflector = Reflector(
            api,
            GPUQUOTAS,
            self.state.quotas_handler,
            watch_timeout_s=config.watch_timeout_s,
            absent_ok=True,  # no GpuQuota CRD installed: no quotas
        )
        self.quota_writer = QuotaWriter(
            self.state,
            api,
            self.leading,
            period_s=config.quota_status_s,
            on_nudge=lambda reason: self.metrics.quota_nudges.labels(reason).inc(),
        )
        self.state.quotas_handler.on_raise = self.quota_writer.raised
        self.state.on_cards_back = self.quota_writer.cards_back
        # The claims path: counted against GpuQuotas (the claims webhook) and drawn on
        # the page. absent_ok: a cluster without resource.k8s.io/v1 has no claims path.
        self.claims_book = ClaimsBook(
            self.state, assume_ttl_s=config.reservation_ttl_s, keep_objects=config.web
        )
        self.claims_book.on_release = lambda ns: self.quota_writer.raised({ns})
        self._map = web.MapCache(lambda: web.map_body(self.state, self.claims_book))
        self.quota_writer.before_round = self.claims_book.expire
        self.slice_reflector = Reflector(
            api,
            RESOURCE_SLICES,
            self.claims_book.slices_handler,
            field_selector=f"spec.driver={DRIVER}",
            watch_timeout_s=config.watch_timeout_s,
            absent_ok=True,
            after_list=after_list,
            while_listing=listing,
        )
        self.claim_reflector = Reflector(
            api,
            RESOURCE_CLAIMS,
            self.claims_book.claims_handler,
            watch_timeout_s=config.watch_timeout_s,
            absent_ok=True,
            after_list=after_list,
            while_listing=listing,
        )
        # GPU preemption chooses victims within the PodDisruptionBudgets. Their list
        # gates preemption alone, not the verbs: a cluster whose RBAC lacks them still
        # places pods.
        self.budgets = BudgetBook()
        self.budget_reflector = Reflector(
            api,
            POD_DISRUPTION_BUDGETS,
            self.budgets,
            watch_timeout_s=config.watch_timeout_s,
        )
        # Not before the lists are in: a new leader takes over the holds from the pods.
        self.preemptor = Preemptor(
            self.state,
            api,
            self.events,
            lambda: self.leading() and self.synced() and self.budget_reflector.synced.is_set(),
            on_evict=self.metrics.preemptions.inc,
            budgets=self.budgets,
            on_blocked=lambda reason: self.metrics.preemptions_blocked.labels(reason).inc(),
        )
        self.metrics.on_scrape(self._refresh_gauges)
        self._problems_seen: dict[str, int] = {}

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        self.events.start()
        for r in self._reflectors():
            r.start()
        self.quota_writer.start()
        if self.config.preemption:
            self.budget_reflector.start()
            self.preemptor.start()
        if self.leader is not None:
            self.leader.start()

    def stop(self) -> None:
        for r in self._reflectors():
            r.stop()
        self.quota_writer.stop()
        self.budget_reflector.stop()
        self.preemptor.stop()
        if self.leader is not None:
            self.leader.stop(release=True)
        self.events.stop()

    def _reflectors(self) -> tuple[Reflector, ...]:
        return (
            self.node_reflector,
            self.pod_reflector,
            self.quota_reflector,
            self.slice_reflector,
            self.claim_reflector,
        )

    def wait_synced(self, timeout_s: float | None = 30.0) -> bool:
        """Whether every reflector has listed within ``timeout_s`` (None: no limit)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for r in self._reflectors():
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not r.synced.wait(left):
                return False
        return True

    def synced(self) -> bool:
        """Nodes, pods, quotas, slices and claims listed: before that a verb could pass a
        quota."""
        return all(r.synced.is_set() for r in self._reflectors())

    def _quota_check(self, request: PodRequest) -> str:
        with self.state.lock:
            return self.state.quotas.never_fits(request)

    def leading(self) -> bool:
        return self.leader is None or self.leader.is_leader()

    def _refresh_gauges(self) -> None:
        with self.state.lock:
            t = self.state.cluster.snapshot().tables
            self.metrics.cards_allocated.set(int((t.tenants > 0).sum()))
            self.metrics.cards_cordoned.set(sum(self.state.cordoned_cards.values()))
            self.metrics.nodes.set(len(self.state.cluster))
            self.metrics.reservations.set(len(self.state.reservations))
            self.metrics.holds.set(len(self.state.holds))
            self.metrics.quotas.set(len(self.state.quotas.book))
            problems = dict(self.state.problems)
        for kind, n in problems.items():
            delta = n - self._problems_seen.get(kind, 0)
            if delta > 0:
                self.metrics.problems.labels(kind).inc(delta)
            self._problems_seen[kind] = n

    # --- HTTP surface ---------------------------------------------------------------------

    def handle(self, method: str, path: str, body: bytes, accept_encoding: str = "") -> Response:
        """Answer a request, doing a bind's API write in this thread."""
        out = self.dispatch(method, path, body, accept_encoding)
        if isinstance(out, Response):
            return out
        if isinstance(out, Offload):
            return out.work()
        refused = self.fence(out)
        if refused is not None:
            return refused
        try:
            bind_once(self.api, *out.call)
        except Exception as exc:
            return self.bind_done(out, exc)
        return self.bind_done(out)

    def dispatch(
        self, method: str, path: str, body: bytes, accept_encoding: str = ""
    ) -> Response | BindWrite | Offload:
        route = path.split("?", 1)[0].rstrip("/") or "/"
        if method == "GET":
            if route == "/healthz":
                return Response(200, b"ok", "text/plain")
            if route == "/readyz":
                if not self.synced():
                    return Response(503, b"not synced", "text/plain")
                if not self.leading():
                    return Response(503, b"standby", "text/plain")
                return Response(200, b"ok", "text/plain")
            if route == "/metrics":
                return Response(200, self.metrics.exposition(), "text/plain; version=0.0.4")
            if self.config.web and route == "/gpus":
                return Response(200, web.page(), "text/html; charset=utf-8")
            if self.config.web and route == "/gpus.json":
                gzipped = web.accepts_gzip(accept_encoding)
                return Offload(lambda: self._map_response(gzipped))
            return Response(404, b"not found", "text/plain")
        if method != "POST":
            return Response(405, b"method not allowed", "text/plain")
        verb = route.lstrip("/")
        handler = {
            "filter": self._filter,
            "prioritize": self._prioritize,
            "bind": self._bind,
            "mutate": self._mutate,
            "validate": self._validate,
            "validate-claims": self._validate_claims,
        }.get(verb)
        if handler is None:
            return Response(404, b"not found", "text/plain")
        start = time.perf_counter()
        out: Response | PendingBind | None = None
        try:
            if verb in ("filter", "prioritize", "bind") and not self.leading():
                self.metrics.failures.labels(verb, "standby").inc()
                holder = self.leader.holder if self.leader else ""
                return _error(503, f"standby replica; the leader is {holder!r}")
            if verb in ("filter", "prioritize", "bind") and not self.synced():
                # Until both lists are in, cards of pods not listed yet look free.
                self.metrics.failures.labels(verb, "not-synced").inc()
                return _error(503, "not synced yet: the node and pod lists are not both in")
            out = handler(body)
            return BindWrite(out, start) if isinstance(out, PendingBind) else out
        except WireError as exc:
            self.metrics.failures.labels(verb, "bad-request").inc()
            return _error(400, str(exc))
        except Exception as exc:  # a bug: answer, log, count -- never take the process down
            log.exception("%s failed", verb)
            self.metrics.failures.labels(verb, "internal").inc()
            return _error(500, f"internal error: {type(exc).__name__}")
        finally:
            if not isinstance(out, PendingBind):  # timed when its write is done
                self.metrics.verb_seconds.labels(verb).observe(time.perf_counter() - start)

    def fence(self, write: BindWrite) -> Response | None:
        """Refuse a bind's write (releasing its cards) if this replica no longer leads.

        Leadership is checked when a request arrives and again here, the moment before
        the write: a replica whose lease lapsed while the bind waited (a slow filter, a
        queued write) writes nothing; the new leader places the pod. ``is_leader`` is
        true only while the last renewal is younger than ``renew_deadline_s``, so another
        replica can take the lease no sooner than ``lease_s - renew_deadline_s`` (5 s by
        default) after this check: a write slower than that can still land after a
        takeover, and the new leader's watch then books it (docs/scheduler.md).
        """
        if self.leading():
            return None
        release_pending(self.state, write.pending)
        self.metrics.failures.labels("bind", "lost-leadership").inc()
        self.metrics.verb_seconds.labels("bind").observe(time.perf_counter() - write.started)
        holder = self.leader.holder if self.leader else ""
        message = (
            f"pod {write.pending.args.key}: this replica lost its leadership before the "
            f"write (the leader is {holder!r}); nothing was written"
        )
        log.warning("bind %s", message)
        return Response(200, encode_binding_result(message))

    def bind_done(self, write: BindWrite, error: BaseException | None = None) -> Response:
        """The answer to a bind whose API write ended (``error``: how it failed)."""
        pending = write.pending
        try:
            if error is None:
                self.metrics.placements.inc()
                return Response(200, encode_binding_result())
            if not isinstance(error, ApiError):  # a bug in the write: release, answer 500
                log.error("bind %s: the write failed", pending.args.key, exc_info=error)
                release_pending(self.state, pending)
                self.metrics.failures.labels("bind", "internal").inc()
                return _error(500, f"internal error: {type(error).__name__}")
            return self._bind_refused(pending.args, write_failed(self.state, pending, error))
        finally:
            self.metrics.verb_seconds.labels("bind").observe(time.perf_counter() - write.started)

    def _bind_refused(self, args: BindingArgs, exc: BindError) -> Response:
        """The scheduler gets the reason in the result's Error and retries the pod."""
        self.metrics.failures.labels("bind", exc.reason).inc()
        log.info("bind %s -> %s failed: %s", args.key, args.node, exc)
        return Response(200, encode_binding_result(str(exc)))

    def _filter(self, body: bytes) -> Response:
        args = decode_extender_args(body)
        out = filter_pod(self.state, self.placer, args, narrow=self.config.narrow)
        if out.spec_error:
            self.metrics.failures.labels("filter", "bad-spec").inc()
            self.events.record(args.pod, "TesseraInvalidSpec", out.spec_error)
        elif out.placed:  # kube-scheduler's retry races its own bind: no event, no preemption
            self.metrics.failures.labels("filter", "already-placed").inc()
        elif out.unschedulable:
            self.metrics.failures.labels("filter", "unschedulable").inc()
            why = {**out.failed, **out.unresolvable}
            self.events.record(
                args.pod, "TesseraUnschedulable", summarise(why, len(args.node_names))
            )
            if self.config.preemption and out.request is not None:
                offered = [n for n in args.node_names if n in out.failed]  # in their order
                self.preemptor.consider(args.pod, out.request, offered)
        return Response(200, encode_filter_result(out.node_names, out.failed, out.unresolvable))

    def _map_response(self, gzipped: bool) -> Response:
        body = self._map.get()
        if gzipped:
            return Response(200, body.gzip, JSON, "gzip")
        return Response(200, b"", JSON, pieces=body.json_pieces())

    def _prioritize(self, body: bytes) -> Response:
        args = decode_extender_args(body)
        return Response(200, encode_priorities(prioritize_pod(self.state, self.placer, args)))

    def _bind(self, body: bytes) -> Response | PendingBind:
        args = decode_binding_args(body)
        try:
            return begin_bind(self.state, self.placer, self.api, args)
        except BindError as exc:
            return self._bind_refused(args, exc)

    def _mutate(self, body: bytes) -> Response:
        result = self.webhook.mutate(body)
        label = "refused" if not result.allowed else ("mutated" if result.mutated else "allowed")
        self.metrics.admissions.labels("mutate", label).inc()
        return Response(200, result.body)

    def _validate(self, body: bytes) -> Response:
        result = self.webhook.validate(body)
        self.metrics.admissions.labels("validate", "allowed" if result.allowed else "refused").inc()
        return Response(200, result.body)

    def _validate_claims(self, body: bytes) -> Response:
        result = review_claim(body, self.claims_book.admit, self._claims_unready)
        self.metrics.admissions.labels("claims", "allowed" if result.allowed else "refused").inc()
        return Response(200, result.body)

    def _claims_unready(self) -> str:
        """Why this replica may not count a claim now ("" when it may)."""
        if not self.leading():
            holder = self.leader.holder if self.leader else ""
            return f"standby replica of the Tessera scheduler (the leader is {holder!r}); try again"
        if not self.synced():
            return "the Tessera scheduler has not listed pods, quotas and claims yet; try again"
        return ""
