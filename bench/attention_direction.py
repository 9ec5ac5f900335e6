"""Benchmark: what seeing both sides of a word buys, bidirectional vs causal (vs right-to-left for NER).

One corpus per run. Each direction trains with the corpus' recipe and the same budget, once per seed
(`seeds=[...]`, so each seed is an ordinary run and `seeds.json` holds mean and sample std), the best
checkpoint picked on the recipe's validation set, and is scored on the held-out set:
  sst2       the recipe picks on a 5% split of train and scores dev (GLUE's test has no labels)
  bc5cdr     picks on dev, scores test
  conll2003  picks on dev, scores test
The only difference between the rows is `attention=`. For NER the test predictions of every seed's model
are broken down (the library's evaluate path: `read_labelled_file`, `Predictor.window_logits`, the task's
decoding and its local seqeval metric) by entity type, by where the entity starts in its sentence (the
first, middle or last third of its words, and the word index of its first word), and by kind of error,
boundary errors split by the side that is wrong (start, end, both). Every cell is mean +- sample std over
the seeds. Run from the repo root:

    python bench/attention_direction.py --corpus sst2 --json bench/results/direction_sst2.json
    python bench/attention_direction.py --corpus bc5cdr --json bench/results/direction_bc5cdr.json
    python bench/attention_direction.py --corpus conll2003 --json bench/results/direction_conll2003.json
    python bench/attention_direction.py --corpus bc5cdr --max-train 64 --max-eval 32 --epochs 1 --seeds 1
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import machine_line, quiet, table_header, table_row, timed, write_json
from seqeval.metrics.sequence_labeling import get_entities

from bert_tasks import load_recipe, train
from bert_tasks.config import ATTENTION_DIRECTIONS
from bert_tasks.inference.evaluate import read_labelled_file
from bert_tasks.inference.predictor import Predictor
from bert_tasks.metrics.ner.ner import CATEGORIES, sentence_errors
from bert_tasks.runtime import reuse_freed_memory

RECIPES = {
    "sst2": Path("recipes/sentiment_sst2.yaml"),
    "bc5cdr": Path("recipes/ner_bc5cdr.yaml"),
    "conll2003": Path("recipes/ner_conll2003.yaml"),
}
#: Right-to-left is the mirror that tells which side matters for entity boundaries; for a sentence label
#: it adds nothing causal does not already say, so sentiment compares two directions.
DIRECTIONS = {
    "sst2": ATTENTION_DIRECTIONS[:2],
    "bc5cdr": ATTENTION_DIRECTIONS,
    "conll2003": ATTENTION_DIRECTIONS,
}
THIRDS = ("first third", "middle third", "last third")
#: Word index of an entity's first word: [low, high] inclusive, the last open-ended.
START_BUCKETS = ((0, 0), (1, 2), (3, 5), (6, 10), (11, 20), (21, None))
BOUNDARY_SIDES = ("start wrong", "end wrong", "both wrong")


def third(start: int, length: int) -> str:
    """Which third of its sentence an entity starts in (by word index)."""
    return THIRDS[min(2, 3 * start // length)]


def start_bucket(start: int, length: int) -> str:
    low, high = next((low, high) for low, high in START_BUCKETS if high is None or start <= high)
    return f"{low}+" if high is None else str(low) if low == high else f"{low}-{high}"


def f1_by(gold: list[list[str]], predicted: list[list[str]], bucket: Callable[[int, int], str]) -> dict:
    """Entity-level precision, recall and F1 (exact type and span, as seqeval's default mode) per bucket of
    the entity's first word; a predicted entity counts in the bucket where it starts, as a gold one does."""
    found, guessed, support = Counter(), Counter(), Counter()
    for gold_tags, predicted_tags in zip(gold, predicted, strict=True):
        length = len(gold_tags)
        truth, guesses = set(get_entities(list(gold_tags))), set(get_entities(list(predicted_tags)))
        for entity in truth:
            support[bucket(entity[1], length)] += 1
            found[bucket(entity[1], length)] += entity in guesses
        for entity in guesses:
            guessed[bucket(entity[1], length)] += 1
    scores = {}
    for name in support | guessed:
        precision = found[name] / guessed[name] if guessed[name] else 0.0
        recall = found[name] / support[name] if support[name] else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        scores[name] = {"precision": precision, "recall": recall, "f1": f1, "support": support[name]}
    return scores


def boundary_sides(gold: list[list[str]], predicted: list[list[str]]) -> Counter:
    """The metric's `wrong_boundary` errors by the side of the span that is wrong."""
    sides: Counter = Counter()
    for gold_tags, predicted_tags in zip(gold, predicted, strict=True):
        for kind, truth, guess in sentence_errors(list(gold_tags), list(predicted_tags)):
            if kind == "wrong_boundary":
                start, end = truth[1] != guess[1], truth[2] != guess[2]
                sides[
                    BOUNDARY_SIDES[2] if start and end else BOUNDARY_SIDES[0] if start else BOUNDARY_SIDES[1]
                ] += 1
    return sides


def ner_breakdown(model_dir: Path, test_file: str, max_eval: int | None) -> dict[str, Any]:
    """One seed's model on the test file, read and decoded as `bert-tasks evaluate` does, broken down."""
    overrides = [] if max_eval is None else [f"max_eval_samples={max_eval}"]
    raw, policy = read_labelled_file(model_dir, test_file, overrides, "ner")
    predictor = Predictor(model_dir, policy=policy, progress=False)
    encoded, logits = predictor.window_logits(raw)
    task, id2label = predictor.task, predictor.id2label
    metrics = task.metrics(raw, encoded, logits, id2label)
    predicted = [tags for tags, _ in task.predict_tags(raw, encoded, logits, id2label)]
    gold = raw["tags"]
    by_third, by_start = f1_by(gold, predicted, third), f1_by(gold, predicted, start_bucket)
    return {
        "f1": metrics["f1"],
        "per_type": {name: row["f1"] for name, row in metrics["per_type"].items()},
        "third": {name: row["f1"] for name, row in by_third.items()},
        "start_word": {name: row["f1"] for name, row in by_start.items()},
        "errors": {kind: metrics["errors"][kind] for kind in CATEGORIES},
        "boundary": dict(boundary_sides(gold, predicted)),
        "support": {
            "per_type": {name: row["support"] for name, row in metrics["per_type"].items()},
            "third": {name: row["support"] for name, row in by_third.items()},
            "start_word": {name: row["support"] for name, row in by_start.items()},
        },
    }


def spread(values: list[float]) -> dict[str, Any]:
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "values": values,
    }


