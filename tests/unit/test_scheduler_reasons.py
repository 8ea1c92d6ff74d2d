"""summarise: per-node reasons folded into the one line kube-scheduler shows in the pod's
FailedScheduling event and `kubectl tessera why` prints."""

from __future__ import annotations

from tessera.scheduler.reasons import summarise


def test_most_common_first_then_alphabetical_and_one_node_said_once() -> None:
    reasons = {"n1": "no card with 20000 MiB free", "n2": "model T4 excluded",
               "n3": "no card with 20000 MiB free", "n4": "cordoned"}  # fmt: skip
    assert summarise(reasons) == (
        "0/4 nodes fit — 2 nodes: no card with 20000 MiB free; 1 node: cordoned; "
        "1 node: model T4 excluded"
    )


def test_past_the_limit_the_rest_is_counted_as_other_reasons() -> None:
    reasons = {f"n{i}": f"reason {i % 4}" for i in range(7)}  # 0, 1, 2: twice; 3: once
    assert summarise(reasons, limit=2) == (
        "0/7 nodes fit — 2 nodes: reason 0; 2 nodes: reason 1; 3 nodes: other reasons"
    )
    assert summarise({"n1": "a", "n2": "b"}, limit=1) == (
        "0/2 nodes fit — 1 node: a; 1 node: other reasons"
    )


def test_the_total_and_head_given_replace_the_counted_ones() -> None:
    assert summarise({"n1": "full"}, total=5) == "0/5 nodes fit — 1 node: full"
    assert summarise({"n1": "full"}, total=1) == "0/1 node fit — 1 node: full"
    assert summarise({}, total=3) == "0/3 nodes fit"
    assert summarise({}) == "0/0 nodes fit"
    head = "kube-scheduler's own filters leave out 1 of 2 nodes"
    assert summarise({"n1": "tainted"}, head=head) == f"{head} — 1 node: tainted"


def test_eight_groups_are_shown_by_default() -> None:
    nine = summarise({f"n{i}": f"r{i}" for i in range(9)})
    assert nine.count("1 node: r") == 8 and nine.endswith("; 1 node: other reasons")
