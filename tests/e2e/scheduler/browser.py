"""The GPU map page in a real browser: headless Chromium's DOM after the page's script
ran, parsed into elements, and a screenshot."""

from __future__ import annotations

import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

__all__ = ["Elements", "browser"]


class Elements(HTMLParser):
    """Every element's tag, attributes and own text, in document order."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, dict[str, str], list[str]]] = []
        self._open: list[int] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.append((tag, {k: v or "" for k, v in attrs}, []))
        if tag not in ("input", "meta", "br", "img"):
            self._open.append(len(self.found) - 1)

    def handle_endtag(self, tag: str) -> None:
        if self._open:
            self._open.pop()

    def handle_data(self, data: str) -> None:
        for i in self._open:
            self.found[i][2].append(data)

    def by_id(self, ident: str) -> tuple[dict[str, str], str]:
        [(attrs, text)] = [(a, "".join(x)) for _, a, x in self.found if a.get("id") == ident]
        return attrs, text

    def with_class(self, cls: str) -> list[tuple[str, dict[str, str], str]]:
        return [(t, a, "".join(x)) for t, a, x in self.found
                if cls in a.get("class", "").split()]  # fmt: skip


def browser(url: str, out: Path) -> Elements:
    """Headless Chromium: the DOM after the page's script ran, and a screenshot."""
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("no chromium (Debian package; `make test` installs it as root)")
    base = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            f"--user-data-dir={out / 'profile'}", "--virtual-time-budget=10000",
            "--window-size=1400,1000"]  # fmt: skip
    dom = subprocess.run([*base, "--dump-dom", url], capture_output=True, text=True,
                         timeout=120, check=True).stdout  # fmt: skip
    subprocess.run([*base, f"--screenshot={out / 'gpus.png'}", url], capture_output=True,
                   timeout=120, check=True)  # fmt: skip
    parsed = Elements()
    parsed.feed(dom)
    return parsed
