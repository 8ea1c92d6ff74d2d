"""`kubectl tessera why` for a pod on the claims path: where each claim stands, and the
room the claims path's cards have for each request."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tessera.claims.devices import DRIVER, resource_slice
from tessera.model.clusterspec import make_cards
from tessera.view.claim_wait import Ask, Constraint, Toleration, claim_asks, explain
from tessera.view.gpumap import build_map

CARDS = make_cards("n1", 2, "A100")  # 40,960 MiB each, 16 slots


def _pod(*claims: dict[str, Any], made: dict[str, str] | None = None) -> dict[str, Any]:
    statuses = [{"name": k, "resourceClaimName": v} for k, v in (made or {}).items()]
    return {"metadata": {"name": "p", "namespace": "team"},
            "spec": {"resourceClaims": list(claims)},
            "status": {"resourceClaimStatuses": statuses}}  # fmt: skip


def _claim(name: str, memory: str | None = None, compute: str | None = None,
           **exactly: Any) -> dict[str, Any]:  # fmt: skip
    requests = {k: v for k, v in (("memory", memory), ("compute", compute)) if v is not None}
    spec = {"deviceClassName": DRIVER, **exactly}
    if requests:
        spec["capacity"] = {"requests": requests}
    return {"metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": spec}]}}}  # fmt: skip


def _allocated(name: str, device: str, memory: str) -> dict[str, Any]:
    result = {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": device,
              "consumedCapacity": {"memory": memory, "compute": "50", "slots": "1"}}  # fmt: skip
    claim = _claim(name, memory, "50")
    claim["status"] = {"allocation": {"devices": {"results": [result]}}}
    return claim


# The chart's DeviceClass (charts/tessera/templates/device-classes.yaml).
CLASSES = {
    DRIVER: {"spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}}
}


def _lines(pod: dict[str, Any], claims: list[dict[str, Any]], cards: Any = CARDS,
           classes: Any = CLASSES) -> list[str]:  # fmt: skip
    slices = [resource_slice("n1", cards, generation=1)]
    gmap = build_map([], [], slices=slices, claims=claims)
    return explain(pod, {c["metadata"]["name"]: c for c in claims}, slices, gmap, classes)


def test_a_request_is_read_in_the_terms_that_decide_where_it_fits() -> None:
    pinned = {"cel": {"expression": f'device.attributes["{DRIVER}"].model == "A100"'}}
    claim = _claim("c", "8Gi", "30", selectors=[pinned], count=2)
    expression = pinned["cel"]["expression"]
    assert claim_asks(claim) == [Ask("gpu", DRIVER, 2, 8192, 30, (expression,))]
    whole = _claim("w")
    whole["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = f"burst-share.{DRIVER}"
    assert claim_asks(whole) == [Ask("gpu", f"burst-share.{DRIVER}", 1, None, 0)]
    other = _claim("o")
    other["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "nic.example.com"
    assert claim_asks(other) == []


def test_room_counts_what_the_allocated_claims_leave_free() -> None:
    # Card 0 holds 36 GiB and half its compute: an 8 GiB / 30 % slice fits only on card 1.
    held = _allocated("held", "gpu-0", "36Gi")
    want = _claim("want", "8Gi", "30")
    lines = _lines(_pod({"name": "gpu", "resourceClaimName": "want"},
                        {"name": "other", "resourceClaimName": "held"}), [held, want])  # fmt: skip
    assert lines == [
        "  claim gpu (team/want): not allocated",
        f"    request gpu: 1 card(s) of {DRIVER} with 8192 MiB and 30 % compute: room on 1 "
        "card(s) of 1 node(s) now (most free: 40960 MiB on n1 card 1)",
        "  claim other (team/held): allocated (n1 gpu-0)",
    ]


def test_a_whole_card_or_two_cards_find_no_room_beside_a_slice() -> None:
    held = _allocated("held", "gpu-0", "1Gi")
    for claim, shape in ((_claim("whole"), "the whole card and 0 % compute"),
                         (_claim("two", "1Gi", count=2), "1024 MiB and 0 % compute")):  # fmt: skip
        name = claim["metadata"]["name"]
        lines = _lines(_pod({"name": "gpu", "resourceClaimName": name}), [held, claim])
        if name == "whole":  # card 1 is whole and free
            assert lines[1].endswith("(most free: 40960 MiB on n1 card 1)"), lines
        else:  # two cards of one node: card 0 has room for 1 GiB too
            assert "room on 2 card(s) of 1 node(s)" in lines[1], lines
        assert shape in lines[1]
    full = [_allocated("a", "gpu-0", "1Gi"), _allocated("b", "gpu-1", "1Gi")]
    lines = _lines(_pod({"name": "gpu", "resourceClaimName": "whole"}), [*full, _claim("whole")])
    assert lines[1].endswith("no node has room for it now"), lines


def test_room_ends_at_the_last_slot_and_the_last_percent_of_compute() -> None:
    """Card 0 holds one claim (1 GiB, 50 %), card 1 none. With one slot on card 0 it has
    no room left; with its slots, a 50 % ask fits beside the claim and 51 % does not."""
    held = _allocated("held", "gpu-0", "1Gi")
    one_slot = [replace(CARDS[0], slots=1), CARDS[1]]

    def line(claim: dict[str, Any], cards: Any = CARDS) -> str:
        name = claim["metadata"]["name"]
        return _lines(_pod({"name": "gpu", "resourceClaimName": name}), [held, claim], cards)[1]

    assert "room on 1 card(s) of 1 node(s)" in line(_claim("a", "1Gi", "10"), one_slot)
    assert line(_claim("b", "1Gi", "50")).endswith(
        "room on 2 card(s) of 1 node(s) now (most free: 40960 MiB on n1 card 1)"
    )
    assert "room on 1 card(s) of 1 node(s)" in line(_claim("c", "1Gi", "51"))


def test_cards_out_of_service_are_not_counted() -> None:
    out = [replace(CARDS[0], healthy=False), replace(CARDS[1], cordoned=True)]
    lines = _lines(_pod({"name": "gpu", "resourceClaimName": "c"}), [_claim("c", "1Gi")], out)
    assert lines[1].endswith("no card of the claims path is in service"), lines


def test_a_claim_not_made_missing_or_malformed_says_so() -> None:
    bad = _claim("bad", "lots")
    pod = _pod({"name": "t", "resourceClaimTemplateName": "tpl"},
               {"name": "gone", "resourceClaimName": "gone"},
               {"name": "made", "resourceClaimTemplateName": "tpl"},
               made={"made": "bad"})  # fmt: skip
    assert _lines(pod, [bad]) == [
        "  claim t: not made yet from its template (the resourceclaim controller makes it)",
        "  claim gone (team/gone): no such ResourceClaim",
        "  claim made (team/bad): spec.devices.requests[0].exactly.capacity.requests.memory: "
        "must be a Kubernetes quantity such as 500m, 2, 1.5, 512Mi, 1G or 1e3 (got 'lots')",
    ]


def test_constraints_group_the_cards_one_allocation_may_take() -> None:
    """Four A100s in NVLink pairs (islands 0 and 2); cards 0 and 2 are full, so the room
    left is one card in each island. Two cards on one island: none; on distinct islands:
    both; a constraint that binds another request too is weighed within this one only."""
    cards = make_cards("n1", 4, "A100", nvlink="pairs")
    full = [_allocated("a", "gpu-0", "40Gi"), _allocated("b", "gpu-2", "40Gi")]
    island = f"{DRIVER}/nvlinkIsland"

    def line(*constraints: dict[str, Any], more: bool = False) -> str:
        claim = _claim("c", "8Gi", count=2)
        if more:
            claim["spec"]["devices"]["requests"].append(
                {"name": "nic", "exactly": {"deviceClassName": "nic.example.com"}}
            )
        claim["spec"]["devices"]["constraints"] = list(constraints)
        return _lines(_pod({"name": "gpu", "resourceClaimName": "c"}), [claim, *full], cards)[1]

    assert line().endswith("room on 2 card(s) of 1 node(s) now (most free: 40960 MiB on n1 "
                           "card 1)")  # fmt: skip
    assert line({"matchAttribute": island}).endswith(": no node has room for it now")
    assert line({"requests": ["gpu"], "matchAttribute": island}).endswith(
        ": no node has room for it now")  # fmt: skip
    assert line({"requests": ["nic"], "matchAttribute": island}).endswith("card 1)")  # not it
    assert "room on 2 card(s)" in line({"distinctAttribute": island})
    assert line({"matchAttribute": f"{DRIVER}/rack"}).endswith(": no node has room for it now")
    spanning = line({"matchAttribute": island}, more=True)
    said = ("no node has room for it now; 1 selector(s) or constraint(s) not weighed "
            "(constraints only within this request)")  # fmt: skip
    assert spanning.endswith(said), spanning
    # Three cards on distinct islands and distinct indices: the islands (two) bound it.
    three = _claim("c", "1Gi", count=3)
    by_index = {"distinctAttribute": f"{DRIVER}/index"}
    three["spec"]["devices"]["constraints"] = [{"distinctAttribute": island}, by_index]
    pod = _pod({"name": "gpu", "resourceClaimName": "c"})
    assert _lines(pod, [three], cards)[1].endswith(": no node has room for it now")
    three["spec"]["devices"]["constraints"].pop(0)
    assert "room on 4 card(s) of 1 node(s)" in _lines(pod, [three], cards)[1]
    one = _claim("c")
    one["spec"]["devices"]["constraints"] = [{"matchAttribute": island}]
    assert claim_asks(one) == [Ask("gpu", DRIVER, 1, None, 0, (), (Constraint(island),))]


def _one(expression: str, classes: Any = CLASSES) -> str:
    claim = _claim("c", "1Gi", selectors=[{"cel": {"expression": expression}}])
    return _lines(_pod({"name": "gpu", "resourceClaimName": "c"}), [claim], classes=classes)[1]


def test_cel_selectors_narrow_the_cards_counted() -> None:
    """As the allocator evaluates them, against each card's attributes."""
    one_card = f'device.attributes["{DRIVER}"].index == 1'
    assert _one(one_card).endswith("room on 1 card(s) of 1 node(s) now (most free: 40960 MiB "
                                   "on n1 card 1)")  # fmt: skip
    assert _one(f'device.attributes["{DRIVER}"].model.startsWith("A100")').startswith(
        f"    request gpu: 1 card(s) of {DRIVER} with 1024 MiB and 0 % compute: room on 2 card(s)"
    )
    t4 = f'device.attributes["{DRIVER}"].model.startsWith("T4")'
    assert _one(t4).endswith(": no card in service passes its CEL selectors")
    # The DeviceClass's selectors count too.
    other = {DRIVER: {"spec": {"selectors": [{"cel": {"expression": 'device.driver == "x"'}}]}}}
    assert _one("true", other).endswith(": no card in service passes its CEL selectors")


