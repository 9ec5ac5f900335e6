"""Benchmark: NER fine-tuning, bert-tasks' recipe against a plain transformers Trainer, one run, test F1.

  baseline    the issue's baseline, a plain Trainer: labels on each word's first sub-token, truncation at
              128 sub-tokens, argmax decoding, lr 5e-5, batch 32, bf16, 3 epochs, dynamic padding and
              Trainer defaults otherwise (random batches, no warmup, no weight decay); scored with seqeval
              (default conlleval mode) on the test set at the word level: the words whose first sub-token
              was truncated away get no prediction and count as O (the count is printed)
  bert-tasks  bert_tasks.train(load_recipe("recipes/ner_<corpus>.yaml", overrides)), the CLI's code
              path, with the recipe's own hyper-parameters (windows instead of truncation, BIO Viterbi
              decoding, dev scored every epoch and the best epoch kept); scored by itself: the test split
              of its metrics.json (seqeval, the same default mode, untruncated gold)
  --baseline defaults  instead of the issue's baseline, a Trainer at TrainingArguments' own defaults (batch
              8, lr 5e-5, 3 epochs, no warmup, no weight decay; bf16 as on bert-tasks' side) truncating at
              512, run_ner.py's default: what a user gets without choosing anything
  --baseline tuned  instead of the issue's baseline, a Trainer tuned for speed with the recipe's own
              hyper-parameters (lr, batch size, max_length, warmup, weight decay, epochs), bf16,
              group_by_length and fused AdamW: the speed comparison at equal settings
"wall s" is everything each side does from reading the files to the test scores: the baseline trains and
predicts test; bert-tasks also scores dev after every epoch and again at the end, and saves the model.
"train ex/s" is the training loop alone: the Trainer's train_samples_per_second, and bert-tasks' training
log over the whole loop (evaluations excluded; it counts windows, one per sentence at max_length 256).
"bf16" for a Trainer means: where bert-tasks' `mixed_precision=auto` takes it (AVX512-BF16, AMX, CUDA),
fp32 on a CPU without bf16 instructions, as bert-tasks. Both read the train/test files the recipe names.
Run from the repo root:

    python bench/finetune_ner.py --corpus bc5cdr --json bench/results/finetune_ner_bc5cdr.json
    python bench/finetune_ner.py --corpus ncbi_disease --json bench/results/finetune_ner_ncbi_disease.json
    python bench/finetune_ner.py --corpus conll2003 --json bench/results/finetune_ner_conll2003.json
    python bench/finetune_ner.py --corpus bc5cdr --baseline tuned --json bench/results/finetune_ner_speed.json
    python bench/finetune_ner.py --corpus bc5cdr --max-train-samples 64 --max-eval-samples 32 --epochs 1
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
    quiet,
    ratio,
    read_conll,
    table_header,
    table_row,
    timed,
    times,
    training_args,
    write_json,
)
from datasets import Dataset
from seqeval.metrics import classification_report
from transformers import (
    AutoModelForTokenClassification,
    AutoTokenizer,
    DataCollatorForTokenClassification,
    Trainer,
    set_seed,
)

from bert_tasks import Config, load_recipe, train
from bert_tasks.modeling.load import resolve_model_path
from bert_tasks.runtime import reuse_freed_memory

CORPORA = ("bc5cdr", "ncbi_disease", "conll2003")
#: The issue's baseline settings.
BASELINE = {"max_length": 128, "lr": 5e-5, "batch_size": 32, "epochs": 3.0}
#: A Trainer as TrainingArguments leaves it (batch 8, lr 5e-5, 3 epochs, no warmup, no weight decay) and
#: run_ner.py's default length (the tokenizer's 512): what a user gets without choosing anything.
TRAINER_DEFAULTS = {"max_length": 512, "lr": 5e-5, "batch_size": 8, "epochs": 3.0}
IGNORE = -100


def first_subtoken_labels(word_ids: list[int | None], word_labels: list[int]) -> list[int]:
    """The word's label on its first sub-token, -100 on the rest and on special tokens."""
    labels, previous = [], None
    for word in word_ids:
        labels.append(IGNORE if word is None or word == previous else word_labels[word])
        previous = word
    return labels


