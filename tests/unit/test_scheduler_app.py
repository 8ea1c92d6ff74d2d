"""The HTTP surface: 4xx for anything malformed, never a 500; health, readiness, metrics."""

from __future__ import annotations

import base64
import contextlib
import gzip
import http.client
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tessera.kube import EVENTS, LEASES, NODES, PODS, ApiError, Conflict
from tessera.kube.kinds import (
    GPUQUOTAS,
    POD_DISRUPTION_BUDGETS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
)
from tessera.model.clusterspec import make_cards
from tessera.model.types import NodeInventory
from tessera.scheduler import http as http_server
from tessera.scheduler.app import Response
from tessera.scheduler.holds import Hold
from tessera.scheduler.http import serve
from tessera.scheduler.web import MapBody, MapCache, _gzip_json, accepts_gzip
from tessera.view.gpumap import Pending, assemble, map_json, map_parts
from tests._logs import logged
from tests.unit._scheduler_world import World, binding_args, node_obj, pod_obj
from tests.unit._wait import eventually

TEXT = "text/plain"

MALFORMED = [
    b"",
    b"{",
    b"null",
    b"[]",
    b'"text"',
    b"\xff\xfe",
    b'{"Pod": null, "NodeNames": ["n1"]}',
    b'{"Pod": {"metadata": {}}, "NodeNames": ["n1"]}',
    b'{"Pod": {"metadata": {"name": "p"}}, "NodeNames": "n1"}',
    b'{"Pod": {"metadata": {"name": "p"}}, "NodeNames": [1, 2]}',
    b'{"Pod": {"metadata": {"name": "p"}}}',
    b'{"Pod": {"metadata": {"name": "p"}}, "Nodes": {"items": [{"metadata": 5}]}}',
]


@pytest.fixture
def world() -> Iterator[World]:
    w = World([node_obj("n1", 2)])
    yield w
    w.close()


@pytest.mark.parametrize("body", MALFORMED)
@pytest.mark.parametrize("verb", ["filter", "prioritize", "bind", "mutate", "validate"])
def test_malformed_bodies_get_400(world: World, verb: str, body: bytes) -> None:
    r = world.app.handle("POST", f"/{verb}", body)
    assert r.status == 400, (verb, body, r.body)
    assert json.loads(r.body)["Error"]


def test_pod_with_garbage_spec_is_answered_not_crashed(world: World) -> None:
    pod = {"metadata": {"name": "p", "namespace": "default", "uid": "u"},
           "spec": {"containers": "nope"}}  # fmt: skip
    status, out = world.post("filter", {"Pod": pod, "NodeNames": ["n1"]})
    assert status == 200
    assert out["NodeNames"] == [] and "spec.containers" in out["FailedAndUnresolvableNodes"]["n1"]
    status, out = world.post("prioritize", {"Pod": pod, "NodeNames": ["n1"]})
    assert status == 200 and out == [{"Host": "n1", "Score": 0}]
    assert (
        _value(world.app, "tessera_scheduler_failures_total", reason="bad-spec", verb="filter") == 1
    )
    world.app.events.flush()
    [event] = world.kube.list(EVENTS, "default").items
    assert event["reason"] == "TesseraInvalidSpec" and "spec.containers" in event["message"]


def test_paths_and_methods(world: World) -> None:
    assert world.app.handle("GET", "/healthz", b"").status == 200
    assert world.app.handle("GET", "/readyz", b"") == Response(200, b"ok", TEXT)
    # A trailing slash and a query string name the same path.
    for path in ("/healthz/", "/readyz?verbose=1", "/metrics/?x=1&y=2"):
        assert world.app.handle("GET", path, b"").status == 200, path
    pod = world.create(pod_obj("p"))
    body = json.dumps({"Pod": pod, "NodeNames": ["n1"]}).encode()
    assert world.app.handle("POST", "/filter/?timeout=5s", body).status == 200
    assert world.app.handle("GET", "/nope", b"").status == 404
    assert world.app.handle("POST", "/nope", b"{}").status == 404
    assert world.app.handle("PUT", "/filter", b"{}").status == 405


def test_metrics_count_verbs_placements_and_cards(world: World) -> None:
    pod = world.create(pod_obj("p", gpu=2))
    assert world.schedule(pod) == "n1"
    world.app.handle("POST", "/filter", b"{")
    text = world.app.handle("GET", "/metrics", b"").body.decode()
    assert 'tessera_scheduler_verb_seconds_count{verb="filter"}' in text
    assert "tessera_scheduler_placements_total 1.0" in text
    assert "tessera_scheduler_leader 1.0" in text  # no election: the only replica leads
    assert "tessera_scheduler_cards_allocated 2.0" in text
    assert 'tessera_scheduler_failures_total{reason="bad-request",verb="filter"} 1.0' in text


def test_unschedulable_pod_gets_a_summarised_event(world: World) -> None:
    pod = world.create(pod_obj("big", gpu=4))
    assert world.filter(pod)["NodeNames"] == []
    metrics = world.app.handle("GET", "/metrics", b"").body.decode()
    assert 'tessera_scheduler_failures_total{reason="unschedulable",verb="filter"} 1.0' in metrics
    world.app.events.flush()
    events = world.kube.list(EVENTS, "default").items
    assert len(events) == 1
    assert events[0]["reason"] == "TesseraUnschedulable"
    assert events[0]["message"].startswith("0/1 node fit — 1 node: ")


