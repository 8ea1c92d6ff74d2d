"""A real Prometheus (the Debian package's binary) for the e2e tests, as a child process.

It scrapes the given targets every second into a throwaway folder and evaluates the given
rule files as often; ``query``, ``rules`` and ``alert_state`` ask its HTTP API. Skips
(with the reason) where the binary is not installed: ``make test`` installs it as root
(Makefile, ``view-packages``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.error import HTTPError, URLError
from urllib.parse import urlencode
from urllib.request import urlopen

import pytest
import yaml

from tessera.testenv.process import free_port
from tests.e2e.wait import wait_for

__all__ = ["Prometheus"]


class Prometheus:
    def __init__(
        self, workdir: Path, targets: dict[str, str], rule_files: tuple[Path, ...] = ()
    ) -> None:
        """``targets``: job name -> host:port serving /metrics."""
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.skip("no prometheus binary (Debian package `prometheus`; `make test` "
                        "installs it when run as root)")  # fmt: skip
        self.binary = binary
        self.dir = workdir / "prometheus"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": [addr]}]}
                for job, addr in targets.items()
            ],
        }
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = (self.dir / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [
                self.binary,
                f"--config.file={self.dir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()

        def ready() -> bool:
            try:
                with urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    return bool(r.status == 200)
            except (URLError, OSError):
                return False

        wait_for("Prometheus to be ready", ready, 60, 0.2, self.log_tail)

    def log_tail(self) -> str:
        return (self.dir / "prometheus.log").read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def _get(self, path: str, params: dict[str, Any]) -> Any:
        try:
            with urlopen(f"{self.url}{path}?{urlencode(params, doseq=True)}", timeout=10) as r:
                return json.load(r)
        except HTTPError as exc:  # 400 for a query that does not parse: keep its message
            return json.load(exc)

    def query(self, promql: str) -> dict[str, Any]:
        """The whole answer of an instant query (status, data or error)."""
        return dict(self._get("/api/v1/query", {"query": promql}))

    def label_values(self, label: str, match: str) -> list[str]:
        body = self._get(f"/api/v1/label/{label}/values", {"match[]": [match]})
        assert body.get("status") == "success", body
        return list(body["data"])

    def rules(self) -> dict[str, dict[str, Any]]:
        """Each alerting rule loaded, by name: its health, state and last error."""
        body = self._get("/api/v1/rules", {"type": "alert"})
        assert body.get("status") == "success", body
        return {r["name"]: r for g in body["data"]["groups"] for r in g["rules"]}

    def alert_state(self, name: str) -> str:
        """``firing``, ``pending`` or ``inactive``: the most advanced of the alert's series."""
        body = self._get("/api/v1/alerts", {})
        states = {a["state"] for a in body["data"]["alerts"] if a["labels"]["alertname"] == name}
        return next((s for s in ("firing", "pending") if s in states), "inactive")

    def targets_up(self) -> dict[str, str]:
        body = self._get("/api/v1/targets", {})
        return {t["labels"]["job"]: t["health"] for t in body["data"]["activeTargets"]}
