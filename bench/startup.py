"""Benchmark: start-up time of the `bert-tasks` command against a floor, importing torch and transformers.

    python bench/startup.py --repeats 5
    python bench/startup.py --rows floor,help,predict --ner-model runs/ner_bc5cdr \\
        --json bench/results/startup.json

Each row is a fresh subprocess, timed from spawn to exit (wall time), --repeats times; the table gives the
median, min and max, and the median's ratio to the floor's median. The rows run round-robin, one run of
each row per repeat, so machine noise hits all rows alike. Rows (select some with --rows NAME,NAME):
  floor          python -c "import torch, transformers": the least any bert-tasks command has to load
  bert-floor     python -c "import torch, transformers.models.bert.modeling_bert": what any command that
                 builds a BERT must import before bert-tasks runs a line of its own (not a ratio target)
  help           bert-tasks --help
  finetune-help  bert-tasks finetune --help
  config-error   bert-tasks finetune sentiment lr=abc
  unknown-key    bert-tasks finetune sentiment learning_rat=3e-5
  missing-file   bert-tasks finetune sentiment train_file=/nonexistent.csv output_dir=<tmp>/...
  predict        bert-tasks predict ner "<one sentence>" --model DIR: start-up, model load, one text
  predict-onnx   the same with DIR's ONNX export (`bert-tasks export --format onnx`, made first, not
                 timed, unless --onnx-model names one): onnxruntime, no torch. fp32: a 2-step model's
                 near-tied logits would fail the int8 export's label check
The three error rows must exit with status 1 and print one stderr line (bert-tasks' one-line errors); the
others must exit 0 with some output. A row that does not is reported as failed, with the reason (its
stderr's last line) under the table, and is not run again. For `predict`, DIR is --ner-model, else a model
this script first trains with `bert-tasks finetune ner max_steps=2 output_dir=<tmp>/ner` (not timed).
`bert-tasks` is the console script next to this Python (what users run), or `python -m bert_tasks` with
--launcher module. Every subprocess runs in a temporary working directory with stdin closed (/dev/null)
and HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false. Run from the repo root.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import machine_line, median, ratio, table_header, table_row, times, write_json

PREDICT_TEXT = "The patient suffers from severe headaches and occasional nausea."
#: The environment every subprocess gets on top of this one's: no network, no tokenizer threads warning.
ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
FLOOR = "import torch, transformers"
BERT_FLOOR = "import torch, transformers.models.bert.modeling_bert"
#: One run's outcome: the finished process, or why there is none (it timed out).
Outcome = subprocess.CompletedProcess | str


@dataclass
class Row:
    """One command to time. `args` may hold {tmp} (the scratch dir), {run} (the run's number), {model} and
    {onnx} (the model dirs of the predict rows)."""

    name: str
    what: str  # the table's "what" cell
    args: list[str]  # after the launcher; the floor's are the whole command
    error: bool = False  # an error row: must exit 1 with one stderr line
    seconds: list[float] = field(default_factory=list)
    failed: str | None = None
    message: str | None = None  # an error row's stderr line, for the JSON


def make_rows(bert_tasks: str) -> list[Row]:
    finetune = f"{bert_tasks} finetune sentiment"
    return [
        Row("floor", f'`python -c "{FLOOR}"`', [sys.executable, "-c", FLOOR]),
        Row("bert-floor", f'`python -c "{BERT_FLOOR}"`', [sys.executable, "-c", BERT_FLOOR]),
        Row("help", f"`{bert_tasks} --help`", ["--help"]),
        Row("finetune-help", f"`{bert_tasks} finetune --help`", ["finetune", "--help"]),
        Row(
            "config-error",
            f"`{finetune} lr=abc` (error)",
            ["finetune", "sentiment", "lr=abc"],
            error=True,
        ),
        Row(
            "unknown-key",
            f"`{finetune} learning_rat=3e-5` (error)",
            ["finetune", "sentiment", "learning_rat=3e-5"],
            error=True,
        ),
        Row(
            "missing-file",
            f"`{finetune} train_file=/nonexistent.csv output_dir=<tmp>` (error)",
            ["finetune", "sentiment", "train_file=/nonexistent.csv", "output_dir={tmp}/missing-{run}"],
            error=True,
        ),
        Row(
            "predict",
            f'`{bert_tasks} predict ner "{PREDICT_TEXT}" --model DIR`',
            ["predict", "ner", PREDICT_TEXT, "--model", "{model}"],
        ),
        Row(
            "predict-onnx",
            f'`{bert_tasks} predict ner "{PREDICT_TEXT}" --model ONNX_DIR` (ONNX export of DIR)',
            ["predict", "ner", PREDICT_TEXT, "--model", "{onnx}"],
        ),
    ]


def launcher(kind: str) -> tuple[list[str], str]:
    """The command that runs bert-tasks, and how the output names it.

    The console script next to the interpreter is preferred (it is what users run); without one, or with
    --launcher module, `python -m bert_tasks`.
    """
    script = Path(sys.executable).parent / "bert-tasks"
    if kind == "script" and script.is_file():
        return [str(script)], f"bert-tasks = console script {script}"
    note = "" if kind == "module" else f" (no console script at {script})"
    return [sys.executable, "-m", "bert_tasks"], f"bert-tasks = {sys.executable} -m bert_tasks{note}"


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(nothing)"


def run_once(command: list[str], cwd: Path, timeout: float) -> tuple[float, Outcome]:
    """Wall seconds of one fresh process and its result, or a reason string if it timed out."""
    start = time.perf_counter()
    try:
        done = subprocess.run(
            command,
            cwd=cwd,
            env={**os.environ, **ENV},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return time.perf_counter() - start, f"timed out after {timeout:.0f} s"
    return time.perf_counter() - start, done


def check(row: Row, done: Outcome) -> str | None:
    """Why this run does not count (None when it does): the row's expected exit status and output."""
    if isinstance(done, str):
        return done
    stderr_lines = [line for line in done.stderr.splitlines() if line.strip()]
    if row.error:
        wrong = [f"exit status {done.returncode}, not 1"] if done.returncode != 1 else []
        if len(stderr_lines) != 1:
            wrong.append(f"{len(stderr_lines)} stderr lines, not 1")
        return f"{'; '.join(wrong)}; stderr's last line: {last_line(done.stderr)}" if wrong else None
    if done.returncode != 0:
        return f"exit status {done.returncode}; stderr's last line: {last_line(done.stderr)}"
    if not row.name.endswith("floor") and not done.stdout.strip():
        return f"exit status 0 but no output; stderr's last line: {last_line(done.stderr)}"
    return None


def train_ner(prefix: list[str], tmp: Path, timeout: float) -> tuple[str | None, str | None]:
    """(model dir, None) after a 2-step `bert-tasks finetune ner` in `tmp`, or (None, why it failed)."""
    model_dir = tmp / "ner"
    command = [*prefix, "finetune", "ner", "max_steps=2", f"output_dir={model_dir}"]
    print(f"training the predict row's model (not timed): {shlex.join(command)}", file=sys.stderr, flush=True)
    seconds, done = run_once(command, tmp, timeout)
    if isinstance(done, str):
        return None, f"training its model: {done}"
    if done.returncode != 0:
        return None, f"training its model: exit status {done.returncode}; {last_line(done.stderr)}"
    print(f"trained in {seconds:.1f} s", file=sys.stderr, flush=True)
    return str(model_dir), None


def export_onnx(prefix: list[str], model: str, tmp: Path, timeout: float) -> tuple[str | None, str | None]:
    """(export dir, None) after `bert-tasks export --format onnx` of `model`, or (None, why it failed)."""
    out = tmp / "ner-onnx"
    command = [*prefix, "export", "--format", "onnx", "--model", model, str(out)]
    print(f"exporting the predict-onnx row's model (not timed): {shlex.join(command)}", file=sys.stderr)
    _, done = run_once(command, tmp, timeout)
    if isinstance(done, str) or done.returncode != 0:
        why = done if isinstance(done, str) else f"exit status {done.returncode}; {last_line(done.stderr)}"
        return None, f"exporting its model: {why}"
    return str(out), None


def cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    names = [row.name for row in make_rows("bert-tasks")]
    parser.add_argument("--repeats", type=int, default=5, help="runs of each row (default: 5)")
    parser.add_argument(
        "--rows",
        default=",".join(names),
        help=f"comma-separated rows to run, of: {','.join(names)} (default: all; the ratio needs floor)",
    )
    parser.add_argument("--ner-model", help="model dir for the predict row (default: train a 2-step one)")
    parser.add_argument(
        "--onnx-model", help="export dir for the predict-onnx row (default: export the NER model)"
    )
    parser.add_argument("--launcher", choices=("script", "module"), default="script")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per run (default: 300)")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args()
    wanted = [name.strip() for name in args.rows.split(",") if name.strip()]
    if unknown := sorted(set(wanted) - set(names)):
        parser.error(f"unknown --rows {','.join(unknown)}; choose from {','.join(names)}")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")

    prefix, launched = launcher(args.launcher)
    shown = "python -m bert_tasks" if prefix[0] == sys.executable else "bert-tasks"
    rows = [row for row in make_rows(shown) if row.name in wanted]
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as scratch:
        tmp = Path(scratch)
        model = str(Path(args.ner_model).resolve()) if args.ner_model else None
        predicts = [row for row in rows if row.name.startswith("predict")]
        if predicts and model is None:
            model, failed = train_ner(prefix, tmp, max(args.timeout, 1800.0))
            for row in predicts:
                row.failed = failed
        onnx = str(Path(args.onnx_model).resolve()) if args.onnx_model else None
        onnx_row = next((row for row in rows if row.name == "predict-onnx" and not row.failed), None)
        if onnx_row is not None and onnx is None and model is not None:
            onnx, onnx_row.failed = export_onnx(prefix, model, tmp, max(args.timeout, 1800.0))
        for run in range(args.repeats):
            for row in rows:  # round-robin: one run of each row per repeat
                if row.failed:
                    continue
                filled = [arg.format(tmp=tmp, run=run, model=model, onnx=onnx) for arg in row.args]
                command = filled if row.name.endswith("floor") else [*prefix, *filled]
                seconds, done = run_once(command, tmp, args.timeout)
                row.failed = check(row, done)
                if not row.failed:
                    row.seconds.append(seconds)
                    if row.error and not isinstance(done, str):
                        row.message = done.stderr.strip()
            print(f"repeat {run + 1}/{args.repeats} done", file=sys.stderr, flush=True)

    floor = next((row for row in rows if row.name == "floor" and not row.failed), None)
    floor_median = median(floor.seconds) if floor else None
    print(f"command: `{shlex.join(['python', *sys.argv])}` | {launched}")
    print(f"repeats {args.repeats} | {machine_line()}")
    table_header(["what", "median s", "min s", "max s", "vs floor"])
    results: list[dict[str, Any]] = []
    for row in rows:
        if row.failed:
            table_row([row.what, "failed", "-", "-", "-"])
        else:
            row_median = median(row.seconds)
            table_row(
                [
                    row.what,
                    cell(row_median),
                    cell(min(row.seconds)),
                    cell(max(row.seconds)),
                    times(ratio(row_median, floor_median)),
                ]
            )
        results.append(
            {
                "row": row.name,
                "what": row.what.replace("`", ""),
                "seconds": [round(s, 3) for s in row.seconds],
                "median_s": None if row.failed else round(median(row.seconds), 3),
                "vs_floor": None if row.failed else ratio(median(row.seconds), floor_median),
                "failed": row.failed,
                "error_message": row.message,
            }
        )
    failed = [row for row in rows if row.failed]
    if failed:
        print()
    for row in failed:
        print(f"- {row.name} failed: {row.failed}")
    write_json(args.json, {"launcher": launched, "repeats": args.repeats, "rows": results})


if __name__ == "__main__":
    main()
