"""FakeKube refuses as the real API server does: the same write with a UID that is not
the stored object's, sent to both, is refused with the same status, reason and words.
The unit suite's fakes stand in for the API server only as far as these hold."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tessera.kube import PODS, ApiError, FakeKube
from tessera.kube.client import KubeClient
from tessera.testenv import TestEnv

pytestmark = pytest.mark.e2e

NAME = "fake-refusals"


@pytest.fixture
def api(testenv: TestEnv) -> Iterator[KubeClient]:
    client = KubeClient.from_kubeconfig(str(testenv.kubeconfig))
    yield client
    client.delete(PODS, NAME, "default")


def _refusal(write: Callable[[Any], Any], kube: Any) -> tuple[int, str, str]:
    """The refusal, with the stored pod's UID (the server's own, on each) as ``<uid>``."""
    uid = kube.get(PODS, NAME, "default")["metadata"]["uid"]
    with pytest.raises(ApiError) as refused:
        write(kube)
    return refused.value.status, refused.value.reason, refused.value.message.replace(uid, "<uid>")


def test_a_write_with_another_uid_is_refused_alike(api: KubeClient) -> None:
    containers = [{"name": "c", "image": "x"}]
    body = {
        "metadata": {"name": NAME},
        "spec": {"schedulerName": "nobody", "containers": containers},
    }
    api.create(PODS, body, "default")
    fake = FakeKube()
    fake.create(PODS, body, "default")
    other = "0123abcd-0000-4000-8000-000000000000"  # neither's
    writes: list[Callable[[Any], Any]] = [
        # The preemptor's record: a patch's UID is a change of an immutable field (422).
        lambda kube: kube.merge_patch(PODS, NAME, {"metadata": {"uid": other}}, "default"),
        lambda kube: kube.evict("default", NAME, other),  # a victim replaced
        lambda kube: kube.bind("default", NAME, other, "node-a", {}),  # a pod replaced
    ]
    said = [_refusal(write, api) for write in writes]
    assert [_refusal(write, fake) for write in writes] == said
    assert [status for status, _, _ in said] == [422, 409, 409]