def word_tags(
    token_ids: np.ndarray, word_ids: list[int | None], num_words: int, labels: list[str]
) -> list[str]:
    """Word-level tags from per-token predictions: each word's first sub-token; words not seen are O."""
    tags, previous = ["O"] * num_words, None
    for position, word in enumerate(word_ids):
        if word is not None and word != previous:
            tags[word] = labels[token_ids[position]]
        previous = word
    return tags


def seqeval_scores(gold: list[list[str]], predicted: list[list[str]]) -> dict[str, Any]:
    """Overall micro P/R/F1 and per-type F1, seqeval's default mode (as bert-tasks' `f1`/`per_type`)."""
    report = classification_report(gold, predicted, output_dict=True, zero_division=0)
    micro = report["micro avg"]
    per_type = {
        name: {"f1": float(row["f1-score"]), "support": int(row["support"])}
        for name, row in report.items()
        if not name.endswith(" avg")
    }
    return {
        "precision": float(micro["precision"]),
        "recall": float(micro["recall"]),
        "f1": float(micro["f1-score"]),
        "per_type": per_type,
    }


def baseline_settings(cfg: Config, kind: str) -> dict[str, Any]:
    """The issue's baseline, a Trainer at transformers' own defaults, or one tuned for speed with the
    recipe's own hyper-parameters."""
    if kind == "issue":
        return {**BASELINE, "trainer": {}}
    if kind == "defaults":
        return {**TRAINER_DEFAULTS, "trainer": {}}
    return {
        "max_length": cfg.max_length,
        "lr": cfg.lr,
        "batch_size": cfg.batch_size,
        "epochs": cfg.epochs,
        "trainer": {
            "warmup_steps": cfg.warmup_ratio,  # transformers 5: a float < 1 is a ratio
            "weight_decay": cfg.weight_decay,
            "optim": "adamw_torch_fused",
            "train_sampling_strategy": "group_by_length",
        },
    }


def trainer_tags(
    cfg: Config,
    settings: dict[str, Any],
    epochs: float,
    rows: tuple[int | None, int | None],
    tmp: Path,
    seed: int = 42,
) -> dict[str, Any]:
    """A plain Trainer from the CoNLL files to word-level test tags, so a caller can score them its own way.

    `rows`: the first N train and test sentences (None: all). Returns the test `words`, `gold` and
    `predicted` tags per sentence with the run's counts (sentences, truncated words) and its train ex/s.
    """
    model_dir = resolve_model_path(cfg.model)
    train_words, train_tags = read_conll(cfg.train_file, rows[0])
    test_words, test_tags = read_conll(cfg.test_file, rows[1])
    labels = sorted({tag for row in train_tags for tag in row})
    label2id = {label: i for i, label in enumerate(labels)}
    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def encode(words: list[list[str]]) -> tuple[dict[str, list], list[list[int | None]]]:
        encoded = tokenizer(
            words, is_split_into_words=True, truncation=True, max_length=settings["max_length"]
        )
        return dict(encoded), [encoded.word_ids(i) for i in range(len(words))]

    train_columns, train_word_ids = encode(train_words)
    train_columns["labels"] = [
        first_subtoken_labels(ids, [label2id[tag] for tag in tags])
        for ids, tags in zip(train_word_ids, train_tags, strict=True)
    ]
    test_columns, test_word_ids = encode(test_words)
    set_seed(seed)  # the new classifier head's initialisation
    model = AutoModelForTokenClassification.from_pretrained(
        model_dir, num_labels=len(labels), id2label=dict(enumerate(labels)), label2id=label2id
    )
    trainer = Trainer(
        model=model,
        args=training_args(
            tmp / "baseline",
            seed=seed,
            num_train_epochs=epochs,
            per_device_train_batch_size=settings["batch_size"],
            per_device_eval_batch_size=cfg.eval_batch_size,
            learning_rate=settings["lr"],
            bf16=bf16_as_bert_tasks(),
            **settings["trainer"],
        ),
        train_dataset=Dataset.from_dict(train_columns),
        data_collator=DataCollatorForTokenClassification(tokenizer),
    )
    train_rate = trainer.train().metrics["train_samples_per_second"]
    # transformers 5 length-groups the evaluation batches too under group_by_length, which would put
    # the predictions out of dataset order: predict with a Trainer in sequential order.
    predictor = Trainer(
        model=trainer.model,
        args=training_args(
            tmp / "predict", per_device_eval_batch_size=cfg.eval_batch_size, bf16=bf16_as_bert_tasks()
        ),
        data_collator=DataCollatorForTokenClassification(tokenizer),
    )
    logits = predictor.predict(Dataset.from_dict(test_columns)).predictions  # [N, T, C], padded
    token_ids = logits.argmax(axis=-1)  # [N, T]
    predicted = [
        word_tags(token_ids[i], test_word_ids[i], len(words), labels) for i, words in enumerate(test_words)
    ]
    unseen = sum(
        len(words) - len({w for w in ids if w is not None})
        for words, ids in zip(test_words, test_word_ids, strict=True)
    )
    return {
        "words": test_words,
        "gold": test_tags,
        "predicted": predicted,
        "train_sentences": len(train_words),
        "test_sentences": len(test_words),
        "test_words": sum(len(words) for words in test_words),
        "words_truncated_as_O": unseen,
        "epochs": epochs,
        "train_examples_per_s": train_rate,
    }


