"""The sentiment shapes on a tiny model: pair windows, each shape's loss by hand, threshold tuning, and the
metrics against scikit-learn and scipy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from datasets import Dataset
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, precision_recall_fscore_support
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from bert_tasks.data.batching import RowCollator, with_rows
from bert_tasks.data.padded_batches import model_inputs
from bert_tasks.errors import BertTasksError
from bert_tasks.modeling.load import load_model
from bert_tasks.tasks.sentiment import SentimentTask
from bert_tasks.tasks.sentiment_shapes import MultiLabel, Regression, tune_thresholds

REVIEW = (
    "The battery lasts all day and the keyboard is a joy to type on, but the screen is dim, the speakers "
    "crackle at any volume, and the trackpad misses every second click."
)


@pytest.fixture(scope="module")
def tokenizer(default_model_dir: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(default_model_dir)


def pieces(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("aspect_first", [False, True])
def test_pairs_are_two_segments_windowed_over_the_longer_side_only(
    tokenizer: PreTrainedTokenizerBase, aspect_first: bool
) -> None:
    """Every window holds the whole aspect as its own segment (token_type_ids 1 on segment B), and the
    review's windows cover every one of its sub-tokens, whichever side of the pair the review is."""
    task = SentimentTask(text_pair_column="aspect")
    aspect = "screen brightness"
    text, pair = (aspect, REVIEW) if aspect_first else (REVIEW, aspect)
    raw = Dataset.from_dict({"text": [text, "Short one.", text], "text_pair": [pair, "price", pair]})
    encoded = task.encode(raw, tokenizer, None, max_length=16, stride=4)
    review, short = pieces(tokenizer, REVIEW), pieces(tokenizer, aspect)
    windows = [row for row in encoded if row["example_id"] == 0]
    assert len(windows) > 3 and [row["example_id"] for row in encoded] == sorted(encoded["example_id"])
    seen: list[int] = []
    for row in windows:
        ids, segments = row["input_ids"], row["token_type_ids"]
        assert len(ids) <= 16
        first_sep = ids.index(tokenizer.sep_token_id)
        a, b = ids[1:first_sep], ids[first_sep + 1 : -1]
        assert segments == [0] * (first_sep + 1) + [1] * (len(ids) - first_sep - 1)
        whole, windowed = (a, b) if aspect_first else (b, a)
        assert whole == short  # the short side, never cut
        seen.append(windowed)
    covered = [piece for window in seen for piece in window]
    assert seen[0] == review[: len(seen[0])] and seen[-1] == review[-len(seen[-1]) :]
    assert set(covered) == set(review) and len(covered) >= len(review)  # every piece, overlaps repeated
    assert [row["example_id"] for row in encoded].count(1) == 1


def test_a_pair_whose_short_side_leaves_no_room_is_one_line(tokenizer: PreTrainedTokenizerBase) -> None:
    task = SentimentTask(text_pair_column="aspect")
    raw = Dataset.from_dict(
        {
            "text": ["Fine.", REVIEW],
            "text_pair": ["price", "the very long and wordy aspect of screen brightness"],
        }
    )
    with pytest.raises(BertTasksError) as error:
        task.encode(raw, tokenizer, None, max_length=16, stride=4)
    assert str(error.value) == (
        "example 2 ('The battery lasts all day and the key...' / 'the very long and wordy aspect of "
        "scr...'): its aspect is 10 sub-tokens, which leaves 3 of max_length=16 (after 3 special tokens) "
        "for windows of its text, not more than stride=4; the aspect is never cut, so shorten it, raise "
        "max_length or lower stride"
    )
    assert len(task.encode(raw, tokenizer, None, max_length=16, stride=2)) > 2  # room for windows that move


def test_a_pair_model_refuses_lone_texts(tokenizer: PreTrainedTokenizerBase) -> None:
    task = SentimentTask(text_pair_column="aspect")
    with pytest.raises(BertTasksError, match="the model reads text pairs; give each text its aspect"):
        task.encode(Dataset.from_dict({"text": ["Fine."]}), tokenizer, None, 16, 4)


