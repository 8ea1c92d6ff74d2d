"""Shared test helpers. Fixtures that start a cluster live in tests/e2e/conftest.py only."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"
OPENB = SHARED_DATA / "alibaba-gpu-v2023"


@pytest.fixture(scope="session")
def openb_dir() -> Path:
    """The Alibaba 2023 trace beside the checkout (../shared/data), or skip."""
    if not (OPENB / "openb_node_list_gpu_node.csv").exists():
        pytest.skip("../shared/data/alibaba-gpu-v2023 is not beside this checkout")
    return OPENB
