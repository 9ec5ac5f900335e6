"""The shape demo recipes on the real default model (slow: about 5 minutes on 2 busy cores): each trains and
scores above a floor set from its first run, and a pair model's label follows the aspect.

The floors sit below the first run's validation scores (README, "Text pairs, label sets and ratings")
by a margin for another machine's arithmetic, thread count and bf16 support: pairs accuracy 1.000 (floor
0.95), multi-label macro-F1 0.936 at the tuned thresholds (floor 0.85), regression Spearman 0.978 (floor
0.95), MAE 0.265 (ceiling 0.45), rounded accuracy 0.81 (floor 0.7).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bert_tasks import SentimentClassifier, load_recipe, train

pytestmark = pytest.mark.slow

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
#: Hand-written reviews, none of them in the demo: (text, an aspect it praises, one it pans).
CONTRASTS = [
    ("The camera is superb, but sadly the battery barely lasts a day.", "camera", "battery"),
    ("We loved the food; the service, on the other hand, was rude.", "food", "service"),
    ("The room was tiny, though the staff were really kind.", "staff", "room"),
    ("Great keyboard, shame about the dim screen.", "keyboard", "screen"),
    ("The price is a bargain even if the speakers sound tinny.", "price", "speakers"),
    ("Breakfast was awful but the location was perfect.", "location", "breakfast"),
]


def run(recipe: str, tmp_path: Path) -> tuple[Path, dict[str, float]]:
    cfg = load_recipe(RECIPES / recipe, [f"output_dir={tmp_path / 'run'}"], task="sentiment")
    model_dir = train(cfg)
    return model_dir, json.loads((model_dir / "metrics.json").read_text())["validation"]


def test_the_pairs_demo_reads_the_aspect(tmp_path: Path) -> None:
    model_dir, scores = run("pairs_demo.yaml", tmp_path)
    assert scores["accuracy"] >= 0.95
    classify = SentimentClassifier(model_dir)
    right = 0
    for text, praised, panned in CONTRASTS:
        good, bad = classify([(text, praised), (text, panned)])
        assert good["scores"]["positive"] - bad["scores"]["positive"] > 0.4, text  # the aspect moves it
        right += (good["label"], bad["label"]) == ("positive", "negative")
    assert right >= 5  # the first run: 5 of 6 (the service of the second came out positive, at 0.52)


def test_the_multi_label_demo_tunes_its_thresholds(tmp_path: Path) -> None:
    model_dir, scores = run("multilabel_demo.yaml", tmp_path)
    assert scores["macro_f1"] >= 0.85
    policy = json.loads((model_dir / "config.json").read_text())["bert_tasks"]
    assert policy["multi_label"] is True and len(policy["thresholds"]) == 5


def test_the_regression_demo_ranks_ratings(tmp_path: Path) -> None:
    _, scores = run("regression_demo.yaml", tmp_path)
    assert scores["spearman"] >= 0.95 and scores["mae"] <= 0.45 and scores["rounded_accuracy"] >= 0.7
