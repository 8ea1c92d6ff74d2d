"""The DRA plugin's two services, called as gRPC calls them (request in, answer out),
with the real preparer over FakeKube. The integration suite serves them on sockets;
this one checks every claim of a batch gets its own answer whatever the others do."""

from __future__ import annotations

import contextlib
import logging
import queue
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from tessera.claims.devices import DRIVER
from tessera.kube.fake import FakeKube
from tessera.kube.kinds import RESOURCE_CLAIMS
from tessera.model.clusterspec import make_cards
from tessera.node.dra.prepare import ClaimPreparer, PreparedDevice
from tessera.node.dra.server import DraPluginServer, _DraPlugin, _Registration
from tessera.node.dra.v1 import dra_pb2 as pb
from tessera.node.dra.v1 import registration_pb2 as reg
from tessera.node.dra.v1alpha1 import health_pb2 as hpb
from tessera.node.dra.v1alpha1 import health_pb2_grpc as hpbg
from tessera.node.formats.layout import Layout
from tessera.node.kube_source import KubeClaims
from tests._logs import logged_levels
from tests.unit._claims import claim as a_claim

NODE = "node-a"


SERVER_LOGGER = "tessera.node.dra.server"


class Flaky(ClaimPreparer):
    """Fails, as a bug or a full disk would, for the claim names in ``broken``."""

    broken: frozenset[str] = frozenset()

    def prepare(self, namespace: str, name: str, uid: str) -> list[PreparedDevice]:
        if name in self.broken:
            raise KeyError("results")
        return super().prepare(namespace, name, uid)

    def unprepare(self, uid: str) -> None:
        if uid in self.broken:
            raise OSError(28, "No space left on device")
        super().unprepare(uid)


def server(tmp_path: Path, kube: FakeKube) -> tuple[DraPluginServer, Flaky]:
    cards = make_cards(NODE, 2, "A100")
    preparer = Flaky(NODE, cards, Layout(tmp_path / "state"), "v1", KubeClaims(kube),
                     tmp_path / "cdi")  # fmt: skip
    return DraPluginServer(preparer, tmp_path / "plugins", tmp_path / "registry"), preparer


def claim(kube: FakeKube, name: str) -> dict[str, Any]:
    obj = a_claim(
        name, memory="1Gi", device="gpu-1", pool=NODE, ns="team", share_id=f"share-{name}"
    )
    return kube.seed(RESOURCE_CLAIMS, obj, "team")


def ref(obj: dict[str, Any]) -> pb.Claim:
    m = obj["metadata"]
    return pb.Claim(namespace=m["namespace"], name=m["name"], uid=m["uid"])


