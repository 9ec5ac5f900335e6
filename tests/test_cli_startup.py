"""The CLI answers before the heavy imports: help, config mistakes, data and model-dir mistakes.

Checked structurally, in a fresh interpreter: which modules are loaded when the answer is given (the
speed itself is measured by bench/startup.py, never in a test).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("torch", "transformers", "accelerate", "datasets")

#: Runs `main(argv)` and reports its exit status and which heavy modules it had imported by then.
PROBE = """
import contextlib, io, json, sys
from bert_tasks.cli import main
argv = json.loads(sys.argv[1])
with contextlib.redirect_stderr(io.StringIO()) as err, contextlib.redirect_stdout(io.StringIO()):
    try:
        status = main(argv)
    except SystemExit as exit:
        status = exit.code
loaded = [name for name in json.loads(sys.argv[2]) if name in sys.modules]
print(json.dumps({"status": status, "loaded": loaded, "stderr": err.getvalue()}))
"""


def probe(argv: list[str], cwd: Path) -> dict[str, object]:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(argv), json.dumps(HEAVY)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        check=True,
    )
    return json.loads(result.stdout)


@pytest.mark.parametrize(
    ("argv", "status", "message"),
    [
        (["--help"], 0, ""),
        (["finetune", "--help"], 0, ""),
        (["finetune", "sentiment", "learning_rat=3e-5"], 1, "unknown config key 'learning_rat'"),
        (["finetune", "ner", "lr=abc"], 1, "lr='abc' on the command line: expected a number"),
        (
            ["finetune", "ner", "attention=sideways"],
            1,
            "attention='sideways', must be one of bidirectional, causal, right_to_left",
        ),
        (["finetune", "sentiment", "--recipe", "missing.yaml"], 1, "recipe not found"),
        (["finetune", "sentiment", "train_file=missing.csv"], 1, "missing.csv: file not found"),
        (["finetune", "sentiment", "train_file=bad.csv"], 1, "bad.csv:1: header has columns"),
        (["finetune", "sentiment", "train_file=bad.csv", "header=false", "text_column=x"], 1, "header=false"),
        (["finetune", "ner", "train_file=bad.csv", "format=brat"], 1, "format='brat', must be one of auto"),
        (["predict", "ner", "--model", "nowhere/at/all", "a text"], 1, "no such directory"),
        (["predict", "ner", "a text"], 1, "no model at runs/ner (the default --model); train one with"),
        (["evaluate", "ner", "--model", "nowhere/at/all", "--data", "bad.csv"], 1, "no such directory"),
        (["debug", "data", "sentiment", "train_file=bad.csv"], 1, "bad.csv:1: header has columns"),
        (["debug", "data", "ner", "--rare", "0"], 1, "--rare must be at least 1, got 0"),
        (["debug", "data", "ner", "max_length=1000"], 1, "max_length=1000, must be >= 8 and <= 512"),
    ],
)
@pytest.mark.slow
def test_answers_come_before_torch_and_transformers(
    tmp_path: Path, argv: list[str], status: int, message: str
) -> None:
    (tmp_path / "bad.csv").write_text("sentence,score\nfine,1\n", encoding="utf-8")
    answer = probe([*argv, f"output_dir={tmp_path / 'out'}"] if argv[0] == "finetune" else argv, tmp_path)
    assert answer["status"] == status, answer
    assert message in answer["stderr"]
    assert answer["loaded"] == [], f"{argv} imported {answer['loaded']} before answering"
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_class_weights_of_the_wrong_length_are_answered_once_the_data_is_read(tmp_path: Path) -> None:
    """The label count comes from the training data (read with datasets), never from a model."""
    argv = ["finetune", "sentiment", "class_weights=[1,2,3]", f"output_dir={tmp_path / 'out'}"]
    answer = probe(argv, tmp_path)
    assert answer["status"] == 1
    assert "class_weights has 3 weight(s) but the training data has 2 labels (negative, positive)" in str(
        answer["stderr"]
    )
    assert {"torch", "transformers", "accelerate"}.isdisjoint(answer["loaded"]), answer["loaded"]
    assert not (tmp_path / "out").exists()


def test_finetune_help_lists_every_config_key_with_its_default_and_meaning() -> None:
    from bert_tasks.config import Config

    result = subprocess.run(
        [sys.executable, "-m", "bert_tasks", "finetune", "--help"], capture_output=True, text=True, check=True
    )
    for name in Config.__dataclass_fields__:
        if name != "task":
            assert f"  {name}=" in result.stdout, name
    assert re.search(r"\n  lr=5e-05 +peak learning rate \(AdamW\)\n", result.stdout)
    assert re.search(r"\n  viterbi=true +NER: BIO-constrained Viterbi decoding", result.stdout)


def test_a_mistyped_model_path_is_named_as_a_path_not_a_hub_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`model=runs/nre` beside a `runs/` dir is a typo of a path: 'no such directory', not a hub download."""
    from bert_tasks.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    assert main(["finetune", "sentiment", "model=runs/nre", "output_dir=out"]) == 1
    assert capsys.readouterr().err.strip() == (
        "bert-tasks: error: model runs/nre: no such directory; pass a saved model dir or a hub id"
    )


@pytest.mark.parametrize(
    ("policy", "argv", "message"),
    [
        ({}, ["a text", "--pair", "screen"], "reads one text per input, not text pairs; drop --pair"),
        ({"text_pair_column": "aspect"}, ["--file", "in.jsonl"], "in.jsonl:1: no 'aspect' for the text"),
    ],
)
def test_pair_mistakes_are_answered_from_the_model_dirs_json(
    tmp_path: Path, policy: dict[str, object], argv: list[str], message: str
) -> None:
    """Whether a model reads text pairs is in config.json: `--pair` for one that does not, and a record
    without the pair field for one that does, are one line before torch loads."""
    model = tmp_path / "model"
    model.mkdir()
    config = {
        "architectures": ["BertForSequenceClassification"],
        "id2label": {"0": "negative", "1": "positive"},
        "bert_tasks": {"task": "sentiment", "max_length": 32, "stride": 8, **policy},
    }
    (model / "config.json").write_text(json.dumps(config), encoding="utf-8")
    (tmp_path / "in.jsonl").write_text('{"text": "The screen is dim."}\n', encoding="utf-8")
    answer = probe(["predict", "sentiment", "--model", str(model), *argv], tmp_path)
    assert answer["status"] == 1 and message in str(answer["stderr"]), answer
    assert answer["loaded"] == [], answer["loaded"]
