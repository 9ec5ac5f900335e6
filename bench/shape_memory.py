"""Benchmark: does padding batches to a bounded set of lengths bound a predictor's memory growth?

Under bf16 autocast on CPU, resident memory grows with the number of distinct batch shapes a model
sees (BENCHMARKS.md, "Serving over HTTP"): a server's micro-batches of ever-different sizes keep adding
to it. Each setting runs in a fresh process: a `Predictor` (as the command line sets its process up)
called --calls times on 1..--max-texts random SST-2 dev sentences (the same draws for every setting),
resident memory after a warm-up and every --every calls, and the texts/s over the calls. Settings: the
padded length rounded up to a multiple of --multiples tokens (8 is what the tasks pad to), under bf16
and fp32. `--linear` isolates the cause: one bf16 `Linear(384, 1536)` (a feed-forward layer of the
model) on [N, 384] inputs of 1,200 random row counts N in 5..900 (what unpadding hands every projection:
the batch's real tokens), against the same with N rounded up to a multiple of 64, and fp32.
`--buckets-cost` prices the fix (`modeling/unpad.packed_rows`): one process, one torch thread, each call's
batch predicted twice, with the packed rows bucketed and exact, in alternating order, so load hits both
alike; it prints the median per-call time ratio, at the first of --precisions. Run from the repo root:

    python bench/shape_memory.py --model /tmp/serve-bench-sentiment --json bench/results/shape_memory.json
    python bench/shape_memory.py --linear
    python bench/shape_memory.py --model /tmp/serve-bench-sentiment --buckets-cost --calls 300
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

SST2_DEV = Path(__file__).resolve().parents[2] / "shared" / "data" / "sst2" / "dev.tsv"


def one_setting(model: str, multiple: int, precision: str, calls: int, every: int, max_texts: int) -> dict:
    """Run in this process (a fresh one per setting): RSS MiB along the calls and texts/s."""
    import psutil
    from common import quiet, read_tsv

    from bert_tasks.inference.predictor import Predictor
    from bert_tasks.runtime import configure_cli_process

    configure_cli_process()
    quiet()
    texts = read_tsv(SST2_DEV, "sentence", "label")["text"]
    draws = random.Random(0)
    batches = [draws.sample(texts, draws.randint(1, max_texts)) for _ in range(calls)]
    predictor = Predictor(model, batch_size=64, mixed_precision=precision, progress=False)
    predictor.task.pad_to_multiple_of = multiple  # the setting measured (the tasks' own value is 8)
    predictor.records(texts[:64])  # warm-up
    process = psutil.Process()
    rss = [process.memory_info().rss >> 20]
    start, done = time.perf_counter(), 0
    for call, batch in enumerate(batches, start=1):
        predictor.records(batch)
        done += len(batch)
        if call % every == 0:
            rss.append(process.memory_info().rss >> 20)
    seconds = time.perf_counter() - start
    return {
        "multiple": multiple,
        "precision": precision,
        "rss_mib": rss,
        "texts_per_s": round(done / seconds, 1),
    }


def linear_rows(mode: str, calls: int = 1200, every: int = 200) -> dict:
    """RSS MiB along `calls` calls of one Linear on random row counts (`mode`: bf16, bf16-round64, fp32)."""
    import psutil
    import torch

    torch.set_num_threads(1)
    layer = torch.nn.Linear(384, 1536)
    draws = random.Random(0)
    process = psutil.Process()
    rss = [process.memory_info().rss >> 20]
    with torch.inference_mode():
        for call in range(1, calls + 1):
            rows = draws.randint(5, 900)
            if mode == "bf16-round64":
                rows = -(-rows // 64) * 64
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode != "fp32"):
                layer(torch.randn(rows, 384))
            if call % every == 0:
                rss.append(process.memory_info().rss >> 20)
    return {"mode": mode, "rss_mib": rss}


def buckets_cost(model: str, calls: int, max_texts: int, precision: str) -> None:
    """Per-call time of prediction (`precision`: bf16 or no) with the packed rows bucketed against exact,
    alternating."""
    import statistics

    import torch
    from common import machine_line, quiet, read_tsv

    from bert_tasks.inference.predictor import Predictor
    from bert_tasks.modeling import unpad
    from bert_tasks.runtime import configure_cli_process

    configure_cli_process()
    quiet()
    torch.set_num_threads(1)
    texts = read_tsv(SST2_DEV, "sentence", "label")["text"]
    draws = random.Random(0)
    predictor = Predictor(model, batch_size=64, mixed_precision=precision, progress=False)
    predictor.records(texts[:64])  # warm-up
    bucketed = unpad.packed_rows
    seconds: dict[bool, list[float]] = {True: [], False: []}
    for call in range(calls):
        batch = draws.sample(texts, draws.randint(1, max_texts))
        for bucket in (True, False) if call % 2 else (False, True):
            unpad.packed_rows = bucketed if bucket else lambda real: real
            start = time.perf_counter()
            predictor.records(batch)
            seconds[bucket].append(time.perf_counter() - start)
    unpad.packed_rows = bucketed
    ratios = [a / b for a, b in zip(seconds[True], seconds[False], strict=True)]
    print(machine_line(), "| load average", os.getloadavg(), "| mixed_precision", precision)
    for bucket, name in ((False, "exact N rows"), (True, "bucketed rows")):
        print(f"{name}: median {1000 * statistics.median(seconds[bucket]):.1f} ms per call")
    print(f"bucketed / exact, median per call over {calls} calls: {statistics.median(ratios):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", help="a sentiment model dir")
    parser.add_argument("--multiples", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--precisions", nargs="+", default=["bf16", "no"])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--max-texts", type=int, default=32)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--linear", action="store_true", help="the one-Linear experiment instead")
    parser.add_argument("--buckets-cost", action="store_true", help="bucketed vs exact rows, per call")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one setting, print its JSON
    args = parser.parse_args()
    if args.buckets_cost:
        buckets_cost(args.model, args.calls, args.max_texts, args.precisions[0])
        return
    if args.linear and args.one:
        print(json.dumps(linear_rows(args.one)))
        return
    if args.linear:
        print(os.getloadavg())
        for mode in ("bf16", "bf16-round64", "fp32"):
            command = [sys.executable, __file__, "--model", "-", "--linear", "--one", mode]
            result = subprocess.run(command, capture_output=True, text=True, check=True)
            print(result.stdout.strip())
        return
    if args.one:
        multiple, precision = args.one.split(",")
        print(
            json.dumps(
                one_setting(args.model, int(multiple), precision, args.calls, args.every, args.max_texts)
            )
        )
        return
    from common import machine_line, table_header, table_row, write_json

    print(machine_line(), "| load average", os.getloadavg())
    table_header(
        ["precision", "pad multiple", "texts/s", f"RSS MiB after warm-up, then every {args.every} calls"]
    )
    rows = []
    for precision in args.precisions:
        for multiple in args.multiples:
            command = [sys.executable, __file__, "--model", args.model, "--one", f"{multiple},{precision}"]
            command += [
                "--calls",
                str(args.calls),
                "--every",
                str(args.every),
                "--max-texts",
                str(args.max_texts),
            ]
            result = subprocess.run(command, capture_output=True, text=True, check=True, env=os.environ)
            row = json.loads(result.stdout.splitlines()[-1])
            rows.append(row)
            table_row([precision, multiple, row["texts_per_s"], " -> ".join(map(str, row["rss_mib"]))])
    print("load average", os.getloadavg())
    write_json(args.json, {"machine": machine_line(), "calls": args.calls, "rows": rows})


if __name__ == "__main__":
    main()