@pytest.mark.parametrize("preemption", [True, False])
def test_an_unschedulable_pod_goes_to_the_preemptor_only_with_preemption_on(
    preemption: bool,
) -> None:
    w = World([node_obj("n1", 2)], preemption=preemption)
    try:
        handed: list[tuple[str, list[str]]] = []

        def consider(pod: Any, request: Any, nodes: list[str]) -> None:
            handed.append((request.key, nodes))

        w.app.preemptor.consider = consider  # type: ignore[method-assign]
        assert w.filter(w.create(pod_obj("big", gpu=4)))["NodeNames"] == []
        # Off, its thread never starts: a pod handed over would wait there for ever.
        assert handed == ([("default/big", ["n1"])] if preemption else [])
    finally:
        w.close()


def test_a_pod_that_fits_or_is_not_ours_gets_no_event(world: World) -> None:
    pod = world.create(pod_obj("cpu-only", gpu=None))
    assert world.filter(pod, ["n1", "elsewhere"])["NodeNames"] == ["n1", "elsewhere"]
    assert world.filter(world.create(pod_obj("fits")))["NodeNames"] == ["n1"]
    world.app.events.flush()
    assert world.kube.list(EVENTS, "default").items == []
    text = world.app.handle("GET", "/metrics", b"").body.decode()
    assert 'reason="unschedulable"' not in text


def test_standby_refuses_extender_verbs_but_serves_the_webhook() -> None:
    w = World([node_obj("n1", 1)], leader_elect=True, lease_namespace="default")
    other = World.__new__(World)
    other.kube = w.kube
    from tessera.scheduler.app import SchedulerApp
    from tessera.scheduler.config import SchedulerConfig

    other.app = SchedulerApp(
        SchedulerConfig(lease_namespace="default", identity="other", watch_timeout_s=1), w.kube
    )
    try:
        assert w.app.leader is not None and w.app.leader.try_acquire_or_renew()
        other.app.start()
        assert other.app.wait_synced(5)
        assert other.app.leader is not None and not other.app.leader.try_acquire_or_renew()
        pod = w.create(pod_obj("p"))
        r = other.app.handle(
            "POST", "/filter", json.dumps({"Pod": pod, "NodeNames": ["n1"]}).encode()
        )
        assert r.status == 503 and "standby" in json.loads(r.body)["Error"]
        holder = other.app.leader.holder
        assert holder and holder != "other"
        for verb, body in (("prioritize", {"Pod": pod, "NodeNames": ["n1"]}),
                           ("bind", binding_args(pod, "n1"))):  # fmt: skip
            r = other.app.handle("POST", f"/{verb}", json.dumps(body).encode())
            assert (r.status, json.loads(r.body)) == (
                503, {"Error": f"standby replica; the leader is {holder!r}"}), verb  # fmt: skip
        for verb in ("filter", "prioritize", "bind"):
            failures = _value(
                other.app, "tessera_scheduler_failures_total", reason="standby", verb=verb
            )
            assert failures == 1, verb
        assert other.app.handle("GET", "/readyz", b"") == Response(503, b"standby", TEXT)
        review = {"request": {"uid": "1", "operation": "CREATE", "object": pod_obj("q")}}
        assert other.app.handle("POST", "/mutate", json.dumps(review).encode()).status == 200
        assert w.filter(pod)["NodeNames"] == ["n1"]
        leads = b"tessera_scheduler_leader 1.0"
        assert leads in w.app.metrics.exposition()
        assert leads not in other.app.metrics.exposition()
        # The other replica takes the Lease over: the metric follows.
        lease = w.kube.get(LEASES, "tessera-scheduler", "default")
        lease["spec"]["holderIdentity"] = "other"
        lease["spec"]["renewTime"] = "2026-11-28T00:00:00.000000Z"
        w.kube.replace(LEASES, lease, "default")
        assert not w.app.leader.try_acquire_or_renew()
        assert b"tessera_scheduler_leader 0.0" in w.app.metrics.exposition()
    finally:
        other.app.stop()
        w.close()


def test_real_socket_keeps_alive_and_answers_400(world: World) -> None:
    server = serve(world.app, "127.0.0.1", 0)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        for _ in range(3):  # one connection, several requests
            conn.request(
                "POST", "/filter", body=b"{not json", headers={"Content-Type": "application/json"}
            )
            resp = conn.getresponse()
            assert resp.status == 400
            resp.read()
        conn.request("GET", "/healthz")
        assert conn.getresponse().read() == b"ok"
        conn.close()
    finally:
        server.stop()


def test_the_server_listens_on_the_port_it_is_given_and_logs_no_line_per_request(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="aiohttp.access")
    with socket.socket() as probe:  # a port free a moment ago
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = serve(world.app, "127.0.0.1", port)
    try:
        assert server.port == port
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/healthz")
        assert conn.getresponse().read() == b"ok"
        conn.close()
    finally:
        server.stop()
    assert [r for r in caplog.records if r.name == "aiohttp.access"] == []


