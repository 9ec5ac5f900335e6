"""Benchmark: fine-tuning SST-2, bert-tasks against transformers' Trainer on the same data in one run.

Speed mode (default): the same first N training rows, 1 epoch, batch 32, lr 5e-5, seed 42 for all:
  trainer-default  Trainer as run_glue.py runs it: every row padded to 128, fp32, random batches, and
                   its other defaults (adamw_torch_fused in transformers 5, no warmup, no weight decay)
  trainer-tuned    the same Trainer with bf16 where bert-tasks' auto takes it (a CPU with AVX512-BF16
                   or AMX; fp32 elsewhere), train_sampling_strategy="group_by_length" (transformers 5's
                   name for group_by_length), dynamic padding (DataCollatorWithPadding), adamw_torch_fused
  bert-tasks       bert_tasks.train(load_recipe("recipes/sentiment_sst2.yaml", overrides)), the CLI's
                   code path, keeping the recipe's warmup, weight decay and precision (auto: bf16 where the
                   CPU runs it natively); overrides max_train_samples epochs lr batch_size eval_every
                   output_dir, attention_dropout=none (the checkpoint's 0.1, as the Trainers have), plus
                   logging_steps above the step count so its train_log.jsonl holds one record that times
                   the whole loop
"loop s" is the optimisation loop alone (Trainer.train(); bert-tasks' one log record); "total s" is
everything from reading the files to the dev accuracy: read + tokenize + model load + train + score dev
(bert-tasks also scores dev twice, at the last step and after restoring the best weights, and saves the
model: that counts against it). Accuracy: scikit-learn's accuracy_score on the dev rows for everyone
(bert-tasks' metrics.json computes it with the same function). Eval batch: the recipe's, for everyone.
An untimed warm-up round on 64 rows comes first (--warmup-rows), so the one-off costs of a fresh process
do not all land on whichever implementation runs first; --repeats N interleaves N timed rounds (median).

Quality mode (--quality): on all of SST-2, wall time, dev accuracy and macro-F1 of
  bert-tasks        the recipe as shipped (--set overrides it), dev held out as its test split
  trainer-defaults  a Trainer at TrainingArguments' own defaults (batch 8, lr 5e-5, 3 epochs, no warmup,
                    no weight decay, random batches; dynamic padding; bf16 as on bert-tasks' side), trained
                    on every train row and scored on dev once: the anchor of issue #17 item 3
(--impls picks; default bert-tasks; --seed seeds both). Run from the repo root (the recipe's data paths
are relative to it):

    python bench/finetune_sentiment.py --json bench/results/finetune_sentiment.json
    python bench/finetune_sentiment.py --train-samples 64 --max-eval-samples 32      # smoke test
    python bench/finetune_sentiment.py --quality --json bench/results/finetune_sentiment_quality.json
    python bench/finetune_sentiment.py --quality --impls trainer-defaults --seed 43 \
        --json bench/results/trainer_defaults_sst2_s43.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from common import (
    bf16_as_bert_tasks,
    cpu_name,
    machine_line,
    median,
    quiet,
    ratio,
    read_tsv,
    table_header,
    table_row,
    timed,
    times,
    training_args,
    write_json,
)
from datasets import Dataset
from sklearn.metrics import accuracy_score, f1_score
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    Trainer,
    default_data_collator,
    set_seed,
)

from bert_tasks import Config, load_recipe, train
from bert_tasks.modeling.load import resolve_model_path
from bert_tasks.runtime import reuse_freed_memory

TRAINERS = ("trainer-default", "trainer-tuned")
#: What quality mode runs: bert-tasks' recipe, and a Trainer at its own defaults on the same data.
QUALITY_IMPLS = ("bert-tasks", "trainer-defaults")
#: bert-tasks as shipped, with torch's dense word-embedding gradient (the `embedding_grad` lever alone), and
#: with its word embeddings frozen (an opt-in lever that changes what is learned).
BERT_TASKS = {
    "bert-tasks": [],
    "bert-tasks-dense-grad": ["embedding_grad=dense"],
    "bert-tasks-frozen-embeddings": ["freeze_embeddings=true"],
}
SPEED_IMPLS = (*TRAINERS, *BERT_TASKS)
IMPLEMENTATIONS = (*SPEED_IMPLS, "trainer-defaults")
#: run_glue.py's --max_seq_length default, to which trainer-default pads every row.
PAD_TO = 128


def trainer_settings(name: str) -> dict[str, Any]:
    """TrainingArguments of each Trainer: speed mode's two (1 epoch, batch 32, lr 5e-5), and quality
    mode's at TrainingArguments' own defaults but bf16 (the arithmetic bert-tasks and the NER anchor of
    bench/finetune_ner.py --baseline defaults run). bf16 only where bert-tasks takes it (`auto`)."""
    if name == "trainer-defaults":
        return {"bf16": bf16_as_bert_tasks()}
    speed_mode = {
        "num_train_epochs": 1,
        "per_device_train_batch_size": 32,
        "learning_rate": 5e-5,
        "optim": "adamw_torch_fused",
    }
    if name == "trainer-tuned":
        return {**speed_mode, "bf16": bf16_as_bert_tasks(), "train_sampling_strategy": "group_by_length"}
    return speed_mode


def run_trainer(name: str, cfg: Config, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """One Trainer run from the TSV files to dev accuracy; returns loop and total seconds and accuracy."""
    dynamic_padding = name != "trainer-default"  # run_glue.py's trainer-default pads every row to 128
    model_dir = resolve_model_path(cfg.model)

    def run() -> tuple[dict[str, float], float]:
        label_names = list(cfg.label_names or ["0", "1"])
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        padding = {} if dynamic_padding else {"padding": "max_length"}

        def encode(path: str, limit: int | None) -> Dataset:
            rows = read_tsv(path, cfg.text_column, cfg.label_column, limit)
            encoded = tokenizer(rows["text"], truncation=True, max_length=PAD_TO, **padding)
            return Dataset.from_dict({**encoded, "labels": [int(label) for label in rows["label"]]})

        train_set = encode(cfg.train_file, args.train_samples)
        dev_set = encode(dev_file(cfg), args.max_eval_samples)
        set_seed(args.seed)  # the new classifier head's initialisation
        model = AutoModelForSequenceClassification.from_pretrained(
            model_dir,
            num_labels=len(label_names),
            id2label=dict(enumerate(label_names)),
            label2id={label: i for i, label in enumerate(label_names)},
        )
        trainer = Trainer(
            model=model,
            args=training_args(
                tmp / name,
                seed=args.seed,
                per_device_eval_batch_size=cfg.eval_batch_size,
                **trainer_settings(name),
            ),
            train_dataset=train_set,
            data_collator=DataCollatorWithPadding(tokenizer) if dynamic_padding else default_data_collator,
        )
        _, loop_seconds = timed(trainer.train)
        # Score against the label_ids predict() returns with the logits: they come in the same order even
        # if the eval dataloader does not keep the dataset's (group_by_length may reorder it).
        output = trainer.predict(dev_set)
        predicted = np.argmax(output.predictions, axis=-1)
        scores = {
            "accuracy": float(accuracy_score(output.label_ids, predicted)),
            "macro_f1": float(f1_score(output.label_ids, predicted, average="macro")),
        }
        return scores, loop_seconds

    (scores, loop_seconds), total_seconds = timed(run)
    return {"loop_s": loop_seconds, "total_s": total_seconds, **scores}


def dev_file(cfg: Config) -> str:
    """SST-2 dev: the recipe's test file (it validates on a split of train), else its validation file."""
    return cfg.validation_file or cfg.test_file


