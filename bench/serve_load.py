"""Benchmark: `bert-tasks serve` under load on loopback, against the library's own batch throughput.

Bounded, and stops by itself: first the library alone (a `Predictor` in this process, set up as the
command line sets its own process, `predictor.records(texts)` over all texts in its length-sorted
batches of --max-batch: what a program calling the library gets; median of --repeats, then freed; measured
again after the server stopped, and the server compared with the faster of the two, since a shared
machine's load moves between them), then one server process
(`bert-tasks serve sentiment`, as a user starts it) and, for each number of concurrent clients and each
--texts-per-request, --requests requests of that many texts (a client sends its next request when its
answer came). Reported per client
count: texts/s against the library's, latency p50/p95/p99, errors (any status but 200, or no answer),
from /info's counters the model calls, mean texts per call, each worker's share of the texts (`--workers
N`: a client's connection stays with the worker that accepted it), the share of the wall time the model
threads were busy and the texts/s they made while busy (what the model does at the server's batches,
beside the server's own work), and the resident memory of the server's processes before the first load
and after the last.
Texts: SST-2 dev sentences (../shared/data/sst2/dev.tsv), cycled. The server is stopped with SIGTERM at
the end and its exit status checked.

The clients run in this process on the server's own cores, so what they cost is taken from the server:
they are aiohttp's, which spent 0.16-0.19 ms of CPU per one-text request here against 1.9 ms for
httpx's async client (41% of one of 2 cores at 32 clients). The "client CPU" column is this process's
CPU time during the load over its wall time (1.0 = one core). Run from the repo root:

    python bench/serve_load.py --model /tmp/serve-bench-sentiment --json bench/results/serve_load.json
    python bench/serve_load.py --model /tmp/x --requests 200 --clients 1 8      # a quick look
    python bench/serve_load.py --model /tmp/x --workers 2 --clients 32          # two worker processes
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import httpx
import psutil
from common import machine_line, quiet, read_tsv, table_header, table_row, write_json

from bert_tasks.runtime import configure_cli_process

SST2_DEV = Path(__file__).resolve().parents[2] / "shared" / "data" / "sst2" / "dev.tsv"


def library_throughput(model: str, texts: list[str], batch: int, repeats: int) -> float:
    """Texts/s of one `Predictor.records(texts)` call in batches of `batch` (median of `repeats`)."""
    from bert_tasks.inference.predictor import Predictor

    predictor = Predictor(model, batch_size=batch, progress=False)
    predictor.records(texts[:batch])  # warm-up
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        predictor.records(texts)
        runs.append(len(texts) / (time.perf_counter() - start))
    del predictor
    gc.collect()
    return statistics.median(runs)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(
    model: str, port: int, max_batch: int, max_wait_ms: float, workers: int, threads: int | None
) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "bert_tasks", "--quiet", "serve", "sentiment", "--model", model]
    flags = ["--port", str(port), "--max-batch", str(max_batch), "--max-wait-ms", str(max_wait_ms)]
    flags += ["--workers", str(workers)] + (["--threads", str(threads)] if threads else [])
    process = subprocess.Popen([*command, *flags], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the server exited: {process.stderr.read().decode() if process.stderr else ''}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return process
        except httpx.TransportError:
            time.sleep(0.2)
    process.kill()
    raise SystemExit("the server did not answer /health within 300 s")


async def load(
    url: str, texts: list[str], requests: int, clients: int, per_request: int = 1
) -> tuple[float, list[float], int, float]:
    """Wall seconds, per-request latencies, the error count and this process's CPU seconds (the load
    generator's own cost) of `requests` requests of `per_request` texts each."""
    latencies: list[float] = []
    errors = 0
    sent = 0

    async def client(http: aiohttp.ClientSession) -> None:
        nonlocal errors, sent
        while sent < requests:
            first = sent * per_request
            sending = [texts[(first + i) % len(texts)] for i in range(per_request)]
            sent += 1
            start = time.perf_counter()
            try:
                async with http.post(f"{url}/predict", json={"texts": sending}) as answer:
                    records = (await answer.json())["records"] if answer.status == 200 else []
                ok = [record["text"] for record in records] == sending
            except (aiohttp.ClientError, asyncio.TimeoutError):
                ok = False
            latencies.append(time.perf_counter() - start)
            errors += not ok

    connections = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connections, timeout=aiohttp.ClientTimeout(total=120)) as http:
        cpu, start = time.process_time(), time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        return time.perf_counter() - start, latencies, errors, time.process_time() - cpu


def worker_counters(url: str, workers: int) -> dict[int, dict[str, float]]:
    """/info's counters of each worker process, by pid: asked on fresh connections until every worker
    answered (each new connection goes to whichever worker accepts it first)."""
    counters: dict[int, dict[str, float]] = {}
    for _ in range(50 * workers):
        info = httpx.get(f"{url}/info", timeout=60, headers={"connection": "close"}).json()
        counters[info["pid"]] = info["counters"]
        if len(counters) == workers:
            return counters
    raise SystemExit(f"only {len(counters)} of {workers} workers answered /info")