def test_the_certificate_is_checked_again_and_again_and_a_failed_check_is_logged(
    world: World, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(http_server, "RECHECK_S", 0.02)
    checks: list[int] = []

    def recheck() -> None:
        checks.append(1)
        if len(checks) == 1:
            raise OSError("tls.crt: no such file")

    server = serve(world.app, "127.0.0.1", 0, recheck_tls=recheck)
    try:
        eventually(lambda: len(checks) >= 3)  # the failure did not end the checks
    finally:
        server.stop()
    [failed] = [r for r in caplog.records if r.name == "tessera.scheduler.http"]
    assert failed.getMessage() == "checking the serving certificate for a change"
    assert failed.exc_info is not None and str(failed.exc_info[1]) == "tls.crt: no such file"


def test_stop_does_not_wait_for_a_map_being_built() -> None:
    w = World([node_obj("n1", 2)], web=True)
    building, release, threads = threading.Event(), threading.Event(), []

    def slow_build() -> MapBody:
        threads.append(threading.current_thread().name)
        building.set()
        release.wait(30)
        return MapBody(gzip.compress(b'{"nodes": []}'))

    w.app._map._build = slow_build
    server = http_server.Server(w.app, "127.0.0.1", 0, shutdown_timeout_s=0.2)
    server.start()

    def load_map() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        with contextlib.suppress(OSError, http.client.HTTPException):
            conn.request("GET", "/gpus.json")
            conn.getresponse().read()
        conn.close()

    reader = threading.Thread(target=load_map)
    try:
        reader.start()
        assert building.wait(5)
        server.stop()
        assert not release.is_set()  # stop came back with the build still running
        assert threads == ["tessera-offload_0"]  # on the server's own thread, not the loop's
    finally:
        release.set()
        reader.join(10)
        w.close()


def test_a_body_over_the_limit_is_refused_not_read(world: World) -> None:
    server = serve(world.app, "127.0.0.1", 0)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        too_big = b" " * (http_server.MAX_BODY + 1)  # 64 MiB: 5,000 full Nodes fit under it
        with contextlib.suppress(ConnectionError):  # it may close before the body is sent
            conn.request("POST", "/filter", body=too_big)
        assert conn.getresponse().status == 413
    finally:
        conn.close()
        server.stop()


def _bind_over_socket(world: World, port: int, name: str) -> tuple[int, Any]:
    pod = world.create(pod_obj(name))
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("POST", "/filter", body=json.dumps({"Pod": pod, "NodeNames": ["n1"]}))
    node = json.loads(conn.getresponse().read())["NodeNames"][0]
    conn.request("POST", "/bind", body=json.dumps(binding_args(pod, node)))
    resp = conn.getresponse()
    out = (resp.status, json.loads(resp.read()))
    conn.close()
    return out


def test_real_socket_binds_off_the_loop_and_refuses_oversized_bodies(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a binder given, bind's API write runs on the ThreadedBinder's pool; a
    body over the limit gets 413 and nothing is placed."""
    monkeypatch.setattr(http_server, "MAX_BODY", 4096)
    threads: list[str] = []
    real_bind = world.kube.bind

    def bind(*args: Any, **kwargs: Any) -> None:
        threads.append(threading.current_thread().name)
        real_bind(*args, **kwargs)

    monkeypatch.setattr(world.kube, "bind", bind)
    server = serve(world.app, "127.0.0.1", 0)
    try:
        assert _bind_over_socket(world, server.port, "p") == (200, {"Error": ""})
        assert world.kube.get(PODS, "p", "default")["spec"]["nodeName"] == "n1"
        assert len(threads) == 1 and threads[0].startswith("tessera-bind")
        big = json.dumps({"Pod": world.create(pod_obj("q")), "NodeNames": ["n1"] * 1000})
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        conn.request("POST", "/filter", body=big)
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 413
        assert world.app.state.reservations.get("default/q") is None
        conn.close()
    finally:
        server.stop()


def test_stop_does_not_wait_for_ever_on_a_bind_stuck_in_the_api(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bind whose API write hangs gets the shutdown timeout, then stop() returns."""
    entered, release = threading.Event(), threading.Event()

    def stuck_bind(*args: Any, **kwargs: Any) -> None:
        entered.set()
        release.wait(30)

    monkeypatch.setattr(world.kube, "bind", stuck_bind)
    server = http_server.Server(world.app, "127.0.0.1", 0, shutdown_timeout_s=0.5)
    server.start()
    pod = world.create(pod_obj("p"))
    node = world.filter(pod)["NodeNames"][0]
    args = binding_args(pod, node)

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        with contextlib.suppress(OSError, http.client.HTTPException):
            conn.request("POST", "/bind", body=json.dumps(args))
            conn.getresponse().read()
        conn.close()

    caller = threading.Thread(target=client)
    caller.start()
    try:
        assert entered.wait(5)
        start = time.monotonic()
        server.stop()
        assert time.monotonic() - start < 5
    finally:
        release.set()
        caller.join(10)


def test_the_gpu_map_is_built_off_the_loop_so_filter_is_served_meanwhile() -> None:
    """At scale the map takes seconds to build; the verbs must not wait for it."""
    w = World([node_obj("n1", 2)], web=True)
    building, release, builds = threading.Event(), threading.Event(), []

    def slow_build() -> MapBody:
        builds.append(1)
        building.set()
        release.wait(30)
        return MapBody(gzip.compress(b'{"nodes": []}'))

    w.app._map._build = slow_build
    server = http_server.Server(w.app, "127.0.0.1", 0, shutdown_timeout_s=0.5)
    server.start()
    answers: list[bytes] = []

    def load_map() -> None:  # as a browser: gzip accepted
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        conn.request("GET", "/gpus.json", headers={"Accept-Encoding": "gzip, deflate"})
        resp = conn.getresponse()
        assert resp.getheader("Content-Encoding") == "gzip"
        answers.append(gzip.decompress(resp.read()))
        conn.close()

    readers = [threading.Thread(target=load_map) for _ in range(2)]
    try:
        readers[0].start()
        assert building.wait(5)
        readers[1].start()  # a second page load while the first map is being built
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        pod = w.create(pod_obj("p"))
        conn.request("POST", "/filter", body=json.dumps({"Pod": pod, "NodeNames": ["n1"]}))
        assert json.loads(conn.getresponse().read())["NodeNames"] == ["n1"]
        conn.close()
        release.set()
        for r in readers:
            r.join(10)
        assert answers == [b'{"nodes": []}'] * 2
        assert len(builds) == 1  # the second load waited for the first build and shared it
    finally:
        release.set()
        server.stop()
        w.close()


def test_the_map_cache_builds_once_per_max_age() -> None:
    now, builds = [0.0], []

    def build(seconds: float = 0.0) -> MapBody:
        now[0] += seconds
        builds.append(1)
        return MapBody(gzip.compress(str(len(builds)).encode()))

    def got(cache: MapCache) -> bytes:
        return gzip.decompress(cache.get().gzip)

    cache = MapCache(build, 1.0, lambda: now[0])
    assert got(cache) == b"1" and got(cache) == b"1"
    now[0] = 0.99
    assert got(cache) == b"1"
    now[0] = 1.0
    assert got(cache) == b"2"
    cache = MapCache(lambda: build(0.5), 1.0, lambda: now[0])  # kept 5 x 0.5 s
    assert got(cache) == b"3"
    now[0] += 2.4
    assert got(cache) == b"3"
    now[0] += 0.1
    assert got(cache) == b"4"


def test_the_map_goes_gzip_encoded_to_a_client_that_accepts_it() -> None:
    w = World([node_obj("n1", 2)], web=True)
    try:
        plain = w.app.handle("GET", "/gpus.json", b"")
        text = b"".join(plain.pieces)
        assert (plain.status, plain.content_type, plain.body) == (200, "application/json", b"")
        assert plain.encoding == "" and json.loads(text)["nodes"][0]["name"] == "n1"
        packed = w.app.handle("GET", "/gpus.json", b"", "gzip, deflate, br")
        assert (packed.status, packed.content_type) == (200, "application/json")
        assert packed.encoding == "gzip" and gzip.decompress(packed.body) == text
        assert len(packed.body) < len(text)
        assert w.app.handle("GET", "/gpus.json", b"", "gzip;q=0, br").encoding == ""
    finally:
        w.close()


@pytest.mark.parametrize(
    ("header", "ok"),
    [("gzip", True), ("deflate, gzip;q=0.5", True), ("gzip;q=1", True), ("GZIP", True),
     ("x-gzip", True),
     ("gzip;q=0", False), ("gzip; q=0.0", False), ("br", False), ("", False),
     ("gzip;q=nope", False)],
)  # fmt: skip
def test_accept_encoding_is_read_with_its_weights(header: str, ok: bool) -> None:
    assert accepts_gzip(header) is ok


class _RecordingBinder:
    """A Binder that writes to the FakeKube from the loop, or raises ``error``."""

    def __init__(self, world: World, error: BaseException | None = None) -> None:
        self.world, self.error = world, error
        self.threads: list[str] = []
        self.closed = False

    async def bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str]
    ) -> None:
        self.threads.append(threading.current_thread().name)
        if self.error is not None:
            raise self.error
        self.world.kube.bind(namespace, name, uid, node, annotations)

    async def close(self) -> None:
        self.closed = True


