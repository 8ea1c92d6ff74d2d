"""A test kubelet that speaks the real device plugin protocol over unix sockets.

It does what kubelet's device manager does, in the same order (pkg/kubelet/cm/
devicemanager, read for behaviour, not copied):

* serves ``v1beta1.Registration`` on ``<plugin dir>/kubelet.sock``; on ``Register`` it
  checks the version, then (asynchronously, as kubelet does) dials the plugin's socket,
  calls ``GetDevicePluginOptions`` and holds ``ListAndWatch``, keeping the device list
  and health it streams;
* admits pods **one at a time**: adds the pod to its pod manager first (so pod-resources
  lists it), then for each container (init containers first, then app containers) that
  asks for the resource: reuses devices of init containers, computes the available set
  (healthy minus allocated), calls ``GetPreferredAllocation(available, must_include,
  size)``, takes the preferred devices that are available and fills the rest arbitrarily,
  then calls ``Allocate`` with one container request; a failure rejects the pod;
* before starting each container, calls ``PreStartContainer`` when the plugin asked for it;
* serves ``v1.PodResourcesLister.List`` on its own socket: admitted pods (and the one
  being admitted), their app containers and the devices each holds;
* ``restart()``: deletes every file in the plugin folder (kubelet clears it on start),
  creates a new ``kubelet.sock``, keeps its allocations (kubelet's checkpoint).
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from tessera.node.deviceplugin.v1beta1 import api_pb2 as pb
from tessera.node.deviceplugin.v1beta1 import api_pb2_grpc as pbg
from tessera.node.deviceplugin.v1beta1 import podresources_pb2 as prpb
from tessera.node.deviceplugin.v1beta1 import podresources_pb2_grpc as prpbg

__all__ = ["AdmissionError", "KContainer", "KPod", "KubeletDouble", "Started"]


class AdmissionError(Exception):
    """kubelet rejected the pod (UnexpectedAdmissionError); ``status`` is the plugin's."""

    def __init__(self, message: str, status: grpc.StatusCode | None = None) -> None:
        self.status = status
        super().__init__(message)


@dataclass(frozen=True)
class KContainer:
    name: str
    gpus: int
    init: bool = False


@dataclass
class KPod:
    namespace: str
    name: str
    uid: str
    containers: list[KContainer]

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass
class Started:
    """What the runtime would get for one container: devices and the plugin's answer."""

    pod: KPod
    container: str
    devices: list[str]
    response: pb.ContainerAllocateResponse

    @property
    def envs(self) -> dict[str, str]:
        return dict(self.response.envs)

    def mount(self, container_path: str) -> pb.Mount:
        for m in self.response.mounts:
            if m.container_path == container_path:
                return m
        raise KeyError(container_path)


@dataclass
class _Endpoint:
    resource: str
    options: pb.DevicePluginOptions
    channel: grpc.Channel
    stub: pbg.DevicePluginStub
    stream: Any = None
    thread: threading.Thread | None = None


class _Registration(pbg.RegistrationServicer):
    def __init__(self, k: KubeletDouble) -> None:
        self.k = k

    def Register(self, request: pb.RegisterRequest, context: Any) -> pb.Empty:
        if request.version != "v1beta1":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unsupported {request.version}")
        with self.k._mu:
            refuse = self.k.refuse_registers > 0
            self.k.refuse_registers -= refuse
        if refuse:  # as a kubelet still starting up answers
            context.abort(grpc.StatusCode.UNAVAILABLE, "device manager not ready")
        # kubelet answers first and connects to the plugin in the background.
        threading.Thread(target=self.k._connect, args=(request,), daemon=True).start()
        return pb.Empty()


class _PodResources(prpbg.PodResourcesListerServicer):
    def __init__(self, k: KubeletDouble) -> None:
        self.k = k

    def List(self, request: prpb.ListPodResourcesRequest, context: Any) -> Any:
        self.k.podres_calls += 1
        return self.k._list()


