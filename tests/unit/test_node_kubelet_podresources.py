"""The pod-resources client: what kubelet's List says each container holds of Tessera's
resource, and no answer (None, never an exception) when kubelet is not there to ask."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from tessera.node.deviceplugin.v1beta1 import podresources_pb2 as pb
from tessera.node.kubelet.podresources import PodResourcesClient, view_from

RES = "tessera.io/gpu"


def test_only_the_resource_asked_for_is_held_and_every_pod_is_listed() -> None:
    resp = pb.ListPodResourcesResponse(
        pod_resources=[
            pb.PodResources(
                name="train",
                namespace="team",
                containers=[
                    pb.ContainerResources(
                        name="main",
                        devices=[
                            pb.ContainerDevices(resource_name=RES, device_ids=["s1", "s2"]),
                            pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=["x"]),
                        ],
                    ),
                    pb.ContainerResources(name="sidecar"),
                ],
            ),
            pb.PodResources(name="web", namespace="team"),  # no containers asking devices
        ]
    )
    got = view_from(resp, RES)
    assert got.pods == frozenset({("team", "train"), ("team", "web")})
    assert got.held == {
        ("team", "train", "main"): frozenset({"s1", "s2"}),
        ("team", "train", "sidecar"): frozenset(),
    }


def test_no_socket_is_no_answer_and_close_is_safe_before_any_call(tmp_path: Path) -> None:
    client = PodResourcesClient(tmp_path / "kubelet.sock", RES)
    assert client.view() is None
    client.close()
    client.close()


def test_a_socket_that_does_not_answer_is_no_answer_and_is_dialled_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "kubelet.sock"
    with socket.socket(socket.AF_UNIX) as mute:  # listening, never accepting: kubelet hung
        mute.bind(str(path))
        mute.listen(1)
        client = PodResourcesClient(path, RES, timeout_s=0.2)
        began = time.monotonic()
        assert client.view() is None
        assert time.monotonic() - began < 5  # the call's own deadline, not a hang
        assert "pod-resources List failed: <" in caplog.text  # with what gRPC said
        assert client._channel is None  # the next view dials a new channel