def test_a_given_binder_writes_from_the_loop_and_is_closed_on_stop(world: World) -> None:
    binder = _RecordingBinder(world)
    server = serve(world.app, "127.0.0.1", 0, binder=binder)
    try:
        assert _bind_over_socket(world, server.port, "p") == (200, {"Error": ""})
        stored = world.kube.get(PODS, "p", "default")
        assert stored["spec"]["nodeName"] == "n1"
        assert binder.threads == [f"tessera-http-{server.port}"]  # no hop to a thread
        assert world.app.state.held("default/p") is not None
    finally:
        server.stop()
    assert binder.closed


@pytest.mark.parametrize(
    ("error", "status", "reason"),
    [
        (Conflict(409, "Conflict", "pod p is already assigned"), 200, "conflict"),
        (ApiError(403, "Forbidden", "pods/binding is forbidden"), 200, "api"),
        (RuntimeError("a bug in the transport"), 500, "internal"),
    ],
)
def test_a_write_that_failed_for_sure_releases_the_cards_and_says_why(
    world: World,
    error: BaseException,
    status: int,
    reason: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="tessera.scheduler.app")
    server = serve(world.app, "127.0.0.1", 0, binder=_RecordingBinder(world, error))
    try:
        code, out = _bind_over_socket(world, server.port, "p")
    finally:
        server.stop()
    assert code == status
    message = out["Error"]
    assert ("internal error: RuntimeError" if status == 500 else str(error)) in message
    assert world.app.state.held("default/p") is None
    assert "default/p" not in world.app.state.reservations
    assert not world.kube.get(PODS, "p", "default")["spec"].get("nodeName")
    metrics = world.app.handle("GET", "/metrics", b"").body.decode()
    assert f'tessera_scheduler_failures_total{{reason="{reason}",verb="bind"}} 1.0' in metrics
    assert 'tessera_scheduler_verb_seconds_count{verb="bind"} 1.0' in metrics
    if status == 500:  # a bug: its traceback goes to the log
        [record] = [r for r in caplog.records if r.name == "tessera.scheduler.app"]
        assert record.getMessage() == "bind default/p: the write failed"
        assert record.levelno == logging.ERROR and record.exc_info is not None
        assert record.exc_info[1] is error
    else:
        assert logged(caplog, "tessera.scheduler.app") == [
            f"bind default/p -> n1 failed: {message}"
        ]
    # The cards are free for the next pod.
    assert world.schedule(world.create(pod_obj("q", gpu=2))) == "n1"


