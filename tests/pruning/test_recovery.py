"""`prune ... recover_steps=S`: the pruned model is step 0 of the recovery run, so a recovery that only
spoils it leaves its weights bit for bit; the recovered dir's recipe.yaml reruns the recovery from the
source dir (`prune_heads`); every file prune writes is in the dir's manifest, so `--overwrite` replaces
them."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from bert_tasks.cli import main
from bert_tasks.config import load_recipe
from bert_tasks.pruning import prune
from bert_tasks.pruning.heads import head_items
from bert_tasks.training import train
from bert_tasks.training.output_dir import MANIFEST
from tests.helpers import build_tiny_model, distill_config, read_log, tiny_config

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def plain(fitted_sentiment_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 of the fitted model's 8 heads removed in 2 steps, no recovery."""
    return prune(
        "sentiment", fitted_sentiment_run, "3", tmp_path_factory.mktemp("plain") / "out", ["steps=2"]
    )


def record_of(out: Path) -> dict:
    return json.loads((out / "pruning.json").read_text())


def manifest(out: Path) -> set[str]:
    return set(json.loads((out / MANIFEST).read_text())["entries"])


def test_a_recovery_that_only_spoils_leaves_the_pruned_weights_bit_for_bit(
    fitted_sentiment_run: Path, plain: Path, tmp_path: Path, capsys
) -> None:
    """lr=1 wrecks the model at its first update (accuracy 1.0 -> 0.5): no step beats step 0."""
    out = tmp_path / "spoiled"
    argv = ["prune", "sentiment", "--model", str(fitted_sentiment_run), "--heads", "3", "--out", str(out)]
    assert main([*argv, "steps=2", "recover_steps=4", "lr=1"]) == 0
    recovery = record_of(out)["recovery"]
    assert (recovery["evaluations"][0]["step"], recovery["evaluations"][0]["accuracy"]) == (0, 1.0)
    assert [e["step"] for e in recovery["evaluations"]] == [0, 1, 2, 3, 4]
    assert all(e["accuracy"] < 1.0 for e in recovery["evaluations"][1:]), "the updates did spoil it"
    assert (recovery["best_step"], recovery["gain"], recovery["validation"]["accuracy"]) == (0, 0.0, 1.0)
    assert [row["step"] for row in read_log(out) if "loss" in row] == [1, 2, 3, 4]
    want, found = load_file(plain / "model.safetensors"), load_file(out / "model.safetensors")
    assert found.keys() == want.keys()
    assert all(torch.equal(found[key], want[key]) for key in want)
    assert json.loads((out / "config.json").read_text())["pruned_heads"] == record_of(plain)["pruned_heads"]
    err = capsys.readouterr().err
    assert "recovery did not help: no evaluation of its 4 updates beat the pruned model on validation" in err
    assert "none beat the pruned model, so these are its weights" in (out / "README.md").read_text()


def test_the_recovered_recipe_reruns_the_recovery_and_overwrite_replaces_the_prune_files(
    sentiment_run: Path, tmp_path: Path
) -> None:
    out = prune("sentiment", sentiment_run, "3", tmp_path / "recovered", ["steps=2", "recover_steps=2"])
    record = record_of(out)
    recipe = load_recipe(out / "recipe.yaml")
    assert recipe.model == os.path.abspath(sentiment_run), "the source dir, which stays"
    assert recipe.prune_heads == head_items(record["pruned_heads"])
    assert (recipe.eval_at_start, recipe.max_steps) == (True, 2)
    assert {"pruning.json", "pruning.png", "README.md"} <= manifest(out)
    assert set(os.listdir(out)) - {MANIFEST} <= manifest(out), "every file is the run's or prune's"
    weights, losses = load_file(out / "model.safetensors"), [r for r in read_log(out) if "loss" in r]
    assert main(["finetune", "sentiment", "--recipe", str(out / "recipe.yaml"), "--overwrite"]) == 0
    assert not (out / "pruning.json").exists() and not (out / "pruning.png").exists(), "replaced"
    again = load_file(out / "model.safetensors")
    assert again.keys() == weights.keys() and all(torch.equal(again[k], weights[k]) for k in weights)
    assert [r for r in read_log(out) if "loss" in r] == [
        {**row, "examples_per_s": new["examples_per_s"]}
        for row, new in zip(losses, [r for r in read_log(out) if "loss" in r], strict=True)
    ], "the same updates, to the last digit"
    assert json.loads((out / "config.json").read_text())["pruned_heads"] == record["pruned_heads"]


def test_a_dir_pruned_without_recovery_lists_every_file_it_holds(
    plain: Path, tiny_model: Path, tmp_path: Path
) -> None:
    assert manifest(plain) == set(os.listdir(plain)) - {MANIFEST}
    copy = tmp_path / "copy"
    shutil.copytree(plain, copy)
    argv = [
        "finetune",
        "sentiment",
        f"model={tiny_model}",
        f"output_dir={copy}",
        "max_steps=1",
        "--overwrite",
    ]
    assert main([*argv, "report_to=none", "mixed_precision=no"]) == 0
    assert not (copy / "pruning.json").exists()
    assert "pruned_heads" not in json.loads((copy / "config.json").read_text())


def test_a_distilled_student_recovers_from_its_own_weights(tmp_path: Path) -> None:
    """A student distilled at a high lr (its weights far from the teacher's layers), then recovering at a
    tiny one: the recovered weights are the pruned student's, not the teacher cut again and pruned."""
    base = build_tiny_model(tmp_path / "base", num_hidden_layers=4)
    teacher = train(tiny_config("sentiment", base, tmp_path / "teacher"))
    student = train(distill_config("sentiment", teacher, tmp_path / "student", student_layers=2, lr=0.01))
    plain = prune("sentiment", student, "2", tmp_path / "plain")
    out = prune("sentiment", student, "2", tmp_path / "recovered", ["recover_steps=2", "lr=1e-9"])
    assert record_of(out)["pruned_heads"] == record_of(plain)["pruned_heads"]
    want, found = load_file(plain / "model.safetensors"), load_file(out / "model.safetensors")
    assert found.keys() == want.keys()
    for key in want:
        torch.testing.assert_close(found[key], want[key], atol=1e-6, rtol=0, msg=key)
    cut = load_file(teacher / "model.safetensors")["bert.encoder.layer.2.output.dense.weight"]
    moved = (want["bert.encoder.layer.1.output.dense.weight"] - cut).abs().max()
    assert moved > 1e-3, "the student is far from its teacher's layer, so the check above can fail"
    recipe = load_recipe(out / "recipe.yaml")
    assert (recipe.teacher, recipe.student) == (str(teacher), os.path.abspath(student)), "on its teacher"
