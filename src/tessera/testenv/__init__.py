"""A real Kubernetes control plane on 127.0.0.1 for tests and ``tessera dev-cluster``.

Binaries are built from their Go modules (wrappers in ``testenv/``) and cached under
``~/.cache/tessera``; ``TestEnv.start`` runs etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok; ``create_gpu_nodes`` turns ``NodeInventory`` values into
kwok-managed Nodes. See docs/testenv.md.

Names are imported on first use, so ``tessera --help`` does not pay for cryptography.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tessera.testenv.build import Binaries, ensure_binaries
    from tessera.testenv.config import extender, scheduler_config
    from tessera.testenv.env import TestEnv
    from tessera.testenv.errors import BuildError, StartError, TestEnvError
    from tessera.testenv.nodes import node_manifest

__all__ = [
    "Binaries",
    "BuildError",
    "StartError",
    "TestEnv",
    "TestEnvError",
    "ensure_binaries",
    "extender",
    "node_manifest",
    "scheduler_config",
]

_WHERE = {
    "Binaries": "build",
    "ensure_binaries": "build",
    "extender": "config",
    "scheduler_config": "config",
    "TestEnv": "env",
    "BuildError": "errors",
    "StartError": "errors",
    "TestEnvError": "errors",
    "node_manifest": "nodes",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'tessera.testenv' has no attribute {name!r}")
    return getattr(importlib.import_module(f"tessera.testenv.{_WHERE[name]}"), name)
