"""Benchmark: issue 18's "Ship small" table, one per task, every row built and measured in one script run.

Per task, the teacher is the bundled all-MiniLM-L6-v2 (6 layers, 384 wide, 12 heads) fine-tuned by the
task's recipe on a slice (`common.slice_recipe`): SST-2 on the first --sst2-rows train rows for
--sst2-teacher-epochs (10% of them, stratified, pick the checkpoint; all 872 dev sentences are scored, held
out); BC5CDR on the first --bc5cdr-rows train sentences for --bc5cdr-teacher-epochs (the first --eval-rows
dev sentences pick, the first --eval-rows test sentences are scored). Every student trains on the same
slice for --sst2-epochs / --bc5cdr-epochs. The rows, each from the toolkit's own commands:

  - the teacher in fp32, under bf16 autocast, and int8 (torch dynamic quantization, on load);
  - the 3-layer student distilled with `bert-tasks distill`'s defaults (layers [0, 2, 4], alpha 0.5, T 2),
    the same student trained without a teacher (alpha=0: the gold loss alone), and a 4-layer student;
  - the teacher with 25% and 50% of its heads pruned (`bert-tasks prune`), without and with recovery
    (recover_steps=--recover-steps, recovery's defaults);
  - the 3-layer student as it is and pruned 25% / 50% (with recovery, which keeps its teacher), each in
    torch int8 and exported to ONNX int8 (`bert-tasks export --format onnx --quantize int8`, checked on
    the validation split);
  - the best combination, picked among those six int8 students by validation score and speed, never by
    the scored split: the fastest on one core whose validation score is within --loss-budget points of
    the fp32 teacher's, or, when none is, the best on validation.

Scores: `Predictor.evaluate` (the code of `bert-tasks evaluate`) of every row as it runs (fp32, bf16, int8,
ONNX), on validation and on the scored split. Speed and memory: every row in a fresh process (`--child`),
rows round-robin over --repeats (median), so the machine's load hits all alike: it opens the dir with
`Predictor`, then on 1 and on 2 threads (torch.set_num_threads; onnxruntime intra-op threads; the order
alternates between repeats) predicts the first --speed-texts texts of the scored split once to warm up and
once timed (tokenizing, windowing and decoding included), and reports its peak resident memory (VmHWM).
Size on disk: the weights file (model.safetensors; model.onnx). Ratios are against the fp32 teacher.

Run from the repo root (BENCHMARKS.md, "Ship small, one table per task", has its command and wall time):

    OMP_WAIT_POLICY=PASSIVE python bench/ship_small.py --json bench/results/ship_small.json \\
        --png bench/figures/ship_small.png
    OMP_WAIT_POLICY=PASSIVE python bench/ship_small.py --sst2-rows 300 --bc5cdr-rows 150 --eval-rows 60 \\
        --recover-steps 4 --repeats 1 --speed-texts 64   # smoke, a few minutes
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
SHARES = (0.25, 0.5)
FP32 = {"mixed_precision": "no"}
INT8 = {"mixed_precision": "no", "quantize": "int8"}


@dataclass
class Row:
    """One row of a task's table: a model dir and how it runs, then what was measured of it."""

    key: str
    name: str
    directory: Path
    #: `Predictor` options: how the dir runs (precision, quantization); {} for an ONNX export.
    options: dict[str, str]
    #: One of the combinations the best is picked from.
    candidate: bool = False
    scores: dict[str, float] = field(default_factory=dict)
    runs: list[dict[str, Any]] = field(default_factory=list)


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One row's speed and memory in this (fresh) process: what `bert-tasks predict` would load and run."""
    from common import on_threads, peak_rss_mib, timed

    from bert_tasks.runtime import configure_cli_process

    configure_cli_process()
    from bert_tasks.inference.predictor import Predictor

    texts = json.loads(Path(spec["texts"]).read_text(encoding="utf-8"))
    predictor, load = timed(lambda: Predictor(spec["dir"], batch_size=64, progress=False, **spec["options"]))
    speed = {}
    for threads in spec["threads"]:
        on_threads(predictor, spec["dir"], threads)
        predictor.predict(texts[:64])  # warm-up, on these threads
        seconds = timed(lambda: predictor.predict(texts))[1]
        speed[threads] = len(texts) / seconds
    return {"load_s": load, "texts_per_s": speed, "peak_rss_mib": peak_rss_mib()}


