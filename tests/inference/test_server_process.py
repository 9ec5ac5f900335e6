"""`bert-tasks serve` as a real process on a free loopback port, spoken to over HTTP: every endpoint, every
client mistake, micro-batching seen in /info's counters, and graceful shutdown on SIGTERM and SIGINT
with requests in flight (none lost, exit status 0). Each server is started and stopped by its test,
every request has a timeout. Slow: each start imports torch and loads a model (~5 s on 2 cores).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.inference.server_cases import ERROR_CASES, MAX_CHARS, MAX_TEXTS

pytestmark = pytest.mark.slow

TIMEOUT = 60  # seconds, for any one request, start or stop


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def server(
    model_dir: Path, log: Path, *flags: str, omp_threads: str | None = "1"
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A `bert-tasks serve sentiment` process and its base URL, once /health answers; killed if left.
    `omp_threads`: its OMP_NUM_THREADS (None: unset, so the server picks its thread count itself)."""
    port = free_port()
    env = {name: value for name, value in os.environ.items() if name != "OMP_NUM_THREADS"}
    if omp_threads is not None:
        env["OMP_NUM_THREADS"] = omp_threads
    command = [sys.executable, "-m", "bert_tasks", "serve", "sentiment", "--model", str(model_dir)]
    with log.open("wb") as output:
        process = subprocess.Popen(
            [*command, "--port", str(port), *flags],
            stdout=output,
            stderr=subprocess.STDOUT,
            env=env,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + TIMEOUT
        while True:
            assert process.poll() is None, log.read_text()
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        yield process, url
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=TIMEOUT)


def predict(url: str, texts: list[str]) -> httpx.Response:
    return httpx.post(f"{url}/predict", json={"texts": texts}, timeout=TIMEOUT)


def test_every_endpoint_every_client_mistake_and_batching(sentiment_run: Path, tmp_path: Path) -> None:
    """One server: each endpoint, each mistake's status and line, then 32 clients at once with one text
    each: far fewer model calls than requests (/info's counters), each client its own answer."""
    flags = ["--max-texts", str(MAX_TEXTS), "--max-chars", str(MAX_CHARS), "--max-wait-ms", "200"]
    with server(sentiment_run, tmp_path / "log", *flags) as (process, url):
        assert httpx.get(f"{url}/health", timeout=TIMEOUT).json() == {"status": "ok"}
        info = httpx.get(f"{url}/info", timeout=TIMEOUT).json()
        assert (info["task"], info["pid"], info["limits"]["max_texts"]) == (
            "sentiment",
            process.pid,
            MAX_TEXTS,
        )
        assert "/predict" in httpx.get(f"{url}/openapi.json", timeout=TIMEOUT).json()["paths"]
        body = {"records": [{"id": "r1", "text": "Good."}]}
        [record] = httpx.post(f"{url}/predict", json=body, timeout=TIMEOUT).json()["records"]
        assert record["id"] == "r1" and record["label"] in info["labels"]
        for name, content, status, message in ERROR_CASES:
            answer = httpx.post(f"{url}/predict", content=content, timeout=TIMEOUT)
            assert answer.status_code == status, (name, answer.text)
            assert answer.json()["detail"].startswith(message), (name, answer.text)

        before = httpx.get(f"{url}/info", timeout=TIMEOUT).json()["counters"]
        texts = [f"review number {n} is {'great' if n % 2 else 'awful'}" for n in range(32)]
        with ThreadPoolExecutor(32) as clients:
            answers = list(clients.map(lambda text: predict(url, [text]), texts))
        after = httpx.get(f"{url}/info", timeout=TIMEOUT).json()["counters"]
    assert [answer.json()["records"][0]["text"] for answer in answers] == texts
    assert (after["requests"] - before["requests"], after["texts"] - before["texts"]) == (32, 32)
    assert after["batches"] - before["batches"] <= 8, (before, after)


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_finishes_the_requests_in_flight_and_exits_0(
    sentiment_run: Path, tmp_path: Path, stop: signal.Signals
) -> None:
    """The requests wait in the batcher (a 3 s batching window) when the signal comes: every one is
    answered with its own records, new connections are refused, and the process exits with status 0."""
    log = tmp_path / "log"
    with server(sentiment_run, log, "--max-wait-ms", "3000") as (process, url):
        texts = [f"in flight {n}" for n in range(6)]
        with ThreadPoolExecutor(len(texts)) as clients:
            pending = [clients.submit(predict, url, [text]) for text in texts]
            deadline = time.monotonic() + TIMEOUT
            while httpx.get(f"{url}/info", timeout=TIMEOUT).json()["counters"]["requests"] < len(texts):
                assert time.monotonic() < deadline
                time.sleep(0.05)
            process.send_signal(stop)
            answers = [future.result(timeout=TIMEOUT) for future in pending]
        assert process.wait(timeout=TIMEOUT) == 0, log.read_text()
    assert [answer.status_code for answer in answers] == [200] * len(texts)
    assert [answer.json()["records"][0]["text"] for answer in answers] == texts
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/health", timeout=5)
    assert "Application shutdown complete" in log.read_text()


def test_workers_share_the_port_each_with_its_model(sentiment_run: Path, tmp_path: Path) -> None:
    """--workers 2: two processes answer on one port (stateless replicas), sharing the cores between
    them (each torch would take them all); SIGTERM stops them all, exit 0."""
    with server(sentiment_run, tmp_path / "log", "--workers", "2", omp_threads=None) as (process, url):
        threads: dict[int, int] = {}
        deadline = time.monotonic() + TIMEOUT
        while len(threads) < 2 and time.monotonic() < deadline:  # the second worker may still be loading
            with httpx.Client(
                timeout=TIMEOUT
            ) as fresh:  # a new connection each time: either worker may take it
                info = fresh.get(f"{url}/info", headers={"connection": "close"}).json()
                threads[info["pid"]] = info["threads"]
            assert predict(url, ["Good."]).status_code == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=TIMEOUT) == 0
    assert len(threads) == 2 and process.pid not in threads
    assert set(threads.values()) == {max(1, len(os.sched_getaffinity(0)) // 2)}
