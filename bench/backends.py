"""Benchmark: one sentiment model four ways — fp32 torch, int8 torch (dynamic, on load), ONNX fp32, ONNX int8.

    python bench/backends.py --model /tmp/onnx-sst2 --data ../shared/data/sst2/dev.tsv --repeats 3 \\
        --json bench/results/backends.json

The ONNX dirs are written first by `export_onnx` (the code of `bert-tasks export --format onnx`; its
seconds and parity line are printed). Every measurement is a fresh process (`--child`), so each row's
memory is its own: it opens the dir with `Predictor` (the code path of `bert-tasks predict/evaluate`),
scores --data once (`Predictor.evaluate`), predicts its texts once to warm up and once timed, and reports
its peak resident memory (VmHWM: runtime, libraries and model together). Rows and thread counts run
round-robin over --repeats (median texts/s), so machine noise hits all alike. Threads:
torch.set_num_threads for torch rows, the session's intra-op threads for ONNX rows. Accuracy: the whole
--data, scored once per row; texts/s: its first --max-texts texts. Size on disk: the weights file
(model.safetensors; model.onnx). Run from the repo root."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: Row name -> (which dir: source or an export, Predictor options).
ROWS = {
    "fp32 torch": ("source", {"mixed_precision": "no"}),
    "int8 torch (dynamic, on load)": ("source", {"mixed_precision": "no", "quantize": "int8"}),
    "ONNX fp32": ("onnx-fp32", {}),
    "ONNX int8": ("onnx-int8", {}),
}


def child(model_dir: str, data: str, row: str, threads: int, score: bool, max_texts: int) -> dict[str, float]:
    """One row in this (fresh) process: score (when asked), then time prediction on the first texts."""
    from common import on_threads, peak_rss_mib

    from bert_tasks.inference.evaluate import read_labelled_file
    from bert_tasks.inference.predictor import Predictor

    options = ROWS[row][1]
    start = time.perf_counter()
    predictor = Predictor(model_dir, batch_size=64, **options)
    on_threads(predictor, model_dir, threads)
    load = time.perf_counter() - start
    raw = read_labelled_file(model_dir, data)
    accuracy = predictor.evaluate(raw)["accuracy"] if score else None
    texts = list(raw["text"])[:max_texts]
    predictor.predict(texts[:64])
    start = time.perf_counter()
    predictor.predict(texts)
    seconds = time.perf_counter() - start
    peak = peak_rss_mib()
    return {"load_s": load, "texts_per_s": len(texts) / seconds, "accuracy": accuracy, "peak_rss_mib": peak}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True, help="a fine-tuned sentiment model dir")
    parser.add_argument("--data", required=True, help="labelled file read with the model's recipe")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-texts", type=int, default=400, help="texts timed per run (default: 400)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", nargs=3, metavar=("ROW", "THREADS", "SCORE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        row, threads, score = args.child
        print(json.dumps(child(args.model, args.data, row, int(threads), score == "1", args.max_texts)))
        return

    from common import machine_line, median, table_header, table_row, weights_mb, write_json

    from bert_tasks.inference.onnx_export import export_onnx

    with tempfile.TemporaryDirectory(prefix="bench-backends-") as scratch:
        dirs = {"source": Path(args.model)}
        for method in (None, "int8"):
            out = Path(scratch) / f"onnx-{method or 'fp32'}"
            start = time.perf_counter()
            parity = export_onnx(args.model, out, method)
            print(f"export {method or 'fp32'}: {time.perf_counter() - start:.1f} s; {parity}", flush=True)
            dirs[out.name] = out
        runs: dict[tuple[str, int], list[dict[str, float]]] = {}
        for repeat in range(args.repeats):
            for row, (which, _) in ROWS.items():
                for threads in (1, 2):
                    command = [sys.executable, __file__, "--model", str(dirs[which]), "--data", args.data]
                    score = "1" if repeat == 0 and threads == 2 else "0"  # the same numbers every time
                    command += ["--max-texts", str(args.max_texts), "--child", row, str(threads), score]
                    done = subprocess.run(command, capture_output=True, text=True, check=True)
                    runs.setdefault((row, threads), []).append(json.loads(done.stdout.splitlines()[-1]))
            print(f"repeat {repeat + 1}/{args.repeats} done", file=sys.stderr, flush=True)
        sizes = {which: weights_mb(path) for which, path in dirs.items()}

    print(f"command: `python {' '.join(sys.argv)}` | repeats {args.repeats} | {machine_line()}")
    table_header(
        ["model", "accuracy", "texts/s 1 core", "texts/s 2 cores", "disk MB", "peak RSS MiB", "load s"]
    )
    results = []
    for row, (which, _) in ROWS.items():
        two = runs[row, 2]
        speed = [median([run["texts_per_s"] for run in runs[row, t]]) for t in (1, 2)]
        result = {
            "row": row,
            "accuracy": two[0]["accuracy"],
            "texts_per_s_1": speed[0],
            "texts_per_s_2": speed[1],
            "disk_mb": sizes[which],
            "peak_rss_mib": median([run["peak_rss_mib"] for run in two]),
            "load_s": median([run["load_s"] for run in two]),
        }
        results.append(result)
        table_row(
            [
                row,
                f"{result['accuracy']:.4f}",
                f"{speed[0]:.0f}",
                f"{speed[1]:.0f}",
                f"{result['disk_mb']:.1f}",
                f"{result['peak_rss_mib']:.0f}",
                f"{result['load_s']:.2f}",
            ]
        )
    write_json(args.json, {"model": args.model, "data": args.data, "rows": results})


if __name__ == "__main__":
    main()
