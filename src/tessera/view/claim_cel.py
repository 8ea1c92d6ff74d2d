"""The CEL selectors of ResourceClaims and DeviceClasses, evaluated against this driver's
devices as kube-scheduler's DRA allocator evaluates them (pure; ``kubectl tessera why``).

The variable ``device`` is built from a ResourceSlice device: ``driver``,
``allowMultipleAllocations``, and ``attributes`` and ``capacity`` by domain (a name
without a domain is the driver's). An attribute is the typed value the slice gives
(string, int, bool, or a version as Kubernetes' semver); a capacity is a quantity.
Kubernetes' quantity and semver functions are those of ``cel_kube.py``. A selector that
calls another Kubernetes function (``isIP``, ``url``...) or names an attribute a device
lacks does not evaluate; it is then not weighed, and said so. The library is the
optional ``cel`` extra (common-expression-language); without it no selector is weighed.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from tessera.view.cel_kube import FUNCTIONS, CelArgumentError, quantity_value, semver_value


def _load() -> ModuleType | None:
    try:
        return importlib.import_module("cel")
    except ImportError:  # the extra is not installed: nothing is evaluated
        return None


cel = _load()
# The library logs every failed call of a function to its logger; the failure is kept in
# the selector's ``problem``, so it is not printed a second time beside the command's output.
logging.getLogger("cel").addHandler(logging.NullHandler())

__all__ = ["Selector", "device_variable"]

_TYPED = ("string", "int", "bool")


def device_variable(dev: Mapping[str, Any], driver: str) -> dict[str, Any]:
    """``device`` as a selector sees one device of ``driver``'s ResourceSlice. A value
    Kubernetes would not read either (a version that is no semver, a capacity that is
    no quantity) is left out, so a selector naming it does not evaluate."""
    attributes: dict[str, dict[str, Any]] = {}
    for name, value in (dev.get("attributes") or {}).items():
        if not isinstance(value, Mapping):
            continue
        typed = next((value[k] for k in _TYPED if k in value), None)
        if isinstance(value.get("version"), str):
            typed = _or_none(semver_value, value["version"])
        if typed is not None:
            attributes.setdefault(_domain(name, driver), {})[_short(name)] = typed
    capacity: dict[str, dict[str, Any]] = {}
    for name, value in (dev.get("capacity") or {}).items():
        raw = value.get("value") if isinstance(value, Mapping) else None
        amount = _or_none(quantity_value, raw) if isinstance(raw, str) else None
        if amount is not None:
            capacity.setdefault(_domain(name, driver), {})[_short(name)] = amount
    return {
        "driver": driver,
        "allowMultipleAllocations": dev.get("allowMultipleAllocations") is True,
        "attributes": attributes,
        "capacity": capacity,
    }


def _domain(name: object, driver: str) -> str:
    return str(name).rpartition("/")[0] or driver


def _short(name: object) -> str:
    return str(name).rpartition("/")[2]


def _or_none(read: Callable[[str], Any], raw: str) -> Any:
    try:
        return read(raw)
    except CelArgumentError:
        return None


def _context() -> Any:
    assert cel is not None
    context = cel.Context()
    for name, function in FUNCTIONS.items():
        context.add_function(name, function)
    return context


class Selector:
    """One CEL expression, compiled once; ``problem`` says why it cannot be weighed
    (the library missing, a syntax error, or the first evaluation that failed)."""

    def __init__(self, expression: str) -> None:
        self.expression = expression
        self.problem = "" if cel is not None else "CEL is not installed (the cel extra)"
        self._program: Any = None
        self._context: Any = None
        if cel is not None:
            self._context = _context()
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
            self._context.add_variable("device", device)
            got = self._program.execute(self._context)
        except Exception as exc:  # the library raises KeyError, RuntimeError, TypeError...
            self.problem = self.problem or f"{type(exc).__name__}: {exc}"
            return None
        if not isinstance(got, bool):
            self.problem = self.problem or f"gives {type(got).__name__}, not a boolean"
            return None
        return got