def test_capacities_are_quantities_as_kubernetes_cel_reads_them() -> None:
    """The cards have 40 GiB: a selector asking 80 passes none, one asking 40 both."""
    big = f'device.capacity["{DRIVER}"].memory.compareTo(quantity("80Gi")) >= 0'
    assert _one(big).endswith(": no card in service passes its CEL selectors"), _one(big)
    fits = f'device.capacity["{DRIVER}"].memory.isLessThan(quantity("40960Mi").add(1))'
    assert "room on 2 card(s) of 1 node(s)" in _one(fits) and "not weighed" not in _one(fits)
    shared = "device.allowMultipleAllocations"
    assert "room on 2 card(s) of 1 node(s)" in _one(shared), _one(shared)


def test_a_selector_that_does_not_evaluate_is_not_weighed_and_says_why() -> None:
    ip = 'isIP("10.0.0.1")'  # a Kubernetes function this CEL does not have
    line = _one(ip)
    assert "room on 2 card(s) of 1 node(s)" in line  # not narrowed by it
    assert f"; 1 selector(s) or constraint(s) not weighed; `{ip}`: " in line, line
    wrong = 'quantity("1Gi") < quantity("2Gi")'  # no such overload, as in Kubernetes
    assert f"not weighed; `{wrong}`: TypeError: No such overload" in _one(wrong), _one(wrong)
    missing = _one('device.attributes["example.com"].rack == "r1"')  # no such domain
    assert "; 1 selector(s) or constraint(s) not weighed; " in missing, missing
    # An error on one card alone (its left side false) leaves the selector unweighed too.
    partly = _one(f'device.attributes["{DRIVER}"].index == 0 || '
                  'device.attributes["example.com"].rack == "r1"')  # fmt: skip
    assert "room on 2 card(s) of 1 node(s)" in partly and "not weighed" in partly, partly
    broken = _one("device.driver ==")
    assert "Failed to parse expression" in broken, broken
    unread = _one("true", classes=None)  # the DeviceClasses could not be listed
    assert unread.endswith(f"; the selectors of DeviceClass {DRIVER} not read"), unread