def run_baseline(cfg: Config, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """The Trainer baseline from the CoNLL files to word-level test scores."""
    settings = baseline_settings(cfg, args.baseline)
    epochs = args.epochs or settings["epochs"]

    def run() -> dict[str, Any]:
        rows = (args.max_train_samples, args.max_eval_samples)
        tagged = trainer_tags(cfg, settings, epochs, rows, tmp, seed=cfg.seed)
        scores = seqeval_scores(tagged.pop("gold"), tagged.pop("predicted"))
        del tagged["words"]
        return {**scores, **tagged}

    scores, seconds = timed(run)
    return {**scores, "wall_s": round(seconds, 1)}


def run_bert_tasks(cfg: Config) -> dict[str, Any]:
    """train(cfg) as the CLI runs it; the test scores are its own metrics.json."""
    out, seconds = timed(lambda: train(cfg))
    test = json.loads((out / "metrics.json").read_text())["test"]
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    (train_rate,) = [record["examples_per_s"] for record in log if "examples_per_s" in record]
    return {
        "train_examples_per_s": train_rate,
        "precision": test["precision"],
        "recall": test["recall"],
        "f1": test["f1"],
        "per_type": {
            name: {"f1": row["f1"], "support": row["support"]} for name, row in test["per_type"].items()
        },
        "epochs": cfg.epochs,
        "wall_s": round(seconds, 1),
    }


def main() -> None:
    reuse_freed_memory()  # what the CLI sets for its process: the library leaves it to the caller
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--corpus", choices=CORPORA, default="bc5cdr")
    parser.add_argument("--recipe", type=Path, help="default: recipes/ner_<corpus>.yaml")
    parser.add_argument(
        "--epochs", type=float, help="for both sides (default: baseline 3, bert-tasks its recipe's)"
    )
    parser.add_argument("--max-train-samples", type=int, help="first N training sentences (both sides)")
    parser.add_argument("--max-eval-samples", type=int, help="first N dev/test sentences (both sides)")
    parser.add_argument("--skip-baseline", action="store_true", help="run bert-tasks only")
    parser.add_argument("--skip-bert-tasks", action="store_true", help="run the baseline only")
    parser.add_argument(
        "--baseline",
        choices=("issue", "defaults", "tuned"),
        default="issue",
        help="which Trainer to compare with",
    )
    parser.add_argument("--seed", type=int, default=42, help="both sides' seed")
    parser.add_argument(
        "--set", nargs="*", default=[], metavar="KEY=VALUE", help="extra bert-tasks overrides"
    )
    parser.add_argument(
        "--output-dir", type=Path, help="keep bert-tasks' model here (replaced; default: temp)"
    )
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args()
    quiet()

    recipe = args.recipe or Path(f"recipes/ner_{args.corpus}.yaml")
    overrides = [
        f"{key}={value:g}"
        for key, value in (
            ("epochs", args.epochs),
            ("max_train_samples", args.max_train_samples),
            ("max_eval_samples", args.max_eval_samples),
        )
        if value is not None
    ]
    with tempfile.TemporaryDirectory() as tmp:
        output_dir = args.output_dir or Path(tmp) / "bert-tasks"
        # One training-log record for the whole loop: its examples/s is the loop's rate.
        whole_loop = ["logging_steps=1000000000"]
        cfg = load_recipe(
            recipe,
            [
                *overrides,
                *whole_loop,
                *args.set,
                f"seed={args.seed}",
                f"output_dir={output_dir}",
                "overwrite=true",
            ],
        )
        results = {} if args.skip_baseline else {"baseline": run_baseline(cfg, args, Path(tmp))}
        if not args.skip_bert_tasks:
            results["bert-tasks"] = run_bert_tasks(cfg)

    types = sorted({name for result in results.values() for name in result["per_type"]})
    print(f"NER {args.corpus} test set: {recipe} {' '.join(overrides + args.set)} | {machine_line()}")
    if "baseline" in results:
        baseline = results["baseline"]
        truncated_at = baseline_settings(cfg, args.baseline)["max_length"]
        print(
            f"baseline: {baseline['words_truncated_as_O']} of {baseline['test_words']} test words lost their "
            f"first sub-token to truncation at {truncated_at} and count as O predictions"
        )
    table_header(
        ["impl", "epochs", "wall s", "train ex/s", "P", "R", "F1", *(f"F1 {name}" for name in types)]
    )
    rows = []
    for name, result in results.items():
        kind = {"baseline": args.baseline} if name == "baseline" else {}
        row = {"corpus": args.corpus, "impl": name, **kind, "seed": args.seed, "cpu": cpu_name()}
        rows.append({**row, **result})
        type_f1 = [result["per_type"].get(t, {}).get("f1") for t in types]
        table_row(
            [
                name,
                f"{result['epochs']:g}",
                f"{result['wall_s']:.0f}",
                f"{result['train_examples_per_s']:.1f}",
                f"{result['precision']:.4f}",
                f"{result['recall']:.4f}",
                f"{result['f1']:.4f}",
                *("-" if f1 is None else f"{f1:.4f}" for f1 in type_f1),
            ]
        )
    if len(results) == 2:
        base, ours = results["baseline"], results["bert-tasks"]
        difference = {
            "corpus": args.corpus,
            "impl": "bert-tasks - baseline",
            "wall_ratio": ratio(ours["wall_s"], base["wall_s"]),
            "train_speedup": ratio(ours["train_examples_per_s"], base["train_examples_per_s"]),
            "f1_points": round(100 * (ours["f1"] - base["f1"]), 2),
            "type_f1_points": {
                t: round(100 * (ours["per_type"][t]["f1"] - base["per_type"][t]["f1"]), 2)
                for t in types
                if t in ours["per_type"] and t in base["per_type"]
            },
        }
        rows.append(difference)
        table_row(
            [
                "bert-tasks - baseline (F1 points)",
                "",
                f"{times(difference['wall_ratio'])} time",
                f"{times(difference['train_speedup'])}",
                "",
                "",
                f"{difference['f1_points']:+.2f}",
                *(
                    f"{difference['type_f1_points'][t]:+.2f}" if t in difference["type_f1_points"] else "-"
                    for t in types
                ),
            ]
        )
    write_json(args.json, rows)


if __name__ == "__main__":
    main()