class Build:
    """Trains, prunes and exports one task's models under `root`, timing each step."""

    def __init__(self, task: str, args: argparse.Namespace, root: Path) -> None:
        from common import slice_recipe

        self.task, self.args, self.root = task, args, root
        sst2 = task == "sentiment"
        rows, epochs = (args.sst2_rows, args.sst2_epochs) if sst2 else (args.bc5cdr_rows, args.bc5cdr_epochs)
        self.teacher_epochs = args.sst2_teacher_epochs if sst2 else args.bc5cdr_teacher_epochs
        self.recipe, self.shared = slice_recipe(task, rows, epochs, args.eval_rows)
        self.seconds: dict[str, float] = {}
        self.refused: dict[str, str] = {}
        self.check_file: Path | None = None

    def step(self, name: str, make: Callable[[], T]) -> T:
        from common import timed

        print(f"[{self.task}] {name} ... (load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
        made, seconds = timed(make)
        self.seconds[name] = round(seconds, 1)
        return made

    def train(self, name: str, extra: list[str]) -> Path:
        from bert_tasks import load_recipe, train

        out = f"output_dir={self.root / name}"
        return self.step(
            name, lambda: train(load_recipe(self.recipe, [*self.shared, out, *extra], self.task))
        )

    def prune(self, name: str, source: Path, share: float, recover: bool) -> Path:
        from bert_tasks.pruning import prune

        overrides = [f"recover_steps={self.args.recover_steps}"] if recover else []
        return self.step(name, lambda: prune(self.task, source, str(share), self.root / name, overrides))

    def export_int8(self, name: str, source: Path) -> Path | None:
        """`bert-tasks export --format onnx --quantize int8 --check <validation split>`; None (and the reason
        kept) if it is refused. The check is the model's own validation split, not the bundled 100 demo
        texts, on which one near-tied label flipping by rounding is 1% of the agreement the check demands
        (BENCHMARKS.md, "Ship small, one table per task")."""
        from bert_tasks.errors import BertTasksError
        from bert_tasks.inference.onnx_export import export_onnx

        out, check = self.root / name, str(self.validation_file(source))
        try:
            parity = self.step(name, lambda: export_onnx(source, out, "int8", check))
        except BertTasksError as error:
            self.refused[name] = str(error)
            print(f"[{self.task}] {name}: {error}", file=sys.stderr, flush=True)
            return None
        print(f"[{self.task}] {name}: {parity}", file=sys.stderr, flush=True)
        return out

    def validation_file(self, model_dir: Path) -> Path:
        """The validation split as a JSONL file in the task's default fields (what `--check` reads)."""
        from common import model_splits

        if self.check_file is None:
            raw = model_splits(model_dir)["validation"]
            fields = [name for name in ("text", "label", "tokens", "tags") if name in raw.column_names]
            self.check_file = self.root / "validation.jsonl"
            raw.select_columns(fields).to_json(self.check_file, lines=True)
        return self.check_file

    def rows(self) -> list[Row]:
        teacher = self.train("teacher", [f"epochs={self.teacher_epochs}"])
        kd = [f"teacher={teacher}", "student_layers=3"]
        rows = [
            Row("teacher", "teacher (6 layers) fp32", teacher, FP32),
            Row("bf16", "teacher bf16 autocast", teacher, {"mixed_precision": "bf16"}),
            Row(
                "int8", "teacher int8 (torch dynamic)", teacher, {"mixed_precision": "no", "quantize": "int8"}
            ),
            Row("kd3", "3 layers, distilled", self.train("kd3", kd), FP32),
            Row("alone3", "3 layers, no teacher (alpha=0)", self.train("alone3", [*kd, "alpha=0"]), FP32),
            Row("kd4", "4 layers, distilled", self.train("kd4", [*kd[:1], "student_layers=4"]), FP32),
        ]
        steps = self.args.recover_steps
        for share in SHARES:
            key = f"pruned{share * 100:.0f}"
            rows.append(Row(key, f"{share:.0%} heads pruned", self.prune(key, teacher, share, False), FP32))
            name = f"{share:.0%} heads pruned + {steps} recovery updates"
            rows.append(Row(f"{key}r", name, self.prune(f"{key}r", teacher, share, True), FP32))
        return rows + self.combinations(rows[3].directory)

    def combinations(self, student: Path) -> list[Row]:
        """The 3-layer student as it is and pruned 25% / 50% (with recovery), each in torch int8 and as an
        ONNX int8 export: the rows the best combination is picked from."""
        students = [("kd3", "3 layers", student)]
        for share in SHARES:
            key = f"kd3-pruned{share * 100:.0f}r"
            name = f"3 layers, {share:.0%} heads pruned + recovery"
            students.append((key, name, self.prune(key, student, share, True)))
        rows = []
        for key, name, source in students:
            rows.append(Row(f"{key}-int8", f"{name} + int8 (torch dynamic)", source, INT8, candidate=True))
            exported = self.export_int8(f"{key}-onnx", source)
            if exported is not None:
                rows.append(Row(f"{key}-onnx", f"{name} + ONNX int8", exported, {}, candidate=True))
        return rows


def score(rows: list[Row], metric: str) -> None:
    """Every row's validation and scored-split score, as `bert-tasks evaluate` computes it (this process)."""
    from common import model_splits

    from bert_tasks.inference.predictor import Predictor

    data = model_splits(rows[0].directory)
    for row in rows:
        predictor = Predictor(row.directory, progress=False, **row.options)
        row.scores = {split: predictor.evaluate(data[split])[metric] for split in ("validation", "test")}


def measure(rows: list[Row], texts: Path, repeats: int) -> None:
    """Speed and memory of every row, each in a fresh process, rows round-robin over the repeats."""
    for repeat in range(repeats):
        order = [1, 2] if repeat % 2 == 0 else [2, 1]
        for row in rows:
            spec = {"dir": str(row.directory), "options": row.options, "texts": str(texts), "threads": order}
            command = [sys.executable, __file__, "--child", json.dumps(spec)]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"{row.name}: the measuring process failed:\n{done.stderr[-3000:]}")
            row.runs.append(json.loads(done.stdout.splitlines()[-1]))
        print(
            f"repeat {repeat + 1}/{repeats} done (load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True
        )


