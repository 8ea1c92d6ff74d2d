"""Client of kubelet's pod-resources API (v1 ``List``) on its unix socket.

kubelet serves it at ``/var/lib/kubelet/pod-resources/kubelet.sock`` (GA since 1.28,
on by default); the agent needs the folder mounted. ``view`` answers None instead of
raising when the socket is absent or does not answer, so the allocator degrades to
matching by its own ledger and creation order (docs/node-agent.md).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import grpc

from tessera.node.deviceplugin.v1beta1 import podresources_pb2 as pb
from tessera.node.deviceplugin.v1beta1 import podresources_pb2_grpc as pbg
from tessera.node.ports import PodResourcesView

__all__ = ["DEFAULT_SOCKET", "PodResourcesClient", "view_from"]

log = logging.getLogger(__name__)

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"


def view_from(resp: pb.ListPodResourcesResponse, resource: str) -> PodResourcesView:
    pods: set[tuple[str, str]] = set()
    held: dict[tuple[str, str, str], frozenset[str]] = {}
    for p in resp.pod_resources:
        pods.add((p.namespace, p.name))
        for c in p.containers:
            ids = [i for d in c.devices if d.resource_name == resource for i in d.device_ids]
            held[(p.namespace, p.name, c.name)] = frozenset(ids)
    return PodResourcesView(pods=frozenset(pods), held=held)


class PodResourcesClient:
    def __init__(self, socket: str | Path, resource: str, timeout_s: float = 2.0) -> None:
        self.socket = Path(socket)
        self.resource = resource
        self.timeout_s = timeout_s
        self._mu = threading.Lock()
        self._channel: grpc.Channel | None = None

    def _stub(self) -> pbg.PodResourcesListerStub:
        with self._mu:
            if self._channel is None:
                self._channel = grpc.insecure_channel(f"unix://{self.socket}")
            return pbg.PodResourcesListerStub(self._channel)

    def view(self) -> PodResourcesView | None:
        if not self.socket.exists():
            return None
        try:
            resp = self._stub().List(pb.ListPodResourcesRequest(), timeout=self.timeout_s)
        except grpc.RpcError as exc:
            log.warning("pod-resources List failed: %s", exc)
            self.close()  # kubelet may have restarted: dial again next time
            return None
        return view_from(resp, self.resource)

    def close(self) -> None:
        with self._mu:
            if self._channel is not None:
                self._channel.close()
                self._channel = None
