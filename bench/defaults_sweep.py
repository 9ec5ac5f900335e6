"""Benchmark: choose the task defaults by a written protocol, on validation splits only (issue #17, item 2).

Each candidate is a set of `key=value` overrides over a shipped recipe; every (corpus, candidate, seed)
is one `bert-tasks finetune` in a child process of its own (so runs are independent and can go two at a
time, each pinned to one core with one torch thread). A run's row keeps what its own run dir says:
the best validation score and the step it came at, how many updates the run made before early stopping
ended it, and the held-out test score, which the protocol never reads (it is printed only for the
candidate the protocol picks). Rows are appended to --json as each run ends; --resume skips done ones.

The protocol (what --table applies):
  1. per corpus, a candidate's score is its mean validation score over seeds;
  2. its regret on a corpus is that corpus' best candidate score minus its own;
  3. the default is the candidate with the smallest worst-case regret over the corpora (ties: the smaller
     mean regret, then the fewer updates), i.e. the one that is never far from each corpus' own best.

    python bench/defaults_sweep.py --corpus bc5cdr ncbi_disease --grid lr=5e-5,1e-4,2e-4 \
        --fixed epochs=10 early_stopping_patience=2 --cores 0 1 --json bench/results/defaults_ner.json
    python bench/defaults_sweep.py --table --json bench/results/defaults_ner.json   # seed 42 only: a pick's
    # seeds in the same table would be a 3-seed mean against 1-seed rows
    python bench/defaults_sweep.py --table --json bench/results/defaults_ner_e5_conll2003.json \
        --anchor bench/results/trainer_defaults_conll2003_s*.json   # beside a Trainer's
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from common import cpu_name, table_header, table_row, write_json

ROOT = Path(__file__).resolve().parents[1]
#: corpus -> (task, the recipe it starts from, the metric that selects)
CORPORA = {
    "bc5cdr": ("ner", "recipes/ner_bc5cdr.yaml", "f1"),
    "ncbi_disease": ("ner", "recipes/ner_ncbi_disease.yaml", "f1"),
    "conll2003": ("ner", "recipes/ner_conll2003.yaml", "f1"),
    "sst2": ("sentiment", "recipes/sentiment_sst2.yaml", "accuracy"),
}


def candidates(grid: list[str]) -> list[tuple[str, ...]]:
    """`["lr=1e-4,2e-4", "warmup_ratio=0,0.1"]` -> every combination as a tuple of key=value overrides."""
    axes = []
    for axis in grid:
        key, _, values = axis.partition("=")
        axes.append([f"{key}={value}" for value in values.split(",")])
    return list(itertools.product(*axes))


def run_one(
    corpus: str, overrides: tuple[str, ...], seed: int, core: int | None, work: Path
) -> dict[str, Any]:
    """One `bert-tasks finetune` in a child process; its row from the run dir it wrote."""
    task, recipe, metric = CORPORA[corpus]
    out = work / f"{corpus}-{'-'.join(overrides)}-seed{seed}".replace("=", "")
    command = [sys.executable, "-m", "bert_tasks", "finetune", task, "--recipe", recipe, *overrides]
    command += [f"seed={seed}", f"output_dir={out}", "report_to=none", "--overwrite"]
    env = dict(os.environ)
    if core is not None:  # one core, one thread: two runs side by side do not fight over both cores
        command = ["taskset", "-c", str(core), *command, "threads=1"]
        env["OMP_NUM_THREADS"] = "1"
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{corpus} {overrides} seed {seed} failed:\n{done.stderr[-3000:]}")
    metrics = json.loads((out / "metrics.json").read_text())
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    evals = [(r["step"], r[f"eval_{metric}"]) for r in log if f"eval_{metric}" in r]
    epochs = [r["epoch"] for r in log if "epoch" in r]
    return {
        "corpus": corpus,
        "overrides": list(overrides),
        "seed": seed,
        "validation": metrics["validation"][metric],
        "test": metrics.get("test", {}).get(metric),
        "best_step": metrics["best_step"],
        "last_step": evals[-1][0],
        "last_epoch": epochs[-1] if epochs else None,
        "evaluations": evals,
        "wall_s": round(wall, 1),
        "core": core,
    }


def sweep(args: argparse.Namespace) -> None:
    (path,) = args.json
    rows = json.loads(path.read_text())["rows"] if args.resume and path.exists() else []
    done = {(r["corpus"], tuple(r["overrides"]), r["seed"]) for r in rows}
    fixed = tuple(args.fixed)
    todo = [
        (corpus, candidate + fixed, seed)
        for seed in args.seeds
        for candidate in candidates(args.grid)
        for corpus in args.corpus
        if (corpus, candidate + fixed, seed) not in done
    ]
    work = Path(tempfile.mkdtemp(prefix="defaults-sweep-"))
    cores = args.cores or [None]
    print(f"{cpu_name()} | {len(todo)} runs, {len(cores)} at a time | run dirs in {work}", flush=True)

    written = threading.Lock()

    def job(lane: int, item: tuple[str, tuple[str, ...], int]) -> None:
        row = run_one(*item, core=cores[lane], work=work)
        row["cpu"] = cpu_name()
        with written:  # one lane at a time rewrites the whole file
            rows.append(row)
            write_json(path, {"rows": rows})
        print(
            f"{row['corpus']} {' '.join(row['overrides'])} seed {row['seed']}: validation "
            f"{row['validation']:.4f} at step {row['best_step']} of {row['last_step']} ({row['wall_s']} s)",
            flush=True,
        )

    # Each lane takes every len(cores)-th run, so lane i always runs on core i.
    def run_lane(lane: int) -> None:
        for item in todo[lane :: len(cores)]:
            job(lane, item)

    with ThreadPoolExecutor(len(cores)) as pool:
        for future in [pool.submit(run_lane, lane) for lane in range(len(cores))]:
            future.result()


def mean_std(values: list[float]) -> str:
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{100 * statistics.mean(values):.2f} ± {100 * spread:.2f}"


def table(paths: list[Path], anchors: list[Path]) -> None:
    """The sweep's table and the protocol's pick (validation only; test printed for the pick alone, beside
    the anchor's test scores when `anchors` names bench/finetune_ner.py JSONs of its baseline)."""
    rows = [row for path in paths for row in json.loads(path.read_text())["rows"]]
    corpora = sorted({r["corpus"] for r in rows})
    by = {}
    for row in rows:
        by.setdefault((tuple(row["overrides"]), row["corpus"]), []).append(row)
    configs = sorted({key[0] for key in by})
    score = {key: statistics.mean(r["validation"] for r in runs) for key, runs in by.items()}
    best = {c: max(score[k] for k in score if k[1] == c) for c in corpora}
    regrets = {}
    for config in configs:
        if all((config, c) in score for c in corpora):
            regret = [best[c] - score[config, c] for c in corpora]
            updates = statistics.mean(r["last_step"] for c in corpora for r in by[config, c])
            regrets[config] = (max(regret), statistics.mean(regret), updates)
    print(f"CPU: {sorted({r.get('cpu', '?') for r in rows})}")
    columns = ["candidate", *(f"{c} validation (best step / updates run)" for c in corpora), "worst regret"]
    table_header(columns)
    for config in configs:
        cells = [" ".join(config)]
        for corpus in corpora:
            runs = by.get((config, corpus), [])
            steps = "; ".join(f"{r['best_step']}/{r['last_step']}" for r in runs)
            cells.append(f"{mean_std([r['validation'] for r in runs])} ({steps})" if runs else "")
        cells.append(f"{100 * regrets[config][0]:.2f}" if config in regrets else "")
        table_row(cells)
    if regrets:
        pick = min(regrets, key=lambda config: regrets[config])
        print(f"\nprotocol's pick: {' '.join(pick)}")
        for corpus in corpora:
            tests = [r["test"] for r in by[pick, corpus] if r["test"] is not None]
            if tests:
                seeds = f"{len(tests)} seed(s)"
                print(f"  {corpus} test (held out, never used to choose): {mean_std(tests)} ({seeds})")
                print_anchor(corpus, tests, anchor_rows(anchors, corpus))


def anchor_rows(paths: list[Path], corpus: str) -> list[dict[str, Any]]:
    """The baseline rows of bench/finetune_ner.py JSONs for `corpus` (one file a seed)."""
    rows = [row for path in paths for row in json.loads(path.read_text())]
    return [row for row in rows if row["corpus"] == corpus and row["impl"] == "baseline"]


def print_anchor(corpus: str, tests: list[float], anchor: list[dict[str, Any]]) -> None:
    """The anchor's test F1 and the pick's margin over it, in points (issue #17 item 3 asks +1.5)."""
    if not anchor:
        return
    kinds = sorted({row.get("baseline", "?") for row in anchor})
    seeds = ", ".join(sorted(str(row.get("seed", "?")) for row in anchor))  # ?: written before they said
    scores = [row["f1"] for row in anchor]
    margin = 100 * (statistics.mean(tests) - statistics.mean(scores))
    print(
        f"  {corpus} anchor, a Trainer ({', '.join(kinds)}), test: {mean_std(scores)} (seeds {seeds}); "
        f"the pick's margin {margin:+.2f} points"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--corpus", nargs="+", choices=sorted(CORPORA), default=["bc5cdr", "ncbi_disease"])
    parser.add_argument("--grid", nargs="*", default=["lr=5e-5,1e-4,2e-4"], help="key=v1,v2 axes")
    parser.add_argument("--fixed", nargs="*", default=[], help="key=value set on every run")
    parser.add_argument("--seeds", nargs="+", type=int, default=[42])
    parser.add_argument(
        "--cores",
        nargs="*",
        type=int,
        default=[],
        help="one run at a time on each of these cores (default: one run at a time, unpinned)",
    )
    parser.add_argument("--json", type=Path, nargs="+", required=True, help="rows (--table: several files)")
    parser.add_argument("--resume", action="store_true", help="skip the runs --json already holds")
    parser.add_argument("--table", action="store_true", help="print the table and the pick from --json")
    parser.add_argument(
        "--anchor",
        type=Path,
        nargs="*",
        default=[],
        help="--table: bench/finetune_ner.py JSONs whose baseline the pick's test scores are set beside",
    )
    args = parser.parse_args()
    if args.table:
        table(args.json, args.anchor)
    else:
        sweep(args)


if __name__ == "__main__":
    main()
