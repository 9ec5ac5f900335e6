"""Benchmark: why equal settings differ. bert-tasks against a plain transformers Trainer at the Trainer's own
settings, with bert-tasks' differences from it switched off one at a time (issue #17, item 1).

Every run trains the bundled all-MiniLM-L6-v2 on the first --train-rows sentences of the corpus' train file
with batch 32, lr 1e-4 and --epochs (3), without a validation split (both sides score their last step's
model), and is scored on the first --test-rows test sentences (default: all of them) at the word level by
bert-tasks' seqeval metric module (default conlleval mode) against the untruncated gold; one run per seed,
the table gives mean +- sample std over --seeds.

  trainer   bench/finetune_ner.py's plain Trainer: transformers' BertForTokenClassification with its
            defaults (padded SDPA attention, torch dropout, no warmup, weight decay 0, max_grad_norm 1.0,
            random batches), first-sub-token labels, argmax decoding, bf16 autocast (as bert-tasks' own
            rows run: `mixed_precision=auto` on a CPU with native bf16), truncation at the recipe's
            max_length (words past it count as O)
  all-on    bert_tasks.train at the same settings; every other key its default
  a lever   all-on with ONE difference set to the Trainer's behaviour (LEVERS below); `fp32` is the one
            lever that moves away from the Trainer (bf16 on both sides), to see what bf16 costs
  all-off   all-on with every difference set to the Trainer's at once: what is left against the Trainer
            is seed noise, or a difference no lever names

Levers without a config key are switched in this process only, by `unittest.mock.patch.object` on the one
class that decides; the package is not edited. Every bert-tasks model is decoded both ways (Viterbi and
argmax) from one pass over the test set, so the decoding row compares the very same models. A lever that
would compute what all-on computes (its key already at the Trainer's value, or no sentence longer than
max_length for truncation) is not run: the notes under the table say why. Rows are run seed by seed and
each run is appended to --json as it ends, so an interrupted run is usable (and --resume continues it).
"wall s" is a run from the files to the test tags: the Trainer's includes its prediction, bert-tasks'
its scoring pass (`train_s` and `score_s` apart in the JSON). Run from the repo root:

    python bench/ablation.py --corpus bc5cdr --json bench/results/ablation_bc5cdr.json
    python bench/ablation.py --recipe my_ner.yaml --json ablation_mine.json    # a corpus of one's own
    python bench/ablation.py --corpus bc5cdr --train-rows 200 --seeds 42 --epochs 1      # a smoke
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from common import machine_line, quiet, read_conll, table_header, table_row, timed, write_json
from finetune_ner import BASELINE, CORPORA, trainer_tags
from torch import nn
from torch.utils.data import Sampler
from transformers import AutoConfig, AutoTokenizer, TrainingArguments

from bert_tasks import Config, load_recipe, train
from bert_tasks.data import batching
from bert_tasks.inference.evaluate import read_labelled_file
from bert_tasks.inference.predictor import Predictor
from bert_tasks.modeling.dropout import FastDropout
from bert_tasks.modeling.load import resolve_model_path
from bert_tasks.modeling.unpad import UnpaddedBertEncoder
from bert_tasks.runtime import reuse_freed_memory
from bert_tasks.tasks.ner import NerTask, load_ner_metric

#: The Trainer's settings (issue #17): batch 32, lr 1e-4, 3 epochs; both sides.
MATCHED = {"batch_size": BASELINE["batch_size"], "lr": 1e-4}
#: transformers' own defaults, for the levers that set a key to the Trainer's value.
TRAINER_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TrainingArguments)}
DECODINGS = ("viterbi", "argmax")


# The switches without a config key: each patches the one class or method that decides, for one run.


def torch_dropout() -> AbstractContextManager[Any]:
    """Every FastDropout (embeddings, residuals, attention probabilities, head) runs torch's `nn.Dropout`."""
    return mock.patch.object(FastDropout, "forward", nn.Dropout.forward)


def padded_encoder() -> AbstractContextManager[Any]:
    """The encoder never unpads: every layer runs on the padded [B, T] batch, as transformers' does."""
    return mock.patch.object(UnpaddedBertEncoder, "_can_unpad", lambda self, *args: False)


class EpochRandomSampler(Sampler[int]):
    """The Trainer's batches: a fresh random order every epoch (seeded by seed + epoch), no length groups.

    Takes `EpochLengthGroupedSampler`'s arguments, so `batching.train_loader` builds it in its place.
    """

    def __init__(self, batch_size: int, lengths: list[int], seed: int) -> None:
        self.rows, self.seed, self.epoch = len(lengths), seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.rows

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(self.rows, generator=generator).tolist())