def _lose_the_lease_once_a_bind_arrives(world: World) -> None:
    """Leading when the bind arrives, not any more when its write would go out."""
    arrived = world.app.dispatch

    def dispatch_then_lose_the_lease(method: str, path: str, body: bytes, *rest: str) -> Any:
        out = arrived(method, path, body, *rest)
        if path == "/bind":
            world.app.leading = lambda: False  # type: ignore[method-assign]
        return out

    world.app.dispatch = dispatch_then_lose_the_lease  # type: ignore[method-assign]


def test_a_replica_that_loses_its_lease_before_the_write_writes_nothing(world: World) -> None:
    binder = _RecordingBinder(world)
    server = serve(world.app, "127.0.0.1", 0, binder=binder)
    _lose_the_lease_once_a_bind_arrives(world)
    try:
        code, out = _bind_over_socket(world, server.port, "p")
    finally:
        server.stop()
    assert (code, out["Error"]) == (
        200,
        "pod default/p: this replica lost its leadership before the write (the leader is "
        "''); nothing was written",
    )
    assert binder.threads == []  # no Binding was sent
    assert not world.kube.get(PODS, "p", "default")["spec"].get("nodeName")
    assert world.app.state.held("default/p") is None
    assert "default/p" not in world.app.state.reservations
    metrics = world.app.handle("GET", "/metrics", b"").body.decode()
    assert 'tessera_scheduler_failures_total{reason="lost-leadership",verb="bind"} 1.0' in metrics
    assert 'tessera_scheduler_verb_seconds_count{verb="bind"} 1.0' in metrics


def test_a_bind_answered_in_the_handlers_thread_is_fenced_too(world: World) -> None:
    """``handle`` (no binder: the write in the calling thread) checks leadership again
    before the write, as the server's loop does."""
    _lose_the_lease_once_a_bind_arrives(world)
    pod = world.create(pod_obj("p", gpu=2))
    assert world.filter(pod)["NodeNames"] == ["n1"]
    assert "lost its leadership before the write" in world.bind(pod, "n1")["Error"]
    assert not world.kube.get(PODS, "p", "default")["spec"].get("nodeName")
    assert world.app.state.held("default/p") is None


def test_scheduling_verbs_wait_for_both_lists() -> None:
    # Nodes listed, pods not yet: the cards of pods not listed yet would look free, and a
    # filter would hand them out again.
    from tessera.kube import FakeKube
    from tessera.scheduler.app import SchedulerApp
    from tessera.scheduler.config import SchedulerConfig

    kube = FakeKube()
    kube.create(NODES, node_obj("n1", 1))
    app = SchedulerApp(SchedulerConfig(leader_elect=False, watch_timeout_s=1), kube)
    pod = kube.create(PODS, pod_obj("p"), "default")
    body = json.dumps({"Pod": pod, "NodeNames": ["n1"]}).encode()
    not_synced = {"Error": "not synced yet: the node and pod lists are not both in"}
    for verb, sent in (("filter", body), ("prioritize", body),
                       ("bind", json.dumps(binding_args(pod, "n1")).encode())):  # fmt: skip
        r = app.handle("POST", f"/{verb}", sent)  # nothing listed yet
        assert (r.status, json.loads(r.body)) == (503, not_synced), verb
    app.start()
    try:
        assert app.wait_synced(5)
        assert app.handle("POST", "/filter", body).status == 200
    finally:
        app.stop()
    for verb in ("filter", "prioritize", "bind"):
        failures = _value(app, "tessera_scheduler_failures_total", reason="not-synced", verb=verb)
        assert failures == 1, verb


