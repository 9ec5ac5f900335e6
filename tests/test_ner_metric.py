"""The local seqeval metric module: numbers checked by hand, error breakdown, offline loading."""

from __future__ import annotations

import evaluate
import pytest

from bert_tasks.tasks.ner import METRIC_DIR

REFERENCES = [["B-Disease", "I-Disease", "O", "B-Chemical"], ["O", "B-Chemical", "I-Chemical"]]
PREDICTIONS = [["B-Disease", "I-Disease", "O", "I-Chemical"], ["O", "B-Chemical", "O"]]


@pytest.fixture(scope="module")
def metric():
    return evaluate.load(str(METRIC_DIR))


def test_known_case_checked_by_hand(metric):
    scores = metric.compute(predictions=PREDICTIONS, references=REFERENCES)
    # Gold: Disease 0-1, Chemical 3, Chemical 1-2 (3 entities).
    # Default (conlleval) mode reads the stray I-Chemical as an entity: predicted Disease 0-1, Chemical 3,
    # Chemical 1-1 (3 entities), of which the first two are exact -> P = R = F1 = 2/3.
    assert scores["precision"] == pytest.approx(2 / 3)
    assert scores["recall"] == pytest.approx(2 / 3)
    assert scores["f1"] == pytest.approx(2 / 3)
    # Strict IOB2 drops the stray I-Chemical: 2 predicted, 1 exact -> P = 1/2, R = 1/3, F1 = 2PR/(P+R) = 0.4.
    assert scores["strict_precision"] == pytest.approx(1 / 2)
    assert scores["strict_recall"] == pytest.approx(1 / 3)
    assert scores["strict_f1"] == pytest.approx(0.4)
    # Tags right on 3 of 4 and 2 of 3 tokens.
    assert scores["accuracy"] == pytest.approx(5 / 7)
    assert scores["per_type"] == {
        "Chemical": {"precision": 0.5, "recall": 0.5, "f1": 0.5, "support": 2},
        "Disease": {"precision": 1.0, "recall": 1.0, "f1": 1.0, "support": 1},
    }
    assert scores["strict_per_type"]["Chemical"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 2}


def test_error_breakdown(metric):
    tokens = [
        ["Cisplatin", "caused", "acute", "renal", "failure"],
        ["rash", "and", "fever", "after", "aspirin"],
    ]
    references = [
        ["B-Chemical", "O", "B-Disease", "I-Disease", "I-Disease"],
        ["B-Disease", "O", "B-Disease", "O", "B-Chemical"],
    ]
    predictions = [
        ["B-Disease", "O", "O", "B-Disease", "I-Disease"],  # wrong type; wrong boundary
        ["O", "B-Chemical", "I-Chemical", "B-Disease", "O"],  # missed; wrong type+boundary; spurious; missed
    ]
    errors = metric.compute(predictions=predictions, references=references, tokens=tokens)["errors"]
    counts = {k: v for k, v in errors.items() if k != "examples"}
    assert counts == {
        "wrong_type": 1,
        "wrong_boundary": 1,
        "wrong_type_and_boundary": 1,
        "missed": 2,
        "spurious": 1,
    }
    examples = errors["examples"]
    assert examples["wrong_type"] == [
        {"sentence": 0, "gold": "Cisplatin [Chemical]", "pred": "Cisplatin [Disease]"}
    ]
    assert examples["wrong_boundary"][0]["pred"] == "renal failure [Disease]"
    assert examples["wrong_type_and_boundary"][0] == {
        "sentence": 1,
        "gold": "fever [Disease]",
        "pred": "and fever [Chemical]",
    }
    assert [e["gold"] for e in examples["missed"]] == ["rash [Disease]", "aspirin [Chemical]"]
    assert examples["spurious"] == [{"sentence": 1, "gold": None, "pred": "after [Disease]"}]


def test_examples_are_capped(metric):
    predictions = [["B-Disease"]] * 8
    errors = metric.compute(predictions=predictions, references=[["O"]] * 8)["errors"]
    assert errors["spurious"] == 8
    assert len(errors["examples"]["spurious"]) == 5
    assert errors["examples"]["spurious"][0]["pred"] == "words 0-0 [Disease]"


def test_loads_offline(metric):
    # conftest sets HF_EVALUATE_OFFLINE before evaluate is imported, so the fixture's load ran offline.
    assert evaluate.config.HF_EVALUATE_OFFLINE
    assert metric.compute(predictions=[["B-Disease", "O"]], references=[["B-Disease", "O"]])["f1"] == 1.0
