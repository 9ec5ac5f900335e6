"""End to end on the real default model and slices of ../shared/data (slow: about 3 minutes on 2 cores).

These pin the quality a user gets from the shipped recipes; they fail (never skip) when ../shared/data
is missing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bert_tasks import EntityTagger, load_recipe, train

pytestmark = pytest.mark.slow

SENTENCE = "The patient suffers from severe headaches and occasional nausea."


def test_sst2_slice_reaches_078(shared_data: Path, tmp_path: Path):
    """First 2,000 SST-2 train rows, 1 epoch, full dev set held out (a tuned Trainer reaches 0.786 on such a
    slice); the recipe's stratified 5% of the slice picks the checkpoint.

    batch_size 16 instead of the recipe's 32: on 2,000 rows that is 119 updates instead of 60, which a
    small model needs; the full-data recipe keeps 32 for speed. lr 1e-4 instead of the recipe's 3e-5: the
    recipe's rate is the best for its 6,000 updates (BENCHMARKS.md); 119 updates need a higher one.
    """
    cfg = load_recipe(
        "recipes/sentiment_sst2.yaml",
        [
            f"train_file={shared_data / 'sst2' / 'train.tsv'}",
            f"test_file={shared_data / 'sst2' / 'dev.tsv'}",
            "max_train_samples=2000",
            "epochs=1",
            "batch_size=16",
            "lr=1e-4",
            "warmup_ratio=0.1",
            "eval_every=0",
            f"output_dir={tmp_path / 'sst2'}",
        ],
        task="sentiment",
    )
    metrics = json.loads((train(cfg) / "metrics.json").read_text())
    assert metrics["test"]["accuracy"] >= 0.78
    assert sum(map(sum, metrics["test"]["confusion_matrix"])) == 872  # every dev sentence, once
    assert sum(map(sum, metrics["validation"]["confusion_matrix"])) == 100  # 5% of the slice


def test_bc5cdr_slice_reaches_062_and_predicts_spans(shared_data: Path, tmp_path: Path):
    """First 2,000 BC5CDR train sentences, 2 epochs; entity F1 on the first 500 dev sentences."""
    cfg = load_recipe(
        "recipes/ner_bc5cdr.yaml",
        [
            f"train_file={shared_data / 'bc5cdr' / 'train.tsv'}",
            f"validation_file={shared_data / 'bc5cdr' / 'dev.tsv'}",
            "test_file=none",
            "max_train_samples=2000",
            "max_eval_samples=500",
            "epochs=2",
            f"output_dir={tmp_path / 'bc5cdr'}",
        ],
        task="ner",
    )
    model_dir = train(cfg)
    metrics = json.loads((model_dir / "metrics.json").read_text())
    assert metrics["validation"]["f1"] >= 0.62
    assert set(metrics["validation"]["per_type"]) == {"Chemical", "Disease"}

    entities = EntityTagger.from_pretrained(model_dir)(SENTENCE)
    assert entities, "no entity found in a sentence with two symptoms"
    for entity in entities:
        assert SENTENCE[entity["start"] : entity["end"]] == entity["text"]
        assert entity["label"] in {"Chemical", "Disease"}
        assert 0.0 < entity["score"] <= 1.0
    assert any("headache" in e["text"] for e in entities)