def random_batches() -> AbstractContextManager[Any]:
    return mock.patch.object(batching, "EpochLengthGroupedSampler", EpochRandomSampler)


def first_window_only() -> AbstractContextManager[Any]:
    """Truncation instead of windows: each sentence keeps its first window (training and scoring alike);
    the words past it get no logits and decode as O, as the Trainer's truncated words count as O."""
    encode_batch = NerTask.encode_batch

    def truncated(self: NerTask, *args: Any, **kwargs: Any) -> dict[str, list[Any]]:
        out = encode_batch(self, *args, **kwargs)
        ids = out["example_id"]
        keep = [i for i, example in enumerate(ids) if i == 0 or ids[i - 1] != example]
        return {column: [values[i] for i in keep] for column, values in out.items()}

    return mock.patch.object(NerTask, "encode_batch", truncated)


@dataclasses.dataclass(frozen=True)
class Corpus:
    """What the levers' "no run needed" checks read: the model's attention dropout, the longest sentence."""

    attention_dropout: float
    longest: int  # sub-tokens with [CLS]/[SEP], over the train and test slices


@dataclasses.dataclass(frozen=True)
class Lever:
    """One difference from the Trainer, and how to set it to the Trainer's behaviour."""

    key: str
    label: str
    overrides: tuple[str, ...] = ()
    patches: tuple[Callable[[], AbstractContextManager[Any]], ...] = ()
    #: Why a run of it would compute what all-on computes (then it is not run), or None.
    same: Callable[[Config, Corpus], str | None] = lambda cfg, corpus: None


def _unless(condition: bool, reason: str) -> str | None:
    return reason if condition else None


LEVERS = (
    Lever(
        "warmup",
        "warmup off (warmup_ratio=0)",
        ("warmup_ratio=0",),
        same=lambda cfg, _: _unless(cfg.warmup_ratio == 0, "warmup_ratio is 0 on both sides"),
    ),
    Lever(
        "weight-decay",
        f"weight decay {TRAINER_DEFAULTS['weight_decay']:g} (the Trainer's)",
        (f"weight_decay={TRAINER_DEFAULTS['weight_decay']}",),
        same=lambda cfg, _: _unless(
            cfg.weight_decay == TRAINER_DEFAULTS["weight_decay"], "weight decay is the Trainer's"
        ),
    ),
    Lever("torch-dropout", "FastDropout -> torch nn.Dropout", patches=(torch_dropout,)),
    Lever(
        "attention-dropout",
        "attention dropout = the model config's",
        same=lambda cfg, corpus: _unless(
            cfg.attention_dropout in (None, corpus.attention_dropout),
            f"attention dropout {corpus.attention_dropout:g} on both sides (the model config's; "
            f"bert-tasks' attention_dropout={cfg.attention_dropout} keeps it)",
        ),
    ),
    Lever("padded", "unpadding off (padded encoder)", patches=(padded_encoder,)),
    Lever(
        "truncation",
        "windows -> truncation (first window only)",
        patches=(first_window_only,),
        same=lambda cfg, corpus: _unless(
            corpus.longest <= cfg.max_length,
            f"no sentence exceeds max_length {cfg.max_length} (longest {corpus.longest} sub-tokens): one "
            "window each, truncation cuts nothing",
        ),
    ),
    Lever(
        "subtokens",
        "first-sub-token labels (label_all_subtokens=false)",
        ("label_all_subtokens=false",),
        same=lambda cfg, _: _unless(not cfg.label_all_subtokens, "first-sub-token labels on both sides"),
    ),
    Lever(
        "clipping",
        f"max_grad_norm {TRAINER_DEFAULTS['max_grad_norm']:g} (the Trainer's)",
        (f"max_grad_norm={TRAINER_DEFAULTS['max_grad_norm']}",),
        same=lambda cfg, _: _unless(
            cfg.max_grad_norm == TRAINER_DEFAULTS["max_grad_norm"],
            f"gradient clipping at {cfg.max_grad_norm:g} on both sides",
        ),
    ),
    Lever("random-batches", "length grouping off (random batches)", patches=(random_batches,)),
)
#: Away from the Trainer (it runs bf16 too): what bf16 costs or buys.
FP32 = Lever("fp32", "bf16 -> fp32 (mixed_precision=no)", ("mixed_precision=no",))
#: An opt-in lever that changes what is learned (issue #22): what freezing the word embeddings costs.
FROZEN = Lever(
    "frozen-embeddings", "word embeddings frozen (freeze_embeddings=true)", ("freeze_embeddings=true",)
)
ALL_ON = Lever("all-on", "bert-tasks, all differences on")


