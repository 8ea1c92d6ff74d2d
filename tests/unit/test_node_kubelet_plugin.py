"""The device plugin server over real gRPC on a unix socket: the device list it streams,
how each call's failure reaches kubelet (status and message), the pod (a Warning Event)
and the exporter (``on_call``), and its registration with kubelet.

The allocator behind it is a script here (answers or raises what a test sets): what it
decides is tested with the real one in tests/integration/test_device_plugin.py."""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from tessera.model.types import Card
from tessera.node.allocation.allocator import AllocationError
from tessera.node.deviceplugin.v1beta1 import api_pb2 as pb
from tessera.node.deviceplugin.v1beta1 import api_pb2_grpc as pbg
from tessera.node.fakes import MemoryEvents
from tessera.node.isolation import ContainerEdits
from tessera.node.kubelet.plugin import KUBELET_SOCKET, DevicePluginServer, device_list
from tessera.node.pods import PodInfo
from tests._logs import logged
from tests.unit._wait import eventually

CARDS = (Card("GPU-a", 0, "T4", 16000, numa_node=1), Card("GPU-b", 1, "T4", 16000))
PLUGIN_LOGGER = "tessera.node.kubelet.plugin"
POD = PodInfo("uid-1", "team", "train", "n", "2026-01-01T00:00:00Z", (), None)


class ScriptedAllocator:
    """Answers each call with ``answer`` (a value, or an exception to raise), and keeps
    the arguments it was called with."""

    def __init__(self) -> None:
        self.answer: object = None
        self.calls: list[tuple[str, tuple[object, ...]]] = []

    def _reply(self, name: str, *args: object) -> Any:
        self.calls.append((name, args))
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer

    def preferred(self, available: list[str], must_include: list[str], size: int) -> Any:
        return self._reply("preferred", available, must_include, size)

    def allocate(self, ids: list[str]) -> Any:
        return self._reply("allocate", ids)

    def pre_start(self, ids: list[str]) -> Any:
        return self._reply("pre_start", ids)


class Server:
    def __init__(self, root: Path, poll_s: float = 0.1, kubelet_check_s: float = 10.0) -> None:
        self.allocator = ScriptedAllocator()
        self.events = MemoryEvents()
        self.calls: list[tuple[str, str, float]] = []
        self.plugin = DevicePluginServer(
            self.allocator,  # type: ignore[arg-type]
            CARDS,
            "tessera.io/gpu",
            root,
            self.events,
            slots_per_card=2,
            endpoint="tessera.sock",
            poll_s=poll_s,
            kubelet_check_s=kubelet_check_s,
        )
        self.plugin.on_call = lambda call, result, s: self.calls.append((call, result, s))
        self.plugin.start()
        self.channel = grpc.insecure_channel(f"unix://{self.plugin.socket_path}")
        self.stub = pbg.DevicePluginStub(self.channel)

    def close(self) -> None:
        self.channel.close()
        self.plugin.stop()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    s = Server(tmp_path)
    yield s
    s.close()


def test_every_slot_is_listed_with_its_cards_health_and_numa_node() -> None:
    devices = device_list(CARDS, 2, {"GPU-b": False})  # GPU-a not in the map: healthy
    assert [(d.ID, d.health) for d in devices] == [
        ("GPU-a::0", "Healthy"), ("GPU-a::1", "Healthy"),
        ("GPU-b::0", "Unhealthy"), ("GPU-b::1", "Unhealthy"),
    ]  # fmt: skip
    assert [n.ID for n in devices[0].topology.nodes] == [1]
    assert not devices[2].HasField("topology")  # NUMA node unknown (-1): none given
    zero = device_list((Card("GPU-z", 0, "T4", 16000, numa_node=0),), 1, {})
    assert [n.ID for n in zero[0].topology.nodes] == [0]


def allocate(ids: list[str]) -> pb.AllocateRequest:
    return pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)])


@pytest.mark.parametrize(
    ("code", "status", "reason"),
    [
        ("INVALID_ARGUMENT", grpc.StatusCode.INVALID_ARGUMENT, "TesseraBadDeviceIDs"),
        ("FAILED_PRECONDITION", grpc.StatusCode.FAILED_PRECONDITION, "TesseraAllocateFailed"),
        ("NOT_FOUND", grpc.StatusCode.NOT_FOUND, "TesseraAllocateFailed"),
        ("ABORTED", grpc.StatusCode.UNKNOWN, "TesseraError"),  # a code it has no map for
    ],
)
def test_an_allocation_error_reaches_kubelet_the_pod_the_log_and_the_exporter(
    server: Server,
    code: str,
    status: grpc.StatusCode,
    reason: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    server.allocator.answer = AllocationError(code, "slots GPU-a::0 are not yours", POD)
    with pytest.raises(grpc.RpcError) as err:
        server.stub.Allocate(allocate(["GPU-a::0"]), timeout=5)
    assert (err.value.code(), err.value.details()) == (status, "slots GPU-a::0 are not yours")
    assert server.events.events == [("team/train", reason, "slots GPU-a::0 are not yours")]
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "slots GPU-a::0 are not yours")
    ]
    [(call, result, seconds)] = server.calls
    assert (call, result) == ("Allocate", status.name)
    assert 0 <= seconds < 5