def test_a_cluster_without_quotas_or_claims_apis_is_served() -> None:
    # No GpuQuota CRD (installed without the chart's CRDs) and no resource.k8s.io/v1
    # (a release before it, or the group turned off): the extender places pods anyway.
    from tessera.kube import FakeKube

    kube = FakeKube()
    kube.unserved = {GPUQUOTAS.plural, RESOURCE_SLICES.plural, RESOURCE_CLAIMS.plural}
    w = World([node_obj("n1", 1)], kube)  # synced, or it fails here
    try:
        assert w.app.quota_reflector.absent and w.app.claim_reflector.absent
        assert w.filter(w.create(pod_obj("p")))["NodeNames"] == ["n1"]
    finally:
        w.close()


def test_without_its_budgets_listed_the_extender_places_pods_but_evicts_none() -> None:
    # PodDisruptionBudgets that do not list (RBAC without them, say): preemption could
    # not keep within them, so it waits; the verbs do not.
    from tessera.kube import FakeKube

    kube = FakeKube()
    kube.unserved = {POD_DISRUPTION_BUDGETS.plural}
    w = World([node_obj("n1", 1)], kube)
    try:
        low = pod_obj("low")
        low["spec"]["priority"] = 10
        assert w.schedule(w.create(low)) == "n1"
        eventually(lambda: not w.app.state.reservations)
        urgent = pod_obj("urgent")
        urgent["spec"]["priority"] = 1000
        assert w.filter(w.create(urgent))["NodeNames"] == []
        w.app.preemptor.step()
        assert [c for c in w.kube.calls if c[0] == "evict"] == []
    finally:
        w.close()


def test_wait_synced_says_no_when_a_list_never_comes() -> None:
    from tessera.kube import FakeKube
    from tessera.scheduler.app import SchedulerApp
    from tessera.scheduler.config import SchedulerConfig

    kube = FakeKube()
    kube.unserved = {NODES.plural}  # the one list every extender needs
    app = SchedulerApp(SchedulerConfig(leader_elect=False, watch_timeout_s=1), kube)
    app.start()
    try:
        assert not app.wait_synced(0.3)
        assert not app.synced()  # the others listed; the nodes did not
        assert app.pod_reflector.synced.is_set()
        assert app.handle("GET", "/readyz?verbose", b"") == Response(503, b"not synced", TEXT)
        assert app.handle("GET", "/healthz?verbose", b"") == Response(200, b"ok", TEXT)
    finally:
        app.stop()


def test_a_leader_that_stops_hands_its_lease_over() -> None:
    w = World([node_obj("n1", 1)], leader_elect=True, lease_namespace="default")
    assert w.app.leader is not None and w.app.leader.try_acquire_or_renew()
    w.close()
    spec = w.kube.get(LEASES, "tessera-scheduler", "default")["spec"]
    assert spec["holderIdentity"] == "" and spec["leaseDurationSeconds"] == 1


def test_the_gpu_map_page_is_off_by_default_and_shows_the_extenders_view() -> None:
    off = World([node_obj("n1", 2)])
    try:
        assert off.app.handle("GET", "/gpus", b"").status == 404
        assert off.app.handle("GET", "/gpus.json", b"").status == 404
    finally:
        off.close()
    broken = node_obj("bad", 1)
    broken["metadata"]["annotations"]["tessera.io/inventory"] = "{nope"
    w = World([node_obj("n1", 2), broken], web=True)
    try:
        placed = w.create(pod_obj("p", gpu=1, memory=3000, cores=20))
        assert w.schedule(placed) == "n1"
        w.create(pod_obj("waits", gpu=1, memory=1_000_000))  # larger than any card

        def mapped() -> dict[str, Any] | None:
            r = w.app.handle("GET", "/gpus.json", b"")
            assert r.status == 200 and r.content_type == "application/json"
            doc = json.loads(b"".join(r.pieces))
            holders = [h for n in doc["nodes"] for c in n["cards"] for h in c["holders"]]
            return doc if holders and doc["pending"] else None

        doc = eventually(mapped)
        [n1] = [n for n in doc["nodes"] if n["name"] == "n1"]
        [held] = [c for c in n1["cards"] if c["holders"]]
        assert held["allocatedMiB"] == 3000 and held["holders"][0]["pod"] == "p"
        [bad] = [n for n in doc["nodes"] if n["name"] == "bad"]
        assert bad["cards"] == [] and "inventory refused" in bad["problem"]
        assert doc["pending"] == [{"namespace": "default", "pod": "waits",
                                   "asks": "main: 1 card 1000000 MiB 0%"}]  # fmt: skip
        assert n1["held"] == "" and bad["held"] == ""
        with w.app.state.lock:  # a preemption holds n1 for the waiting pod (holds.py)
            uid = w.app.state.pods["default/waits"].uid
            w.app.state.holds.put(Hold("default/waits", uid, 1000, "n1", frozenset(), 0.0))

        def held() -> str:  # once the last build is stale (a second)
            doc = json.loads(b"".join(w.app.handle("GET", "/gpus.json", b"").pieces))
            return str(next(n["held"] for n in doc["nodes"] if n["name"] == "n1"))

        # No placement in this hold (as one taken over from an old record): all of it.
        assert eventually(held) == "held for default/waits (priority 1000): the whole node"
        page = w.app.handle("GET", "/gpus", b"")
        assert page.status == 200 and page.content_type.startswith("text/html")
        assert b"gpus.json" in page.body and b'id="q"' in page.body
    finally:
        w.close()