def corpus_facts(cfg: Config, rows: tuple[int | None, int | None]) -> Corpus:
    model_dir = resolve_model_path(cfg.model)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    sentences = [*read_conll(cfg.train_file, rows[0])[0], *read_conll(cfg.test_file, rows[1])[0]]
    lengths = [len(ids) for ids in tokenizer(sentences, is_split_into_words=True)["input_ids"]]
    dropout = AutoConfig.from_pretrained(model_dir).attention_probs_dropout_prob
    return Corpus(attention_dropout=dropout, longest=max(lengths))


def plan(cfg: Config, corpus: Corpus) -> tuple[list[Lever], list[str]]:
    """The runs to make (all-on, each lever that changes something, fp32, all-off) and the notes on the
    levers that need no run."""
    active, notes = [], []
    for lever in LEVERS:
        reason = lever.same(cfg, corpus)
        if reason is None:
            active.append(lever)
        else:
            notes.append(f"{lever.label}: not run, {reason}")
    all_off = Lever(
        "all-off",
        "all differences off (" + ", ".join(lever.key for lever in active) + ", argmax)",
        tuple(item for lever in active for item in lever.overrides),
        tuple(patch for lever in active for patch in lever.patches),
    )
    return [ALL_ON, *active, FP32, FROZEN, all_off], notes


def word_scores(scores: dict[str, Any]) -> dict[str, Any]:
    """The scalars of a metric dict (and per-type F1) for the JSON."""
    kept = {key: scores[key] for key in ("f1", "precision", "recall")}
    return {**kept, "per_type_f1": {name: row["f1"] for name, row in scores["per_type"].items()}}


def run_trainer(cfg: Config, args: argparse.Namespace, seed: int, tmp: Path) -> dict[str, Any]:
    settings = {**BASELINE, **MATCHED, "max_length": cfg.max_length, "trainer": {}}
    rows = (args.train_rows, args.test_rows)
    tagged, seconds = timed(lambda: trainer_tags(cfg, settings, args.epochs, rows, tmp, seed))
    scores = load_ner_metric().compute(
        predictions=tagged["predicted"], references=tagged["gold"], tokens=tagged["words"]
    )
    return {
        "argmax": word_scores(scores),
        "wall_s": round(seconds, 1),
        "train_examples_per_s": round(tagged["train_examples_per_s"], 1),
        "words_truncated_as_O": tagged["words_truncated_as_O"],
    }


def run_bert_tasks(cfg: Config, lever: Lever, test_rows: int | None, test_file: str) -> dict[str, Any]:
    """Train under the lever's patches, then score the saved model on test, decoded both ways."""
    with ExitStack() as patches:
        for patch in lever.patches:
            patches.enter_context(patch())
        out, seconds = timed(lambda: train(cfg))
        started = time.perf_counter()
        cap = [] if test_rows is None else [f"max_eval_samples={test_rows}"]
        raw, policy = read_labelled_file(out, test_file, cap)
        predictor = Predictor(out, mixed_precision=cfg.mixed_precision, progress=False)
        encoded, logits = predictor.window_logits(raw)
    result: dict[str, Any] = {"train_s": round(seconds, 1)}
    for decoding in DECODINGS:
        options = {**policy.task_options, "viterbi": decoding == "viterbi"}
        task = dataclasses.replace(policy, task_options=options).make_task()
        result[decoding] = word_scores(task.metrics(raw, encoded, logits, predictor.id2label))
    result["score_s"] = round(time.perf_counter() - started, 1)
    result["wall_s"] = round(seconds + result["score_s"], 1)  # as the Trainer's: files to test tags
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    result["train_examples_per_s"] = next(r["examples_per_s"] for r in log if "examples_per_s" in r)
    return result


def table_rows(levers: list[Lever]) -> list[tuple[str, str, str]]:
    """(label, run key, decoding) per table row: the Trainer, all-on, each lever, Viterbi off, all-off."""
    rows = [("plain Trainer (the anchor)", "trainer", "argmax"), (ALL_ON.label, "all-on", "viterbi")]
    rows += [(lever.label, lever.key, "viterbi") for lever in levers[1:-1]]
    rows.append(("Viterbi -> argmax (the all-on models)", "all-on", "argmax"))
    rows.append((levers[-1].label, "all-off", "argmax"))
    return rows