def test_the_alternatives_of_a_prioritized_list_are_each_read() -> None:
    claim = _claim("c")
    claim["spec"]["devices"]["requests"] = [{"name": "gpu", "firstAvailable": [
        {"name": "big", "deviceClassName": DRIVER, "capacity": {"requests": {"memory": "80Gi"}}},
        {"name": "nic", "deviceClassName": "nic.example.com"},
        {"name": "small", "deviceClassName": DRIVER,
         "capacity": {"requests": {"memory": "8Gi", "compute": "20"}}}]}]  # fmt: skip
    assert claim_asks(claim) == [Ask("gpu/big", DRIVER, 1, 81920, 0),
                                 Ask("gpu/small", DRIVER, 1, 8192, 20)]  # fmt: skip
    lines = _lines(_pod({"name": "gpu", "resourceClaimName": "c"}), [claim])
    assert lines[1].endswith("no node has room for it now") and "gpu/big" in lines[1]
    assert "gpu/small" in lines[2] and "room on 2 card(s) of 1 node(s)" in lines[2]


def test_without_the_cel_extra_no_selector_is_weighed(monkeypatch: Any) -> None:
    from tessera.view import claim_cel

    monkeypatch.setattr(claim_cel, "cel", None)
    line = _one(f'device.attributes["{DRIVER}"].index == 1')
    assert "room on 2 card(s)" in line  # not narrowed
    assert "; 2 selector(s) or constraint(s) not weighed; " in line  # the class's too
    assert "CEL is not installed (the cel extra)" in line, line


