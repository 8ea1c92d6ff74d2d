"""The CEL selectors of ResourceClaims and DeviceClasses, evaluated against this driver's
devices as kube-scheduler's DRA allocator evaluates them (pure; ``kubectl tessera why``).

The variable ``device`` is built from a ResourceSlice device: ``driver``, and
``attributes`` by domain (a name without a domain is the driver's), each the typed value
the slice gives (string, int, bool; a version as its string). ``capacity`` is left
out: its values are Kubernetes quantities, with ``quantity()`` and its methods, which the
CEL library here does not have. A selector that reads them, calls Kubernetes' own
functions (``semver``) or names an attribute a device lacks does not evaluate; it is then
not weighed, and said so. The library is the optional ``cel`` extra
(common-expression-language); without it no selector is weighed.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import ModuleType
from typing import Any


def _load() -> ModuleType | None:
    try:
        return importlib.import_module("cel")
    except ImportError:  # the extra is not installed: nothing is evaluated
        return None


cel = _load()

__all__ = ["Selector", "device_variable"]

_TYPED = ("string", "int", "bool", "version")


def device_variable(dev: Mapping[str, Any], driver: str) -> dict[str, Any]:
    """``device`` as a selector sees one device of ``driver``'s ResourceSlice."""
    attributes: dict[str, dict[str, Any]] = {}
    for name, value in (dev.get("attributes") or {}).items():
        domain, _, short = str(name).rpartition("/")
        typed = next((value[k] for k in _TYPED if isinstance(value, Mapping) and k in value), None)
        if typed is not None:
            attributes.setdefault(domain or driver, {})[short] = typed
    return {"driver": driver, "attributes": attributes}


class Selector:
    """One CEL expression, compiled once; ``problem`` says why it cannot be weighed
    (the library missing, a syntax error, or the first evaluation that failed)."""

    def __init__(self, expression: str) -> None:
        self.expression = expression
        self.problem = "" if cel is not None else "CEL is not installed (the cel extra)"
        self._program: Any = None
        if cel is not None:
            try:
                self._program = cel.compile(expression)
            except ValueError as exc:
                self.problem = str(exc).splitlines()[0]

    def test(self, device: Mapping[str, Any]) -> bool | None:
        """Whether the device passes; None when the expression does not evaluate to a
        boolean for it (``problem`` then says why)."""
        if self._program is None:
            return None
        try:
            got = self._program.execute({"device": device})
        except Exception as exc:  # the library raises KeyError, RuntimeError, TypeError...
            self.problem = self.problem or f"{type(exc).__name__}: {exc}"
            return None
        if not isinstance(got, bool):
            self.problem = self.problem or f"gives {type(got).__name__}, not a boolean"
            return None
        return got