def test_the_map_is_the_same_json_packed_an_item_at_a_time() -> None:
    big = [{"name": f"n{i}", "cards": [{"uuid": "x" * 900}] * 8} for i in range(40)]  # 290 KB
    parts = [("nodes", big), ("pending", []), ("podProblems", [{"pod": "a", "problem": "é"}])]
    doc = {key: items for key, items in parts}
    body = MapBody(_gzip_json((key, iter(items)) for key, items in parts))
    assert gzip.decompress(body.gzip) == json.dumps(doc, separators=(",", ":")).encode()
    pieces = body.json_pieces(64 * 1024)
    assert len(pieces) > 4 and all(0 < len(p) <= 64 * 1024 for p in pieces)
    assert json.loads(b"".join(pieces)) == doc
    assert MapBody(b"").json_pieces() == ()


def test_the_map_as_json_is_its_parts_in_order() -> None:
    gmap = assemble([NodeInventory("n1", make_cards("n1", 1, "A100"), 0, 0)], {},
                    pending=[Pending("default", "p", "main: 1 card")])  # fmt: skip
    doc = map_json(gmap)
    assert list(doc) == ["nodes", "pending", "podProblems", "claimProblems"]
    assert doc == {key: list(items) for key, items in map_parts(gmap)}
    assert doc["pending"] == [{"namespace": "default", "pod": "p", "asks": "main: 1 card"}]


def test_the_server_sends_the_map_unpacked_in_pieces_to_a_client_without_gzip() -> None:
    w = World([node_obj("n1", 2)], web=True)
    text = json.dumps({"nodes": [{"name": f"n{i}", "pad": "x" * 1000} for i in range(3000)]})
    w.app._map._build = lambda: MapBody(gzip.compress(text.encode()))  # 3 MB: three pieces and more
    server = http_server.Server(w.app, "127.0.0.1", 0, shutdown_timeout_s=0.5)
    server.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        conn.request("GET", "/gpus.json")
        resp = conn.getresponse()
        got = resp.read()
        assert resp.status == 200 and resp.getheader("Content-Encoding") is None
        assert resp.getheader("Content-Type") == "application/json"
        assert resp.getheader("Content-Length") == str(len(text)) and got == text.encode()
        conn.request("GET", "/healthz")  # the connection is still good after it
        assert conn.getresponse().read() == b"ok"
        conn.close()
    finally:
        server.stop()
        w.close()


def test_webhook_answers_are_counted_by_hook_and_result(world: World) -> None:
    def review(pod: dict[str, Any]) -> bytes:
        return json.dumps({"request": {"uid": "1", "operation": "CREATE", "object": pod}}).encode()

    routed = pod_obj("routed")  # a GPU pod for another scheduler: the webhook routes it
    routed["spec"]["schedulerName"] = "default-scheduler"
    cpu, bad = pod_obj("cpu", gpu=None), pod_obj("bad", gpu=0)
    for pod in (routed, cpu, cpu, bad):
        assert world.app.handle("POST", "/mutate", review(pod)).status == 200
    for pod in (cpu, bad, bad):
        assert world.app.handle("POST", "/validate", review(pod)).status == 200
    text = world.app.handle("GET", "/metrics", b"").body.decode()
    counted = {
        line.split(" ")[0]: line.split(" ")[1]
        for line in text.splitlines()
        if line.startswith("tessera_scheduler_admissions_total{")
    }
    name = "tessera_scheduler_admissions_total"
    assert counted == {
        f'{name}{{hook="mutate",result="mutated"}}': "1.0",
        f'{name}{{hook="mutate",result="allowed"}}': "2.0",
        f'{name}{{hook="mutate",result="refused"}}': "1.0",
        f'{name}{{hook="validate",result="allowed"}}': "1.0",
        f'{name}{{hook="validate",result="refused"}}': "2.0",
    }


def _value(app: Any, name: str, **labels: str) -> float | None:
    """One series of the app's metrics (prometheus_client reads its own registry)."""
    return app.metrics.registry.get_sample_value(name, labels)


def test_a_path_or_method_it_does_not_serve_is_answered_in_plain_text(world: World) -> None:
    missing, wrong = Response(404, b"not found", TEXT), Response(405, b"method not allowed", TEXT)
    assert world.app.handle("GET", "/nope", b"") == missing
    assert world.app.handle("GET", "/", b"") == missing
    assert world.app.handle("POST", "/nope", b"{}") == missing
    assert world.app.handle("POST", "/filter?a=1?b=2", b"{").status == 400  # the verb's own
    assert world.app.handle("PUT", "/filter", b"{}") == wrong
    assert world.app.handle("DELETE", "/healthz", b"") == wrong
    # Prometheus reads the text format's version from the content type.
    metrics = world.app.handle("GET", "/metrics", b"")
    assert metrics.content_type == "text/plain; version=0.0.4"