def _all(claims: list[dict[str, Any]], slices: list[Any] | None = None,
         offered: set[str] | None = None, **exactly: Any) -> str:  # fmt: skip
    """The line of a request for every card ``allocationMode: All``, 1 GiB each unless
    ``exactly`` says otherwise."""
    spec = {"allocationMode": "All", "capacity": {"requests": {"memory": "1Gi"}}, **exactly}
    want = _claim("want")
    want["spec"]["devices"]["requests"][0]["exactly"].update(spec)
    slices = slices or [resource_slice("n1", CARDS, generation=1)]
    gmap = build_map([], [], slices=slices, claims=[*claims, want])
    names = {c["metadata"]["name"]: c for c in [*claims, want]}
    pod = _pod({"name": "gpu", "resourceClaimName": "want"})
    return explain(pod, names, slices, gmap, CLASSES, offered)[1]


def test_all_takes_every_matching_card_of_a_node_or_none_of_it() -> None:
    """As the allocator reads allocationMode All: every card of the node that passes the
    selectors is the request's, so one without room, or out of service, refuses the
    node; a card the selectors leave out does not."""
    head = f"    request gpu: every card of {DRIVER} with 1024 MiB and 0 % compute: "
    assert _all([]) == head + "room on 1 node(s) now, all of their matching cards (most: 2 on n1)"
    full = [_allocated("held", "gpu-0", "40Gi")]
    assert _all(full).endswith("no node has every matching card free now (1 with one without "
                               "room)")  # fmt: skip
    not_card_0 = [{"cel": {"expression": f'device.attributes["{DRIVER}"].index != 0'}}]
    assert "room on 1 node(s) now, all of their matching cards (most: 1 on n1)" in _all(
        full, selectors=not_card_0
    )
    cordoned = [resource_slice("n1", [CARDS[0], replace(CARDS[1], cordoned=True)], generation=1)]
    assert _all([], cordoned).endswith("(1 with one out of service)")
    tolerated = [{"key": f"{DRIVER}/cordoned", "operator": "Exists", "effect": "NoSchedule"}]
    assert "room on 1 node(s)" in _all([], cordoned, tolerations=tolerated)
    other_key = [{"key": f"{DRIVER}/unhealthy", "operator": "Exists"}]
    assert _all([], cordoned, tolerations=other_key).endswith("(1 with one out of service)")