def batch_of(task: SentimentTask, raw: Dataset, tokenizer: PreTrainedTokenizerBase, labels: list[str]):  # type: ignore[no-untyped-def]
    encoded = task.encode(raw, tokenizer, {label: i for i, label in enumerate(labels)}, 32, 8)
    collate = RowCollator(task.collator(tokenizer))
    return collate(list(with_rows(encoded)))


def test_multi_label_loss_is_bce_with_logits_by_hand(
    tiny_model: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    """The head's own loss under problem_type multi_label_classification: mean binary cross-entropy."""
    labels = ["anger", "fear", "joy"]
    task = SentimentTask(multi_label=True)
    raw = Dataset.from_dict(
        {"text": ["I was furious and scared.", "What a lovely day."], "label": [["anger", "fear"], []]}
    )
    batch = batch_of(task, raw, tokenizer, labels)
    assert batch["labels"].tolist() == [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]
    model = load_model(tiny_model, "sentiment", labels).eval()
    model.config.problem_type = task.problem_type
    with torch.no_grad():
        out = model(**model_inputs(batch))
    p, y = torch.sigmoid(out.logits.double()), batch["labels"].double()
    by_hand = -(y * p.log() + (1 - y) * (1 - p).log()).mean()
    torch.testing.assert_close(out.loss.double(), by_hand, rtol=1e-5, atol=1e-6)


def test_regression_loss_is_mse_on_standardised_targets(
    tiny_model: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    task = SentimentTask(regression=True)
    assert isinstance(task.shape, Regression)
    task.shape.scale = (3.0, 2.0)
    raw = Dataset.from_dict({"text": ["Awful.", "Superb!", "Fine."], "label": [1.0, 5.0, 4.0]})
    batch = batch_of(task, raw, tokenizer, ["value"])
    assert batch["labels"].tolist() == [-1.0, 1.0, 0.5]
    model = load_model(tiny_model, "sentiment", ["value"]).eval()
    model.config.problem_type = task.problem_type
    with torch.no_grad():
        out = model(**model_inputs(batch))
    by_hand = ((out.logits[:, 0] - torch.tensor([-1.0, 1.0, 0.5])) ** 2).mean()
    torch.testing.assert_close(out.loss, by_hand)


def test_thresholds_take_each_labels_best_f1_and_ties_go_toward_one_half() -> None:
    probabilities = np.array(
        [[0.9, 0.2, 0.6], [0.8, 0.3, 0.7], [0.35, 0.1, 0.4], [0.3, 0.6, 0.45], [0.1, 0.05, 0.2]]
    )  # (N=5, C=3)
    gold = np.array([[1, 0, 0], [1, 0, 0], [1, 0, 0], [0, 0, 0], [0, 0, 0]])
    found = tune_thresholds(probabilities, gold)
    # label 0: all three positives above 0.3, the negatives at or below it: between 0.3 and 0.35
    assert found[0] == pytest.approx(0.325)
    # labels 1 and 2 have no positive: F1 is 0 at every threshold, so 0.5 stays
    assert found[1:] == [0.5, 0.5]
    # a tie: 0.5 and 0.45 give the same F1 (both keep [0.9, 0.8] above, 0.3 below)
    assert tune_thresholds(np.array([[0.9], [0.8], [0.4], [0.3]]), np.array([[1], [1], [0], [0]])) == [0.5]
    # the best threshold is the midpoint of the gap where F1 peaks, nearest 0.5 among equals
    best = tune_thresholds(np.array([[0.9], [0.2], [0.15], [0.1]]), np.array([[1], [1], [0], [0]]))
    assert best == [pytest.approx(0.175)]


def test_multi_label_metrics_match_scikit_learn() -> None:
    rng = np.random.default_rng(0)
    labels = ["anger", "fear", "joy", "sadness"]
    logits = rng.normal(size=(40, 4))
    gold_rows = rng.random((40, 4)) < 0.4
    gold_rows[:, 3] = False  # a label that never occurs...
    logits[:, 3] = -5.0  # ...and is never predicted: left out of macro-F1, as single-label does
    gold = [[label for label, on in zip(labels, row, strict=True) if on] for row in gold_rows]
    shape = MultiLabel([0.5, 0.4, 0.6, 0.5])
    scores = shape.metrics(logits, gold, labels)
    predicted = 1 / (1 + np.exp(-logits)) >= np.array([0.5, 0.4, 0.6, 0.5])
    assert scores["micro_f1"] == pytest.approx(f1_score(gold_rows, predicted, average="micro"))
    macro = f1_score(gold_rows, predicted, average="macro", labels=[0, 1, 2], zero_division=0)
    assert scores["macro_f1"] == pytest.approx(macro)
    assert scores["subset_accuracy"] == pytest.approx(accuracy_score(gold_rows, predicted))
    p, r, f, s = precision_recall_fscore_support(gold_rows, predicted, zero_division=0)
    for i, label in enumerate(labels):
        row = scores["per_label"][label]
        assert (row["precision"], row["recall"], row["f1"], row["support"]) == pytest.approx(
            (p[i], r[i], f[i], s[i])
        )
    assert scores["thresholds"] == {"anger": 0.5, "fear": 0.4, "joy": 0.6, "sadness": 0.5}


def test_regression_metrics_match_scipy_and_rounding_is_to_the_nearest_class() -> None:
    rng = np.random.default_rng(1)
    gold = rng.integers(1, 6, size=50).astype(float)
    values = gold + rng.normal(scale=0.8, size=50)
    shape = Regression(round_to=[1, 2, 3, 4, 5])
    shape.scale = (3.0, 1.5)
    scores = shape.metrics(((values - 3.0) / 1.5)[:, None], gold.tolist(), ["value"])
    assert scores["mae"] == pytest.approx(np.abs(values - gold).mean())
    assert scores["rmse"] == pytest.approx(np.sqrt(((values - gold) ** 2).mean()))
    assert scores["pearson"] == pytest.approx(pearsonr(values, gold)[0])
    assert scores["spearman"] == pytest.approx(spearmanr(values, gold)[0])
    rounded = np.clip(np.floor(values + 0.5 - 1e-12), 1, 5)  # nearest star, ties to the lower, within 1..5
    assert scores["rounded_accuracy"] == pytest.approx((rounded == gold).mean())
    assert shape.rounded(np.array([0.2, 1.5, 2.51, 9.0])).tolist() == [1.0, 1.0, 3.0, 5.0]
    flat = shape.metrics(np.zeros((3, 1)), [1.0, 2.0, 3.0], ["value"])
    assert (flat["pearson"], flat["spearman"]) == (0.0, 0.0)  # constant predictions: no correlation


def test_regression_decodes_values_and_their_rounding() -> None:
    shape = Regression(round_to=[1, 2, 3, 4, 5])
    assert shape.decode(np.array([[3.6], [0.4]]), ["value"]) == [
        {"value": pytest.approx(3.6), "rounded": 4},
        {"value": pytest.approx(0.4), "rounded": 1},
    ]


def test_multi_label_decodes_every_label_over_its_threshold_most_probable_first() -> None:
    shape = MultiLabel([0.5, 0.3, 0.9])
    logits = np.log(
        np.array([[0.6, 0.7, 0.8], [0.1, 0.2, 0.3]]) / (1 - np.array([[0.6, 0.7, 0.8], [0.1, 0.2, 0.3]]))
    )
    first, second = shape.decode(logits, ["anger", "fear", "joy"])
    assert [item["label"] for item in first["labels"]] == ["fear", "anger"]  # joy's 0.8 is under its 0.9
    assert first["labels"][0]["score"] == pytest.approx(0.7)
    assert second["labels"] == [] and second["scores"]["joy"] == pytest.approx(0.3)  # none passes: none
