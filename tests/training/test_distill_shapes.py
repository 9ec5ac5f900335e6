"""Distillation of teachers other than a plain [CLS] classifier: text pairs, causal attention, NER on the
user's own tokens take the teacher's reading of inputs; multi-label and regression teachers are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bert_tasks.model_dir import read_policy
from bert_tasks.training import train
from tests.helpers import distill_config, one_thread, tiny_config, write_jsonl
from tests.test_cli_startup import probe

DEMO = Path(__file__).resolve().parents[2] / "bert_tasks" / "resources" / "demo"

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("single_thread")]


def _teacher(base: Path, out: Path, shape: str, **overrides: object) -> Path:
    """A tiny sentiment teacher on 64 rows of a demo shape."""
    cfg = tiny_config(
        "sentiment",
        base,
        out,
        train_file=DEMO / shape / "train.jsonl",
        validation_file=DEMO / shape / "validation.jsonl",
        max_train_samples=64,
        **overrides,
    )
    with one_thread():
        return train(cfg)


@pytest.fixture(scope="module")
def pair_teacher(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _teacher(tiny_model, tmp_path_factory.mktemp("pairs") / "run", "pairs", text_pair_column="aspect")


def test_a_pair_teacher_distils_on_pairs_and_the_student_reads_them(
    pair_teacher: Path, tmp_path: Path
) -> None:
    """The student inherits the pair field; transfer_file's JSONL records bring their pair with them."""
    notes = write_jsonl(
        tmp_path / "notes.jsonl",
        [{"text": "The screen is dim.", "aspect": "screen"}, {"text": "Great price.", "aspect": "price"}],
    )
    student = train(
        distill_config(
            "sentiment",
            pair_teacher,
            tmp_path / "student",
            train_file=DEMO / "pairs" / "train.jsonl",
            validation_file=None,
            max_steps=2,
            transfer_file=notes,
        )
    )
    assert read_policy(student).task_options["text_pair_column"] == "aspect"
    assert json.loads((student / "metrics.json").read_text())["teacher"]["transfer_texts"] == 2


def test_a_pair_teachers_transfer_file_without_pairs_is_one_line_before_torch(
    pair_teacher: Path, tmp_path: Path
) -> None:
    plain = tmp_path / "notes.txt"
    plain.write_text("The screen is dim.\n", encoding="utf-8")
    out = tmp_path / "out"
    argv = [
        "distill",
        "sentiment",
        "--teacher",
        str(pair_teacher),
        f"train_file={DEMO / 'pairs' / 'train.jsonl'}",
    ]
    answer = probe([*argv, f"transfer_file={plain}", f"output_dir={out}"], tmp_path)
    lines = str(answer["stderr"]).strip().splitlines()
    assert answer["status"] == 1 and len(lines) == 1, answer
    assert f"{plain}:1" in lines[0] and "aspect" in lines[0], lines
    assert {"torch", "transformers"}.isdisjoint(answer["loaded"]) and not out.exists()


@pytest.mark.parametrize(
    ("shape", "overrides", "named"),
    [
        ("multilabel", {}, "multi-label"),
        ("regression", {"regression": True}, "regression"),
    ],
)
def test_a_multi_label_or_regression_teacher_is_refused_in_one_line(
    shape: str, overrides: dict[str, object], named: str, tiny_model: Path, tmp_path: Path
) -> None:
    """Their outputs are no softmax over classes: soft targets would teach the wrong thing."""
    teacher = _teacher(tiny_model, tmp_path / "teacher", shape, **overrides)
    out = tmp_path / "out"
    answer = probe(["distill", "sentiment", "--teacher", str(teacher), f"output_dir={out}"], tmp_path)
    lines = str(answer["stderr"]).strip().splitlines()
    assert answer["status"] == 1 and len(lines) == 1 and f"is a {named} model" in lines[0], answer
    assert {"torch", "transformers", "datasets"}.isdisjoint(answer["loaded"]) and not out.exists()


def test_a_causal_teacher_gives_a_causal_student(tiny_model: Path, tmp_path: Path) -> None:
    """The student attends as its teacher was trained to (its logits are the teacher's last-token ones)."""
    teacher = _teacher(tiny_model, tmp_path / "teacher", "sentiment", attention="causal")
    demo = DEMO / "sentiment"
    cfg = distill_config(
        "sentiment", teacher, tmp_path / "student", train_file=demo / "train.jsonl", max_steps=2
    )
    assert cfg.attention == "causal"
    assert read_policy(train(cfg)).attention == "causal"


def test_a_ner_transfer_file_of_the_users_own_tokens_trains(tiny_model: Path, tmp_path: Path) -> None:
    """JSONL records with `tokens` are words as given, as `predict` takes them; a text is split as usual."""
    with one_thread():
        teacher = train(tiny_config("ner", tiny_model, tmp_path / "teacher", max_steps=2))
    notes = write_jsonl(
        tmp_path / "notes.jsonl",
        [{"tokens": ["Aspirin", "caused", "bleeding", "."]}, {"text": "Valproate caused hepatotoxicity."}],
    )
    student = train(distill_config("ner", teacher, tmp_path / "student", max_steps=2, transfer_file=notes))
    assert json.loads((student / "metrics.json").read_text())["teacher"]["transfer_texts"] == 2
