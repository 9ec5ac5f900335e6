"""Plain helpers for the runner, prediction and CLI tests: a tiny random BERT and tiny run configs.

They are functions, not fixtures, so each test module decides the scope (a session-scoped fixture builds
the tiny model once; tests that mutate a run copy it). Nothing here touches the real 90 MB default model
or ../shared/data: every run takes a couple of seconds on two CPU cores.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoTokenizer, BertConfig, BertModel

from bert_tasks.config import Config, load_recipe
from bert_tasks.data.ner_files import words_with_offsets
from bert_tasks.modeling.load import bundled_model_dir

FIXTURES = Path(__file__).resolve().parent / "fixtures"
DATA = {
    "sentiment": (FIXTURES / "run_sentiment_train.jsonl", FIXTURES / "run_sentiment_validation.jsonl"),
    "ner": (FIXTURES / "run_ner_train.conll", FIXTURES / "run_ner_validation.conll"),
}
LABELS = {
    "sentiment": ["negative", "positive"],
    "ner": ["O", "B-Chemical", "I-Chemical", "B-Disease", "I-Disease"],
}
#: Settings that keep a run at a few seconds: one short epoch, small windows, a log record every step.
FAST = {"epochs": "1", "batch_size": "8", "eval_batch_size": "16", "max_length": "32", "stride": "8"}
FAST |= {"logging_steps": "1", "mixed_precision": "no", "warmup_ratio": "0"}
#: No tracker files: the tests of trackers (tests/training/test_trackers.py) ask for them.
FAST |= {"report_to": "none"}

#: ~65 words of sentiment text: three or more windows at max_length=32.
LONG_REVIEW = " ".join(
    [
        "The hotel looked lovely in the photos, but the room smelled of smoke and the shower ran cold.",
        "The staff at the front desk shrugged every time we asked for help with the broken heating.",
        "Still, the breakfast was unexpectedly wonderful and the view over the harbour was stunning.",
        "We would not stay again, although the location near the old town was honestly very convenient.",
    ]
)
#: A long clinical sentence (~50 words, ~60 with punctuation) with irregular spacing, so that
#: character offsets are tested for real.
LONG_NER_TEXT = (
    "Her  hepatotoxicity improved after sodium valproate was withdrawn and prednisone was given, "
    "but the  patient later developed acute renal failure,\tnephrotoxicity and severe hypotension "
    "while on cisplatin ,  lithium carbonate and haloperidol ; the neuroleptic malignant syndrome "
    "resolved after dantrolene and bromocriptine were started in the intensive care unit ."
)


@contextmanager
def one_thread() -> Iterator[None]:
    """Run torch on one thread: a 32-wide BERT gains nothing from more, and on a busy 2-core machine
    two OpenMP threads fighting another job make each tiny run ~5x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def build_tiny_model(directory: Path, **config: object) -> Path:
    """Save a random 2-layer BERT with the bundled tokenizer: a model dir `model=<dir>` accepts anywhere.

    The weights are seeded, so every test session predicts the same labels and entities; `config`
    overrides `tiny_bert_config` (e.g. no dropout, for runs that must match to the last digit).
    """
    with torch.random.fork_rng():
        torch.manual_seed(0)
        BertModel(tiny_bert_config(**config)).save_pretrained(directory)
    AutoTokenizer.from_pretrained(bundled_model_dir()).save_pretrained(directory)
    return directory


def fast_overrides(task: str, model_dir: Path, output_dir: Path, **overrides: Any) -> list[str]:
    """`key=value` strings for a tiny run on the committed `run_*` fixtures; keyword args win."""
    train_file, validation_file = DATA[task]
    values: dict[str, Any] = {
        **FAST,
        "model": model_dir,
        "output_dir": output_dir,
        "train_file": train_file,
        "validation_file": validation_file,
        **overrides,
    }
    return [f"{key}={value}" for key, value in values.items()]


def tiny_config(task: str, model_dir: Path, output_dir: Path, **overrides: Any) -> Config:
    """The typed config of a tiny run, built the way the CLI builds it (through `load_recipe`)."""
    return load_recipe(None, fast_overrides(task, model_dir, output_dir, **overrides), task=task)


def distill_config(task: str, teacher: Path, output_dir: Path, **overrides: Any) -> Config:
    """The typed config of a tiny distill run of `teacher`; no `model=` (the student starts at `student=`)."""
    values = fast_overrides(task, teacher, output_dir, teacher=teacher, **overrides)
    return load_recipe(None, [item for item in values if not item.startswith("model=")], task=task)


