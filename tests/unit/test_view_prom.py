"""Live use from Prometheus's HTTP API: both queries read into one key per container or
claim and card, and every answer that is not a result is an OSError that says why
(``kubectl tessera top --prometheus`` prints it instead of a traceback)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from tessera.view.prom import ACHIEVED, MEMORY_USED, container_use, query

Answer = tuple[int, str, bytes]  # status, content type, body


class FakePrometheus:
    """/api/v1/query answering what ``answers[promql]`` holds; the queries it was asked."""

    def __init__(self) -> None:
        self.answers: dict[str, Answer] = {}
        self.asked: list[str] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlparse(self.path)
                [promql] = parse_qs(url.query)["query"] if url.path == "/api/v1/query" else [""]
                owner.asked.append(promql)
                status, kind, body = owner.answers.get(promql, (404, "text/plain", b"404"))
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"

    def vector(self, promql: str, series: list[tuple[dict[str, str], str]]) -> None:
        result = [{"metric": m, "value": [1700000000.0, v]} for m, v in series]
        body = {"status": "success", "data": {"resultType": "vector", "result": result}}
        self.answers[promql] = (200, "application/json", json.dumps(body).encode())


def _vector(data: dict[str, Any]) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "vector", **data}}).encode()


@pytest.fixture
def prom() -> Iterator[FakePrometheus]:
    p = FakePrometheus()
    yield p
    p.server.shutdown()
    p.server.server_close()


def test_memory_and_achieved_share_join_per_container_and_claim(prom: FakePrometheus) -> None:
    ctr = {"node": "n", "namespace": "team", "pod": "train", "container": "main",
           "uuid": "GPU-a", "model": "A100"}  # fmt: skip
    claim = {"node": "n", "namespace": "team", "claim": "shared", "uuid": "GPU-b"}
    prom.vector(MEMORY_USED, [(ctr, "1048576"), (claim, "2097152")])
    prom.vector(ACHIEVED, [({**ctr, "__name__": "x"}, "37.5")])  # irate drops the name
    assert container_use(prom.url) == {
        ("team", "train", "main", "GPU-a"): (1048576.0, 37.5),
        ("team", "", "claim/shared", "GPU-b"): (2097152.0, None),  # no busy time yet
    }
    assert prom.asked == [MEMORY_USED, ACHIEVED]


def test_a_query_reads_each_series_as_its_labels_and_value(prom: FakePrometheus) -> None:
    prom.vector("up", [({"job": "a", "instance": "x:1"}, "1"), ({}, "NaN")])
    [(labels, up), (none, nan)] = query(prom.url, "up")
    assert (labels, up, none) == ({"job": "a", "instance": "x:1"}, 1.0, {})
    assert nan != nan  # Prometheus's NaN, read as one
    prom.vector("none", [])
    assert query(prom.url, "none") == []


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        ((400, "application/json",
          b'{"status":"error","errorType":"bad_data","error":"parse error at char 3"}'),
         "failed: parse error at char 3"),
        ((503, "application/json", b'{"status":"unavailable"}'),
         "failed: {'status': 'unavailable'}"),
        ((200, "application/json",
          b'{"status":"success","data":{"resultType":"matrix","result":[]}}'),
         "expected a vector, got matrix"),
        ((200, "text/html", b"<html>Grafana</html>"),
         "HTTP 200, not an answer of Prometheus's API"),
        ((404, "text/plain", b"404 page not found"),
         "HTTP 404, not an answer of Prometheus's API"),
        ((200, "application/json", b"[1, 2]"), "HTTP 200, not an answer of Prometheus's API"),
        # A vector whose series are not Prometheus's (a proxy's, another version's): said,
        # not an AssertionError or a TypeError.
        ((200, "application/json", _vector({"result": [{"metric": {}, "value": "7"}]})),
         "a vector that is not Prometheus's (each series its labels and a [time, value] "
         "pair): [{'metric': {}, 'value': '7'}]"),
        ((200, "application/json", _vector({"result": [{"metric": [], "value": [1, "7"]}]})),
         "[{'metric': [], 'value': [1, '7']}]"),
        ((200, "application/json", _vector({"result": [{"value": [1, "seven"]}]})),
         "[{'value': [1, 'seven']}]"),
        ((200, "application/json", _vector({"result": ["up"]})), "['up']"),
        ((200, "application/json", _vector({"result": {"up": 1}})), "{'up': 1}"),
    ],
)  # fmt: skip
def test_an_answer_that_is_not_a_result_says_why(
    prom: FakePrometheus, answer: Answer, says: str
) -> None:
    prom.answers["up"] = answer
    with pytest.raises(OSError) as err:
        query(prom.url, "up")
    assert str(err.value).startswith("query 'up'") and str(err.value).endswith(says)


def test_nothing_listening_is_an_oserror() -> None:
    with pytest.raises(OSError):
        query("http://127.0.0.1:9", "up", timeout_s=2)