def test_a_verb_that_raises_answers_500_with_the_error_type_and_counts_it(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(body: bytes) -> Response:
        raise KeyError("a bug")

    world.app._filter = broken  # type: ignore[method-assign]
    r = world.app.handle("POST", "/filter", b"{}")
    assert (r.status, json.loads(r.body)) == (500, {"Error": "internal error: KeyError"})
    assert (
        _value(world.app, "tessera_scheduler_failures_total", reason="internal", verb="filter") == 1
    )
    [record] = [r for r in caplog.records if r.name == "tessera.scheduler.app"]
    assert record.getMessage() == "filter failed" and record.exc_info is not None


def test_a_malformed_body_is_refused_with_what_is_wrong(world: World) -> None:
    r = world.app.handle("POST", "/filter", b"{")
    assert r.status == 400 and "JSON" in json.loads(r.body)["Error"]


def test_verb_times_are_durations(world: World) -> None:
    pod = world.create(pod_obj("p", gpu=2))
    assert world.schedule(pod) == "n1"
    for verb in ("filter", "bind"):
        took = _value(world.app, "tessera_scheduler_verb_seconds_sum", verb=verb)
        assert took is not None, verb
        assert 0 <= took < 60, (verb, took)  # seconds since the call, not since boot


def test_a_filter_for_a_pod_already_placed_is_counted_and_tells_nothing(world: World) -> None:
    """kube-scheduler's retry racing its own bind: refused, counted apart, no event."""
    pod = world.create(pod_obj("p", gpu=2))
    assert world.schedule(pod) == "n1"
    out = world.filter(pod)  # its bind in flight, or (once watched) bound
    assert out["NodeNames"] == [] and "to n1" in out["FailedNodes"]["n1"]
    metrics = world.app.handle("GET", "/metrics", b"").body.decode()
    failures = _value(
        world.app, "tessera_scheduler_failures_total", reason="already-placed", verb="filter"
    )
    assert failures == 1
    assert 'reason="unschedulable"' not in metrics
    world.app.events.flush()
    assert world.kube.list(EVENTS, "default").items == []


def test_a_replica_that_lost_its_lease_names_the_leader_it_knows(
    caplog: pytest.LogCaptureFixture,
) -> None:
    w = World([node_obj("n1", 2)], leader_elect=True, lease_namespace="default")
    try:
        assert w.app.leader is not None and w.app.leader.try_acquire_or_renew()
        holder = w.app.leader.holder
        assert holder
        pod = w.create(pod_obj("p", gpu=2))
        assert w.filter(pod)["NodeNames"] == ["n1"]
        _lose_the_lease_once_a_bind_arrives(w)
        caplog.set_level(logging.WARNING, logger="tessera.scheduler.app")
        said = (f"pod default/p: this replica lost its leadership before the write (the "
                f"leader is {holder!r}); nothing was written")  # fmt: skip
        assert w.bind(pod, "n1")["Error"] == said
        assert logged(caplog, "tessera.scheduler.app") == [f"bind {said}"]
        took = _value(w.app, "tessera_scheduler_verb_seconds_sum", verb="bind")
        assert took is not None and 0 <= took < 60
    finally:
        w.close()


def test_webhook_answers_carry_the_review_they_answer(world: World) -> None:
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
              "request": {"uid": "r-1", "operation": "CREATE", "object": pod_obj("q")}}  # fmt: skip
    for hook in ("mutate", "validate"):
        r = world.app.handle("POST", f"/{hook}", json.dumps(review).encode())
        assert r.status == 200 and json.loads(r.body)["response"]["uid"] == "r-1", hook


def test_its_events_name_the_scheduler_and_the_replica_and_it_tracks_only_its_pods() -> None:
    w = World([node_obj("n1", 2)], identity="replica-a", scheduler_name="gpu-sched")
    try:
        ours = pod_obj("ours", gpu=4)
        ours["spec"]["schedulerName"] = "gpu-sched"
        theirs = pod_obj("theirs")
        theirs["spec"]["schedulerName"] = "default-scheduler"
        w.create(theirs)
        assert w.filter(w.create(ours))["NodeNames"] == []  # an event says why
        eventually(lambda: "default/ours" in w.app.state.pods)
        assert "default/theirs" not in w.app.state.pods  # another scheduler's pod
        w.app.events.flush()
        [event] = w.kube.list(EVENTS, "default").items
        assert event["source"] == {"component": "tessera-scheduler"}
        assert (event["reportingComponent"], event["reportingInstance"]) == (
            "tessera-scheduler",
            "replica-a",
        )
        # The mutating webhook sends GPU pods to the profile it is configured with.
        routed = pod_obj("routed")
        routed["spec"]["schedulerName"] = "default-scheduler"
        review = {"request": {"uid": "1", "operation": "CREATE", "object": routed}}
        out = json.loads(w.app.handle("POST", "/mutate", json.dumps(review).encode()).body)
        patch = json.loads(base64.b64decode(out["response"]["patch"]))
        assert patch == [{"op": "add", "path": "/spec/schedulerName", "value": "gpu-sched"}]
    finally:
        w.close()