def cell(stats: dict[str, Any] | None, scale: float = 100.0, digits: int = 1) -> str:
    """`mean ± std` (F1 in points by default), or `-` where a bucket had no entity."""
    if stats is None:
        return "-"
    return f"{stats['mean'] * scale:.{digits}f} ± {stats['std'] * scale:.{digits}f}"


def per_key(seeds: list[dict[str, Any]], field: str) -> dict[str, dict[str, Any]]:
    """{key: spread over the seeds} of one breakdown; a key missing in a seed counts 0 (no entity found)."""
    keys = sorted({key for seed in seeds for key in seed[field]})
    return {key: spread([float(seed[field].get(key, 0)) for seed in seeds]) for key in keys}


def run_direction(args: argparse.Namespace, direction: str, root: Path) -> dict[str, Any]:
    """Train every seed with `attention=direction`, then score (and, for NER, break down) each."""
    recipe = RECIPES[args.corpus]
    overrides = [
        *budget_overrides(args),
        f"attention={direction}",
        f"seeds=[{','.join(map(str, args.seeds))}]",
        "logging_steps=1000000000",  # one training-log record for the whole loop
        "report_to=none",
        *args.set,
        f"output_dir={root / direction}",
        "overwrite=true",
    ]
    cfg = load_recipe(recipe, overrides)
    parent, seconds = timed(lambda: train(cfg))
    summary = json.loads((parent / "seeds.json").read_text())
    result: dict[str, Any] = {"attention": direction, "wall_s": round(seconds, 1), "test": summary["test"]}
    if cfg.task == "ner":
        seeds = [ner_breakdown(parent / f"seed-{seed}", cfg.test_file, args.max_eval) for seed in args.seeds]
        result |= {field: per_key(seeds, field) for field in ("per_type", "third", "start_word", "errors")}
        result["boundary"] = {
            side: spread([float(s["boundary"].get(side, 0)) for s in seeds]) for side in BOUNDARY_SIDES
        }
        result["support"] = seeds[0]["support"]
    return result