def f1_values(records: list[dict[str, Any]], key: str, decoding: str) -> list[float]:
    return [r[decoding]["f1"] for r in sorted(records, key=lambda r: r["seed"]) if r["run"] == key]


def print_table(records: list[dict[str, Any]], levers: list[Lever], notes: list[str]) -> None:
    def mean(values: list[float]) -> float | None:
        return statistics.mean(values) if values else None

    def points(value: float | None, reference: float | None) -> str:
        return "-" if value is None or reference is None else f"{100 * (value - reference):+.2f}"

    all_on = mean(f1_values(records, "all-on", "viterbi"))
    trainer = mean(f1_values(records, "trainer", "argmax"))
    table_header(["row", "F1 mean ± std", "vs all-on", "vs Trainer", "F1 per seed", "wall s"])
    for label, key, decoding in table_rows(levers):
        values = f1_values(records, key, decoding)
        if not values:
            table_row([label, "not run yet", "", "", "", ""])
            continue
        spread = f" ± {statistics.stdev(values):.4f}" if len(values) > 1 else ""
        walls = [r["wall_s"] for r in records if r["run"] == key]
        table_row(
            [
                label,
                f"{statistics.mean(values):.4f}{spread}",
                points(mean(values), all_on),
                points(mean(values), trainer),
                ", ".join(f"{value:.4f}" for value in values),
                f"{statistics.mean(walls):.0f}",
            ]
        )
    for note in notes:
        print(f"- {note}")


def main() -> None:
    reuse_freed_memory()  # what the CLI sets for its process: the library leaves it to the caller
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--corpus", choices=CORPORA, default="bc5cdr")
    parser.add_argument(
        "--recipe", type=Path, help="an NER recipe naming train_file and test_file (default: the corpus')"
    )
    parser.add_argument("--train-rows", type=int, default=2000, help="first N training sentences")
    parser.add_argument("--test-rows", type=int, help="first N test sentences (default: all)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44])
    parser.add_argument("--epochs", type=float, default=BASELINE["epochs"])
    parser.add_argument("--runs", nargs="+", help="only these runs (trainer, all-on, a lever's key, all-off)")
    parser.add_argument("--json", type=Path, help="append each run here as it ends")
    parser.add_argument("--resume", action="store_true", help="keep the runs --json holds, make the rest")
    args = parser.parse_args()
    quiet()
    logging.getLogger("bert_tasks").setLevel(logging.WARNING)  # no INFO lines, no progress bar per run

    recipe = args.recipe or Path(f"recipes/ner_{args.corpus}.yaml")
    corpus = recipe.stem if args.recipe else args.corpus
    matched = [f"{key}={value:g}" for key, value in {**MATCHED, "epochs": args.epochs}.items()]
    base = [*matched, f"max_train_samples={args.train_rows}", "validation_file=none"]
    base += ["report_to=none", "logging_steps=1000000000", "overwrite=true"]
    cfg = load_recipe(recipe, base)  # the Trainer's settings; bert-tasks' runs leave test to this script
    levers, notes = plan(cfg, corpus_facts(cfg, (args.train_rows, args.test_rows)))
    runs = ["trainer", *(lever.key for lever in levers)]
    runs = [key for key in runs if args.runs is None or key in args.runs]
    records = json.loads(args.json.read_text()) if args.resume and args.json and args.json.exists() else []
    done = {(r["run"], r["seed"]) for r in records}
    print(f"ablation {corpus}: {recipe} {' '.join(base)} | {machine_line()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:  # seed by seed: a partial run has every row at the first seeds
            for key in [key for key in runs if (key, seed) not in done]:
                out = Path(tmp) / "bert-tasks"
                if key == "trainer":
                    result = run_trainer(cfg, args, seed, Path(tmp))
                else:
                    lever = next(lever for lever in levers if lever.key == key)
                    settings = [
                        *base,
                        "test_file=none",
                        *lever.overrides,
                        f"seed={seed}",
                        f"output_dir={out}",
                    ]
                    result = run_bert_tasks(
                        load_recipe(recipe, settings), lever, args.test_rows, cfg.test_file
                    )
                records.append({"corpus": corpus, "run": key, "seed": seed, **result})
                write_json(args.json, records)
                decoding = "argmax" if key == "trainer" else "viterbi"
                print(
                    f"{key} seed {seed}: F1 {result[decoding]['f1']:.4f} in {result['wall_s']:.0f} s",
                    flush=True,
                )
    print_table(records, levers, notes)


if __name__ == "__main__":
    main()
