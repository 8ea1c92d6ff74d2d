"""The kubelet device plugin (v1beta1 gRPC over a unix socket), and its lifecycle.

Serves ``DevicePlugin`` on ``<plugin dir>/<endpoint>``, registers with kubelet on
``<plugin dir>/kubelet.sock`` only once serving, and watches the folder: when kubelet
restarts it deletes every socket there and creates a new ``kubelet.sock``; the plugin
then serves again and re-registers (polled every 100 ms, so well inside 2 s). A kubelet
that stops leaves its socket behind and says nothing, so every 10 s the plugin also checks
that something answers on ``kubelet.sock``; when nothing does it is no longer registered,
and it registers again once kubelet is back.

Errors from the allocator go back to kubelet as a gRPC status whose message names what
is wrong, and as a Warning Event on the pod when the pod is known. Nothing raises out of
a handler.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import grpc

from tessera.model.types import Card
from tessera.node.allocation.allocator import AllocationError, Allocator
from tessera.node.deviceplugin.v1beta1 import api_pb2 as pb
from tessera.node.deviceplugin.v1beta1 import api_pb2_grpc as pbg
from tessera.node.isolation import ContainerEdits
from tessera.node.kubelet import slots as S
from tessera.node.ports import EventSink, warn_best_effort

__all__ = ["API_VERSION", "KUBELET_SOCKET", "DevicePluginServer", "device_list"]

log = logging.getLogger(__name__)
_T = TypeVar("_T")

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"

_CODES = {
    "INVALID_ARGUMENT": grpc.StatusCode.INVALID_ARGUMENT,
    "FAILED_PRECONDITION": grpc.StatusCode.FAILED_PRECONDITION,
    "NOT_FOUND": grpc.StatusCode.NOT_FOUND,
}
_REASONS = {
    "INVALID_ARGUMENT": "TesseraBadDeviceIDs",
    "FAILED_PRECONDITION": "TesseraAllocateFailed",
    "NOT_FOUND": "TesseraAllocateFailed",
}


def device_list(
    cards: tuple[Card, ...], slots_per_card: int, healthy: dict[str, bool]
) -> list[pb.Device]:
    """Every slot of every card, with its card's health and NUMA node."""
    out: list[pb.Device] = []
    for c in sorted(cards, key=lambda c: c.index):
        health = HEALTHY if healthy.get(c.uuid, True) else UNHEALTHY
        topo = pb.TopologyInfo(nodes=[pb.NUMANode(ID=c.numa_node)]) if c.numa_node >= 0 else None
        for sid in S.slot_ids(c.uuid, slots_per_card):
            out.append(pb.Device(ID=sid, health=health, topology=topo))
    return out


def _response(edits: ContainerEdits) -> pb.ContainerAllocateResponse:
    return pb.ContainerAllocateResponse(
        envs=edits.envs,
        mounts=[
            pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in edits.mounts
        ],
        cdi_devices=[pb.CDIDevice(name=n) for n in edits.cdi_devices],
    )


class _Servicer(pbg.DevicePluginServicer):  # type: ignore[misc]  # untyped generated base
    def __init__(self, owner: DevicePluginServer) -> None:
        self.o = owner

    def GetDevicePluginOptions(self, request: pb.Empty, context: Any) -> pb.DevicePluginOptions:
        return self.o.options()

    def ListAndWatch(self, request: pb.Empty, context: Any) -> Iterator[pb.ListAndWatchResponse]:
        o = self.o
        seen = -1
        context.add_callback(o._wake)
        while context.is_active() and not o._stopping.is_set():
            with o._cond:
                if o._version == seen:
                    o._cond.wait(timeout=1.0)
                    continue
                seen = o._version
                devices = device_list(o.cards, o.slots_per_card, o._health)
            yield pb.ListAndWatchResponse(devices=devices)

    def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: Any
    ) -> pb.PreferredAllocationResponse:
        out = []
        for r in request.container_requests:
            ids = self.o._guard(
                context,
                "GetPreferredAllocation",
                partial(
                    self.o.allocator.preferred,
                    list(r.available_deviceIDs),
                    list(r.must_include_deviceIDs),
                    r.allocation_size,
                ),
            )
            out.append(pb.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return pb.PreferredAllocationResponse(container_responses=out)

    def Allocate(self, request: pb.AllocateRequest, context: Any) -> pb.AllocateResponse:
        out = []
        for r in request.container_requests:
            _, edits = self.o._guard(
                context, "Allocate", partial(self.o.allocator.allocate, list(r.devices_ids))
            )
            out.append(_response(edits))
        return pb.AllocateResponse(container_responses=out)

    def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: Any
    ) -> pb.PreStartContainerResponse:
        self.o._guard(
            context,
            "PreStartContainer",
            lambda: self.o.allocator.pre_start(list(request.devices_ids)),
        )
        return pb.PreStartContainerResponse()


