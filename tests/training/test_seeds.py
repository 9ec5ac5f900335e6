"""seeds=[...]: one whole run per seed under output_dir, and each score's mean +- std over them."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import pytest

from bert_tasks.cli import main
from bert_tasks.training import train
from bert_tasks.training.output_dir import MANIFEST
from bert_tasks.training.seeds import summarise
from tests.helpers import fast_overrides, tiny_config

pytestmark = pytest.mark.usefixtures("single_thread")


def test_the_summary_is_the_mean_and_sample_std_of_each_scalar_score() -> None:
    per_seed = {
        1: {"validation": {"accuracy": 0.5, "f1": 0.25, "per_class": {}}, "test": {"accuracy": 0.75}},
        2: {"validation": {"accuracy": 0.7, "f1": 0.45, "per_class": {}}, "test": {"accuracy": 0.25}},
        3: {"validation": {"accuracy": 0.9, "f1": 0.65, "per_class": {}}},  # no test split in this seed
    }
    summary = summarise(per_seed)
    assert summary["seeds"] == [1, 2, 3]
    assert summary["validation"]["accuracy"]["mean"] == pytest.approx(0.7)
    assert summary["validation"]["accuracy"]["std"] == pytest.approx(0.2)  # sqrt((0.04 + 0 + 0.04) / 2)
    assert summary["validation"]["f1"]["values"] == [0.25, 0.45, 0.65]
    assert "per_class" not in summary["validation"]  # not a scalar
    assert "test" not in summary  # not every seed has one


@pytest.fixture(scope="module")
def seeds_run(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("seeds") / "run"
    return train(tiny_config("sentiment", tiny_model, out, seeds="[7,8]", max_steps=2))


@pytest.mark.slow
def test_each_seed_is_a_whole_run_and_the_summary_holds_their_scores(seeds_run: Path) -> None:
    summary = json.loads((seeds_run / "seeds.json").read_text())
    accuracies = []
    for seed in (7, 8):
        run = seeds_run / f"seed-{seed}"
        assert (run / "model.safetensors").is_file() and (run / "README.md").is_file()
        assert f"seed: {seed}\n" in (run / "recipe.yaml").read_text()
        accuracies.append(json.loads((run / "metrics.json").read_text())["validation"]["accuracy"])
    assert summary["validation"]["accuracy"]["values"] == accuracies
    assert summary["validation"]["accuracy"]["mean"] == pytest.approx(statistics.fmean(accuracies))
    manifest = json.loads((seeds_run / MANIFEST).read_text())
    assert {"recipe.yaml", "seed-7", "seed-8", "seeds.json"} <= set(manifest["entries"])


@pytest.mark.slow
def test_resume_keeps_finished_seeds_and_trains_the_missing_one(
    seeds_run: Path, tiny_model: Path, tmp_path: Path
) -> None:
    run = shutil.copytree(seeds_run, tmp_path / "run")
    kept = (run / "seed-7" / "model.safetensors").stat().st_mtime_ns
    shutil.rmtree(run / "seed-8")
    train(tiny_config("sentiment", tiny_model, run, seeds="[7,8]", max_steps=2, resume=True))
    assert (run / "seed-7" / "model.safetensors").stat().st_mtime_ns == kept
    assert (run / "seed-8" / "metrics.json").is_file()


@pytest.mark.slow
def test_overwrite_replaces_the_seeds_run_and_keeps_a_users_file(
    seeds_run: Path, tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = shutil.copytree(seeds_run, tmp_path / "run")
    (run / "notes.txt").write_text("mine")
    argv = ["finetune", "sentiment", *fast_overrides("sentiment", tiny_model, run, seeds="[9]", max_steps=2)]
    assert main([*argv, "--overwrite"]) == 1  # a foreign file: nothing deleted
    assert "notes.txt, which no bert-tasks run wrote" in capsys.readouterr().err
    (run / "notes.txt").unlink()
    assert main([*argv, "--overwrite"]) == 0
    assert sorted(p.name for p in run.iterdir() if not p.name.startswith(".")) == [
        "recipe.yaml",
        "seed-9",
        "seeds.json",
    ]
    assert "over 1 seeds: accuracy" in capsys.readouterr().err
