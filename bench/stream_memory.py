"""Benchmark: `bert-tasks predict --file BIG.jsonl --out OUT.jsonl` on --lines lines, in bounded memory.

Writes a JSON Lines file of --lines short texts with ids to --dir (ids alternate between numbers and
strings, and every record carries a field of its own), runs the command as a user would (a fresh
`python -m bert_tasks` process) on --model, samples the process's resident memory every --sample
seconds (psutil: the peak, the median of the second half against the first, which shows growth, and
the value at each tenth of the run),
then checks that OUT has one line per input line, in input order, each with its id and field. Run from
the repo root:

    python bench/stream_memory.py --model /tmp/serve-bench-sentiment --lines 20000      # time it first
    python bench/stream_memory.py --model DIR --lines 1000000 --json bench/results/stream_memory.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil
from common import machine_line, write_json

WORDS = ["good", "bad", "plot", "cast", "slow", "funny", "boring", "moving", "long", "short", "sound", "film"]


def write_input(path: Path, lines: int) -> None:
    """Short reviews (4-12 words) with ids: the shape of a pipeline's export, not of a benchmark set."""
    with path.open("w", encoding="utf-8") as stream:
        for n in range(lines):
            words = " ".join(WORDS[(n * 7 + k * 5) % len(WORDS)] for k in range(4 + n % 9))
            record = {"id": n if n % 2 else f"doc-{n}", "text": f"Review {n}: {words}.", "shard": n % 16}
            stream.write(json.dumps(record) + "\n")


def run(model: str, source: Path, out: Path, sample: float) -> tuple[float, list[int], int]:
    """Wall seconds, RSS samples (bytes) and the exit status of one `predict --out` process."""
    command = [sys.executable, "-m", "bert_tasks", "--quiet", "predict", "sentiment", "--model", model]
    start = time.perf_counter()
    process = subprocess.Popen([*command, "--file", str(source), "--out", str(out)], stderr=subprocess.PIPE)
    watched = psutil.Process(process.pid)
    samples = []
    while process.poll() is None:
        try:
            rss = watched.memory_info().rss
        except psutil.NoSuchProcess:
            break
        if rss:  # 0 once the process has exited and not yet been reaped
            samples.append(rss)
        time.sleep(sample)
    status = process.wait()
    if status:
        raise SystemExit(
            f"predict failed ({status}): {process.stderr.read().decode() if process.stderr else ''}"
        )
    return time.perf_counter() - start, samples, status


def check_output(out: Path, lines: int) -> None:
    """One output line per input line, in order, each with its own id and field."""
    count = 0
    with out.open(encoding="utf-8") as stream:
        for n, line in enumerate(stream):
            record = json.loads(line)
            expected = n if n % 2 else f"doc-{n}"
            if record["id"] != expected or record["shard"] != n % 16 or "label" not in record:
                raise SystemExit(f"{out}:{n + 1}: id {record['id']!r}, expected {expected!r}")
            count += 1
    if count != lines:
        raise SystemExit(f"{out}: {count} lines for {lines} inputs")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True, help="a sentiment model dir")
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/bert-tasks-stream-bench"))
    parser.add_argument("--sample", type=float, default=0.5, help="seconds between RSS samples")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    source, out = args.dir / f"in-{args.lines}.jsonl", args.dir / f"out-{args.lines}.jsonl"
    if not source.exists():
        write_input(source, args.lines)
    out.unlink(missing_ok=True)
    print(machine_line(), "| load average before", os.getloadavg())
    seconds, samples, _ = run(args.model, source, out, args.sample)
    load_after = os.getloadavg()
    check_output(out, args.lines)
    mib = 1 << 20
    half = len(samples) // 2
    first, second = statistics.median(samples[:half] or samples), statistics.median(samples[half:])
    result = {
        "lines": args.lines,
        "input_mib": round(source.stat().st_size / mib),
        "output_mib": round(out.stat().st_size / mib),
        "seconds": round(seconds, 1),
        "texts_per_s": round(args.lines / seconds, 1),
        "peak_rss_mib": round(max(samples) / mib),
        "median_rss_mib_first_half": round(first / mib),
        "median_rss_mib_second_half": round(second / mib),
        "samples": len(samples),
        "rss_mib_at_each_tenth": [round(samples[len(samples) * k // 10 - 1] / mib) for k in range(1, 11)],
        "ids_in_order": True,
    }
    print(json.dumps(result), "| load average after", load_after)
    write_json(args.json, {"machine": machine_line(), "model": args.model, **result})
    out.unlink()


if __name__ == "__main__":
    main()
