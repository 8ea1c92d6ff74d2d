"""tests/mutants.py: a mutant goes into the class it came from, and back out."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import mutants

SOURCE = """\
class A:
    def run(self) -> int:
        return 1


class B:
    @staticmethod
    def run() -> int:
        return 2


def free(x: int) -> int:
    return x + 1
"""

# What mutmut writes into mutants/: each mutant a function named after it, in place.
MUTATED = """\
class A:
    def xǁAǁrun__mutmut_1(self) -> int:
        return 10


class B:
    @staticmethod
    def xǁBǁrun__mutmut_1() -> int:
        return 20


def x_free__mutmut_1(x: int) -> int:
    return x - 1
"""


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "mutants" / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "mod.py").write_text(SOURCE)
    (tmp_path / "mutants" / "src" / "pkg" / "mod.py").write_text(MUTATED)
    monkeypatch.setattr(mutants, "REPO", tmp_path)
    return tmp_path


def _run(text: str) -> tuple[int, int, int]:
    scope: dict[str, object] = {}
    exec(compile(text, "mod", "exec"), scope)
    a, b, free = scope["A"], scope["B"], scope["free"]
    return a().run(), b.run(), free(1)  # type: ignore[attr-defined, operator]


def test_each_mutant_lands_in_its_own_class_or_function(repo: Path) -> None:
    assert _run(SOURCE) == (1, 2, 2)
    _, text = mutants.mutated("pkg.mod.xǁBǁrun__mutmut_1")  # B's run, not A's
    assert _run(text) == (1, 20, 2)
    _, text = mutants.mutated("pkg.mod.x_free__mutmut_1")
    assert _run(text) == (1, 2, 0)
    assert (repo / "src" / "pkg" / "mod.py").read_text() == SOURCE  # only read


def test_check_restores_the_file_and_names_the_survivors(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[str] = []

    class Done:
        def __init__(self, code: int) -> None:
            self.returncode = code

    def fake_pytest(argv: list[str], **_: object) -> Done:
        text = (repo / "src" / "pkg" / "mod.py").read_text()
        ran.append(text)
        return Done(0 if _run(text)[1] == 2 else 1)  # the tests look at B only

    monkeypatch.setattr(mutants.subprocess, "run", fake_pytest)
    names = ["pkg.mod.xǁAǁrun__mutmut_1", "pkg.mod.xǁBǁrun__mutmut_1"]
    assert mutants.check(names, ["tests/x.py"]) == ["pkg.mod.xǁAǁrun__mutmut_1"]
    assert [_run(t) for t in ran] == [(10, 2, 2), (1, 20, 2)]
    assert (repo / "src" / "pkg" / "mod.py").read_text() == SOURCE
