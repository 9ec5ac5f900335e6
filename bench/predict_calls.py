"""Benchmark: what one `Predictor.records` call costs on a small batch (a server's micro-batch).

For each batch size, --calls calls on random SST-2 dev sentences (the same draws in every run), median
milliseconds per call and texts/s, in a process set up as the command line sets its own. Run it on two
checkouts in turn (`PYTHONPATH=<checkout>`, interleaved --rounds times) to compare their per-call cost
under the same load: the 2-core machines these numbers come from are shared and noisy.

    python bench/predict_calls.py --model /tmp/serve-bench-sentiment --checkouts /tmp/before . --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

SST2_DEV = Path(__file__).resolve().parents[2] / "shared" / "data" / "sst2" / "dev.tsv"


def measure(model: str, sizes: list[int], calls: int) -> dict[int, float]:
    """Median ms per call for each batch size (this process, this checkout)."""
    from common import quiet, read_tsv

    from bert_tasks.inference.predictor import Predictor
    from bert_tasks.runtime import configure_cli_process

    configure_cli_process()
    quiet()
    texts = read_tsv(SST2_DEV, "sentence", "label")["text"]
    predictor = Predictor(model, batch_size=64, progress=False)
    predictor.records(texts[:64])  # warm-up
    draws = random.Random(0)
    found = {}
    for size in sizes:
        times = []
        for _ in range(calls):
            batch = draws.sample(texts, size)
            start = time.perf_counter()
            predictor.records(batch)
            times.append(1000 * (time.perf_counter() - start))
        found[size] = statistics.median(times)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True, help="a sentiment model dir")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--checkouts", type=Path, nargs="+", default=[Path(".")])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # internal: this checkout
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.model, args.sizes, args.calls)))
        return
    from common import machine_line, table_header, table_row, write_json

    print(machine_line(), "| load average before", os.getloadavg())
    runs: dict[str, list[dict[str, float]]] = {str(c): [] for c in args.checkouts}
    for _ in range(args.rounds):
        for checkout in args.checkouts:
            command = [sys.executable, __file__, "--one", "--model", args.model, "--calls", str(args.calls)]
            command += ["--sizes", *map(str, args.sizes)]
            env = {**os.environ, "PYTHONPATH": str(checkout.resolve())}
            result = subprocess.run(command, capture_output=True, text=True, check=True, env=env)
            runs[str(checkout)].append(json.loads(result.stdout.splitlines()[-1]))
    print("load average after", os.getloadavg())
    table_header(["checkout", *(f"{size} texts: ms/call (texts/s)" for size in args.sizes)])
    rows = {}
    for checkout, found in runs.items():
        medians = {size: statistics.median(run[str(size)] for run in found) for size in args.sizes}
        rows[checkout] = medians
        table_row([checkout, *(f"{medians[s]:.1f} ({1000 * s / medians[s]:.0f})" for s in args.sizes)])
    write_json(
        args.json, {"machine": machine_line(), "calls": args.calls, "rounds": args.rounds, "rows": rows}
    )


if __name__ == "__main__":
    main()
