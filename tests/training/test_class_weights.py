"""class_weights: counting what the loss sees, the auto weights, and what a weighted run records."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from bert_tasks.config import load_recipe
from bert_tasks.errors import BertTasksError
from bert_tasks.training import train
from bert_tasks.training.class_weights import (
    ClassWeights,
    inverse_sqrt_weights,
    label_counts,
    resolve_class_weights,
)
from tests.helpers import DATA, LABELS, read_conll, read_log, tiny_config, write_jsonl

pytestmark = pytest.mark.usefixtures("single_thread")


def test_counts_are_over_trained_positions_only() -> None:
    assert label_counts([0, 1, 1, 1], 2) == [1, 3]  # one label per window (sentiment)
    tags = [[-100, 0, 0, 3, -100], [-100, 1, 0, -100]]  # one per sub-token, -100 not trained (NER)
    assert label_counts(tags, 5) == [3, 1, 0, 1, 0]


def test_auto_weights_by_hand() -> None:
    """1:9 -> weights 3:1 (inverse square root), scaled so the count-weighted mean weight is 1."""
    assert inverse_sqrt_weights([100, 900]) == pytest.approx([2.5, 5 / 6])
    assert inverse_sqrt_weights([7, 7, 7]) == pytest.approx([1.0, 1.0, 1.0])
    # A label never trained on is counted once: finite, and the rarest weight.
    assert inverse_sqrt_weights([0, 4]) == pytest.approx([5 / 3, 5 / 6])


@pytest.mark.parametrize("counts", [[3, 1_000_000], [90_000, 2_000, 1_500, 900, 40], [1, 2, 3]])
def test_auto_weights_keep_the_loss_scale(counts: list[int]) -> None:
    weights = inverse_sqrt_weights(counts)
    assert sum(n * w for n, w in zip(counts, weights, strict=True)) / sum(counts) == pytest.approx(1.0)
    for rare, weight in zip(counts, weights, strict=True):  # the rarer label, the larger weight
        assert all(weight > other for n, other in zip(counts, weights, strict=True) if n > rare)


def test_given_weights_are_kept_and_described_with_the_counts() -> None:
    weights = resolve_class_weights([1, 3], ["negative", "positive"], [0, 1, 1])
    assert weights == ClassWeights(["negative", "positive"], [1.0, 3.0], [1, 2], "given")
    assert weights.describe() == (
        "class weights (as given; label weight (trained positions)): negative 1 (1), positive 3 (2)"
    )
    assert resolve_class_weights(None, ["negative", "positive"], [0, 1]) is None


def imbalanced_sentiment(tmp_path: Path) -> Path:
    """The sentiment fixture with 5 of its 20 negatives: 1:4, so auto gives 2:1 (5/3 and 5/6)."""
    rows = [json.loads(line) for line in DATA["sentiment"][0].read_text().splitlines()]
    negatives = [row for row in rows if row["label"] == "negative"][:5]
    return write_jsonl(
        tmp_path / "imbalanced.jsonl", negatives + [r for r in rows if r["label"] == "positive"]
    )


def losses(run_dir: Path) -> list[float]:
    return [record["loss"] for record in read_log(run_dir) if "loss" in record]


@pytest.mark.slow
def test_auto_is_logged_noted_in_the_recipe_and_changes_only_the_loss(
    tiny_model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    train_file = imbalanced_sentiment(tmp_path)
    runs = {}
    for name, weights in [("plain", "none"), ("equal", "[1,1]"), ("auto", "auto")]:
        with caplog.at_level(logging.INFO, logger="bert_tasks"):
            cfg = tiny_config(
                "sentiment", tiny_model, tmp_path / name, train_file=train_file, class_weights=weights
            )
            runs[name] = train(cfg)
    described = "class weights (inverse square root of the counts; label weight (trained positions)): "
    described += "negative 1.667 (5), positive 0.8333 (20)"
    assert described in caplog.messages
    recipe = (runs["auto"] / "recipe.yaml").read_text()
    assert f"\n# {described}\n" in recipe and "\nclass_weights: auto\n" in recipe
    assert load_recipe(runs["auto"] / "recipe.yaml").class_weights == "auto"
    assert "class weights" not in (runs["plain"] / "recipe.yaml").read_text()
    # Equal weights are the head's own loss; others change the loss from the first step.
    assert losses(runs["equal"]) == pytest.approx(losses(runs["plain"]), rel=1e-5)
    assert losses(runs["auto"])[0] != pytest.approx(losses(runs["plain"])[0], rel=1e-3)


@pytest.mark.slow
def test_ner_weights_count_every_trained_tag_o_included(tiny_model: Path, tmp_path: Path) -> None:
    """With windows longer than every sentence and the first sub-token of each word trained, the counts
    are the file's tag counts."""
    tags = [tag for sentence in read_conll(DATA["ner"][0]) for _, tag in sentence]
    cfg = tiny_config("ner", tiny_model, tmp_path / "ner", class_weights="auto", max_length=128, stride=32)
    recipe = (train(cfg) / "recipe.yaml").read_text()
    note = next(line for line in recipe.splitlines() if line.startswith("# class weights"))
    weights = inverse_sqrt_weights([tags.count(label) for label in LABELS["ner"]])
    for label, weight in zip(LABELS["ner"], weights, strict=True):
        assert f" {label} {weight:.4g} ({tags.count(label):,})" in note


def test_a_list_of_the_wrong_length_is_one_line_before_the_model_loads(
    tiny_model: Path, tmp_path: Path
) -> None:
    cfg = tiny_config("ner", tiny_model, tmp_path / "out", class_weights="[1,2]")
    with pytest.raises(BertTasksError) as error:
        train(cfg)
    assert str(error.value) == (
        "class_weights has 2 weight(s) but the training data has 5 labels (O, B-Chemical, I-Chemical, "
        "B-Disease, I-Disease); give one weight per label in this order, or class_weights=auto"
    )
    assert not (tmp_path / "out").exists()
