"""One control plane for the scheduler's e2e tests (package scope): see harness.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tessera.testenv import Binaries, TestEnv
from tessera.testenv.process import free_port
from tests.e2e.scheduler.harness import Extender, Harness, gpu_nodes, scheduler_config
from tests.e2e.wait import wait_for


@pytest.fixture(scope="package")
def harness(
    testenv_binaries: Binaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Harness]:
    workdir = tmp_path_factory.mktemp("scheduler-e2e")
    port, webhook_port = free_port(), free_port()
    env = TestEnv.start(
        workdir / "env", binaries=testenv_binaries, scheduler_config=scheduler_config(port)
    )
    h = Harness(env, workdir, gpu_nodes(100, 8))
    try:
        kubeconfig = h.install_rbac()
        h.install_crds()
        env.create_gpu_nodes(h.nodes)
        h.ensure_default_service_account("default")
        serving = env.issue_serving_cert("tessera-webhook")
        h.extender = Extender(
            workdir, kubeconfig, port, webhook_port, serving.cert, serving.key, extra=["--web"]
        )  # the GPU map page (test_view_kubectl.py)
        h.extender.start()
        h.install_webhooks(webhook_port)
        h.install_admission_policy()
        ext = h.extender
        wait_for("the extender to see 100 nodes",
                 lambda: ext.metric("tessera_scheduler_nodes") == 100)  # fmt: skip
        yield h
    finally:
        h.close()
        env.stop()
