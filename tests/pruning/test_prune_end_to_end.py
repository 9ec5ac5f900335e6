"""End to end on the real default model (slow): an SST-2 slice model loses a quarter of its heads through
`bert-tasks prune` with a short recovery, and the dir still classifies dev (held out) well above chance."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bert_tasks import SentimentClassifier, load_recipe, train
from bert_tasks.cli import main

pytestmark = pytest.mark.slow


def test_a_quarter_of_minilms_heads_go_and_it_still_classifies(shared_data: Path, tmp_path: Path) -> None:
    """1,000 SST-2 train rows (5% of them select the checkpoint), 60 updates; the first 300 dev sentences
    held out. Pruning scores the 72 heads on the 50 selection rows, removes 18 in 3 steps, recovers for
    20 updates."""
    sst2 = shared_data / "sst2"
    cfg = load_recipe(
        "recipes/sentiment_sst2.yaml",
        [
            f"train_file={sst2 / 'train.tsv'}",
            f"test_file={sst2 / 'dev.tsv'}",
            "max_train_samples=1000",
            "max_eval_samples=300",
            "max_steps=60",
            "batch_size=16",
            "lr=1e-4",
            "eval_every=0",
            f"output_dir={tmp_path / 'sst2'}",
        ],
        task="sentiment",
    )
    model_dir = train(cfg)
    out = tmp_path / "pruned"
    argv = ["prune", "sentiment", "--model", str(model_dir), "--heads", "0.25", "--out", str(out)]
    assert main([*argv, "recover_steps=20"]) == 0
    record = json.loads((out / "pruning.json").read_text())
    assert record["heads"] == {"before": 72, "removed": 18}
    assert [step["heads_kept"] for step in record["steps"]] == [72, 66, 60, 54]
    assert sum(map(len, json.loads((out / "config.json").read_text())["pruned_heads"].values())) == 18
    assert record["recovery"]["test"]["accuracy"] >= 0.7, record["recovery"]
    predictions = SentimentClassifier.from_pretrained(out)(
        ["A wonderful, moving film.", "Dull and far too long."]
    )
    assert [p["label"] for p in predictions] == ["positive", "negative"]
