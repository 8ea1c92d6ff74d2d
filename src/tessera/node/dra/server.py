"""The agent as a DRA kubelet plugin: registration socket and the v1 DRAPlugin service.

kubelet's plugin watcher finds ``<registry_dir>/gpu.tessera.io-reg.sock``, asks it
``GetInfo`` (type ``DRAPlugin``, the driver name, the service socket, the gRPC services
we serve: ``v1.DRAPlugin``) and reports back with ``NotifyRegistrationStatus``. It then
calls ``NodePrepareResources`` / ``NodeUnprepareResources`` on
``<plugin_dir>/gpu.tessera.io/dra.sock`` with batches of claims; each claim gets its own
answer, so one bad claim does not fail the others in the batch.

On the same socket, ``v1alpha1.DRAResourceHealth``: kubelet (ResourceHealthStatus, on by
default from 1.36) holds a ``NodeWatchResources`` stream open and shows each claim
device's health in the pod's ``status.containerStatuses[].allocatedResourcesStatus``.
Without it kubelet logs an error every 5 s and shows every device Unknown.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from tessera.claims.devices import DRIVER
from tessera.node.dra.prepare import ClaimPreparer, PrepareError
from tessera.node.dra.v1 import dra_pb2 as pb
from tessera.node.dra.v1 import dra_pb2_grpc as pbg
from tessera.node.dra.v1 import registration_pb2 as reg
from tessera.node.dra.v1 import registration_pb2_grpc as regg
from tessera.node.dra.v1alpha1 import health_pb2 as hpb
from tessera.node.dra.v1alpha1 import health_pb2_grpc as hpbg

__all__ = ["DRA_SERVICE", "HEALTH_TIMEOUT_S", "PLUGIN_TYPE", "DraPluginServer"]

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"  # k8s.io/kubelet/pkg/apis/pluginregistration/v1 DRAPlugin
DRA_SERVICE = "v1.DRAPlugin"  # k8s.io/kubelet/pkg/apis/dra/v1 DRAPluginService
# kubelet shows a device Unknown when no report of it came in this long; reports repeat
# every HEALTH_REPEAT_S while the agent's health checks run, so a stalled agent goes
# Unknown and a working one never does.
HEALTH_TIMEOUT_S = 30
HEALTH_REPEAT_S = 10.0


class _Registration(regg.RegistrationServicer):  # type: ignore[misc]  # untyped generated base
    def __init__(self, owner: DraPluginServer) -> None:
        self.owner = owner

    def GetInfo(self, request: reg.InfoRequest, context: Any) -> reg.PluginInfo:
        return reg.PluginInfo(
            type=PLUGIN_TYPE,
            name=self.owner.driver,
            endpoint=str(self.owner.socket_path),
            supported_versions=[DRA_SERVICE],
        )

    def NotifyRegistrationStatus(
        self, request: reg.RegistrationStatus, context: Any
    ) -> reg.RegistrationStatusResponse:
        self.owner.on_registration(request.plugin_registered, request.error)
        return reg.RegistrationStatusResponse()


class _DraPlugin(pbg.DRAPluginServicer):  # type: ignore[misc]  # untyped generated base
    def __init__(self, owner: DraPluginServer) -> None:
        self.owner = owner

    def NodePrepareResources(
        self, request: pb.NodePrepareResourcesRequest, context: Any
    ) -> pb.NodePrepareResourcesResponse:
        out = pb.NodePrepareResourcesResponse()
        for claim in request.claims:
            answer = out.claims[claim.uid]
            try:
                for d in self.owner.preparer.prepare(claim.namespace, claim.name, claim.uid):
                    device = answer.devices.add(
                        request_names=[d.granted.request],
                        pool_name=self.owner.preparer.node,
                        device_name=d.granted.device,
                        cdi_device_ids=list(d.cdi_ids),
                    )
                    if d.granted.share_id is not None:
                        device.share_id = d.granted.share_id
            except PrepareError as exc:
                log.warning("prepare %s/%s: %s", claim.namespace, claim.name, exc)
                del answer.devices[:]
                answer.error = str(exc)
            except Exception as exc:  # never crash a handler; say what broke
                log.exception("prepare %s/%s", claim.namespace, claim.name)
                del answer.devices[:]
                answer.error = f"tessera node agent: {type(exc).__name__}: {exc}"
        return out

    def NodeUnprepareResources(
        self, request: pb.NodeUnprepareResourcesRequest, context: Any
    ) -> pb.NodeUnprepareResourcesResponse:
        out = pb.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            answer = out.claims[claim.uid]
            try:
                self.owner.preparer.unprepare(claim.uid)
            except Exception as exc:
                log.exception("unprepare %s/%s", claim.namespace, claim.name)
                answer.error = f"tessera node agent: {type(exc).__name__}: {exc}"
        return out


class _Health(hpbg.DRAResourceHealthServicer):  # type: ignore[misc]  # untyped generated base
    def __init__(self, owner: DraPluginServer) -> None:
        self.owner = owner

    def NodeWatchResources(
        self, request: hpb.NodeWatchResourcesRequest, context: Any
    ) -> Iterator[hpb.NodeWatchResourcesResponse]:
        o = self.owner
        context.add_callback(o._wake_health)
        sent_version, sent_at = -1, float("-inf")
        while context.is_active():
            with o._health_cond:
                now = time.monotonic()
                checked_since = o._checked_mono > sent_at
                due = o._health_version != sent_version or (
                    checked_since and now - sent_at >= o.health_repeat_s
                )
                if o._health is None or not due:
                    o._health_cond.wait(timeout=1.0)
                    continue
                response = o._health_response()
                sent_version, sent_at = o._health_version, now
            yield response


class DraPluginServer:
    def __init__(
        self,
        preparer: ClaimPreparer,
        plugin_dir: Path = Path("/var/lib/kubelet/plugins"),
        registry_dir: Path = Path("/var/lib/kubelet/plugins_registry"),
        driver: str = DRIVER,
    ) -> None:
        self.preparer = preparer
        self.driver = driver
        self.socket_path = plugin_dir / driver / "dra.sock"
        self.registration_path = registry_dir / f"{driver}-reg.sock"
        self.registered = threading.Event()
        self.refusals = 0  # NotifyRegistrationStatus calls that said kubelet refused us
        self._server: grpc.Server | None = None
        self.health_repeat_s = HEALTH_REPEAT_S
        self._health_cond = threading.Condition()
        self._health: dict[str, str] | None = None  # device name -> "" or why unhealthy
        self._health_version = 0
        self._checked_at = 0  # unix seconds of the last report_health
        self._checked_mono = float("-inf")

    def report_health(self, devices: Mapping[str, str]) -> None:
        """The claims cards' health after a check, by device name: "" when healthy, else
        why not. Streams send it at once when it changed, else repeat it after
        ``health_repeat_s`` (only if checks keep coming)."""
        with self._health_cond:
            self._checked_at = int(time.time())
            self._checked_mono = time.monotonic()
            if devices != self._health:
                self._health = dict(devices)
                self._health_version += 1
            self._health_cond.notify_all()

    def _wake_health(self) -> None:
        with self._health_cond:
            self._health_cond.notify_all()

    def _health_response(self) -> hpb.NodeWatchResourcesResponse:
        assert self._health is not None
        out = hpb.NodeWatchResourcesResponse()
        for name, why in sorted(self._health.items()):
            out.devices.add(
                device=hpb.DeviceIdentifier(pool_name=self.preparer.node, device_name=name),
                health=hpb.UNHEALTHY if why else hpb.HEALTHY,
                last_updated_time=self._checked_at,
                health_check_timeout_seconds=HEALTH_TIMEOUT_S,
                message=why,
            )
        return out

    def on_registration(self, ok: bool, error: str) -> None:
        if ok:
            log.info("kubelet registered DRA driver %s", self.driver)
            self.registered.set()
        else:
            log.error("kubelet refused DRA driver %s: %s", self.driver, error)
            self.refusals += 1
            self.registered.clear()

    def start(self) -> None:
        """Serve both sockets from one gRPC server.

        Binding a port creates its socket file, so kubelet may see the registration
        socket before ``start``; its first call then waits in the listen queue.
        """
        for path in (self.socket_path, self.registration_path):
            path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        pbg.add_DRAPluginServicer_to_server(_DraPlugin(self), server)
        regg.add_RegistrationServicer_to_server(_Registration(self), server)
        hpbg.add_DRAResourceHealthServicer_to_server(_Health(self), server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        server.add_insecure_port(f"unix://{self.registration_path}")
        server.start()
        self._server = server

    def stop(self) -> None:
        """Stop serving; removing the registration socket tells kubelet we are gone."""
        if self._server is not None:  # only sockets it served are its to remove
            self._server.stop(grace=0).wait(5)
            self._server = None
            for path in (self.registration_path, self.socket_path):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        self.registered.clear()