def test_each_claim_of_a_prepare_batch_gets_its_own_answer(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    kube = FakeKube()
    srv, _ = server(tmp_path, kube)
    ok = claim(kube, "ok")
    missing = pb.Claim(namespace="team", name="missing", uid="u-missing")
    out = _DraPlugin(srv).NodePrepareResources(
        pb.NodePrepareResourcesRequest(claims=[missing, ref(ok)]), None
    )
    assert set(out.claims) == {"u-missing", ok["metadata"]["uid"]}
    assert out.claims["u-missing"].error.startswith("reading ResourceClaim team/missing: ")
    assert not out.claims["u-missing"].devices
    [device] = out.claims[ok["metadata"]["uid"]].devices
    assert (device.pool_name, device.device_name, device.share_id) == (NODE, "gpu-1", "share-ok")
    assert list(device.request_names) == ["gpu"]
    assert out.claims[ok["metadata"]["uid"]].error == ""
    [(level, line)] = logged_levels(caplog, SERVER_LOGGER)
    assert level == "WARNING" and line == f"prepare team/missing: {out.claims['u-missing'].error}"


def test_an_unexpected_failure_is_that_claims_answer_not_the_batchs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    kube = FakeKube()
    srv, flaky = server(tmp_path, kube)
    ok = claim(kube, "ok")
    bad = claim(kube, "bad")
    flaky.broken = frozenset({"bad"})
    out = _DraPlugin(srv).NodePrepareResources(
        pb.NodePrepareResourcesRequest(claims=[ref(bad), ref(ok)]), None
    )
    assert out.claims[bad["metadata"]["uid"]].error == "tessera node agent: KeyError: 'results'"
    assert out.claims[ok["metadata"]["uid"]].error == ""
    assert logged_levels(caplog, SERVER_LOGGER) == [("ERROR", "prepare team/bad")]
    [record] = [r for r in caplog.records if r.name == SERVER_LOGGER]
    assert record.exc_info is not None  # with its traceback


def test_each_claim_of_an_unprepare_batch_gets_its_own_answer(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    kube = FakeKube()
    srv, flaky = server(tmp_path, kube)
    a, b = claim(kube, "a"), claim(kube, "b")
    _DraPlugin(srv).NodePrepareResources(
        pb.NodePrepareResourcesRequest(claims=[ref(a), ref(b)]), None
    )
    flaky.broken = frozenset({a["metadata"]["uid"]})
    out = _DraPlugin(srv).NodeUnprepareResources(
        pb.NodeUnprepareResourcesRequest(claims=[ref(a), ref(b)]), None
    )
    assert set(out.claims) == {a["metadata"]["uid"], b["metadata"]["uid"]}
    assert out.claims[a["metadata"]["uid"]].error == (
        "tessera node agent: OSError: [Errno 28] No space left on device"
    )
    assert out.claims[b["metadata"]["uid"]].error == ""
    assert srv.preparer.prepared() == [a["metadata"]["uid"]]
    assert logged_levels(caplog, SERVER_LOGGER)[-1] == ("ERROR", "unprepare team/a")


def test_registration_follows_what_kubelet_last_said_and_refusals_are_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=SERVER_LOGGER)
    srv, _ = server(tmp_path, FakeKube())
    assert (srv.registered.is_set(), srv.refusals) == (False, 0)
    registration = _Registration(srv)
    info = registration.GetInfo(reg.InfoRequest(), None)
    assert (info.type, info.name, list(info.supported_versions)) == (
        "DRAPlugin", DRIVER, ["v1.DRAPlugin"]
    )  # fmt: skip

    def told(ok: bool, error: str = "") -> tuple[bool, int]:
        registration.NotifyRegistrationStatus(
            reg.RegistrationStatus(plugin_registered=ok, error=error), None
        )
        return srv.registered.is_set(), srv.refusals

    assert told(False, "version not supported") == (False, 1)
    assert told(True) == (True, 1)
    assert told(False, "driver name taken") == (False, 2)  # a later refusal takes it back
    assert logged_levels(caplog, SERVER_LOGGER) == [
        ("ERROR", f"kubelet refused DRA driver {DRIVER}: version not supported"),
        ("INFO", f"kubelet registered DRA driver {DRIVER}"),
        ("ERROR", f"kubelet refused DRA driver {DRIVER}: driver name taken"),
    ]


class HealthWatcher:
    """kubelet's NodeWatchResources stream on the served socket, each response queued as
    (pool, device, health name, message, timeout, last update) tuples."""

    def __init__(self, srv: DraPluginServer) -> None:
        self.channel = grpc.insecure_channel(f"unix://{srv.socket_path}")
        stub = hpbg.DRAResourceHealthStub(self.channel)
        self.stream = stub.NodeWatchResources(hpb.NodeWatchResourcesRequest())
        self.got: queue.Queue[list[tuple[str, str, str, str, int, int]]] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        with contextlib.suppress(grpc.RpcError):  # cancelled at the end
            for r in self.stream:
                self.got.put([
                    (d.device.pool_name, d.device.device_name, hpb.HealthStatus.Name(d.health),
                     d.message, d.health_check_timeout_seconds, d.last_updated_time)
                    for d in r.devices
                ])  # fmt: skip

    def next(self, within: float) -> list[tuple[str, str, str, str, int, int]] | None:
        try:
            return self.got.get(timeout=within)
        except queue.Empty:
            return None

    def close(self) -> None:
        self.stream.cancel()
        self.reader.join(5)
        self.channel.close()


@pytest.fixture
def served(kube_dir: Path) -> Iterator[DraPluginServer]:
    srv, _ = server(kube_dir, FakeKube())
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
def kube_dir() -> Iterator[Path]:
    # unix socket paths are limited to 107 bytes: a short folder, not pytest's tmp_path.
    root = Path(tempfile.mkdtemp(prefix="ts-dra-", dir="/tmp"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_the_health_stream_sends_each_change_at_once_and_repeats_while_checks_run(
    served: DraPluginServer,
) -> None:
    srv = served
    srv.health_repeat_s = 0.5
    watcher = HealthWatcher(srv)
    try:
        assert watcher.next(1.2) is None  # no check yet: nothing to say
        before = int(time.time())
        srv.report_health({"gpu-1": "", "gpu-0": ""})
        first = watcher.next(2)
        assert first is not None
        assert [d[:5] for d in first] == [
            (NODE, "gpu-0", "HEALTHY", "", 30), (NODE, "gpu-1", "HEALTHY", "", 30)
        ]  # fmt: skip
        assert all(before <= d[5] <= time.time() for d in first)
        srv.report_health({"gpu-1": "", "gpu-0": ""})  # the same, before the repeat is due
        assert watcher.next(0.3) is None
        srv.report_health({"gpu-1": "XID 79", "gpu-0": ""})  # a change goes at once
        assert [d[:4] for d in watcher.next(0.3) or []] == [
            (NODE, "gpu-0", "HEALTHY", ""), (NODE, "gpu-1", "UNHEALTHY", "XID 79")
        ]  # fmt: skip
        time.sleep(0.6)
        assert watcher.next(0.6) is None  # due, but no check since: kubelet will say Unknown
        srv.report_health({"gpu-1": "XID 79", "gpu-0": ""})  # a check, unchanged: repeated
        again = watcher.next(0.5)
        assert again is not None and [d[2] for d in again] == ["HEALTHY", "UNHEALTHY"]
    finally:
        watcher.close()


def test_a_second_watcher_gets_the_health_as_it_stands(served: DraPluginServer) -> None:
    served.report_health({"gpu-1": "probe failed"})
    watcher = HealthWatcher(served)
    try:
        got = watcher.next(2)
        assert got is not None and [d[1:4] for d in got] == [
            ("gpu-1", "UNHEALTHY", "probe failed")
        ]  # fmt: skip
    finally:
        watcher.close()
