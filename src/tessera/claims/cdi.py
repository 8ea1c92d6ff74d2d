"""The CDI spec that hands a prepared claim to its containers (pure: edits in, JSON out).

kubelet gives the container runtime the CDI device IDs the DRA plugin returns; the runtime
reads the spec files in its CDI folder (``/var/run/cdi`` by default) and applies each
device's ``containerEdits``. One spec file per claim, one device in it named by the
claim's UID, so two claims never share a file and unprepare removes exactly one.

The edits are the ones the device plugin path answers Allocate with
(``tessera.node.isolation.container_edits``): the limits folder read-only, the usage and
allowance folders, libvgpu and its read-only ``/etc/ld.so.preload``, and the card
visibility (``NVIDIA_VISIBLE_DEVICES``, or NVIDIA's own CDI IDs returned beside ours).
"""

from __future__ import annotations

import json
from typing import Any

from tessera.claims.devices import DRIVER
from tessera.node.isolation import ContainerEdits

__all__ = ["CDI_CLASS", "CDI_KIND", "CDI_VERSION", "cdi_device_id", "cdi_spec", "spec_file_name"]

CDI_VERSION = "0.6.0"  # the oldest version with everything used here; runtimes read newer
CDI_CLASS = "claim"
CDI_KIND = f"{DRIVER}/{CDI_CLASS}"


def cdi_device_id(claim_uid: str) -> str:
    return f"{CDI_KIND}={claim_uid}"


def spec_file_name(claim_uid: str) -> str:
    return f"{DRIVER}-{CDI_CLASS}_{claim_uid}.json"


def cdi_spec(claim_uid: str, edits: ContainerEdits) -> str:
    """The spec file's text: one device, ``claim_uid``, with ``edits`` (stable bytes)."""
    container_edits: dict[str, Any] = {
        "env": [f"{k}={v}" for k, v in sorted(edits.envs.items())],
        "mounts": [
            {
                "hostPath": m.host_path,
                "containerPath": m.container_path,
                "options": ["ro" if m.read_only else "rw", "nosuid", "nodev", "rbind"],
            }
            for m in edits.mounts
        ],
    }
    spec = {
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "devices": [{"name": claim_uid, "containerEdits": container_edits}],
    }
    return json.dumps(spec, indent=2, sort_keys=True) + "\n"
