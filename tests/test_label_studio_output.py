"""`predict --format label-studio`: one JSON array of Label Studio tasks pre-annotated with the predictions,
which the Label Studio reader reads back into the predicted spans once an annotator accepts them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bert_tasks.cli import main
from bert_tasks.config import Config
from bert_tasks.data.ner_files import read_ner_file
from bert_tasks.tasks.ner import entity_spans
from tests.helpers import LONG_NER_TEXT, cli_error_line

TEXTS = [LONG_NER_TEXT, "Cisplatin caused renal failure 😀 after aspirin."]


def predict(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    assert main(["--quiet", "predict", *argv]) == 0
    return capsys.readouterr().out


def test_ner_pre_annotations_read_back_as_the_predicted_spans(
    ner_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tasks = json.loads(predict(["ner", "--model", str(ner_run), "--format", "label-studio", *TEXTS], capsys))
    records = [
        json.loads(line)
        for line in predict(["ner", "--model", str(ner_run), "--json", *TEXTS], capsys).splitlines()
    ]
    predicted = [[(e["start"], e["end"], e["label"]) for e in r["entities"]] for r in records]
    assert sum(map(len, predicted)) > 0, (
        "the tiny model predicts no entity: the round trip would prove nothing"
    )
    for task, record in zip(tasks, records, strict=True):
        assert task["data"] == {"text": record["text"]}
        [prediction] = task["predictions"]
        assert prediction["model_version"] == ner_run.name
        results = prediction["result"]
        assert {(r["from_name"], r["to_name"], r["type"]) for r in results} <= {("label", "text", "labels")}
        assert [r["value"] for r in results] == [
            {"start": e["start"], "end": e["end"], "text": e["text"], "labels": [e["label"]]}
            for e in record["entities"]
        ]
        scores = [e["score"] for e in record["entities"]]
        assert prediction.get("score") == (pytest.approx(sum(scores) / len(scores)) if scores else None)
    # What Label Studio exports once an annotator submits the pre-annotation unchanged.
    for task in tasks:
        task["annotations"] = [{"result": task["predictions"][0]["result"], "was_cancelled": False}]
    export = tmp_path / "export.json"
    export.write_text(json.dumps(tasks, ensure_ascii=False), encoding="utf-8")
    data = read_ner_file(export, Config(task="ner"))
    read_back = [
        [(offsets[first][0], offsets[last][1], label) for label, first, last in entity_spans(tags)]
        for tags, offsets in zip(data["tags"], data["word_offsets"], strict=True)
    ]
    assert read_back == predicted


def test_sentiment_pre_annotations_are_choices(
    sentiment_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    texts = ["I loved it", "Terrible plot"]
    tasks = json.loads(
        predict(["sentiment", "--model", str(sentiment_run), "--format", "label-studio", *texts], capsys)
    )
    records = [
        json.loads(line)
        for line in predict(
            ["sentiment", "--model", str(sentiment_run), "--json", *texts], capsys
        ).splitlines()
    ]
    assert tasks == [
        {
            "data": {"text": r["text"]},
            "predictions": [
                {
                    "model_version": sentiment_run.name,
                    "score": r["score"],
                    "result": [
                        {
                            "from_name": "sentiment",
                            "to_name": "text",
                            "type": "choices",
                            "value": {"choices": [r["label"]]},
                            "score": r["score"],
                        }
                    ],
                }
            ],
        }
        for r in records
    ]


def test_json_and_another_format_are_one_line(
    sentiment_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "predict",
        "sentiment",
        "--model",
        str(sentiment_run),
        "--json",
        "--format",
        "label-studio",
        "Fine",
    ]
    assert cli_error_line(argv, capsys) == (
        "bert-tasks: error: --json and --format label-studio ask for two outputs; give one of them"
    )