def test_an_allocation_error_without_a_pod_goes_to_kubelet_alone(server: Server) -> None:
    server.allocator.answer = AllocationError("INVALID_ARGUMENT", "unknown device IDs ['x']")
    with pytest.raises(grpc.RpcError) as err:
        server.stub.Allocate(allocate(["x"]), timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert server.events.events == []


def test_an_unexpected_failure_is_internal_named_and_logged(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    server.allocator.answer = KeyError("GPU-a")
    with pytest.raises(grpc.RpcError) as err:
        server.stub.PreStartContainer(
            pb.PreStartContainerRequest(devices_ids=["GPU-a::0"]), timeout=5
        )
    assert err.value.code() == grpc.StatusCode.INTERNAL
    assert err.value.details() == "tessera node agent: KeyError: 'GPU-a'"
    assert [(c, r) for c, r, _ in server.calls] == [("PreStartContainer", "INTERNAL")]
    [record] = [r for r in caplog.records if r.name == PLUGIN_LOGGER]
    assert record.getMessage() == "device plugin call failed" and record.exc_info is not None
    assert server.events.events == []


def test_each_call_hands_kubelets_arguments_on_and_is_counted_by_name(server: Server) -> None:
    server.allocator.answer = ["GPU-a::1"]
    preferred = server.stub.GetPreferredAllocation(
        pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=["GPU-a::0", "GPU-a::1"],
                    must_include_deviceIDs=["GPU-a::1"],
                    allocation_size=1,
                )
            ]
        ),
        timeout=5,
    )
    assert list(preferred.container_responses[0].deviceIDs) == ["GPU-a::1"]
    server.allocator.answer = (None, ContainerEdits(envs={"TESSERA_ALLOC": "a1"}))
    answer = server.stub.Allocate(allocate(["GPU-a::1"]), timeout=5)
    assert dict(answer.container_responses[0].envs) == {"TESSERA_ALLOC": "a1"}
    server.stub.PreStartContainer(pb.PreStartContainerRequest(devices_ids=["GPU-a::1"]), timeout=5)
    assert server.allocator.calls == [
        ("preferred", (["GPU-a::0", "GPU-a::1"], ["GPU-a::1"], 1)),
        ("allocate", (["GPU-a::1"],)),
        ("pre_start", (["GPU-a::1"],)),
    ]
    assert [(c, r) for c, r, _ in server.calls] == [
        ("GetPreferredAllocation", "ok"), ("Allocate", "ok"), ("PreStartContainer", "ok"),
    ]  # fmt: skip
    assert all(0 <= s < 5 for _, _, s in server.calls)


class Watcher:
    """Holds a ListAndWatch stream as kubelet does, each list's health per slot queued."""

    def __init__(self, stub: pbg.DevicePluginStub) -> None:
        self.stream = stub.ListAndWatch(pb.Empty())
        self.lists: queue.Queue[list[str]] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        with contextlib.suppress(grpc.RpcError):  # cancelled at the end
            for response in self.stream:
                self.lists.put([d.health for d in response.devices])

    def next(self, within: float) -> list[str] | None:
        """The next list, or None when none comes ``within`` seconds."""
        try:
            return self.lists.get(timeout=within)
        except queue.Empty:
            return None

    def close(self) -> None:
        self.stream.cancel()
        self.reader.join(5)


def test_list_and_watch_sends_the_list_at_once_then_only_when_health_changes(
    server: Server,
) -> None:
    watcher = Watcher(server.stub)
    try:
        assert watcher.next(5) == ["Healthy"] * 4
        server.plugin.set_health({"GPU-a": True, "GPU-b": True})  # no change: nothing sent
        assert watcher.next(1.5) is None
        server.plugin.set_health({"GPU-a": True, "GPU-b": False})
        assert watcher.next(5) == ["Healthy"] * 2 + ["Unhealthy"] * 2
        assert watcher.next(1.5) is None
    finally:
        watcher.close()