def test_all_counts_only_cards_large_enough_and_under_its_constraints() -> None:
    """A card smaller than the request is not among "all" (the allocator compares the
    request with each device's capacity); the constraints must hold over every card."""
    slices = [resource_slice("n1", CARDS, generation=1),
              resource_slice("n2", make_cards("n2", 3, "T4"), generation=1)]  # fmt: skip
    line = _all([], slices, capacity={"requests": {"memory": "20Gi"}})  # T4s: 15 GiB
    assert line.endswith("room on 1 node(s) now, all of their matching cards (most: 2 on n1)")
    exactly = _all([], slices, capacity={"requests": {"memory": "40Gi"}})  # the A100's all
    assert exactly.endswith("room on 1 node(s) now, all of their matching cards (most: 2 on n1)")
    assert _all([], slices).endswith("room on 2 node(s) now, all of their matching cards "
                                     "(most: 3 on n2)")  # fmt: skip
    assert _all([], slices, capacity={"requests": {"memory": "80Gi"}}).endswith(
        ": no card passes its CEL selectors and is large enough"
    )
    pairs = [resource_slice("n1", make_cards("n1", 4, "A100", nvlink="pairs"), generation=1)]
    want = _claim("c")
    want["spec"]["devices"]["constraints"] = [{"matchAttribute": f"{DRIVER}/nvlinkIsland"}]
    claim = _claim("want")
    claim["spec"]["devices"]["requests"][0]["exactly"].update(
        {"allocationMode": "All", "capacity": {"requests": {"memory": "1Gi"}}}
    )
    claim["spec"]["devices"]["constraints"] = want["spec"]["devices"]["constraints"]
    gmap = build_map([], [], slices=pairs, claims=[claim])
    line = explain(_pod({"name": "gpu", "resourceClaimName": "want"}), {"want": claim}, pairs,
                   gmap, CLASSES)[1]  # fmt: skip
    assert line.endswith("(1 with one against a constraint)"), line
    one_island = [resource_slice("n1", make_cards("n1", 2, "A100", nvlink="pairs"), generation=1)]
    line = explain(_pod({"name": "gpu", "resourceClaimName": "want"}), {"want": claim},
                   one_island, build_map([], [], slices=one_island, claims=[claim]),
                   CLASSES)[1]  # fmt: skip
    assert "room on 1 node(s) now, all of their matching cards (most: 2 on n1)" in line, line
    claim["spec"]["devices"]["constraints"] = [{"distinctAttribute": f"{DRIVER}/uuid"}]
    line = explain(_pod({"name": "gpu", "resourceClaimName": "want"}), {"want": claim}, pairs,
                   gmap, CLASSES)[1]  # fmt: skip
    assert "room on 1 node(s) now, all of their matching cards (most: 4 on n1)" in line, line


def test_only_the_nodes_kube_scheduler_offers_are_weighed() -> None:
    slices = [resource_slice("n1", CARDS, generation=1),
              resource_slice("n2", make_cards("n2", 2, "A100"), generation=1)]  # fmt: skip
    assert "room on 1 node(s)" in _all([], slices, offered={"n2"})
    assert _all([], slices, offered={"n3"}).endswith(
        ": no card of the claims path on the nodes it may use"
    )
    count = _claim("c", "1Gi")
    gmap = build_map([], [], slices=slices, claims=[count])
    pod = _pod({"name": "gpu", "resourceClaimName": "c"})
    line = explain(pod, {"c": count}, slices, gmap, CLASSES, {"n1"})[1]
    assert "room on 2 card(s) of 1 node(s)" in line, line


def test_a_tolerated_taint_counts_the_card_in_service() -> None:
    cordoned = [replace(c, cordoned=True) for c in CARDS]
    plain = _claim("c", "1Gi")
    tolerant = _claim("t", "1Gi", tolerations=[{"key": f"{DRIVER}/cordoned",
                                                "value": "true"}])  # fmt: skip
    assert _lines(_pod({"name": "gpu", "resourceClaimName": "c"}), [plain], cordoned)[1].endswith(
        "no card of the claims path is in service"
    )
    line = _lines(_pod({"name": "gpu", "resourceClaimName": "t"}), [tolerant], cordoned)[1]
    assert "room on 2 card(s) of 1 node(s)" in line, line