def run_bert_tasks(args: argparse.Namespace, overrides: list[str], tmp: Path) -> dict[str, Any]:
    """One bert-tasks run through train(load_recipe(...)): its wall time, metrics.json and training log."""
    output_dir = args.output_dir or tmp / "bert-tasks"
    cfg = load_recipe(args.recipe, [*overrides, *args.set, f"output_dir={output_dir}", "overwrite=true"])
    out, total_seconds = timed(lambda: train(cfg))
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    return {
        "total_s": total_seconds,
        "metrics": json.loads((out / "metrics.json").read_text()),
        "rates": [record["examples_per_s"] for record in log if "examples_per_s" in record],
    }


def run_speed_round(cfg: Config, args: argparse.Namespace, tmp: Path) -> dict[str, dict[str, float]]:
    """Every implementation once on `args.train_samples` rows: loop and total seconds, dev accuracy."""
    overrides = [
        f"max_train_samples={args.train_samples}",
        "epochs=1",
        "lr=5e-5",
        "batch_size=32",
        "eval_every=0",
        "attention_dropout=none",  # the checkpoint's 0.1, as the Trainers train with
        # Every train row trained, dev scored once at the end, as the Trainers do.
        "validation_split=none",
        f"validation_file={dev_file(cfg)}",
        "test_file=none",
        "logging_steps=1000000000",  # one log record, at the last step: the whole loop's rate
    ]
    if args.max_eval_samples is not None:
        overrides.append(f"max_eval_samples={args.max_eval_samples}")
    rows = len(read_tsv(cfg.train_file, cfg.text_column, cfg.label_column, args.train_samples)["text"])
    results = {}
    for name in args.impls:
        if name not in BERT_TASKS:
            results[name] = run_trainer(name, cfg, args, tmp)
            continue
        run = run_bert_tasks(args, [*overrides, *BERT_TASKS[name]], tmp)
        (rate,) = run["rates"]
        accuracy = run["metrics"]["validation"]["accuracy"]
        # SST-2 rows fit one window each, so the loop trained `rows` windows at `rate`.
        results[name] = {"loop_s": rows / rate, "total_s": run["total_s"], "accuracy": accuracy}
    return results


