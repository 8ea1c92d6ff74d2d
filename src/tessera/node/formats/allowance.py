"""The allowance file (docs/protocol.md, "### Allowance file, version 1"): per card, the
compute the burst-share coordinator lets a tenant use now; libvgpu reads it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from tessera.errors import FormatError
from tessera.node.formats.limits import MAX_CARDS, parse_int, parse_lines

__all__ = ["decode_allowance", "encode_allowance", "write_allowance"]

_WHAT = "allowance file"


def encode_allowance(percent: Mapping[int, int], written_unix_ms: int) -> str:
    """The allowance file's text: per card ordinal, the allowance in percent."""
    lines = ["version=1", f"written_unix_ms={written_unix_ms}"]
    for ordinal in sorted(percent):
        if not 0 <= ordinal < MAX_CARDS or not 0 <= percent[ordinal] <= 100:
            raise FormatError(_WHAT, f"card.{ordinal}.percent={percent[ordinal]} is out of range")
        lines.append(f"card.{ordinal}.percent={percent[ordinal]}")
    return "\n".join(lines) + "\n"


def decode_allowance(text: str) -> tuple[int, dict[int, int]]:
    """(written_unix_ms, {ordinal: percent}) from the file's text."""
    kv = parse_lines(_WHAT, text)
    if "written_unix_ms" not in kv:
        raise FormatError(_WHAT, "missing key 'written_unix_ms'")
    written = parse_int(_WHAT, "written_unix_ms", kv["written_unix_ms"], 0, 10**18 - 1)
    percent = {}
    for key, value in kv.items():
        parts = key.split(".")
        if len(parts) == 3 and parts[0] == "card" and parts[2] == "percent":
            ordinal = parse_int(_WHAT, key, parts[1], 0, MAX_CARDS - 1)
            percent[ordinal] = parse_int(_WHAT, key, value, 0, 100)
    return written, percent


def write_allowance(path: str | Path, percent: Mapping[int, int], written_unix_ms: int) -> None:
    """Replace the file atomically (temp file + rename in the same directory)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(encode_allowance(percent, written_unix_ms))
    os.replace(tmp, path)
