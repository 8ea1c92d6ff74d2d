"""Tessera's error tree. Foreign errors are translated once, at the adapter boundary.

TesseraError
├── SpecError         a user's request (Pod spec, annotation, CLI input) breaks a rule
├── FormatError       a system annotation or file does not decode (docs/protocol.md)
└── PlacementError    a request cannot be placed; carries the per-node reasons
"""

from __future__ import annotations

__all__ = ["FormatError", "PlacementError", "SpecError", "TesseraError"]


class TesseraError(Exception):
    """Base of every error Tessera raises on purpose."""


class SpecError(TesseraError, ValueError):
    """A request breaks a rule. ``field`` names where, ``rule`` says what is required."""

    def __init__(self, field: str, rule: str, value: object = None) -> None:
        self.field = field
        self.rule = rule
        self.value = value
        got = "" if value is None else f" (got {value!r})"
        super().__init__(f"{field}: {rule}{got}")


class FormatError(TesseraError, ValueError):
    """A system annotation or file is malformed. ``what`` names the annotation or file;
    ``kind`` is a short fixed word for metrics (``truncated``, ``unknown_version``, ...)."""

    def __init__(self, what: str, problem: str, kind: str = "malformed") -> None:
        self.what = what
        self.problem = problem
        self.kind = kind
        super().__init__(f"{what}: {problem}")


class PlacementError(TesseraError):
    """No node can take the request. ``reasons`` maps node name to why not."""

    def __init__(self, message: str, reasons: dict[str, str] | None = None) -> None:
        self.reasons = dict(reasons or {})
        super().__init__(message)
