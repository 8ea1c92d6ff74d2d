"""Regenerate the Python code of the kubelet APIs (device plugin, pod-resources, DRA, DRA
resource health and plugin registration) from the checked-in ``.proto`` files.

    .venv/bin/python -m tessera.node.deviceplugin.generate

Runs grpcio-tools' protoc with ``src/`` as the include root, so the generated modules
import each other as ``tessera.node.deviceplugin.v1beta1...`` (a package import, not a
top-level ``api_pb2``).
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["PROTOS", "main"]

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[2]  # .../src
PROTOS = (
    ("deviceplugin/v1beta1", "api.proto"),
    ("deviceplugin/v1beta1", "podresources.proto"),
    ("dra/v1", "dra.proto"),
    ("dra/v1", "registration.proto"),
    ("dra/v1alpha1", "health.proto"),
)


def main() -> int:
    from grpc_tools import protoc  # dev dependency; imported only here

    for where, name in PROTOS:
        folder = HERE.parent / where
        proto = folder / name
        args = [
            "grpc_tools.protoc",
            f"-I{SRC}",
            f"--python_out={SRC}",
            f"--pyi_out={SRC}",
            f"--grpc_python_out={SRC}",
            str(proto.relative_to(SRC)),
        ]
        rc = int(protoc.main(args))
        if rc != 0:
            print(f"protoc failed on {proto.name} (exit {rc})", file=sys.stderr)
            return rc
        (folder / "__init__.py").touch()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