def test_a_toleration_reads_its_key_effect_and_operator() -> None:
    """As the allocator's ToleratesTaint: no key with Exists tolerates every taint; an
    effect other than the taint's tolerates nothing; an empty operator means Equal."""
    cordoned = [replace(c, cordoned=True) for c in CARDS]

    def line(*tolerations: dict[str, str]) -> str:
        claim = _claim("t", "1Gi", tolerations=list(tolerations))
        return _lines(_pod({"name": "gpu", "resourceClaimName": "t"}), [claim], cordoned)[1]

    assert "room on 2 card(s)" in line({"operator": "Exists"})
    other_effect = {"key": f"{DRIVER}/cordoned", "operator": "Exists", "effect": "NoExecute"}
    assert line(other_effect).endswith("no card of the claims path is in service")
    key, value = f"{DRIVER}/cordoned", "true"
    assert Toleration(key, "", value).tolerates(key, value, "NoSchedule")
    assert not Toleration(key, "", "false").tolerates(key, value, "NoSchedule")


def test_a_card_with_one_free_slot_has_room() -> None:
    held = _allocated("held", "gpu-0", "1Gi")
    two_slots = [replace(CARDS[0], slots=2), CARDS[1]]
    line = _lines(_pod({"name": "gpu", "resourceClaimName": "c"}), [held, _claim("c", "1Gi")],
                  two_slots)[1]  # fmt: skip
    assert "room on 2 card(s) of 1 node(s)" in line, line


def test_a_compute_that_is_not_a_quantity_is_refused_naming_the_field() -> None:
    lines = _lines(_pod({"name": "gpu", "resourceClaimName": "c"}), [_claim("c", "1Gi", "half")])
    assert lines == [
        "  claim gpu (team/c): spec.devices.requests[0].exactly.capacity.requests.compute: "
        "must be a Kubernetes quantity such as 500m, 2, 1.5, 512Mi, 1G or 1e3 (got 'half')"
    ]


def test_which_requests_a_constraint_binds() -> None:
    """A constraint binds the requests it names (an alternative through its request's
    name or its own), or every request when it names none; it is weighed across
    requests only when it binds another."""
    island = f"{DRIVER}/nvlinkIsland"
    gpu = {"name": "gpu", "exactly": {"deviceClassName": DRIVER}}
    nic = {"name": "nic", "exactly": {"deviceClassName": "nic.example.com"}}
    alternatives = {"name": "gpu", "firstAvailable": [{"name": "small", "deviceClassName": DRIVER}]}

    def asks(requests: list[Any], *constraints: dict[str, Any]) -> list[Ask]:
        claim = _claim("c")
        claim["spec"]["devices"] = {"requests": requests, "constraints": list(constraints)}
        return claim_asks(claim)

    named = {"requests": ["gpu"], "matchAttribute": island}
    only_nic = {"requests": ["nic"], "distinctAttribute": island}
    assert asks([gpu, nic], only_nic, named)[0].constraints == (Constraint(island),)
    assert asks([gpu, nic], {"matchAttribute": island})[0].constraints == (
        Constraint(island, across=True),
    )
    assert asks([alternatives], named)[0].constraints == (Constraint(island),)
    by_own_name = {"requests": ["gpu/small"], "matchAttribute": island}
    assert asks([alternatives], by_own_name)[0].constraints == (Constraint(island),)


def _slice_of(driver: str, **spec: Any) -> dict[str, Any]:
    obj = resource_slice("n0", make_cards("n0", 1, "A100"), generation=1)
    obj["spec"].update(driver=driver, **spec)
    return obj


