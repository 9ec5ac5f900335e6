"""Benchmark: what distillation buys, on an SST-2 slice and a BC5CDR slice, every row in one script run.

Per task: the teacher (the bundled all-MiniLM-L6-v2, 6 layers, fine-tuned by the task's recipe), then
3-layer students cut from it (layers [0, 2, 4]) and trained with the same recipe and budget:
  - no teacher: `alpha=0`, the gold loss alone (the same student, what distillation is measured against)
  - KD: soft targets (alpha 0.5, temperature 2) + gold
  - KD + hidden: plus TinyBERT-style hidden-state transfer (student layer m from teacher layer 2m+1)
  - KD + hidden + attention: plus MiniLM-style attention-distribution transfer
Selection never sees the scored split: SST-2 picks its best epoch on 10% of the 4,000-row train slice
(`validation_split`) and scores dev (872); BC5CDR picks on the first dev sentences and scores the first
test sentences. Prediction speed: texts/s of `Predictor` over the scored split, teacher vs student.

Run from the repo root (BENCHMARKS.md, "Ship small", has the commands of its tables and their times):

    python bench/distill.py --json bench/results/distill.json
    python bench/distill.py --sst2-rows 400 --bc5cdr-rows 200 --eval-rows 100 --epochs 1  # smoke, ~3 min
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from common import METRIC, machine_line, quiet, slice_recipe, table_header, table_row, write_json

from bert_tasks import load_recipe, train
from bert_tasks.inference.predictor import Predictor
from bert_tasks.runtime import configure_cli_process

#: (row name, distill overrides); None: the teacher itself (a finetune).
ROWS: list[tuple[str, list[str] | None]] = [
    ("teacher (6 layers)", None),
    ("3 layers, no teacher (alpha=0)", ["alpha=0"]),
    ("3 layers, KD", []),
    ("3 layers, KD + hidden", ["transfer=hidden"]),
    ("3 layers, KD + hidden + attention", ["transfer=hidden,attention"]),
]


def task_settings(task: str, args: argparse.Namespace) -> tuple[str, list[str]]:
    """The task's recipe and the slice overrides every row shares."""
    rows = args.sst2_rows if task == "sentiment" else args.bc5cdr_rows
    return slice_recipe(task, rows, args.epochs, args.eval_rows)


def score_texts(task: str, cfg: Any, limit: int) -> list[str]:
    """The scored split's texts, for prediction speed (NER: words joined by spaces)."""
    if task == "sentiment":
        lines = Path(cfg.test_file).read_text(encoding="utf-8").splitlines()[1:]
        return [line.split("\t")[0] for line in lines if line.strip()][:limit]
    sentences, words = [], []
    for line in Path(cfg.test_file).read_text(encoding="utf-8").splitlines():
        if line.strip():
            words.append(line.split("\t")[0])
        elif words:
            sentences.append(" ".join(words))
            words = []
    return (sentences + ([" ".join(words)] if words else []))[:limit]


def texts_per_second(model_dir: Path, texts: list[str]) -> float:
    predictor = Predictor(model_dir)
    predictor.predict(texts[:32])  # warm-up
    start = time.perf_counter()
    predictor.predict(texts)
    return len(texts) / (time.perf_counter() - start)


def run_task(task: str, args: argparse.Namespace, root: Path) -> list[dict[str, Any]]:
    recipe, shared = task_settings(task, args)
    results, teacher = [], None
    rows = [ROWS[0], *(ROWS[int(i)] for i in args.rows.split(","))]
    for name, extra in rows:
        out = root / f"{task}-{len(results)}"
        if extra is None:
            cfg = load_recipe(recipe, [*shared, f"output_dir={out}"], task=task)
        else:
            overrides = [*shared, f"output_dir={out}", f"teacher={teacher}", "student_layers=3", *extra]
            cfg = load_recipe(recipe, overrides, task=task)  # the student starts from the teacher
        start = time.perf_counter()
        model_dir = train(cfg)
        wall = time.perf_counter() - start
        teacher = teacher or model_dir
        metrics = json.loads((model_dir / "metrics.json").read_text())
        results.append(
            {
                "row": name,
                "validation": metrics["validation"][METRIC[task]],
                "test": metrics["test"][METRIC[task]],
                "train_s": round(wall, 1),
                "size_mb": round((model_dir / "model.safetensors").stat().st_size / 2**20, 1),
                "dir": str(model_dir),
            }
        )
    texts = score_texts(task, load_recipe(recipe, shared, task=task), args.speed_texts)
    teacher_speed = texts_per_second(Path(results[0]["dir"]), texts)
    student_speed = texts_per_second(Path(results[1]["dir"]), texts)
    for i, row in enumerate(results):
        row["texts_per_s"] = round(teacher_speed if i == 0 else student_speed, 1)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="sentiment,ner")
    parser.add_argument("--sst2-rows", type=int, default=4000)
    parser.add_argument("--bc5cdr-rows", type=int, default=1000)
    parser.add_argument("--eval-rows", type=int, default=300, help="BC5CDR dev and test sentences")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--speed-texts", type=int, default=872)
    parser.add_argument(
        "--rows", default="1,2,3,4", help="the student rows of ROWS to run (the teacher always)"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    configure_cli_process()  # the command line's settings: idle OpenMP threads sleep beside busy processes
    quiet()
    print(machine_line())
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    payload: dict[str, Any] = {"machine": machine_line(), "args": vars(args) | {"json": str(args.json)}}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for task in args.tasks.split(","):
            results = run_task(task, args, Path(tmp))
            payload[task] = results
            teacher = results[0]
            print(f"\n{task}: {METRIC[task]} (validation picked the epoch; test held out)")
            table_header(["row", "validation", "test", "of teacher", "train s", "texts/s", "MB"])
            for row in results:
                kept = f"{100 * row['test'] / teacher['test']:.1f}%"
                scores = [f"{row['validation']:.4f}", f"{row['test']:.4f}", kept]
                table_row([row["row"], *scores, row["train_s"], row["texts_per_s"], row["size_mb"]])
    payload["wall_s"] = round(time.perf_counter() - started, 1)
    payload["load_average_end"] = round(os.getloadavg()[0], 2)
    print(f"\nwall time {payload['wall_s']} s, load average at end {payload['load_average_end']}")
    write_json(args.json, payload)


if __name__ == "__main__":
    main()
