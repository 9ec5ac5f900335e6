"""`evaluate`'s key=value settings apply or are refused: none is accepted and then ignored.

Reader keys read the file; the saved policy's keys (windows, the task's decoding options) run instead of
the saved values, each said in one line; training keys are refused before the model loads.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest

from bert_tasks.inference.evaluate import evaluate_file, read_labelled_file
from bert_tasks.inference.predictor import Predictor
from bert_tasks.model_dir import read_policy
from tests.helpers import DATA, cli_error_line

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.mark.slow
def test_viterbi_false_runs_argmax_and_says_it_differs_from_training(
    ner_run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = str(DATA["ner"][1])
    with caplog.at_level(logging.INFO, logger="bert_tasks"):
        metrics = evaluate_file("ner", ner_run, data, ["viterbi=false"], tmp_path / "eval")
    assert "viterbi=False differs from the model's training (True): evaluating with it" in caplog.text
    raw, policy = read_labelled_file(ner_run, data, ["viterbi=false"])
    assert policy.task_options["viterbi"] is False
    argmax = Predictor(ner_run, policy=policy)
    assert argmax.task.viterbi is False and metrics == argmax.evaluate(raw)
    assert dataclasses.replace(policy, task_options=read_policy(ner_run).task_options) == read_policy(ner_run)


def test_window_keys_override_the_saved_windows(
    sentiment_run: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="bert_tasks"):
        _, policy = read_labelled_file(
            sentiment_run, str(DATA["sentiment"][1]), ["max_length=16", "stride=4"]
        )
    assert (policy.max_length, policy.stride) == (16, 4)
    assert "max_length=16 differs from the model's training" in caplog.text


def test_a_saved_value_named_again_says_nothing(
    sentiment_run: Path, caplog: pytest.LogCaptureFixture
) -> None:
    saved = read_policy(sentiment_run)
    with caplog.at_level(logging.INFO, logger="bert_tasks"):
        _, policy = read_labelled_file(
            sentiment_run, str(DATA["sentiment"][1]), [f"max_length={saved.max_length}"]
        )
    assert policy == saved and "differs" not in caplog.text


@pytest.mark.parametrize("setting", ["lr=1e-3", "epochs=5", "model=other", "seed=3", "viterbi=false"])
def test_a_training_key_is_refused_in_one_line(
    setting: str, sentiment_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """viterbi is NER's: a sentiment model has no such decoding option."""
    argv = [
        "evaluate",
        "sentiment",
        "--model",
        str(sentiment_run),
        "--data",
        str(DATA["sentiment"][1]),
        setting,
    ]
    line = cli_error_line([*argv, "--out", str(tmp_path / "eval")], capsys)
    key = setting.partition("=")[0]
    assert line.startswith(f"bert-tasks: error: {key}= on the command line is not an evaluate setting: ")
    assert "(max_length, stride)" in line and not (tmp_path / "eval").exists()


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (
            "label_all_subtokens=true",
            "label_all_subtokens= on the command line: the model was trained with its saved "
            "label_all_subtokens (config.json's bert_tasks.label_all_subtokens), which evaluate cannot "
            "change; drop it",
        ),
        (
            "word_splitter=whitespace",
            "word_splitter= on the command line changes nothing here: {data} gives its own tokens, no text "
            "to cut; drop it",
        ),
        (
            "text_column=sentence",
            "text_column= on the command line changes nothing here: {data} gives its own",
        ),
        *(
            (
                setting,
                f"{setting.partition('=')[0]}= on the command line changes nothing here: {{data}} is a "
                "CoNLL file: its columns are read by position and its tags by name; drop it",
            )
            for setting in ("tokens_column=words", "tag_column=labels", "label_names=[O,B-X,I-X]")
        ),
        (
            "document_context=8",
            "document_context= on the command line changes nothing here: {data} marks no documents "
            "(-DOCSTART- lines): no sentence has neighbours; drop it",
        ),
    ],
)
def test_an_ner_setting_that_would_change_nothing_is_refused(
    setting: str, message: str, ner_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """label_all_subtokens only chose the training labels; a CoNLL file's words are cut by no splitter."""
    data = str(DATA["ner"][1])
    argv = ["evaluate", "ner", "--model", str(ner_run), "--data", data, setting]
    line = cli_error_line([*argv, "--out", str(tmp_path / "eval")], capsys)
    assert line.startswith("bert-tasks: error: " + message.format(data=data))
    assert not (tmp_path / "eval").exists()


def test_the_column_keys_apply_to_a_jsonl_file_of_tokens(ner_run: Path, tmp_path: Path) -> None:
    """What a CoNLL file refuses, a JSONL file of tokens reads: its columns are named."""
    tokens = tmp_path / "tokens.jsonl"
    tokens.write_text('{"words": ["aspirin", "rash"], "labels": [1, 0]}\n', encoding="utf-8")
    names = ["tokens_column=words", "tag_column=labels", "label_names=[O,B-Chemical,I-Chemical]"]
    raw, _ = read_labelled_file(ner_run, str(tokens), names)
    assert raw["tokens"] == [["aspirin", "rash"]] and raw["tags"] == [["B-Chemical", "O"]]


def test_word_splitter_applies_to_a_file_of_texts(ner_run: Path, tmp_path: Path) -> None:
    spans = tmp_path / "spans.jsonl"
    spans.write_text('{"text": "aspirin-induced rash", "spans": []}\n', encoding="utf-8")
    raw, policy = read_labelled_file(ner_run, str(spans), ["word_splitter=whitespace"])
    assert policy.task_options["word_splitter"] == "whitespace"
    assert raw["tokens"] == [["aspirin-induced", "rash"]]
