"""Benchmark: inference in fp32, bf16 autocast and INT8 dynamic quantization, speed and quality, one run.

For each fine-tuned model dir, the held-out file is read the way the model's own recipe reads it, and the
three precisions score it with `Predictor.evaluate` (the code path of `bert-tasks evaluate`), interleaved
over repeats; the table reports median examples/s and tokens/s (real sub-tokens), the ratio to fp32,
and the task metric (SST-2: accuracy; NER: entity F1).

    python bench/precision.py \
        --sentiment-model runs/sentiment_sst2 --sentiment-data ../shared/data/sst2/dev.tsv \
        --ner-model runs/ner_bc5cdr --ner-data ../shared/data/bc5cdr/test.tsv \
        --json bench/results/precision.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import datasets
import transformers

from bert_tasks.inference.evaluate import read_labelled_file
from bert_tasks.inference.predictor import Predictor
from bert_tasks.runtime import reuse_freed_memory

#: name -> Predictor options.
PRECISIONS: dict[str, dict[str, Any]] = {
    "fp32": {"mixed_precision": "no"},
    "bf16": {"mixed_precision": "bf16"},
    "int8": {"mixed_precision": "no", "quantize": "int8"},
}
METRIC = {"sentiment": "accuracy", "ner": "f1"}


def bench_task(task: str, model_dir: Path, data: str, repeats: int) -> list[dict[str, Any]]:
    predictors = {
        name: Predictor(model_dir, batch_size=64, **options) for name, options in PRECISIONS.items()
    }
    raw = read_labelled_file(model_dir, data)
    tokenizer = predictors["fp32"].tokenizer
    column = "text" if task == "sentiment" else "tokens"
    tokens = sum(
        len(ids) for ids in tokenizer(list(raw[column]), is_split_into_words=task == "ner")["input_ids"]
    )
    times: dict[str, list[float]] = {name: [] for name in predictors}
    scores: dict[str, float] = {}
    for _ in range(repeats):
        for name, predictor in predictors.items():  # interleaved: machine noise hits all alike
            start = time.perf_counter()
            metrics = predictor.evaluate(raw)
            times[name].append(time.perf_counter() - start)
            scores[name] = float(metrics[METRIC[task]])
    base = statistics.median(times["fp32"])
    rows = []
    for name in predictors:
        seconds = statistics.median(times[name])
        rows.append(
            {
                "task": task,
                "precision": name,
                "examples_per_s": round(len(raw) / seconds, 1),
                "tokens_per_s": round(tokens / seconds),
                "vs_fp32": round(base / seconds, 2),
                METRIC[task]: round(scores[name], 4),
            }
        )
        row = rows[-1]
        print(
            f"| {task} | {name} | {row['examples_per_s']} | {row['tokens_per_s']} | {row['vs_fp32']:.2f}x | "
            f"{METRIC[task]} {row[METRIC[task]]:.4f} |",
            flush=True,
        )
    return rows


def main() -> None:
    reuse_freed_memory()  # what the CLI sets for its process: the library leaves it to the caller
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sentiment-model", type=Path)
    parser.add_argument("--sentiment-data")
    parser.add_argument("--ner-model", type=Path)
    parser.add_argument("--ner-data")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    transformers.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    print("| task | precision | examples/s | tokens/s | vs fp32 | quality |")
    print("| --- | --- | ---: | ---: | ---: | --- |")
    rows = []
    if args.sentiment_model:
        rows += bench_task("sentiment", args.sentiment_model, args.sentiment_data, args.repeats)
    if args.ner_model:
        rows += bench_task("ner", args.ner_model, args.ner_data, args.repeats)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
