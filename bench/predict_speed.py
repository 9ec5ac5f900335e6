"""Benchmark: prediction speed of a fine-tuned model dir, bert-tasks against transformers.pipeline, one run.

On the same model dir and texts, interleaved over --repeats (median reported):
  pipeline        transformers.pipeline("text-classification" | "token-classification",
                  aggregation_strategy="simple" for NER), batch_size 64, on the CPU like bert-tasks' Predictor
  bert-tasks      SentimentClassifier(dir)(texts) / EntityTagger(dir)(texts), batch 64, in this process
  bert-tasks-cli  `bert-tasks predict <task> --model DIR --file F --json` as a subprocess: start-up, imports
                  and model load included, nothing subtracted
  pipeline-script the pipeline as a user runs it on a file, for a like-for-like comparison with the CLI: a
                  subprocess (PIPELINE_SCRIPT) that imports transformers, builds the same pipeline, reads the
                  same file and prints one JSON line per text
The in-process implementations are loaded once (the "load s" column) and warmed up on 64 texts before
timing. Sentiment texts: SST-2 dev sentences; NER texts: BC5CDR test sentences, words joined by spaces.
tokens/s counts real sub-tokens (the tokenizer's ids per text, specials included, no padding), the same
for every implementation. "agreement" compares each bert-tasks output with the pipeline's: sentiment, the
share of texts with the same label; NER, the entity F1 of bert-tasks' (start, end, label) spans against
the pipeline's, so a speed-up that changes results shows (the pipeline's "simple" aggregation can tag part
of a word, e.g. "ID" of "IDR", where bert-tasks tags whole words: that also lowers it). Run from the repo
root:

    python bench/predict_speed.py --sentiment-model runs/sentiment_sst2 --ner-model runs/ner_bc5cdr \\
        --json bench/results/predict_speed.json
    python bench/predict_speed.py --sentiment-model /tmp/x --ner-model /tmp/y --max-texts 64 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import (
    machine_line,
    median,
    quiet,
    ratio,
    read_conll,
    read_tsv,
    table_header,
    table_row,
    timed,
    times,
    write_json,
)
from transformers import AutoTokenizer, pipeline

from bert_tasks import EntityTagger, SentimentClassifier
from bert_tasks.runtime import reuse_freed_memory

BATCH_SIZE = 64
#: The implementations that run as a fresh process per call (no warm-up; start-up included).
SUBPROCESSES = ("bert-tasks-cli", "pipeline-script")
#: An implementation: texts -> outputs that compare across implementations, a label per text (sentiment)
#: or a set of (start, end, label) spans per text (NER).
Predict = Callable[[list[str]], list[Any]]


#: `python -c` program: the least a user writes to run the pipeline over a JSON-lines file of texts.
PIPELINE_SCRIPT = """
import json, sys
from transformers import pipeline
task, model_dir, path, batch_size = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
texts = [json.loads(line)["text"] for line in open(path, encoding="utf-8") if line.strip()]
if task == "sentiment":
    pipe = pipeline("text-classification", model=model_dir, batch_size=batch_size, device="cpu")
else:
    pipe = pipeline("token-classification", model=model_dir, aggregation_strategy="simple",
                    batch_size=batch_size, device="cpu")
for text, result in zip(texts, pipe(texts)):
    print(json.dumps({"text": text, "result": result}, default=float))
"""


def cli_command() -> list[str]:
    """The `bert-tasks` console script of this Python environment (next to the interpreter), else PATH's."""
    script = Path(sys.executable).parent / "bert-tasks"
    found = str(script) if script.is_file() else shutil.which("bert-tasks")
    if found is None:
        sys.exit("predict_speed: no `bert-tasks` command found; install the project (pip install -e .)")
    return [found]


def pipeline_outputs(task: str, results: list[Any]) -> list[Any]:
    """The pipeline's results, comparable across implementations: labels, or (start, end, label) spans."""
    if task == "sentiment":
        return [result["label"] for result in results]
    return [{(e["start"], e["end"], e["entity_group"]) for e in result} for result in results]


def load_implementations(
    task: str, model_dir: str, text_file: Path
) -> tuple[dict[str, Predict], dict[str, float]]:
    """Each implementation as texts -> comparable outputs; the seconds each in-process one took to load."""
    if task == "sentiment":
        pipe, pipe_load = timed(
            lambda: pipeline("text-classification", model=model_dir, batch_size=BATCH_SIZE, device="cpu")
        )
        ours, ours_load = timed(lambda: SentimentClassifier(model_dir, batch_size=BATCH_SIZE))
        implementations: dict[str, Predict] = {
            "pipeline": lambda texts: pipeline_outputs(task, pipe(texts)),
            "bert-tasks": lambda texts: [p["label"] for p in ours(texts)],
        }
    else:
        pipe, pipe_load = timed(
            lambda: pipeline(
                "token-classification",
                model=model_dir,
                aggregation_strategy="simple",
                batch_size=BATCH_SIZE,
                device="cpu",
            )
        )
        ours, ours_load = timed(lambda: EntityTagger(model_dir, batch_size=BATCH_SIZE))
        implementations = {
            "pipeline": lambda texts: pipeline_outputs(task, pipe(texts)),
            "bert-tasks": lambda texts: [
                {(e["start"], e["end"], e["label"]) for e in p} for p in ours(texts)
            ],
        }
    command = [*cli_command(), "predict", task, "--model", model_dir, "--file", str(text_file), "--json"]

    def cli(_: list[str]) -> list[Any]:  # the texts are in text_file already
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        if task == "sentiment":
            return [record["label"] for record in records]
        return [{(e["start"], e["end"], e["label"]) for e in record["entities"]} for record in records]

    script = [sys.executable, "-c", PIPELINE_SCRIPT, task, model_dir, str(text_file), str(BATCH_SIZE)]

    def pipeline_script(_: list[str]) -> list[Any]:
        done = subprocess.run(script, capture_output=True, text=True, check=True)
        results = [json.loads(line)["result"] for line in done.stdout.splitlines() if line.startswith("{")]
        return pipeline_outputs(task, results)

    implementations["bert-tasks-cli"] = cli
    implementations["pipeline-script"] = pipeline_script
    return implementations, {"pipeline": pipe_load, "bert-tasks": ours_load}