class KubeletDouble:
    def __init__(
        self,
        plugin_dir: Path,
        podres_socket: Path,
        resource: str = "tessera.io/gpu",
        seed: int = 0,
        on_devices: Callable[[dict[str, str]], None] | None = None,
    ) -> None:
        self.plugin_dir = Path(plugin_dir)
        self.podres_socket = Path(podres_socket)
        self.resource = resource
        self.rng = random.Random(seed)
        self.on_devices = on_devices
        self._mu = threading.Condition()
        self._admit = threading.Lock()  # kubelet's single admission path
        self.devices: dict[str, str] = {}  # id -> health
        self.topology: dict[str, list[int]] = {}
        self.endpoint: _Endpoint | None = None
        self.pod_manager: dict[str, KPod] = {}  # uid -> pod (insertion order)
        self.pod_devices: dict[tuple[str, str], list[str]] = {}  # (uid, container) -> ids
        self.responses: dict[tuple[str, str], pb.ContainerAllocateResponse] = {}
        self.registrations: list[float] = []  # monotonic time of each Register
        self.refuse_registers = 0  # Register calls to refuse (UNAVAILABLE) from now on
        self.updates = 0
        self.podres_calls = 0
        self._reg_server: grpc.Server | None = None
        self._pr_server: grpc.Server | None = None

    # --- sockets ---------------------------------------------------------------------

    def start(self) -> None:
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self._serve_registration()
        self._serve_podres()

    def _serve_registration(self) -> None:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pbg.add_RegistrationServicer_to_server(_Registration(self), server)
        server.add_insecure_port(f"unix://{self.plugin_dir / 'kubelet.sock'}")
        server.start()
        self._reg_server = server

    def _serve_podres(self) -> None:
        self.podres_socket.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.podres_socket.unlink()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        prpbg.add_PodResourcesListerServicer_to_server(_PodResources(self), server)
        server.add_insecure_port(f"unix://{self.podres_socket}")
        server.start()
        self._pr_server = server

    def stop(self) -> None:
        self._drop_endpoint()
        for s in (self._reg_server, self._pr_server):
            if s is not None:
                s.stop(grace=0).wait(5)
        self._reg_server = self._pr_server = None

    def restart(self, clear: bool = True) -> None:
        """Stop, clear the plugin folder (as kubelet's device manager does when it
        starts; ``clear=False`` keeps the plugins' sockets), come back with a new
        kubelet.sock."""
        self.stop()
        for p in self.plugin_dir.iterdir():
            if clear and p.name != "kubelet_internal_checkpoint":
                p.unlink()
        with self._mu:
            self.devices.clear()
        self.start()

    # --- plugin connection -----------------------------------------------------------

    def _connect(self, req: pb.RegisterRequest) -> None:
        self._drop_endpoint()
        channel = grpc.insecure_channel(f"unix://{self.plugin_dir / req.endpoint}")
        stub = pbg.DevicePluginStub(channel)
        options = stub.GetDevicePluginOptions(pb.Empty(), timeout=5)
        ep = _Endpoint(req.resource_name, options, channel, stub)
        ep.stream = stub.ListAndWatch(pb.Empty())
        ep.thread = threading.Thread(target=self._watch, args=(ep,), daemon=True)
        with self._mu:
            self.endpoint = ep
            self.registrations.append(time.monotonic())
            self._mu.notify_all()
        ep.thread.start()

    def _watch(self, ep: _Endpoint) -> None:
        try:
            for resp in ep.stream:
                with self._mu:
                    self.devices = {d.ID: d.health for d in resp.devices}
                    self.topology = {d.ID: [n.ID for n in d.topology.nodes] for d in resp.devices}
                    self.updates += 1
                    snapshot = dict(self.devices)
                    self._mu.notify_all()
                if self.on_devices is not None:
                    self.on_devices(snapshot)
        except grpc.RpcError:
            pass  # plugin went away; kubelet waits for it to register again

    def _drop_endpoint(self) -> None:
        with self._mu:
            ep, self.endpoint = self.endpoint, None
        if ep is not None:
            if ep.stream is not None:
                ep.stream.cancel()
            ep.channel.close()

    def wait(self, pred: Callable[[], bool], timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        with self._mu:
            while not pred():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._mu.wait(left)
            return True

    def wait_devices(self, count: int, timeout: float = 10.0) -> None:
        if not self.wait(lambda: self.endpoint is not None and len(self.devices) == count, timeout):
            raise TimeoutError(f"plugin did not report {count} devices (has {len(self.devices)})")

    def health_of(self, prefix: str) -> set[str]:
        with self._mu:
            return {h for i, h in self.devices.items() if i.startswith(prefix)}

    # --- admission -------------------------------------------------------------------

    def _allocated(self) -> set[str]:
        return {d for ids in self.pod_devices.values() for d in ids}

    def admit(self, pod: KPod) -> None:
        """Admit ``pod`` the way kubelet does (raises AdmissionError on rejection)."""
        with self._admit:
            with self._mu:
                self.pod_manager[pod.uid] = pod
            try:
                self._allocate_pod(pod)
            except AdmissionError:
                with self._mu:
                    self.pod_manager.pop(pod.uid, None)
                    for c in pod.containers:
                        self.pod_devices.pop((pod.uid, c.name), None)
                raise

    def _allocate_pod(self, pod: KPod) -> None:
        ep = self.endpoint
        # kubelet keys plugins by resource name: one registered under another name does
        # not serve the pods that ask for this one.
        if ep is None or ep.resource != self.resource:
            raise AdmissionError(f"cannot allocate unregistered device {self.resource}")
        reusable: set[str] = set()
        ordered = [c for c in pod.containers if c.init] + [c for c in pod.containers if not c.init]
        for c in ordered:
            if c.gpus <= 0:
                continue
            if (pod.uid, c.name) in self.pod_devices:
                continue  # already allocated (kubelet restart): no RPC
            allocated: list[str] = [d for d in sorted(reusable)][: c.gpus]
            needed = c.gpus - len(allocated)
            with self._mu:
                healthy = {i for i, h in self.devices.items() if h == "Healthy"}
                available = healthy - self._allocated() - set(allocated)
            if needed > 0:
                if len(available) < needed:
                    raise AdmissionError(
                        f"requested number of devices unavailable for {self.resource}. "
                        f"Requested: {needed}, Available: {len(available)}"
                    )
                if ep.options.get_preferred_allocation_available:
                    req = pb.PreferredAllocationRequest(
                        container_requests=[
                            pb.ContainerPreferredAllocationRequest(
                                available_deviceIDs=sorted(available | set(allocated)),
                                must_include_deviceIDs=allocated,
                                allocation_size=c.gpus,
                            )
                        ]
                    )
                    try:
                        resp = ep.stub.GetPreferredAllocation(req, timeout=10)
                    except grpc.RpcError as exc:
                        raise AdmissionError(
                            f"device plugin GetPreferredAllocation rpc failed with err: "
                            f"{exc.details()}",
                            exc.code(),
                        ) from exc
                    preferred = list(resp.container_responses[0].deviceIDs)
                    for d in preferred:
                        if needed and d in available:
                            allocated.append(d)
                            available.discard(d)
                            needed -= 1
                rest = sorted(available)
                self.rng.shuffle(rest)
                allocated += rest[:needed]
            with self._mu:
                self.pod_devices[(pod.uid, c.name)] = list(allocated)
            try:
                resp = ep.stub.Allocate(
                    pb.AllocateRequest(
                        container_requests=[pb.ContainerAllocateRequest(devices_ids=allocated)]
                    ),
                    timeout=10,
                )
            except grpc.RpcError as exc:
                raise AdmissionError(f"Allocate failed: {exc.details()}", exc.code()) from exc
            with self._mu:
                self.responses[(pod.uid, c.name)] = resp.container_responses[0]
            if c.init:
                reusable |= set(allocated)  # handed on to the next containers
            else:
                reusable -= set(allocated)  # an app container keeps what it reused

    def start_containers(self, pod: KPod) -> list[Started]:
        """PreStartContainer for each GPU container, then what the runtime would get."""
        ep = self.endpoint
        out: list[Started] = []
        ordered = [c for c in pod.containers if c.init] + [c for c in pod.containers if not c.init]
        for c in ordered:
            ids = self.pod_devices.get((pod.uid, c.name))
            if not ids:
                continue
            if ep is not None and ep.options.pre_start_required:
                ep.stub.PreStartContainer(pb.PreStartContainerRequest(devices_ids=ids), timeout=10)
            out.append(Started(pod, c.name, list(ids), self.responses[(pod.uid, c.name)]))
        return out

    def run(self, pod: KPod) -> list[Started]:
        self.admit(pod)
        return self.start_containers(pod)

    def remove(self, pod: KPod) -> None:
        """The pod terminated: kubelet frees its devices."""
        with self._mu:
            self.pod_manager.pop(pod.uid, None)
            for c in pod.containers:
                self.pod_devices.pop((pod.uid, c.name), None)
                self.responses.pop((pod.uid, c.name), None)

    # --- pod-resources ---------------------------------------------------------------

    def _list(self) -> prpb.ListPodResourcesResponse:
        with self._mu:
            pods = list(self.pod_manager.values())
            devices = dict(self.pod_devices)
        out = []
        for p in pods:
            containers = []
            for c in p.containers:
                if c.init:
                    continue  # List reports app containers (and sidecars), not init ones
                ids = devices.get((p.uid, c.name), [])
                devs = [prpb.ContainerDevices(resource_name=self.resource, device_ids=ids)]
                containers.append(prpb.ContainerResources(name=c.name, devices=devs if ids else []))
            out.append(prpb.PodResources(name=p.name, namespace=p.namespace, containers=containers))
        return prpb.ListPodResourcesResponse(pod_resources=out)