def read_log(run_dir: Path) -> list[dict[str, Any]]:
    """The records of a run's train_log.jsonl."""
    return [json.loads(line) for line in (run_dir / "train_log.jsonl").read_text().splitlines()]


def train_steps(run_dir: Path) -> list[int]:
    """Steps of the loss records (logging_steps=1 writes one per optimizer update)."""
    return [record["step"] for record in read_log(run_dir) if "loss" in record]


#: Gold types of some words of LONG_NER_TEXT; every other word is O.
LONG_NER_TYPES = {
    "hepatotoxicity": "Disease",
    "valproate": "Chemical",
    "prednisone": "Chemical",
    "nephrotoxicity": "Disease",
    "hypotension": "Disease",
    "cisplatin": "Chemical",
    "haloperidol": "Chemical",
    "dantrolene": "Chemical",
    "bromocriptine": "Chemical",
}


def long_ner_sentence() -> list[tuple[str, str]]:
    """LONG_NER_TEXT as (word, BIO tag) pairs, split the way prediction splits raw text."""
    words, _ = words_with_offsets(LONG_NER_TEXT)
    return [(word, f"B-{LONG_NER_TYPES[word]}" if word in LONG_NER_TYPES else "O") for word in words]


def write_conll(path: Path, sentences: list[list[tuple[str, str]]]) -> Path:
    """Write (word, tag) sentences as a two-column CoNLL file."""
    blocks = ["\n".join(f"{word}\t{tag}" for word, tag in sentence) for sentence in sentences]
    path.write_text("\n\n".join(blocks) + "\n", encoding="utf-8")
    return path


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    """Write one JSON object per line."""
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return path


def read_conll(path: Path) -> list[list[tuple[str, str]]]:
    """The (word, tag) sentences of a two-column CoNLL file."""
    blocks = path.read_text(encoding="utf-8").strip().split("\n\n")
    return [[tuple(line.split("\t")) for line in block.splitlines()] for block in blocks]  # type: ignore[misc]


def tiny_bert_config(**overrides: object) -> BertConfig:
    """A 2-layer, 32-wide BERT with the bundled tokenizer's vocabulary: fast, but real shapes."""
    settings: dict[str, object] = {
        "vocab_size": 30522,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 37,
        "max_position_embeddings": 128,
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
    }
    settings.update(overrides)
    return BertConfig(**settings)


def at_real_tokens(per_token: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, T, ...] -> [N, ...]: the outputs at real tokens, the only ones a patched model promises.

    Patched models run their layers on the real tokens only and leave zeros at padding positions, whose
    outputs no head, loss or decoder reads (bert_tasks/modeling/unpad.py).
    """
    return per_token[attention_mask.bool()]


def assert_same_training_step(
    stock: torch.nn.Module,
    patched: torch.nn.Module,
    batch: dict[str, torch.Tensor],
    labels: torch.Tensor,
    stock_batch: dict[str, torch.Tensor] | None = None,
) -> None:
    """One forward + backward in train mode on each model: equal losses and equal gradients for every
    parameter (the fused `qkv` against stock's query, key and value gradients, concatenated).

    `stock_batch`: what stock reads instead of `batch` (e.g. a hand-built 4-D mask)."""
    losses = []
    for model, inputs in ((stock, stock_batch or batch), (patched, batch)):
        model.train()
        loss = model(**inputs, labels=labels).loss
        loss.backward()
        losses.append(loss)
    torch.testing.assert_close(losses[1], losses[0], atol=0, rtol=1e-4)
    stock_grads = {name: param.grad for name, param in stock.named_parameters()}
    checked = 0
    for name, param in patched.named_parameters():
        if name.endswith(("qkv.weight", "qkv.bias")):
            prefix, suffix = name.rsplit(".qkv.", 1)
            want = torch.cat([stock_grads[f"{prefix}.{p}.{suffix}"] for p in ("query", "key", "value")])
        else:
            want = stock_grads[name]
        torch.testing.assert_close(param.grad, want, atol=1e-7, rtol=1e-4, msg=name)
        checked += 1
    assert checked == len(list(patched.parameters()))


def write_file(tmp_path: Path, name: str, content: str | bytes) -> Path:
    """A file in `tmp_path` with exactly these bytes (or this text as UTF-8): readers' bad-input cases."""
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def cli_error_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run `bert-tasks argv` in-process: exit status 1, exactly one `bert-tasks: error:` line on stderr and
    no traceback. Returns that line."""
    from bert_tasks.cli import main

    capsys.readouterr()
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    [line] = err.strip().splitlines()
    assert line.startswith("bert-tasks: error: ")
    return line
