"""Benchmark: `bert-tasks prune` at 25% and 50% of the heads, with and without recovery, and the speed bought.

SST-2 part: a sentiment model trained with recipes/sentiment_sst2.yaml on the first --sst2-rows rows of
../shared/data/sst2/train.tsv for 1 epoch (batch 16, lr 1e-4, as tests/test_end_to_end.py's slice run),
the checkpoint picked on the recipe's stratified 5% split of that slice, the full dev set (872 sentences)
held out. BC5CDR part: recipes/ner_bc5cdr.yaml on the first --bc5cdr-rows training sentences for 1 epoch,
validation and test the first --bc5cdr-eval sentences of dev and test.

Each model is pruned twice (25% and 50% of its 72 heads) by `bert_tasks.pruning.prune`, scored on the
validation split (which chooses the heads), and then recovers for --recover-steps updates through `train`
with recovery's defaults (the recipe's lr / 5, warmup 10%, validation before the first update and 4 times
during it, the best kept); one run gives both rows, since pruning.json scores the test split before
recovery and metrics.json after. Then, from the 50% recovery's recipe.yaml (the same pruned start, data
and schedule): the control, the unpruned model given the same updates at the same lr (`prune_heads=none`),
and on SST-2 the recovery and its control again at each --compare-lr. texts/s: prediction
(`Predictor.predict`, fp32, batch 64) over the test texts, best of --repeats, with 1 and 2 torch threads.

Run from the repo root:

    OMP_WAIT_POLICY=PASSIVE python bench/prune.py --json bench/results/prune.json
    python bench/prune.py --sst2-rows 400 --bc5cdr-rows 200 --bc5cdr-eval 100 --recover-steps 5  # smoke
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from common import machine_line, model_splits, quiet, split_texts, table_header, table_row, timed, write_json

from bert_tasks import load_recipe, train
from bert_tasks.inference.predictor import Predictor
from bert_tasks.pruning import prune

DATA = Path("../shared/data")
SHARES = (0.25, 0.5)


def sst2_model(root: Path, rows: int) -> Path:
    cfg = load_recipe(
        "recipes/sentiment_sst2.yaml",
        [
            f"train_file={DATA / 'sst2' / 'train.tsv'}",
            f"test_file={DATA / 'sst2' / 'dev.tsv'}",
            f"max_train_samples={rows}",
            "epochs=1",
            "batch_size=16",
            "lr=1e-4",
            "warmup_ratio=0.1",
            "eval_every=0",
            "report_to=none",
            f"output_dir={root / 'sst2'}",
        ],
        task="sentiment",
    )
    return train(cfg)


def bc5cdr_model(root: Path, rows: int, eval_rows: int) -> Path:
    cfg = load_recipe(
        "recipes/ner_bc5cdr.yaml",
        [
            f"train_file={DATA / 'bc5cdr' / 'train.tsv'}",
            f"validation_file={DATA / 'bc5cdr' / 'dev.tsv'}",
            f"test_file={DATA / 'bc5cdr' / 'test.tsv'}",
            f"max_train_samples={rows}",
            f"max_eval_samples={eval_rows}",
            "epochs=1",
            "report_to=none",
            f"output_dir={root / 'bc5cdr'}",
        ],
        task="ner",
    )
    return train(cfg)


def test_texts(model_dir: Path) -> list[str]:
    """The test split's texts as the model's recipe reads them (SST-2 dev, the BC5CDR test slice)."""
    return split_texts(model_splits(model_dir)["test"])


def record_heads(model_dir: Path) -> int:
    config = json.loads((model_dir / "config.json").read_text())
    return config["num_hidden_layers"] * config["num_attention_heads"]


def texts_per_second(model_dir: Path, texts: list[str], threads: int, repeats: int) -> float:
    torch.set_num_threads(threads)
    predictor = Predictor(model_dir, mixed_precision="no", progress=False)
    predictor.predict(texts[:64])  # warm-up
    best = min(timed(lambda: predictor.predict(texts))[1] for _ in range(repeats))
    return round(len(texts) / best, 1)


def recovery_row(
    model: str, run_dir: Path, metric: str, heads: int, speed: dict[int, float]
) -> dict[str, Any]:
    """A recovery run's scores: the kept step's, step 0's, and the last evaluation's (what one evaluation at
    the end, with nothing to choose from, would have kept)."""
    metrics = json.loads((run_dir / "metrics.json").read_text())
    log = [json.loads(line) for line in (run_dir / "train_log.jsonl").read_text().splitlines()]
    evaluations = [(row["step"], row[f"eval_{metric}"]) for row in log if f"eval_{metric}" in row]
    recipe = load_recipe(run_dir / "recipe.yaml")
    return {
        "model": model,
        "heads": heads,
        "lr": recipe.lr,
        "validation": metrics["validation"][metric],
        "test": metrics["test"][metric],
        "best_step": metrics["best_step"],
        "validation_at_step_0": evaluations[0][1],
        "validation_at_last_step": evaluations[-1][1],
        "evaluations": evaluations,
        "texts_per_s": speed,
    }


def rerun(recipe: Path, out: Path, overrides: list[str]) -> Path:
    """A recovery's recipe.yaml run again with `overrides`: the same pruned start (prune_heads) and data."""
    return train(load_recipe(recipe, [*overrides, f"output_dir={out}", "report_to=none"]))


