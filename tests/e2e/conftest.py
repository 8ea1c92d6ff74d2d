"""Fixtures that start a real control plane (testenv). Only e2e tests use them.

- ``testenv_binaries`` (session): builds or reuses the cached binaries, with progress;
- ``testenv`` (session): one shared, ready environment (no nodes created up front);
- ``start_testenv`` (function): a factory for extra environments, e.g. with a scheduler
  config naming an extender; each one is stopped when the test ends, pass or fail.

Every process is tied to the pytest process (PR_SET_PDEATHSIG), so even a killed test
run leaves nothing running.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tessera.testenv import Binaries, TestEnv, TestEnvError, ensure_binaries


def _say(config: pytest.Config) -> Callable[[str], None]:
    reporter = config.pluginmanager.getplugin("terminalreporter")

    def say(message: str) -> None:
        if reporter is not None:
            reporter.write_line(f"[testenv] {message}")

    return say


@pytest.fixture(scope="session")
def testenv_binaries(pytestconfig: pytest.Config) -> Binaries:
    try:
        return ensure_binaries(progress=_say(pytestconfig))
    except TestEnvError as exc:
        pytest.fail(f"cannot build the test control plane: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def testenv(
    testenv_binaries: Binaries,
    tmp_path_factory: pytest.TempPathFactory,
    pytestconfig: pytest.Config,
) -> Iterator[TestEnv]:
    env = TestEnv.start(
        tmp_path_factory.mktemp("testenv"),
        binaries=testenv_binaries,
        progress=_say(pytestconfig),
    )
    try:
        yield env
    finally:
        env.stop()


StartTestEnv = Callable[..., TestEnv]


@pytest.fixture
def start_testenv(
    testenv_binaries: Binaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StartTestEnv]:
    """``start_testenv(scheduler_config=..., **kwargs)`` -> a started ``TestEnv``."""
    started: list[TestEnv] = []

    def start(state_dir: Path | None = None, **kwargs: Any) -> TestEnv:
        env = TestEnv.start(
            state_dir or tmp_path_factory.mktemp("env"), binaries=testenv_binaries, **kwargs
        )
        started.append(env)
        return env

    try:
        yield start
    finally:
        for env in started:
            env.stop()