def speed(args: argparse.Namespace) -> list[dict[str, Any]]:
    cfg = load_recipe(args.recipe)
    rows_trained = len(
        read_tsv(cfg.train_file, cfg.text_column, cfg.label_column, args.train_samples)["text"]
    )
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in args.impls}
    with tempfile.TemporaryDirectory() as tmp:
        if args.warmup_rows:
            # Untimed: the first run in a process pays one-off costs (oneDNN kernels, thread pools,
            # allocator) that would otherwise all land on whichever implementation runs first.
            warmup = {"train_samples": args.warmup_rows, "max_eval_samples": 32}
            run_speed_round(cfg, argparse.Namespace(**{**vars(args), **warmup}), Path(tmp))
        for _ in range(args.repeats):
            for name, result in run_speed_round(cfg, args, Path(tmp)).items():  # interleaved
                runs[name].append(result)
    summary = {
        name: {key: median([run[key] for run in results]) for key in ("loop_s", "total_s", "accuracy")}
        for name, results in runs.items()
    }

    print(
        f"SST-2 fine-tuning speed: {rows_trained} train rows, 1 epoch, batch 32, lr 5e-5 | {machine_line()}"
    )
    table_header(
        [
            "impl",
            "loop s",
            "loop ex/s",
            "total s",
            "total ex/s",
            "dev acc",
            "speed-up vs default (loop / total)",
            "vs tuned (loop / total)",
        ]
    )
    rows = []
    for name, measured in summary.items():
        row: dict[str, Any] = {
            "impl": name,
            "train_rows": rows_trained,
            "repeats": args.repeats,
            "loop_s": round(measured["loop_s"], 2),
            "loop_examples_per_s": round(rows_trained / measured["loop_s"], 1),
            "total_s": round(measured["total_s"], 2),
            "total_examples_per_s": round(rows_trained / measured["total_s"], 1),
            "dev_accuracy": round(measured["accuracy"], 4),
        }
        cells = []
        for trainer in TRAINERS:
            base = summary.get(trainer, {})
            for phase in ("loop", "total"):
                row[f"{phase}_speedup_vs_{trainer}"] = ratio(base.get(f"{phase}_s"), measured[f"{phase}_s"])
            cells.append(
                f"{times(row[f'loop_speedup_vs_{trainer}'])} / {times(row[f'total_speedup_vs_{trainer}'])}"
            )
        rows.append(row)
        table_row(
            [
                name,
                f"{row['loop_s']:.1f}",
                f"{row['loop_examples_per_s']:.0f}",
                f"{row['total_s']:.1f}",
                f"{row['total_examples_per_s']:.0f}",
                f"{row['dev_accuracy']:.4f}",
                *cells,
            ]
        )
    return rows


