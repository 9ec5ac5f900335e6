"""Every recipe in recipes/ loads through load_recipe (typed, validated) without training anything."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bert_tasks.config import load_recipe

RECIPES = sorted((Path(__file__).resolve().parents[1] / "recipes").glob("*.yaml"))


def test_recipes_exist() -> None:
    assert RECIPES, "recipes/ holds no *.yaml"


@pytest.mark.parametrize("path", RECIPES, ids=[p.name for p in RECIPES])
def test_recipe_loads(path: Path) -> None:
    task = yaml.safe_load(path.read_text(encoding="utf-8"))["task"]
    cfg = load_recipe(path, task=task)
    assert cfg.task == task


@pytest.mark.parametrize("path", RECIPES, ids=[p.name for p in RECIPES])
def test_recipe_opens_with_the_command_that_runs_it(path: Path) -> None:
    header = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        header.append(line)
    assert header, f"{path.name} must open with a comment"
    assert any("bert-tasks " in line for line in header), f"{path.name}'s opening comment lacks its command"


def test_the_sst2_recipe_selects_on_a_carved_split_and_holds_dev_out() -> None:
    """SST-2's only labelled evaluation set is dev: selecting on it and reporting it would flatter it."""
    cfg = load_recipe(
        Path(__file__).resolve().parents[1] / "recipes" / "sentiment_sst2.yaml", task="sentiment"
    )
    assert cfg.validation_split == 0.05 and cfg.validation_file is None
    assert cfg.test_file is not None and Path(cfg.test_file).name == "dev.tsv"