def budget_overrides(args: argparse.Namespace) -> list[str]:
    pairs = (
        ("max_train_samples", args.max_train),
        ("max_eval_samples", args.max_eval),
        ("epochs", args.epochs),
    )
    return [f"{key}={value:g}" for key, value in pairs if value is not None]


def print_tables(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    ner = args.corpus != "sst2"
    held_out = "dev (picked on 5% of train)" if not ner else "test (picked on dev)"
    print(f"\n### Attention direction: {args.corpus}, {held_out}, {len(args.seeds)} seed(s) {args.seeds}\n")
    print(f"{machine_line()} | load average {os.getloadavg()[0]:.2f} at the end\n")
    print("`" + shlex.join(["python", "bench/attention_direction.py", *sys.argv[1:]]) + "`")
    budget = " ".join(budget_overrides(args) + args.set) or "its full budget"
    print(f"(recipe {RECIPES[args.corpus]}; {budget})\n")
    metrics = ["f1", "precision", "recall"] if ner else ["accuracy", "macro_f1"]
    table_header(["attention", "wall s (all seeds)", *metrics])
    for row in rows:
        table_row([row["attention"], f"{row['wall_s']:.0f}", *(cell(row["test"].get(m)) for m in metrics)])
    if not ner:
        return
    for field, title in (
        ("per_type", "entity type"),
        ("third", "where the entity starts"),
        ("start_word", "word index of the entity's first word"),
    ):
        keys = sorted({key for row in rows for key in row[field]}, key=_order(field))
        support = rows[0]["support"][field]  # gold entities: the same test set for every row
        print(f"\nF1 (points) by {title}\n")
        table_header(["attention", *(f"{key} ({support[key]})" if key in support else key for key in keys)])
        for row in rows:
            table_row([row["attention"], *(cell(row[field].get(key)) for key in keys)])
    print("\nErrors (counts; wrong_boundary split by the side that is wrong)\n")
    table_header(["attention", *CATEGORIES, *BOUNDARY_SIDES])
    for row in rows:
        errors = [cell(row["errors"].get(kind), 1, 1) for kind in CATEGORIES]
        table_row(
            [row["attention"], *errors, *(cell(row["boundary"][side], 1, 1) for side in BOUNDARY_SIDES)]
        )


def _order(field: str) -> Callable[[str], Any]:
    if field == "third":
        return THIRDS.index
    if field == "start_word":
        return lambda key: int(key.split("-")[0].rstrip("+"))
    return str


def main() -> None:
    reuse_freed_memory()  # what the CLI sets for its process: the library leaves it to the caller
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--corpus", choices=tuple(RECIPES), required=True)
    parser.add_argument(
        "--seeds", type=int, nargs="+", default=[42, 43], help="one whole run each (default 42 43)"
    )
    parser.add_argument("--max-train", type=int, help="first N training rows (default: all)")
    parser.add_argument("--max-eval", type=int, help="first N validation and test rows (default: all)")
    parser.add_argument("--epochs", type=float, help="default: the recipe's")
    parser.add_argument(
        "--directions",
        nargs="+",
        choices=ATTENTION_DIRECTIONS,
        help="default: all three for NER, two for sst2",
    )
    parser.add_argument(
        "--set", nargs="*", default=[], metavar="KEY=VALUE", help="more overrides, every direction"
    )
    parser.add_argument(
        "--output-dir", type=Path, help="keep the models here (replaced; default: a temp dir)"
    )
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args()
    quiet()
    directions = args.directions or DIRECTIONS[args.corpus]
    with tempfile.TemporaryDirectory() as tmp:
        root = args.output_dir or Path(tmp)
        rows = [run_direction(args, direction, root) for direction in directions]
    print_tables(args, rows)
    write_json(
        args.json, {"corpus": args.corpus, "seeds": args.seeds, "machine": machine_line(), "rows": rows}
    )


if __name__ == "__main__":
    main()