def quality(args: argparse.Namespace) -> list[dict[str, Any]]:
    overrides = [f"max_train_samples={args.train_samples}"] if args.train_samples is not None else []
    if args.max_eval_samples is not None:
        overrides.append(f"max_eval_samples={args.max_eval_samples}")
    overrides.append(f"seed={args.seed}")
    print(f"SST-2 fine-tuning quality: {args.recipe} {' '.join(overrides + args.set)} | {machine_line()}")
    table_header(["impl", "wall s", "selected on", "selection acc", "dev acc", "dev macro-F1", "best step"])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.impls:
            if name == "bert-tasks":
                row = bert_tasks_quality(run_bert_tasks(args, overrides, Path(tmp)), args, overrides)
            else:
                row = trainer_quality(name, args, Path(tmp))
            rows.append({**row, "seed": args.seed, "cpu": cpu_name()})
            table_row(
                [
                    name,
                    f"{row['wall_s']:.0f}",
                    row["selected_on"],
                    "-" if row["selection_accuracy"] is None else f"{row['selection_accuracy']:.4f}",
                    f"{row['dev_accuracy']:.4f}",
                    f"{row['dev_macro_f1']:.4f}",
                    row["best_step"],
                ]
            )
    return rows


def trainer_quality(name: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """A Trainer on every train row the recipe names (capped by --train-samples), its last weights scored
    on dev: no model selection, as a Trainer at its defaults has none."""
    cfg = load_recipe(args.recipe)
    run = run_trainer(name, cfg, args, tmp)
    return {
        "impl": name,
        "settings": trainer_settings(name),
        "wall_s": round(run["total_s"], 1),
        "selected_on": "none (last step)",
        "selection_accuracy": None,
        "dev_accuracy": round(run["accuracy"], 4),
        "dev_macro_f1": round(run["macro_f1"], 4),
        "best_step": "last",
    }


def bert_tasks_quality(run: dict[str, Any], args: argparse.Namespace, overrides: list[str]) -> dict[str, Any]:
    """bert-tasks' row from its metrics.json: dev as held out (its test split) where the recipe says so."""
    metrics = run["metrics"]
    # The recipe picks its checkpoint on `validation` (a split of train) and holds dev out as `test`; a
    # recipe without a test split selects on dev itself, which the row then says.
    dev = metrics.get("test", metrics["validation"])
    row = {
        "impl": "bert-tasks",
        "recipe": str(args.recipe),
        "overrides": overrides + args.set,
        "wall_s": round(run["total_s"], 1),
        "selected_on": "a split of train" if "test" in metrics else "dev",
        "selection_accuracy": round(metrics["validation"]["accuracy"], 4),
        "dev_accuracy": round(dev["accuracy"], 4),
        "dev_macro_f1": round(dev["macro_f1"], 4),
        "best_step": metrics["best_step"],
    }
    return row


def main() -> None:
    reuse_freed_memory()  # what the CLI sets for its process: the library leaves it to the caller
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--recipe", type=Path, default=Path("recipes/sentiment_sst2.yaml"))
    parser.add_argument(
        "--quality", action="store_true", help="bert-tasks alone, full SST-2, recipe defaults"
    )
    parser.add_argument(
        "--train-samples", type=int, help="first N training rows (speed mode default 4000; quality: all)"
    )
    parser.add_argument("--max-eval-samples", type=int, help="first N dev rows (default: all 872)")
    parser.add_argument(
        "--impls",
        nargs="+",
        choices=IMPLEMENTATIONS,
        help=f"speed mode: of {', '.join(SPEED_IMPLS)} (default: all); "
        f"quality mode: of {', '.join(QUALITY_IMPLS)} (default: bert-tasks)",
    )
    parser.add_argument("--seed", type=int, default=42, help="every implementation's seed")
    parser.add_argument("--repeats", type=int, default=1, help="speed mode: runs per implementation (median)")
    parser.add_argument(
        "--warmup-rows", type=int, default=64, help="speed mode: untimed warm-up round on N rows (0: none)"
    )
    parser.add_argument(
        "--set", nargs="*", default=[], metavar="KEY=VALUE", help="extra bert-tasks overrides"
    )
    parser.add_argument("--output-dir", type=Path, help="keep bert-tasks' model here (default: a temp dir)")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args()
    quiet()
    allowed = QUALITY_IMPLS if args.quality else SPEED_IMPLS
    args.impls = args.impls or (["bert-tasks"] if args.quality else list(allowed))
    if not set(args.impls) <= set(allowed):
        parser.error(f"--impls: {'quality' if args.quality else 'speed'} mode runs {', '.join(allowed)}")
    if args.quality:
        rows = quality(args)
    else:
        args.train_samples = args.train_samples or 4000
        rows = speed(args)
    write_json(args.json, rows)


if __name__ == "__main__":
    main()
