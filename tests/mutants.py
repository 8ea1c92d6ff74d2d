"""Run mutmut's survivors again by hand, each in its own class (docs/testing.md).

``mutmut apply`` writes a method's mutant into the first class of the file that has a
method of that name; this copies it from ``mutants/`` into the class it came from. The
checked file is restored from memory after each mutant, so uncommitted edits elsewhere
in the checkout (and in that file) are kept.

    python tests/mutants.py apply NAME            # write one mutant into src/
    python tests/mutants.py check FILE... < NAMES # each name: killed or SURVIVED

NAME is as ``mutmut results`` prints it, e.g. ``tessera.kube.binder.xǁAioBinderǁbind__mutmut_52``
or ``tessera.model.clusterspec.x_make_cards__mutmut_7``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
Function = ast.FunctionDef | ast.AsyncFunctionDef


def _where(name: str) -> tuple[Path, str, str | None, str]:
    """(source file, mutant function's name, class or None, the function it mutates)."""
    module, _, mutant = name.rpartition(".")
    path = REPO / "src" / (module.replace(".", "/") + ".py")
    base = mutant.split("__mutmut_")[0]
    if "ǁ" in base:  # xǁClassǁmethod
        _, cls, function = base.split("ǁ")
        return path, mutant, cls, function
    return path, mutant, None, base.removeprefix("x_")


def _span(node: Function) -> tuple[int, int]:
    first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
    return first - 1, node.end_lineno or node.lineno


def _find(body: list[ast.stmt], name: str) -> Function:
    [found] = [n for n in body if isinstance(n, Function) and n.name == name]
    return found


def mutated(name: str) -> tuple[Path, str]:
    """The source file and its text with the mutant in place of the original."""
    path, mutant, cls, function = _where(name)
    copy = (REPO / "mutants" / path.relative_to(REPO)).read_text()
    [node] = [n for n in ast.walk(ast.parse(copy))
              if isinstance(n, Function) and n.name == mutant]  # fmt: skip
    start, end = _span(node)
    code = textwrap.dedent("".join(copy.splitlines(keepends=True)[start:end]))
    code = code.replace(f"def {mutant}(", f"def {function}(", 1)
    text = path.read_text()
    tree = ast.parse(text)
    scope = tree.body
    if cls is not None:
        [klass] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
        scope = klass.body
    original = _find(scope, function)
    start, end = _span(original)
    lines = text.splitlines(keepends=True)
    lines[start:end] = [textwrap.indent(code, " " * original.col_offset)]
    return path, "".join(lines)


def check(names: list[str], files: list[str]) -> list[str]:
    """The names whose mutant every test in ``files`` passes with (pytest -x each)."""
    survived = []
    for name in names:
        path, text = mutated(name)
        before = path.read_text()
        try:
            path.write_text(text)
            run = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p",
                                  "no:cacheprovider", *files], cwd=REPO,
                                 capture_output=True, check=False)  # fmt: skip
        finally:
            path.write_text(before)
        verdict = "SURVIVED" if run.returncode == 0 else "killed"
        print(f"{verdict} {name}", flush=True)
        if run.returncode == 0:
            survived.append(name)
    return survived


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "apply":
        path, text = mutated(argv[1])
        path.write_text(text)
        return 0
    if len(argv) >= 2 and argv[0] == "check":
        names = [line.split(":")[0].strip() for line in sys.stdin if line.strip()]
        return 1 if check(names, argv[1:]) else 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