def measure(task: str, model_dir: Path, root: Path, args: argparse.Namespace) -> dict[str, Any]:
    metric = json.loads((model_dir / "metrics.json").read_text())["metric_for_best"]
    texts = test_texts(model_dir)
    unpruned_speed = {t: texts_per_second(model_dir, texts, t, args.repeats) for t in (1, 2)}
    base = json.loads((model_dir / "metrics.json").read_text())
    rows = [
        {
            "model": "unpruned",
            "heads": record_heads(model_dir),
            "validation": base["validation"][metric],
            "test": base["test"][metric],
            "texts_per_s": unpruned_speed,
        }
    ]
    steps = args.recover_steps
    for share in SHARES:
        out = root / f"{task}-pruned-{int(share * 100)}"
        started = time.perf_counter()
        prune(task, model_dir, str(share), out, [f"recover_steps={steps}"])
        seconds = time.perf_counter() - started
        record = json.loads((out / "pruning.json").read_text())
        last = record["steps"][-1]
        speed = {t: texts_per_second(out, texts, t, args.repeats) for t in (1, 2)}
        common = {"heads": last["heads_kept"], "texts_per_s": speed, "prune_s": round(seconds, 1)}
        rows.append(
            {
                "model": f"{share:.0%} pruned",
                "validation": last["validation"][metric],
                "test": last["test"][metric],
                **common,
            }
        )
        rows.append(
            recovery_row(
                f"{share:.0%} pruned + {steps} recovery updates", out, metric, common["heads"], speed
            )
            | {"prune_s": common["prune_s"], "pruned_heads": record["pruned_heads"]}
        )
    # Against the last share's recovery (its recipe.yaml: the same pruned start, data and schedule): the
    # control, the unpruned model given the same updates; on SST-2 also other recovery lrs, each with its
    # control.
    recovered = rows[-1]
    recipe = root / f"{task}-pruned-{int(SHARES[-1] * 100)}" / "recipe.yaml"
    lrs = [recovered["lr"], *(args.compare_lr if task == "sentiment" else [])]
    for number, lr in enumerate(lrs):
        if number:
            again = rerun(recipe, root / f"{task}-lr-{number}", [f"lr={lr}"])
            rows.append(
                recovery_row(recovered["model"], again, metric, recovered["heads"], recovered["texts_per_s"])
            )
        control = rerun(recipe, root / f"{task}-control-{number}", ["prune_heads=none", f"lr={lr}"])
        name = f"control: unpruned + {steps} updates"
        rows.append(recovery_row(name, control, metric, rows[0]["heads"], unpruned_speed))
    return {"task": task, "metric": metric, "test_texts": len(texts), "rows": rows}


def show(result: dict[str, Any]) -> None:
    print(f"\n{result['task']} ({result['metric']}; {result['test_texts']} test texts)")
    table_header(
        ["model", "heads", "lr", "kept step", "validation", "test", "texts/s 1 thread", "texts/s 2 threads"]
    )
    for row in result["rows"]:
        speed = row["texts_per_s"]
        lr = f"{row['lr']:g}" if "lr" in row else "–"
        kept = "–"
        if "best_step" in row:
            first, final = row["validation_at_step_0"], row["validation_at_last_step"]
            kept = f"{row['best_step']} (step 0: {first:.4f}, last: {final:.4f})"
        table_row(
            [
                row["model"],
                row["heads"],
                lr,
                kept,
                f"{row['validation']:.4f}",
                f"{row['test']:.4f}",
                speed[1],
                speed[2],
            ]
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sst2-rows", type=int, default=4000)
    parser.add_argument("--bc5cdr-rows", type=int, default=2000)
    parser.add_argument("--bc5cdr-eval", type=int, default=500)
    parser.add_argument("--recover-steps", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--compare-lr",
        type=float,
        nargs="*",
        default=[1e-4],
        help="SST-2: recovery (and control) lrs to compare",
    )
    parser.add_argument("--part", choices=("all", "sst2", "bc5cdr"), default="all")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    quiet()
    print(machine_line())
    started = time.perf_counter()
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-prune-") as scratch:
        root = Path(scratch)
        if args.part in ("all", "sst2"):
            results.append(measure("sentiment", sst2_model(root, args.sst2_rows), root, args))
            show(results[-1])
        if args.part in ("all", "bc5cdr"):
            model = bc5cdr_model(root, args.bc5cdr_rows, args.bc5cdr_eval)
            results.append(measure("ner", model, root, args))
            show(results[-1])
    wall = round(time.perf_counter() - started)
    print(f"\nwall time {wall} s")
    write_json(
        args.json,
        {
            "machine": machine_line(),
            "args": vars(args) | {"json": str(args.json)},
            "wall_s": wall,
            "results": results,
        },
    )


if __name__ == "__main__":
    main()