def test_a_later_watcher_gets_the_list_as_it_stands(server: Server) -> None:
    server.plugin.set_health({"GPU-a": False, "GPU-b": True})
    watcher = Watcher(server.stub)
    try:
        assert watcher.next(5) == ["Unhealthy"] * 2 + ["Healthy"] * 2
    finally:
        watcher.close()


class Registrar(pbg.RegistrationServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self.requests: list[pb.RegisterRequest] = []
        self.refuse = ""  # kubelet's answer to a plugin it will not take, as it words one

    def Register(self, request: pb.RegisterRequest, context: Any) -> pb.Empty:
        self.requests.append(request)
        if self.refuse:
            context.abort(grpc.StatusCode.UNKNOWN, self.refuse)
        return pb.Empty()


def serve_kubelet(root: Path, registrar: Registrar) -> grpc.Server:
    """kubelet's Registration service on ``kubelet.sock`` in the plugin folder."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pbg.add_RegistrationServicer_to_server(registrar, server)
    server.add_insecure_port(f"unix://{root / KUBELET_SOCKET}")
    server.start()
    return server


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[Registrar]:
    registrar = Registrar()
    server = serve_kubelet(tmp_path, registrar)
    yield registrar
    server.stop(0).wait(5)


def test_it_registers_once_with_its_endpoint_resource_and_options(
    tmp_path: Path, kubelet: Registrar, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=PLUGIN_LOGGER)
    told: list[int] = []
    server = Server(tmp_path)
    server.plugin.on_register = lambda: told.append(server.plugin.registrations)
    try:
        eventually(lambda: server.plugin.registrations == 1)
        time.sleep(0.5)  # five more turns of the watch: no second Register
        assert server.plugin.registrations == 1 and told == [1]
        assert server.plugin.registered
        [request] = kubelet.requests
        assert (request.version, request.endpoint, request.resource_name) == (
            "v1beta1",
            "tessera.sock",
            "tessera.io/gpu",
        )
        assert request.options.pre_start_required
        assert request.options.get_preferred_allocation_available
        assert server.plugin.register_failures == 0
        assert logged(caplog, PLUGIN_LOGGER) == [
            "registered with kubelet as tessera.io/gpu (tessera.sock)"
        ]
    finally:
        server.close()
    assert not server.plugin.registered  # stopped: kubelet loses the endpoint with it


def test_registered_follows_a_restarted_kubelet_that_refuses_then_accepts(
    tmp_path: Path, kubelet: Registrar
) -> None:
    server = Server(tmp_path)
    try:
        eventually(lambda: server.plugin.registered)
        # A new kubelet (a new kubelet.sock) that will not take the plugin.
        again = Registrar()
        again.refuse = "cannot register with kubelet using version v1beta1"
        (tmp_path / KUBELET_SOCKET).unlink()
        restarted = serve_kubelet(tmp_path, again)
        try:
            eventually(lambda: server.plugin.register_failures >= 2)
            assert not server.plugin.registered
            assert server.plugin.registrations == 1
            again.refuse = ""
            eventually(lambda: server.plugin.registered)
            assert (server.plugin.registrations, len(again.requests)) == (
                2, server.plugin.register_failures + 1
            )  # fmt: skip
        finally:
            restarted.stop(0).wait(5)
    finally:
        server.close()


def test_a_removed_plugin_socket_is_served_and_registered_again(
    tmp_path: Path, kubelet: Registrar, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=PLUGIN_LOGGER)
    # kubelet itself still runs (same kubelet.sock), but it dropped the endpoint with
    # the socket: only a new Register brings the plugin back.
    server = Server(tmp_path)
    try:
        eventually(lambda: server.plugin.registrations == 1)
        server.plugin.socket_path.unlink()
        eventually(lambda: server.plugin.registrations == 2)
        assert server.plugin.socket_path.exists()
        assert len(kubelet.requests) == 2
        assert "plugin socket removed (kubelet restart?): serving again" in logged(
            caplog, PLUGIN_LOGGER
        )
    finally:
        server.close()


def test_a_kubelet_that_refuses_is_asked_every_turn_and_logged_every_fifty(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket(socket.AF_UNIX) as refusing:  # bound, not listening: refused
        refusing.bind(str(tmp_path / KUBELET_SOCKET))
        server = Server(tmp_path, poll_s=0.01)
        try:
            eventually(lambda: server.plugin.register_failures >= 52)
            assert not server.plugin.registered
        finally:
            server.close()
    assert server.plugin.registrations == 0
    lines = [r.getMessage() for r in caplog.records if "Register" in r.getMessage()]
    assert [line.split(": <")[0] for line in lines] == [  # each with gRPC's error after it
        "Register with kubelet failed (1 so far)",
        "Register with kubelet failed (51 so far)",
    ]


def test_a_kubelet_that_never_answers_costs_one_register_deadline_and_not_the_service(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A hung kubelet: its socket takes connections and never says a word. Register gives
    # up at its 5 s deadline, and the plugin answers calls all the while.
    with socket.socket(socket.AF_UNIX) as hung:
        hung.bind(str(tmp_path / KUBELET_SOCKET))
        hung.listen(8)
        server = Server(tmp_path)
        try:
            time.sleep(1.0)
            assert server.plugin.register_failures == 0  # still waiting for the answer
            options = server.stub.GetDevicePluginOptions(pb.Empty(), timeout=2)
            assert options.pre_start_required
            eventually(lambda: server.plugin.register_failures == 1, timeout=10)
            assert not server.plugin.registered
        finally:
            server.close()
    [line] = [r.getMessage() for r in caplog.records if "Register" in r.getMessage()]
    assert line.startswith("Register with kubelet failed (1 so far)")
    assert "DEADLINE_EXCEEDED" in line


def stop_leaving_the_socket(server: grpc.Server, sock: Path) -> None:
    """Stop a gRPC server as a killed kubelet stops: its socket file stays (same inode
    and mtime, so the plugin sees the same kubelet), with nothing listening on it."""
    kept = sock.with_name("kept")
    os.link(sock, kept)
    server.stop(0).wait(5)  # gRPC removes the socket it served
    os.rename(kept, sock)


def test_a_stopped_kubelet_is_noticed_at_the_next_check_and_registered_with_when_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    registrar = Registrar()
    kubelet = serve_kubelet(tmp_path, registrar)
    server = Server(tmp_path, kubelet_check_s=0.5)
    try:
        eventually(lambda: server.plugin.registered)
        time.sleep(1.2)  # two checks that find kubelet there: no second Register
        assert (server.plugin.registrations, server.plugin.kubelet_silent) == (1, False)
        stop_leaving_the_socket(kubelet, tmp_path / KUBELET_SOCKET)
        eventually(lambda: not server.plugin.registered, timeout=3)
        assert server.plugin.kubelet_silent
        assert (
            f"kubelet does not answer on {tmp_path / KUBELET_SOCKET} (stopped?): "
            "registering again once it does"
        ) in logged(caplog, PLUGIN_LOGGER)
        eventually(lambda: server.plugin.register_failures >= 2)  # asked every turn
        # kubelet back: a new kubelet.sock (it clears the folder first, as kubelet does).
        (tmp_path / KUBELET_SOCKET).unlink()
        server.plugin.socket_path.unlink()
        kubelet = serve_kubelet(tmp_path, registrar)
        eventually(lambda: server.plugin.registered)
        assert (server.plugin.registrations, server.plugin.kubelet_silent) == (2, False)
    finally:
        server.close()
        kubelet.stop(0).wait(5)


def test_a_kubelet_whose_socket_is_gone_is_silent(tmp_path: Path, kubelet: Registrar) -> None:
    server = Server(tmp_path)
    try:
        eventually(lambda: server.plugin.registered)
        (tmp_path / KUBELET_SOCKET).unlink()
        eventually(lambda: server.plugin.kubelet_silent)
        assert not server.plugin.registered
    finally:
        server.close()


def test_its_folder_is_made_and_made_again_and_stop_leaves_nothing_running(
    tmp_path: Path,
) -> None:
    root = tmp_path / "plugins" / "device-plugins"
    server = Server(root)
    assert server.plugin.socket_path.exists()
    # The whole tree gone at once, as on a node wipe (a rename: removing it file by file
    # would race the watch, which makes the folder again as soon as it sees it gone).
    (tmp_path / "plugins").rename(tmp_path / "wiped")
    shutil.rmtree(tmp_path / "wiped")
    eventually(server.plugin.socket_path.exists)
    watcher = server.plugin._watcher
    server.close()
    assert watcher is not None and not watcher.is_alive()  # stop waits for the watch
    time.sleep(0.3)
    assert not server.plugin.socket_path.exists()  # and nothing serves it again
    server.plugin.stop()  # a second stop is harmless


def test_stop_before_start_is_harmless(tmp_path: Path) -> None:
    plugin = DevicePluginServer(
        ScriptedAllocator(),  # type: ignore[arg-type]
        CARDS, "tessera.io/gpu", tmp_path, MemoryEvents(), 2, "tessera.sock",
    )  # fmt: skip
    plugin.stop()
    assert not (tmp_path / "tessera.sock").exists()
