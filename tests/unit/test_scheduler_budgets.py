"""PodDisruptionBudgets read ahead: the Eviction API's rules (eviction.go, v1.36)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from tessera.kube.port import WatchEvent
from tessera.scheduler.budgets import BudgetBook, Disruptee

RUNNING = Disruptee("team-a", {"app": "train"}, ready=True, pending=False)


def budget(
    name: str = "keep",
    ns: str = "team-a",
    allowed: int = 0,
    healthy: int = 2,
    desired: int = 2,
    selector: dict[str, Any] | None = None,
    generation: int = 1,
    observed: int = 1,
    policy: str | None = None,
    expected: int = 3,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"selector": selector if selector is not None else {
        "matchLabels": {"app": "train"}}}  # fmt: skip
    if policy:
        spec["unhealthyPodEvictionPolicy"] = policy
    return {
        "metadata": {"name": name, "namespace": ns, "generation": generation},
        "spec": spec,
        "status": {
            "disruptionsAllowed": allowed,
            "currentHealthy": healthy,
            "desiredHealthy": desired,
            "observedGeneration": observed,
            "expectedPods": expected,
        },
    }


def book(*items: dict[str, Any]) -> BudgetBook:
    b = BudgetBook()
    b.replace(list(items))
    return b


def test_no_budget_no_refusal() -> None:
    assert book().refusal(RUNNING) == ""
    other_ns = book(budget(ns="team-b"))
    assert other_ns.refusal(RUNNING) == ""  # budgets are per namespace
    other_labels = book(budget(selector={"matchLabels": {"app": "serve"}}))
    assert other_labels.refusal(RUNNING) == ""


def test_a_budget_that_allows_none_refuses_and_says_why() -> None:
    assert (
        book(budget()).refusal(RUNNING) == "PodDisruptionBudget keep needs 2 healthy pods and has 2"
    )
    spare = book(budget(healthy=3, desired=2))  # the controller has not caught up yet
    assert spare.refusal(RUNNING) == "PodDisruptionBudget keep allows no disruption now"


def test_a_budget_that_counts_no_expected_pods_says_so() -> None:
    # maxUnavailable over bare pods: the controller counts two healthy, expects none,
    # allows none (as the real one does; tests/e2e/test_eviction_forecast.py).
    none_expected = book(budget(healthy=2, desired=0, expected=0))
    assert none_expected.refusal(RUNNING) == (
        "PodDisruptionBudget keep counts no expected pods, so allows no disruption "
        "(maxUnavailable and percentages count only pods whose controller has a scale)"
    )


def test_each_victim_takes_one_of_the_allowed_disruptions() -> None:
    b = book(budget(allowed=1, healthy=3))
    spent: Counter[str] = Counter()
    assert b.refusal(RUNNING, spent) == ""
    assert spent == {"team-a/keep": 1}
    assert b.refusal(RUNNING, spent) == (
        "PodDisruptionBudget keep allows 1 disruption(s), all taken by the other victims"
    )
    assert b.refusal(RUNNING) == ""  # without a plan's count: the pod alone may go


def test_victims_count_up_to_the_disruptions_allowed() -> None:
    b = book(budget(allowed=2, healthy=4))
    spent: Counter[str] = Counter()
    assert [b.refusal(RUNNING, spent) == "" for _ in range(3)] == [True, True, False]
    assert spent == {"team-a/keep": 2}


def test_a_pending_pod_goes_whatever_its_budget() -> None:
    pending = Disruptee("team-a", {"app": "train"}, ready=False, pending=True)
    assert book(budget()).refusal(pending) == ""


def test_two_budgets_over_one_pod_refuse_it() -> None:
    b = book(budget("a", allowed=5), budget("b", allowed=5, selector={}))
    assert b.refusal(RUNNING) == (
        "more than one PodDisruptionBudget covers it (a, b), which eviction refuses"
    )


def test_an_unready_pod_goes_when_its_budget_has_its_healthy_pods_or_always_allows() -> None:
    unready = Disruptee("team-a", {"app": "train"}, ready=False, pending=False)
    assert book(budget(healthy=2, desired=2)).refusal(unready) == ""
    assert book(budget(healthy=1, desired=2)).refusal(unready) != ""
    assert book(budget(healthy=0, desired=0)).refusal(unready) != ""  # desired > 0 needed
    assert book(budget(healthy=1, desired=1)).refusal(unready) == ""  # the least that counts
    assert book(budget(healthy=1, desired=2, policy="AlwaysAllow")).refusal(unready) == ""
    spent: Counter[str] = Counter()
    assert book(budget(healthy=2, desired=2)).refusal(unready, spent) == ""
    assert spent == {}  # it does not count against the budget


def test_a_budget_its_controller_cannot_count_says_why() -> None:
    # A Job's pods under maxUnavailable: the sync fails, nothing counted, none allowed;
    # said even before the first sync's generation is observed (the real one's status).
    job = budget(healthy=0, desired=0, expected=0, generation=1, observed=0)
    failed = {"type": "DisruptionAllowed", "status": "False", "reason": "SyncFailed",
              "message": "jobs.batch does not implement the scale subresource"}  # fmt: skip
    job["status"]["conditions"] = [failed]
    assert book(job).refusal(RUNNING) == (
        "PodDisruptionBudget keep allows no disruption: its controller cannot count it "
        "(jobs.batch does not implement the scale subresource)"
    )
    job["status"]["conditions"] = [dict(failed, message="")]
    assert book(job).refusal(RUNNING).endswith("cannot count it (SyncFailed)")
    for other in ({"reason": "InsufficientPods"}, {"status": "True"}, {"type": "Other"}):
        job["status"]["conditions"] = [dict(failed, **other)]
        assert "cannot count" not in book(job).refusal(RUNNING)
    unready = Disruptee("team-a", {"app": "train"}, ready=False, pending=False)
    job["spec"]["unhealthyPodEvictionPolicy"] = "AlwaysAllow"
    job["status"]["conditions"] = [failed]
    assert book(job).refusal(unready) == ""  # the API lets it go all the same


def test_a_status_field_that_is_not_a_number_counts_as_zero() -> None:
    # A status a controller has not written (or wrote wrong) allows nothing.
    for bad in (None, "3", True, 2.0):
        obj = budget(allowed=3, healthy=3, desired=2)
        obj["status"]["disruptionsAllowed"] = bad
        assert book(obj).refusal(RUNNING) == "PodDisruptionBudget keep allows no disruption now"


def test_a_budget_its_controller_has_not_observed_refuses() -> None:
    b = book(budget(allowed=3, generation=2, observed=1))
    assert b.refusal(RUNNING) == "PodDisruptionBudget keep is not yet observed by its controller"


def test_the_watch_keeps_the_book() -> None:
    b = book()
    b.apply(WatchEvent("ADDED", budget()))
    assert b.refusal(RUNNING) != ""
    b.apply(WatchEvent("MODIFIED", budget(allowed=1, healthy=3)))
    assert b.refusal(RUNNING) == ""
    b.apply(WatchEvent("MODIFIED", budget()))
    b.apply(WatchEvent("DELETED", budget()))
    assert b.refusal(RUNNING) == ""
    b.replace([budget()])
    assert b.refusal(RUNNING) != ""
    b.replace([])
    assert b.refusal(RUNNING) == ""


def test_the_book_says_which_budget_loosened() -> None:
    """What may let go a pod it kept: more disruptions, observed at last, unready pods
    free to go, another selector, or gone. A tightening or a count that changes nothing
    is not reported (budgets' status changes often on a busy cluster)."""
    b = book(budget(allowed=1, healthy=3))
    told: list[str] = []
    b.on_loosened = told.append

    def now(**kw: Any) -> list[str]:
        b.apply(WatchEvent("MODIFIED", budget(**kw)))
        return list(told)

    assert now(allowed=0, healthy=2) == []  # tighter
    assert now(allowed=0, healthy=2, desired=3) == []  # unready pods kept still
    assert now(allowed=1, healthy=3) == ["team-a/keep"]  # one disruption allowed
    told.clear()
    assert now(allowed=1, healthy=3, selector={}) == ["team-a/keep"]  # another selector
    told.clear()
    unobserved = {"allowed": 0, "healthy": 1, "desired": 2, "selector": {}, "generation": 2}
    assert now(**unobserved) == []
    assert now(**unobserved, observed=2) == ["team-a/keep"]  # observed at last
    told.clear()
    assert now(**unobserved, observed=2, policy="AlwaysAllow") == ["team-a/keep"]
    told.clear()
    last = budget(**unobserved, observed=2, policy="AlwaysAllow")
    b.apply(WatchEvent("DELETED", last))  # the watch delivers its last state: unchanged
    b.apply(WatchEvent("ADDED", budget("new")))  # a new budget lets nothing go
    assert told == ["team-a/keep"]
    b.replace([budget("new")])  # a re-list that changes nothing tells nothing
    assert told == ["team-a/keep"]
    b.replace([budget("new", allowed=1, healthy=3)])  # one that loosens it, does
    assert told == ["team-a/keep", "team-a/new"]
    b.replace([])  # a re-list without it: gone
    assert told == ["team-a/keep", "team-a/new", "team-a/new"]
