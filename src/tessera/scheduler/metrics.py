"""Prometheus metrics of the scheduler process (one registry per process, not global).

=============================================  =====================================
tessera_scheduler_verb_seconds{verb}           histogram: handler time per verb
tessera_scheduler_placements_total             pods bound with an assignment
tessera_scheduler_failures_total{verb,reason}  refusals and errors, by short reason
tessera_scheduler_cards_allocated              cards with at least one tenant
tessera_scheduler_cards_cordoned               cards an operator took out of service
tessera_scheduler_nodes                        GPU nodes in the state
tessera_scheduler_reservations                 tentative bookings in flight
tessera_scheduler_leader                       1 on the replica that leads
tessera_scheduler_admissions_total{hook,result}  webhook answers, hook mutate/validate/claims
tessera_scheduler_state_problems_total{kind}   inventories/assignments/quotas/slices: bad
tessera_scheduler_quota_nudges_total{reason}   waiting pods annotated to be tried again:
                                               quota-raised, cards-in-service
tessera_scheduler_quotas                       GpuQuota objects in force
tessera_scheduler_preemption_evictions_total   pods evicted for a higher-priority pod's cards
tessera_scheduler_preemption_holds             nodes held for a preempting pod not yet placed
tessera_scheduler_preemption_blocked_total{reason}  preemptions stopped: budget (budgets
                                               read ahead protect the victims), refused,
                                               unanswered (the record or an eviction:
                                               no answer, or never sent)
tessera_scheduler_webhook_cert_expiry_timestamp_seconds  the serving certificate's end
tessera_scheduler_webhook_cert_loads_total     serving certificates loaded (start, renewals)
=============================================  =====================================
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["Metrics"]

_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.verb_seconds = Histogram(
            "tessera_scheduler_verb_seconds", "Handler time per verb", ["verb"],
            buckets=_BUCKETS, registry=r,
        )  # fmt: skip
        self.placements = Counter(
            "tessera_scheduler_placements", "Pods bound with an assignment", registry=r
        )
        self.failures = Counter(
            "tessera_scheduler_failures", "Refusals and errors by reason", ["verb", "reason"],
            registry=r,
        )  # fmt: skip
        self.cards_allocated = Gauge(
            "tessera_scheduler_cards_allocated", "Cards with at least one tenant", registry=r
        )
        self.cards_cordoned = Gauge(
            "tessera_scheduler_cards_cordoned",
            "Cards taken out of service by an operator (tessera.io/cordoned-cards)",
            registry=r,
        )
        self.nodes = Gauge("tessera_scheduler_nodes", "GPU nodes in the state", registry=r)
        self.reservations = Gauge(
            "tessera_scheduler_reservations", "Tentative bookings in flight", registry=r
        )
        self.leader = Gauge("tessera_scheduler_leader", "1 on the leading replica", registry=r)
        self.admissions = Counter(
            "tessera_scheduler_admissions", "Webhook answers", ["hook", "result"], registry=r
        )
        self.problems = Counter(
            "tessera_scheduler_state_problems", "Annotations that did not decode", ["kind"],
            registry=r,
        )  # fmt: skip
        self.quota_nudges = Counter(
            "tessera_scheduler_quota_nudges",
            "Waiting pods annotated so kube-scheduler tries them again after a quota rise "
            "or a card back in service, by reason (quota-raised, cards-in-service)",
            ["reason"],
            registry=r,
        )
        for reason in ("quota-raised", "cards-in-service"):
            self.quota_nudges.labels(reason)  # exposed at 0 from the start, for rate()
        self.quotas = Gauge("tessera_scheduler_quotas", "GpuQuota objects in force", registry=r)
        self.preemptions = Counter(
            "tessera_scheduler_preemption_evictions",
            "Lower-priority pods evicted for a higher-priority pod's cards",
            registry=r,
        )
        self.preemptions_blocked = Counter(
            "tessera_scheduler_preemption_blocked",
            "Preemption tries that evicted nothing more, by reason: budget (the "
            "PodDisruptionBudgets read ahead protect the victims it needs), refused (the "
            "Eviction API refused a victim) or unanswered (the API server did not take the "
            "preemption's record, or did not answer an eviction)",
            ["reason"],
            registry=r,
        )
        for reason in ("budget", "refused", "unanswered"):
            self.preemptions_blocked.labels(reason)  # exposed at 0 from the start
        self.holds = Gauge(
            "tessera_scheduler_preemption_holds",
            "Nodes held for a preempting pod that has not been placed yet",
            registry=r,
        )
        self.webhook_cert_expiry = Gauge(
            "tessera_scheduler_webhook_cert_expiry_timestamp_seconds",
            "When the webhook's serving certificate in use expires (unix seconds)",
            registry=r,
        )
        self.webhook_cert_loads = Counter(
            "tessera_scheduler_webhook_cert_loads",
            "Webhook serving certificates loaded: one at start, one per renewal seen",
            registry=r,
        )
        self._refreshers: list[Callable[[], None]] = []

    def webhook_cert_loaded(self, not_after: float) -> None:
        self.webhook_cert_expiry.set(not_after)
        self.webhook_cert_loads.inc()

    def on_scrape(self, refresh: Callable[[], None]) -> None:
        """Call ``refresh`` (which sets gauges) before each exposition."""
        self._refreshers.append(refresh)

    def exposition(self) -> bytes:
        for refresh in self._refreshers:
            refresh()
        return generate_latest(self.registry)
