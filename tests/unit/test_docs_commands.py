"""Every command the docs name exists: `kubectl tessera X`, `tessera X [Y] [--flag]` and
`make X`, read from the CLIs themselves and the Makefile; and the defaults that
operations.md's flag tables give are the commands' own."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import typer

from tessera.cli import app as tessera_app
from tessera.view.kubectl import app as kubectl_app

REPO = Path(__file__).resolve().parents[2]
DOCS = {p.name: p.read_text() for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]}
KUBECTL = r"kubectl tessera ([a-z][a-z-]*)"
TESSERA = r"`tessera ([a-z][a-z0-9 =.,/-]*)`?"
MAKE = r"`make ([a-z][a-z-]*)"


def _named(pattern: str, docs: dict[str, str]) -> dict[str, list[str]]:
    """What ``pattern``'s group captures in the docs -> the docs that name it."""
    out: dict[str, list[str]] = {}
    for name, text in docs.items():
        for what in sorted(set(re.findall(pattern, text))):
            out.setdefault(what, []).append(name)
    return out


def _group(app: typer.Typer) -> Any:
    """The app as its command line sees it: a group whose ``commands`` are by name."""
    group = typer.main.get_command(app)
    assert hasattr(group, "commands")
    return group


def _missing_kubectl(docs: dict[str, str]) -> dict[str, list[str]]:
    have = set(_group(kubectl_app).commands)
    return {c: w for c, w in _named(KUBECTL, docs).items() if c not in have}


def _missing_tessera(docs: dict[str, str]) -> dict[str, list[str]]:
    """Commands walked word by word down the groups; a flag must be the command's."""
    missing = {}
    for text, where in _named(TESSERA, docs).items():
        command = _group(tessera_app)
        for word in text.split():
            if word == "--":
                break  # what follows is handed on (dev-cluster kubectl)
            if word.startswith("-"):
                opts = {o for p in command.params for o in getattr(p, "opts", [])}
                if word.split("=")[0] not in opts:
                    missing[text] = where
                break
            if not hasattr(command, "commands"):
                break  # an argument of the command
            command = command.commands.get(word)
            if command is None:
                missing[text] = where
                break
    return missing


def _missing_make(docs: dict[str, str]) -> dict[str, list[str]]:
    targets = set(re.findall(r"^([a-z][a-z-]*):", (REPO / "Makefile").read_text(), re.M))
    return {t: w for t, w in _named(MAKE, docs).items() if t not in targets}


def test_every_command_the_docs_name_exists() -> None:
    assert {"top", "why", "cordon"} <= _named(KUBECTL, DOCS).keys()  # the reading works
    assert {"demo", "test"} <= _named(MAKE, DOCS).keys()
    assert "scheduler --web" in _named(TESSERA, DOCS)
    assert _missing_kubectl(DOCS) == {}
    assert _missing_tessera(DOCS) == {}
    assert _missing_make(DOCS) == {}


@pytest.mark.parametrize(
    "line",
    [
        "kubectl tessera topp",
        "`tessera simulate --seedz 3`",
        "`tessera dev-cluster upp`",
        "`make tests`",
    ],
)
def test_a_misnamed_command_is_caught(line: str) -> None:
    docs = {"x.md": line}
    assert {**_missing_kubectl(docs), **_missing_tessera(docs), **_missing_make(docs)}


FLAG_ROW = r"^\| `(--[a-z-]+)` \| ([^|]+) \|"  # | `--flag` | default | when to change it |


def _reads_as(told: str, default: Any) -> bool:
    """Whether a table's default cell (backticks and remarks gone) says ``default``."""
    if isinstance(default, bool):
        return told == ("on" if default else "off")
    if default == "":
        return told in ('""', "off")
    if isinstance(default, int | float):
        try:
            return float(told.removesuffix(" s")) == float(default)
        except ValueError:
            return False
    return told == str(default)


def _defaults_told_wrong(text: str) -> dict[str, tuple[str, Any]]:
    """Rows of the docs' flag tables whose default is not the command's: flag -> (what
    the row says, the default), the default None for a flag neither command has."""
    commands = _group(tessera_app).commands
    wrong = {}
    for flag, cell in re.findall(FLAG_ROW, text, re.M):
        told = cell.split(" (")[0].replace("`", "").strip()
        params = [p for name in ("scheduler", "node-agent") for p in commands[name].params
                  if flag in getattr(p, "opts", []) + getattr(p, "secondary_opts", [])]  # fmt: skip
        if len(params) != 1:
            wrong[flag] = (told, None)
            continue
        if not _reads_as(told, params[0].default):
            wrong[flag] = (told, params[0].default)
    return wrong


def test_the_defaults_operations_md_gives_are_the_commands() -> None:
    text = DOCS["operations.md"]
    assert len(re.findall(FLAG_ROW, text, re.M)) >= 10  # the reading works
    assert _defaults_told_wrong(text) == {}


def test_a_default_told_wrong_is_caught() -> None:
    rows = "| `--slots-per-card` | 8 | x |\n| `--leader-elect` | off | x |\n| `--nope` | 1 | x |"
    assert _defaults_told_wrong(rows) == {
        "--slots-per-card": ("8", 16),
        "--leader-elect": ("off", True),
        "--nope": ("1", None),
    }