def agreement(task: str, reference: list[Any], predicted: list[Any]) -> float:
    """Sentiment: share of equal labels. NER: entity F1 of `predicted` spans against `reference` spans."""
    if task == "sentiment":
        return sum(a == b for a, b in zip(reference, predicted, strict=True)) / len(reference)
    same = sum(len(a & b) for a, b in zip(reference, predicted, strict=True))
    total = sum(len(a) + len(b) for a, b in zip(reference, predicted, strict=True))
    return 2 * same / total if total else 1.0


def bench_task(task: str, model_dir: str, texts: list[str], args: argparse.Namespace) -> list[dict[str, Any]]:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    num_tokens = sum(len(ids) for ids in tokenizer(texts)["input_ids"])
    with tempfile.TemporaryDirectory() as tmp:
        text_file = Path(tmp) / "texts.jsonl"  # JSON lines: a text starting with "{" stays a text
        text_file.write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts))
        implementations, load_seconds = load_implementations(task, model_dir, text_file)
        for name, predict in implementations.items():
            if name not in SUBPROCESSES:
                predict(texts[:BATCH_SIZE])  # warm-up: allocator, oneDNN kernels
        seconds: dict[str, list[float]] = {name: [] for name in implementations}
        outputs: dict[str, list[Any]] = {}
        for _ in range(args.repeats):
            for name, predict in implementations.items():  # interleaved: machine noise hits all alike
                outputs[name], elapsed = timed(lambda predict=predict: predict(texts))
                seconds[name].append(elapsed)

    base = len(texts) / median(seconds["pipeline"])
    cli_vs_script = ratio(median(seconds["pipeline-script"]), median(seconds["bert-tasks-cli"]))
    rows = []
    for name in implementations:
        texts_per_s = len(texts) / median(seconds[name])
        entities = sum(len(spans) for spans in outputs[name]) if task == "ner" else None
        row = {
            "task": task,
            "impl": name,
            "texts": len(texts),
            "tokens": num_tokens,
            "load_s": round(load_seconds[name], 2) if name in load_seconds else None,
            "median_s": round(median(seconds[name]), 3),
            "texts_per_s": round(texts_per_s, 1),
            "tokens_per_s": round(num_tokens * texts_per_s / len(texts), 1),
            "entities": entities,
            "entities_per_s": None if entities is None else round(entities * texts_per_s / len(texts), 1),
            "vs_pipeline": ratio(texts_per_s, base),
            # the same ratio within each interleaved repeat: how far one reading of it can be trusted
            "vs_pipeline_per_repeat": [
                ratio(pipe, own) for pipe, own in zip(seconds["pipeline"], seconds[name], strict=True)
            ],
            "agreement_with_pipeline": round(agreement(task, outputs["pipeline"], outputs[name]), 4),
        }
        if name == "bert-tasks-cli":
            row["vs_pipeline_script"] = cli_vs_script
        rows.append(row)
        table_row(
            [
                task,
                name,
                row["texts"],
                "-" if row["load_s"] is None else f"{row['load_s']:.1f}",
                f"{row['median_s']:.2f}",
                f"{row['texts_per_s']:.0f}",
                f"{row['tokens_per_s']:.0f}",
                "-" if entities is None else f"{row['entities_per_s']:.0f}",
                times(row["vs_pipeline"]),
                f"{100 * row['agreement_with_pipeline']:.2f}%",
            ]
        )
    return rows


def main() -> None:
    reuse_freed_memory()  # what the CLI sets for its process: the library leaves it to the caller
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sentiment-model", help="a model dir saved by `bert-tasks finetune sentiment`")
    parser.add_argument("--ner-model", help="a model dir saved by `bert-tasks finetune ner`")
    parser.add_argument("--sentiment-texts", type=Path, default=Path("../shared/data/sst2/dev.tsv"))
    parser.add_argument("--ner-texts", type=Path, default=Path("../shared/data/bc5cdr/test.tsv"))
    parser.add_argument("--max-texts", type=int, help="first N texts of each file (default: all)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args()
    if not (args.sentiment_model or args.ner_model):
        parser.error("give --sentiment-model DIR and/or --ner-model DIR")
    quiet()

    print(f"batch {BATCH_SIZE} | repeats {args.repeats} | {machine_line()}")
    table_header(
        [
            "task",
            "impl",
            "texts",
            "load s",
            "median s",
            "texts/s",
            "tokens/s",
            "entities/s",
            "vs pipeline",
            "agreement",
        ]
    )
    rows = []
    if args.sentiment_model:
        texts = [
            t.strip() for t in read_tsv(args.sentiment_texts, "sentence", "label", args.max_texts)["text"]
        ]
        rows += bench_task("sentiment", args.sentiment_model, texts, args)
    if args.ner_model:
        texts = [" ".join(words) for words in read_conll(args.ner_texts, args.max_texts)[0]]
        rows += bench_task("ner", args.ner_model, texts, args)
    for row in rows:
        if "vs_pipeline_script" in row:
            print(
                f"{row['task']}: bert-tasks-cli vs pipeline-script, both fresh processes: "
                f"{times(row['vs_pipeline_script'])}"
            )
    write_json(args.json, rows)


if __name__ == "__main__":
    main()