def tree_rss(process: psutil.Process) -> int:
    """Resident bytes of the server and its worker processes."""
    return sum(part.memory_info().rss for part in [process, *process.children(recursive=True)])


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True, help="a sentiment model dir")
    parser.add_argument("--requests", type=int, default=2000, help="requests per client count")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument(
        "--texts-per-request", type=int, nargs="+", default=[1], help="each client count runs each of these"
    )
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--max-wait-ms", type=float, default=5.0)
    parser.add_argument("--workers", type=int, default=1, help="the server's --workers")
    parser.add_argument("--threads", type=int, help="the server's --threads (default: its own choice)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    configure_cli_process()  # the server runs with the command line's process settings: so does the library
    quiet()
    texts = read_tsv(SST2_DEV, "sentence", "label")["text"]

    library = library_throughput(args.model, texts, args.max_batch, args.repeats)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_server(args.model, port, args.max_batch, args.max_wait_ms, args.workers, args.threads)
    memory = psutil.Process(server.pid)
    asyncio.run(load(url, texts, 64 * args.workers, 8 * args.workers))  # warm-up: first batches, allocator
    rss_before = tree_rss(memory)
    threads = httpx.get(f"{url}/info", timeout=60).json()["threads"]
    print(machine_line())
    print(
        f"library (Predictor.records, batches of {args.max_batch}): {library:.0f} texts/s "
        f"on {len(texts)} texts; server: {args.workers} worker(s) of {threads} torch thread(s)"
    )
    rows = []
    for clients, per_request in itertools.product(args.clients, args.texts_per_request):
        counters = worker_counters(url, args.workers)
        seconds, latencies, errors, client_cpu = asyncio.run(
            load(url, texts, args.requests, clients, per_request)
        )
        after = worker_counters(url, args.workers)
        done = {pid: {key: after[pid][key] - counters[pid][key] for key in after[pid]} for pid in after}
        calls = sum(worker["batches"] for worker in done.values())
        model_seconds = sum(worker["model_seconds"] for worker in done.values())
        worker_texts = sorted(worker["texts"] for worker in done.values())
        rss = tree_rss(memory)
        row = {
            "clients": clients,
            "texts_per_request": per_request,
            "requests": args.requests,
            "texts_per_s": round(args.requests * per_request / seconds, 1),
            "p50_ms": round(1000 * percentile(latencies, 0.50), 1),
            "p95_ms": round(1000 * percentile(latencies, 0.95), 1),
            "p99_ms": round(1000 * percentile(latencies, 0.99), 1),
            "errors": errors,
            "client_cpu_share": round(client_cpu / seconds, 3),
            "model_calls": calls,
            "texts_per_call": round(sum(worker_texts) / max(calls, 1), 1),
            "worker_shares": "/".join(f"{part / max(sum(worker_texts), 1):.2f}" for part in worker_texts),
            "model_busy": round(model_seconds / seconds / args.workers, 3),
            "model_texts_per_s": round(args.requests * per_request / max(model_seconds, 1e-9), 1),
            "server_rss_mib": round(rss / (1 << 20)),
        }
        rows.append(row)
    rss_after = tree_rss(memory)
    server.send_signal(signal.SIGTERM)
    status = server.wait(timeout=120)
    library_after = library_throughput(args.model, texts, args.max_batch, args.repeats)
    print(f"library again, after the server stopped: {library_after:.0f} texts/s")
    columns = ["clients", "texts a request", "requests", "texts/s", "vs library", "p50 ms", "p95 ms"]
    columns += ["p99 ms", "errors", "client CPU"]
    columns += ["model calls", "texts per call", "texts by worker", "model busy", "model texts/s"]
    columns += ["server RSS MiB"]
    table_header(columns)
    for row in rows:
        row["vs_library"] = round(row["texts_per_s"] / max(library, library_after), 3)
        keys = ["clients", "texts_per_request", "requests", "texts_per_s", "vs_library", "p50_ms", "p95_ms"]
        keys += ["p99_ms", "errors", "client_cpu_share"]
        keys += ["model_calls", "texts_per_call", "worker_shares", "model_busy", "model_texts_per_s"]
        keys += ["server_rss_mib"]
        table_row([row[key] for key in keys])
    mib = 1 << 20
    print(
        f"server RSS {rss_before / mib:.0f} MiB after warm-up, {rss_after / mib:.0f} MiB after the last "
        f"load; exit status after SIGTERM: {status}"
    )
    write_json(
        args.json,
        {
            "machine": machine_line(),
            "library_texts_per_s": round(library, 1),
            "library_texts_per_s_after": round(library_after, 1),
            "rows": rows,
            "rss_mib": {"before": round(rss_before / mib), "after": round(rss_after / mib)},
            "exit_status": status,
            "settings": {
                "max_batch": args.max_batch,
                "max_wait_ms": args.max_wait_ms,
                "workers": args.workers,
                "threads": threads,
                "cpus": os.cpu_count(),
            },
        },
    )


if __name__ == "__main__":
    main()