def test_a_slice_of_another_driver_a_malformed_one_or_a_card_not_mapped_is_passed_over() -> None:
    claim = _claim("c", "1Gi")
    ours = resource_slice("n1", CARDS, generation=1)
    malformed = _slice_of(DRIVER, nodeName="", pool={})
    slices = [_slice_of("nic.example.com"), malformed, ours]
    mapped = [resource_slice("n1", CARDS[1:], generation=1)]  # the map read card 1 alone
    gmap = build_map([], [], slices=mapped, claims=[claim])
    pod = _pod({"name": "gpu", "resourceClaimName": "c"})
    line = explain(pod, {"c": claim}, slices, gmap, CLASSES)[1]
    assert line.endswith("room on 1 card(s) of 1 node(s) now (most free: 40960 MiB on n1 card 1)")


def test_all_names_every_node_blocked_and_the_node_with_most_cards() -> None:
    a = make_cards("a", 3, "A100")
    b = make_cards("b", 2, "A100")
    slices = [resource_slice("a", a, generation=1), resource_slice("b", b, generation=1)]
    assert _all([], slices).endswith("room on 2 node(s) now, all of their matching cards "
                                     "(most: 3 on a)")  # fmt: skip
    out = [resource_slice("a", [replace(a[0], cordoned=True), *a[1:]], generation=1),
           resource_slice("b", [replace(b[0], healthy=False), *b[1:]], generation=1)]  # fmt: skip
    assert _all([], out).endswith("no node has every matching card free now (2 with one out "
                                  "of service)")  # fmt: skip
    full = [_allocated("held", "gpu-0", "40Gi")]  # pool n1, card 0
    mixed = [resource_slice("n1", CARDS, generation=1), out[0]]
    assert _all(full, mixed).endswith("no node has every matching card free now (1 with one "
                                      "out of service, 1 with one without room)")  # fmt: skip
    on_b = _allocated("held-b", "gpu-0", "40Gi")
    on_b["status"]["allocation"]["devices"]["results"][0]["pool"] = "b"
    both = [resource_slice("n1", CARDS, generation=1), slices[1]]
    assert _all([*full, on_b], both).endswith("(2 with one without room)")


def test_all_refuses_a_node_whose_cards_lack_a_constrained_attribute() -> None:
    claim = _claim("want")
    claim["spec"]["devices"]["requests"][0]["exactly"].update(
        {"allocationMode": "All", "capacity": {"requests": {"memory": "1Gi"}}}
    )
    claim["spec"]["devices"]["constraints"] = [{"matchAttribute": f"{DRIVER}/rack"}]
    slices = [resource_slice("n1", CARDS, generation=1),
              resource_slice("n2", make_cards("n2", 2, "A100"), generation=1)]  # fmt: skip
    gmap = build_map([], [], slices=slices, claims=[claim])
    line = explain(_pod({"name": "gpu", "resourceClaimName": "want"}), {"want": claim}, slices,
                   gmap, CLASSES)[1]  # fmt: skip
    assert line.endswith("(2 with one against a constraint)"), line


def test_only_the_first_selector_problem_is_quoted() -> None:
    first, second = 'isIP("10.0.0.1")', 'isCIDR("10.0.0.0/8")'
    claim = _claim("c", "1Gi", selectors=[{"cel": {"expression": e}} for e in (first, second)])
    line = _lines(_pod({"name": "gpu", "resourceClaimName": "c"}), [claim])[1]
    assert "; 2 selector(s) or constraint(s) not weighed; " in line, line
    assert f"`{first}`: " in line and f"`{second}`" not in line, line


def test_every_claim_of_the_pod_gets_its_line() -> None:
    two = _allocated("two", "gpu-0", "1Gi")
    results = two["status"]["allocation"]["devices"]["results"]
    results.append({**results[0], "device": "gpu-1"})
    foreign = _claim("nic")
    foreign["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "nic.example.com"
    refs = [{"name": n, "resourceClaimName": n} for n in ("two", "bad", "nic", "ok")]
    lines = _lines(_pod(*refs), [two, _claim("bad", "lots"), foreign, _claim("ok", "1Gi")])
    assert [line.split(":")[0] for line in lines] == [
        "  claim two (team/two)", "  claim bad (team/bad)", "  claim nic (team/nic)",
        "  claim ok (team/ok)", "    request gpu"]  # fmt: skip
    assert lines[0] == "  claim two (team/two): allocated (n1 gpu-0, n1 gpu-1)"
    assert lines[2] == f"  claim nic (team/nic): not allocated; it asks no class of {DRIVER}"