class DevicePluginServer:
    def __init__(
        self,
        allocator: Allocator,
        cards: tuple[Card, ...],
        resource: str,
        plugin_dir: str | Path,
        events: EventSink,
        slots_per_card: int,
        endpoint: str,
        poll_s: float = 0.1,
        kubelet_check_s: float = 10.0,
    ) -> None:
        self.allocator = allocator
        self.cards = tuple(cards)
        self.resource = resource
        self.plugin_dir = Path(plugin_dir)
        self.events = events
        self.slots_per_card = slots_per_card
        self.endpoint = endpoint
        self.poll_s = poll_s
        self.kubelet_check_s = kubelet_check_s
        self._checked_at = 0.0
        self._health: dict[str, bool] = {c.uuid: True for c in cards}
        self._version = 0
        self._cond = threading.Condition()
        self._stopping = threading.Event()
        self._server: grpc.Server | None = None
        self._watcher: threading.Thread | None = None
        self._kubelet_id: tuple[int, int] | None = None
        # kubelet accepted our Register, has not restarted since and still answers
        self.registered = False
        # Nothing answered on kubelet.sock at the last check and no Register has since
        # succeeded: kubelet is down (the DRA driver's registration is then moot too).
        self.kubelet_silent = False
        self.registrations = 0
        self.register_failures = 0
        self.on_register: Callable[[], None] | None = None
        # (call, result, seconds) after each container's call; result "ok" or the gRPC
        # status name. The exporter's histogram and counters hang here.
        self.on_call: Callable[[str, str, float], None] | None = None

    # --- state -----------------------------------------------------------------------

    @property
    def socket_path(self) -> Path:
        return self.plugin_dir / self.endpoint

    def options(self) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(
            pre_start_required=True, get_preferred_allocation_available=True
        )

    def set_health(self, healthy: dict[str, bool]) -> None:
        """New card health; ListAndWatch streams send the new device list at once."""
        with self._cond:
            if healthy == self._health:
                return
            self._health = dict(healthy)
            self._version += 1
            self._cond.notify_all()

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _guard(self, context: Any, call: str, fn: Callable[[], _T]) -> _T:
        t0 = time.perf_counter()
        result = "ok"
        try:
            return fn()
        except AllocationError as exc:
            log.warning("%s", exc.message)
            if exc.pod is not None:
                reason = _REASONS.get(exc.code, "TesseraError")
                warn_best_effort(self.events, exc.pod, reason, exc.message)
            status = _CODES.get(exc.code, grpc.StatusCode.UNKNOWN)
            result = status.name
            context.abort(status, exc.message)
        except Exception as exc:  # never crash a handler; say what broke
            log.exception("device plugin call failed")
            result = grpc.StatusCode.INTERNAL.name
            context.abort(
                grpc.StatusCode.INTERNAL, f"tessera node agent: {type(exc).__name__}: {exc}"
            )
        finally:
            if self.on_call is not None:
                self.on_call(call, result, time.perf_counter() - t0)
        raise AssertionError("grpc's context.abort returns only by raising")

    # --- lifecycle -------------------------------------------------------------------

    def _serve(self) -> None:
        if self._server is not None:
            self._server.stop(grace=0).wait(2)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        pbg.add_DevicePluginServicer_to_server(_Servicer(self), server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        server.start()
        self._server = server

    def _kubelet_identity(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.plugin_dir / KUBELET_SOCKET)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns)

    def _kubelet_answers(self) -> bool:
        """Whether a gRPC connection to ``kubelet.sock`` comes up (a full handshake, so
        kubelet logs nothing about a client that said nothing)."""
        with grpc.insecure_channel(f"unix://{self.plugin_dir / KUBELET_SOCKET}") as ch:
            try:
                grpc.channel_ready_future(ch).result(timeout=2.0)
            except grpc.FutureTimeoutError:
                return False
        return True

    def _check_kubelet(self) -> None:
        now = time.monotonic()
        if now - self._checked_at < self.kubelet_check_s:
            return
        self._checked_at = now
        if not self._kubelet_answers():
            log.warning(
                "kubelet does not answer on %s (stopped?): registering again once it does",
                self.plugin_dir / KUBELET_SOCKET,
            )
            self.registered = False
            self.kubelet_silent = True

    def _register(self) -> bool:
        target = f"unix://{self.plugin_dir / KUBELET_SOCKET}"
        try:
            with grpc.insecure_channel(target) as ch:
                pbg.RegistrationStub(ch).Register(
                    pb.RegisterRequest(
                        version=API_VERSION,
                        endpoint=self.endpoint,
                        resource_name=self.resource,
                        options=self.options(),
                    ),
                    timeout=5,
                )
        except grpc.RpcError as exc:
            self.register_failures += 1
            if self.register_failures % 50 == 1:  # every 5 s at the 100 ms poll
                log.warning(
                    "Register with kubelet failed (%d so far): %s", self.register_failures, exc
                )
            return False
        self.registrations += 1
        log.info("registered with kubelet as %s (%s)", self.resource, self.endpoint)
        if self.on_register is not None:
            self.on_register()
        return True

    def start(self) -> None:
        """Serve, register, and watch the folder for kubelet restarts (background)."""
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self._serve()
        self._stopping.clear()
        self._watcher = threading.Thread(target=self._watch, name="plugin-watch", daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        while not self._stopping.is_set():
            try:
                kubelet = self._kubelet_identity()
                if not self.socket_path.exists():
                    log.info("plugin socket removed (kubelet restart?): serving again")
                    self.plugin_dir.mkdir(parents=True, exist_ok=True)
                    self._serve()
                    self.registered = False
                if kubelet != self._kubelet_id:
                    self.registered = False
                if kubelet is None:
                    self.kubelet_silent = True
                if self.registered:
                    self._check_kubelet()
                if not self.registered and kubelet is not None:
                    self.registered = self._register()
                    if self.registered:
                        self._kubelet_id = kubelet
                        self._checked_at = time.monotonic()
                        self.kubelet_silent = False
            except Exception:  # keep watching: the next turn may succeed
                log.exception("device plugin watch")
            self._stopping.wait(self.poll_s)

    def stop(self) -> None:
        self._stopping.set()
        self._wake()
        if self._watcher is not None:
            self._watcher.join(5)
        self.registered = False
        if self._server is not None:  # only a socket it served is its to remove
            self._server.stop(grace=0).wait(5)
            self._server = None
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
