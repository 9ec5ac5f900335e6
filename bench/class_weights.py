"""Benchmark: class_weights=auto against no class weights, on imbalanced sentiment and on BC5CDR.

SST-2 part: a deliberately imbalanced training slice of ../shared/data/sst2/train.tsv (by default 450
negative : 4,050 positive, drawn once with --slice-seed, the same slice for every run), trained with
recipes/sentiment_sst2.yaml for --epochs with and without `class_weights=auto`, once per --seeds. There is
no validation split, so no checkpoint is selected: the last weights are scored once on the full SST-2
dev set (872 sentences, balanced 428 : 444) as a held-out test set. Reported as mean ± sample std over the
seeds: macro-F1, accuracy, and the minority (negative) class's F1 and recall.

BC5CDR part: recipes/ner_bc5cdr.yaml as shipped (best dev epoch kept, test held out), with and without
`class_weights=auto`, one seed each: entity F1, per-type F1 and their macro mean on test.

Run from the repo root, one part at a time (each SST-2 run takes a minute or two on 2 cores, each BC5CDR
run 5-15 minutes):

    python bench/class_weights.py --part sst2 --json bench/results/class_weights_sst2.json
    python bench/class_weights.py --part bc5cdr --json bench/results/class_weights_bc5cdr.json
    python bench/class_weights.py --part sst2 --minority 40 --majority 160 --seeds 42 --epochs 1  # smoke
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from common import machine_line, quiet, read_tsv, table_header, table_row, timed, write_json

from bert_tasks import load_recipe, train

SETTINGS = ("none", "auto")
SST2 = Path("../shared/data/sst2")


def imbalanced_slice(path: Path, minority: int, majority: int, seed: int) -> Path:
    """`minority` negatives and `majority` positives of SST-2 train, drawn and shuffled with `seed`."""
    rows = read_tsv(SST2 / "train.tsv", "sentence", "label")
    pairs = list(zip(rows["text"], rows["label"], strict=True))
    rng = np.random.default_rng(seed)
    picked = []
    for label, size in (("0", minority), ("1", majority)):
        pool = [pair for pair in pairs if pair[1] == label]
        picked += [pool[i] for i in rng.choice(len(pool), size=size, replace=False)]
    order = rng.permutation(len(picked))
    lines = ["sentence\tlabel", *(f"{picked[i][0]}\t{picked[i][1]}" for i in order)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def weights_note(run_dir: Path) -> str:
    """The resolved weights, as the run noted them in recipe.yaml (none: no such line)."""
    lines = (run_dir / "recipe.yaml").read_text(encoding="utf-8").splitlines()
    return next((line[2:] for line in lines if line.startswith("# class weights")), "none")


def run(recipe: str, overrides: list[str]) -> tuple[dict[str, Any], float, str]:
    """One train() through the recipe: its test scores, wall seconds and resolved weights."""
    cfg = load_recipe(recipe, [*overrides, "overwrite=true"])
    out, seconds = timed(lambda: train(cfg))
    metrics = json.loads((out / "metrics.json").read_text())
    return metrics["test"], seconds, weights_note(out)


def mean_std(values: list[float]) -> str:
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.4f} ± {spread:.4f}"


def sst2(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    train_file = imbalanced_slice(work / "sst2_imbalanced.tsv", args.minority, args.majority, args.slice_seed)
    results: dict[str, Any] = {}
    for seed in args.seeds:  # settings interleaved: the load on a shared machine falls on both alike
        for setting in SETTINGS:
            scores, seconds, note = run(
                "recipes/sentiment_sst2.yaml",
                [
                    f"train_file={train_file}",
                    "validation_file=none",
                    f"test_file={SST2 / 'dev.tsv'}",
                    f"epochs={args.epochs}",
                    "eval_every=0",
                    f"seed={seed}",
                    f"class_weights={setting}",
                    f"output_dir={work / f'sst2-{setting}-{seed}'}",
                ],
            )
            negative = scores["per_class"]["negative"]
            results.setdefault(setting, []).append(
                {
                    "seed": seed,
                    "macro_f1": scores["macro_f1"],
                    "accuracy": scores["accuracy"],
                    "negative_f1": negative["f1"],
                    "negative_recall": negative["recall"],
                    "wall_s": round(seconds, 1),
                    "weights": note,
                }
            )
            print(f"sst2 class_weights={setting} seed={seed}: {results[setting][-1]}", flush=True)
            write_json(args.json, {"args": {k: str(v) for k, v in vars(args).items()}, "partial": results})
    print(
        f"SST-2, imbalanced train slice {args.minority} negative : {args.majority} positive (slice seed "
        f"{args.slice_seed}), {args.epochs} epochs, seeds {' '.join(map(str, args.seeds))}; "
        f"test = SST-2 dev (872) | {machine_line()}"
    )
    table_header(
        ["class_weights", "macro-F1", "accuracy", "F1 negative (minority)", "recall negative", "wall s"]
    )
    for setting, runs in results.items():
        cells = [
            mean_std([r[key] for r in runs])
            for key in ("macro_f1", "accuracy", "negative_f1", "negative_recall")
        ]
        table_row([setting, *cells, f"{statistics.mean(r['wall_s'] for r in runs):.0f}"])
    for setting, runs in results.items():
        print(f"{setting}: {runs[0]['weights']}")
    return results


def bc5cdr(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for setting in SETTINGS:
        scores, seconds, note = run(
            "recipes/ner_bc5cdr.yaml",
            [
                f"seed={args.seeds[0]}",
                f"class_weights={setting}",
                f"output_dir={work / f'bc5cdr-{setting}'}",
                *([f"epochs={args.bc5cdr_epochs}"] if args.bc5cdr_epochs else []),
            ],
        )
        per_type = {name: row["f1"] for name, row in scores["per_type"].items()}
        results[setting] = {
            "f1": scores["f1"],
            "precision": scores["precision"],
            "recall": scores["recall"],
            "per_type_f1": per_type,
            "macro_f1": statistics.mean(per_type.values()),
            "wall_s": round(seconds, 1),
            "weights": note,
        }
    types = sorted(next(iter(results.values()))["per_type_f1"])
    epochs = f", {args.bc5cdr_epochs} epoch(s)" if args.bc5cdr_epochs else ""
    print(
        f"BC5CDR, recipes/ner_bc5cdr.yaml{epochs}, seed {args.seeds[0]}; test (4,797 sentences) | "
        f"{machine_line()}"
    )
    table_header(
        ["class_weights", "precision", "recall", "F1", *(f"F1 {t}" for t in types), "macro-F1", "wall s"]
    )
    for setting, r in results.items():
        per_type = [f"{r['per_type_f1'][t]:.4f}" for t in types]
        table_row(
            [
                setting,
                f"{r['precision']:.4f}",
                f"{r['recall']:.4f}",
                f"{r['f1']:.4f}",
                *per_type,
                f"{r['macro_f1']:.4f}",
                f"{r['wall_s']:.0f}",
            ]
        )
    for setting, r in results.items():
        print(f"{setting}: {r['weights']}")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--part", choices=("sst2", "bc5cdr"), required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44])
    parser.add_argument("--epochs", type=float, default=2.0, help="SST-2 part only")
    parser.add_argument("--bc5cdr-epochs", type=float, help="BC5CDR part: epochs (default: the recipe's 3)")
    parser.add_argument("--minority", type=int, default=450, help="negatives in the SST-2 slice")
    parser.add_argument("--majority", type=int, default=4050, help="positives in the SST-2 slice")
    parser.add_argument("--slice-seed", type=int, default=0)
    parser.add_argument("--work-dir", type=Path, help="keep the runs here (default: a temporary dir)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    quiet()
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work_dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        results = sst2(args, work) if args.part == "sst2" else bc5cdr(args, work)
    write_json(args.json, {"args": {k: str(v) for k, v in vars(args).items()}, "results": results})


if __name__ == "__main__":
    main()