def summarise(rows: list[Row]) -> list[dict[str, Any]]:
    """One JSON-ready record per row: scores, median speeds and memory, disk size, ratios to the teacher."""
    from common import median, ratio, weights_mb

    results = []
    for row in rows:
        speed = {t: median([run["texts_per_s"][str(t)] for run in row.runs]) for t in (1, 2)}
        results.append(
            {
                "key": row.key,
                "row": row.name,
                "candidate": row.candidate,
                **row.scores,
                "texts_per_s_1": round(speed[1], 1),
                "texts_per_s_2": round(speed[2], 1),
                "disk_mb": round(weights_mb(row.directory), 1),
                "peak_rss_mib": round(median([run["peak_rss_mib"] for run in row.runs])),
                "load_s": round(median([run["load_s"] for run in row.runs]), 2),
                "runs": row.runs,
            }
        )
    teacher = results[0]
    for result in results:
        result["speed_x_1"] = ratio(result["texts_per_s_1"], teacher["texts_per_s_1"])
        result["speed_x_2"] = ratio(result["texts_per_s_2"], teacher["texts_per_s_2"])
        # Not common.ratio, whose None stands for a side not run: a score of 0 is a score.
        result["of_teacher"] = round(result["test"] / teacher["test"], 4) if teacher["test"] else None
        result["disk_fraction"] = ratio(result["disk_mb"], teacher["disk_mb"])
    return results


def pick_best(results: list[dict[str, Any]], budget: float) -> tuple[dict[str, Any] | None, str]:
    """The best combination by validation score and speed (never the scored split), and the rule's words."""
    candidates = [r for r in results if r["candidate"]]
    if not candidates:
        return None, "no combination was exported"
    floor = results[0]["validation"] - budget / 100
    within = [r for r in candidates if r["validation"] >= floor]
    if within:
        best = max(within, key=lambda r: r["texts_per_s_1"])
        rule = (
            f"the fastest on one core of the {len(within)} of {len(candidates)} int8 students whose "
            f"validation score is within {budget:g} points of the teacher's ({floor:.4f} or more)"
        )
        return best, rule
    best = max(candidates, key=lambda r: r["validation"])
    return best, f"none is within {budget:g} points of the teacher on validation: the best on validation"


def percent(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.1f}%"


def targets(results: list[dict[str, Any]], best: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The issue's targets, each with what this run measured and whether it met them."""
    from common import times

    by = {r["key"]: r for r in results}
    teacher, kd = by["teacher"], by["kd3"]
    found = [
        (
            "3-layer student: >= 98.5% of the teacher's score at >= 1.8x its speed (one core)",
            (kd["of_teacher"] or 0) >= 0.985 and (kd["speed_x_1"] or 0) >= 1.8,
            f"{percent(kd['of_teacher'])} at {times(kd['speed_x_1'])} (two cores {times(kd['speed_x_2'])})",
        ),
        (
            "distilled beats the same student without a teacher by >= 1 point",
            kd["test"] - by["alone3"]["test"] >= 0.01,
            f"{100 * (kd['test'] - by['alone3']['test']):+.1f} points",
        ),
        (
            "50% of heads pruned: <= 1 point lost after recovery",
            teacher["test"] - by["pruned50r"]["test"] <= 0.01,
            f"{100 * (by['pruned50r']['test'] - teacher['test']):+.1f} points "
            f"(without recovery {100 * (by['pruned50']['test'] - teacher['test']):+.1f})",
        ),
    ]
    if best is not None:
        loss = teacher["test"] - best["test"]
        found.append(
            (
                "best combination: >= 4x the fp32 teacher, <= 2 points lost, <= 1/3 of its size on disk",
                (best["speed_x_1"] or 0) >= 4 and loss <= 0.02 and best["disk_fraction"] <= 1 / 3,
                f"{times(best['speed_x_1'])} (two cores {times(best['speed_x_2'])}), {-100 * loss:+.1f} "
                f"points, {best['disk_fraction']:.2f} of the size on disk",
            )
        )
    return [{"target": name, "met": bool(met), "measured": measured} for name, met, measured in found]


def show(task: str, metric: str, result: dict[str, Any]) -> None:
    from common import table_header, table_row, times

    rows, best = result["rows"], result["best"]
    print(f"\n{task} ({metric}; validation picks, test is held out; speed on {result['speed_texts']} texts)")
    table_header(
        [
            "row",
            "validation",
            "test",
            "% of teacher",
            "texts/s 1 core",
            "x teacher",
            "texts/s 2 cores",
            "x teacher",
            "disk MB",
            "disk / teacher",
            "peak RSS MiB",
        ]
    )
    shown = [*rows, {**best, "row": f"**best combination**: {best['row']}"}] if best else rows
    for row in shown:
        table_row(
            [
                row["row"],
                f"{row['validation']:.4f}",
                f"{row['test']:.4f}",
                percent(row["of_teacher"]),
                f"{row['texts_per_s_1']:.0f}",
                times(row["speed_x_1"]),
                f"{row['texts_per_s_2']:.0f}",
                times(row["speed_x_2"]),
                f"{row['disk_mb']:.1f}",
                f"{row['disk_fraction']:.2f}",
                row["peak_rss_mib"],
            ]
        )
    print(f"best combination: {best['row'] if best else '-'}, picked as {result['rule']}")
    for name, why in result["refused_exports"].items():
        print(f"- export refused, so no row: {name}: {why}")
    for target in result["targets"]:
        print(f"- {'met' if target['met'] else 'MISSED'}: {target['target']}: {target['measured']}")


def draw(payload: dict[str, Any], tasks: list[str], path: Path) -> None:
    """Score against speed (one core, x the fp32 teacher), one panel per task, every row labelled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(len(tasks), 1, figsize=(12, 5.5 * len(tasks)), squeeze=False)
    for axis, task in zip(axes[:, 0], tasks, strict=True):
        result = payload[task]
        for number, row in enumerate(result["rows"], start=1):
            best = result["best"] is not None and row["key"] == result["best"]["key"]
            marker = "*" if best else "s" if row["candidate"] else "o"
            label = f"{number}  {row['row']}{'  (best combination)' if best else ''}"
            axis.scatter(row["speed_x_1"], row["test"], marker=marker, s=140 if best else 40, label=label)
            # Numbers, not names, beside the points: rows of one speed (pruned, recovered) would overprint.
            point = (row["speed_x_1"], row["test"])
            axis.annotate(str(number), point, textcoords="offset points", xytext=(4, 4), fontsize=8)
        axis.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, frameon=False)
        axis.axhline(result["rows"][0]["test"], color="grey", linewidth=0.6, linestyle="--")
        axis.set_xlabel("texts/s on one core, x the fp32 teacher")
        axis.set_ylabel(f"{result['metric']} on the held-out split")
        axis.set_title(f"{task}: score against speed (dashed: the fp32 teacher)")
        axis.grid(alpha=0.3)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)


def run_task(task: str, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    from common import METRIC, model_splits, split_texts

    build = Build(task, args, root / task)
    rows = build.rows()
    score(rows, METRIC[task])
    texts = split_texts(model_splits(rows[0].directory)["test"])[: args.speed_texts]
    texts_file = root / f"{task}-texts.json"
    texts_file.write_text(json.dumps(texts), encoding="utf-8")
    measure(rows, texts_file, args.repeats)
    results = summarise(rows)
    best, rule = pick_best(results, args.loss_budget)
    return {
        "metric": METRIC[task],
        "speed_texts": len(texts),
        "rows": results,
        "best": best,
        "rule": rule,
        "targets": targets(results, best),
        "build_s": build.seconds,
        "refused_exports": build.refused,
    }


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", default="sentiment,ner")
    parser.add_argument("--sst2-rows", type=int, default=4000)
    parser.add_argument("--sst2-epochs", type=int, default=1, help="of the students")
    parser.add_argument("--sst2-teacher-epochs", type=int, default=2)
    parser.add_argument("--bc5cdr-rows", type=int, default=1000)
    parser.add_argument("--bc5cdr-epochs", type=int, default=2, help="of the students")
    parser.add_argument("--bc5cdr-teacher-epochs", type=int, default=3)
    parser.add_argument("--eval-rows", type=int, default=300, help="BC5CDR dev and test sentences")
    parser.add_argument("--recover-steps", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--speed-texts", type=int, default=400, help="texts of the scored split timed")
    parser.add_argument(
        "--loss-budget", type=float, default=2.0, help="points below the teacher's validation"
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--png", type=Path)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    args = arguments()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    from common import machine_line, quiet, write_json

    from bert_tasks.runtime import configure_cli_process

    configure_cli_process()  # the command line's settings: idle OpenMP threads sleep beside busy processes
    quiet()
    tasks = args.tasks.split(",")
    started, load = time.perf_counter(), os.getloadavg()[0]
    settings = {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()}
    payload: dict[str, Any] = {"command": " ".join(["python", *sys.argv]), "args": settings}
    print(f"command: `{payload['command']}`\n{machine_line()}\nload average at start {load:.2f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-ship-small-") as scratch:
        for task in tasks:
            payload[task] = run_task(task, args, Path(scratch))
            show(task, payload[task]["metric"], payload[task])
            write_json(args.json, payload)  # each task's numbers as soon as they are in
    payload |= {"machine": machine_line(), "wall_s": round(time.perf_counter() - started)}
    payload |= {"load_average": {"start": round(load, 2), "end": round(os.getloadavg()[0], 2)}}
    print(f"\nwall {payload['wall_s']} s; load average {load:.2f} at start, {os.getloadavg()[0]:.2f} at end")
    write_json(args.json, payload)
    if args.png:
        draw(payload, tasks, args.png)


if __name__ == "__main__":
    main()
