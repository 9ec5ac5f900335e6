"""`bert-tasks compress`: distil -> prune -> ONNX int8, each step scored on the validation split."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bert_tasks.cli import main
from bert_tasks.compress import CompressPlan, _report, compress, plan_compress, render_report
from bert_tasks.config import load_recipe
from bert_tasks.errors import BertTasksError
from bert_tasks.inference.predictor import Predictor
from tests.test_cli_startup import probe

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.mark.slow  # a distill run, a pruning and an ONNX export of tiny models
def test_compress_runs_each_step_and_scores_every_model_on_validation(
    sentiment_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "small"
    argv = ["compress", "sentiment", "--model", str(sentiment_run), "--out", str(out), "--heads", "0.25"]
    assert main([*argv, "--max-loss", "100", "max_steps=2"]) == 0
    report = json.loads((out / "compress.json").read_text())
    steps = [row["step"] for row in report["steps"]]
    assert steps == ["teacher", "distilled", "pruned", "onnx-int8"]
    assert report["deploy"] == str(out / "onnx-int8")  # every step is within 100 points
    distilled = json.loads((out / "distilled" / "config.json").read_text())
    assert distilled["num_hidden_layers"] == 1  # half of the teacher's 2
    pruned = json.loads((out / "pruned" / "config.json").read_text())
    assert sum(len(heads) for heads in pruned["pruned_heads"].values()) == 1  # a quarter of its 4 heads
    assert (out / "onnx-int8" / "model.onnx").is_file()
    sizes = [row["weights_bytes"] for row in report["steps"]]
    assert sizes[1] < sizes[0]
    # The teacher's score is the one evaluate gives on the recipe's validation file.
    cfg = load_recipe(sentiment_run / "recipe.yaml", [], task="sentiment")
    predictor = Predictor(sentiment_run, progress=False)
    validation = predictor.task.read_file(str(cfg.validation_file), cfg)
    assert report["steps"][0]["validation"] == pytest.approx(predictor.evaluate(validation)["accuracy"])
    printed = capsys.readouterr().out
    assert "| distilled |" in printed and f"deploy: {out / 'onnx-int8'}" in printed


def _plan(max_loss: float | None) -> CompressPlan:
    cfg = load_recipe(None, [], task="sentiment")
    return CompressPlan("sentiment", Path("t"), Path("o"), 3, "0.25", 0, True, max_loss, cfg)


@pytest.mark.parametrize(
    ("max_loss", "deploy"), [(None, "int8"), (1.0, "int8"), (0.6, "distilled"), (0.1, "t")]
)
def test_max_loss_deploys_the_last_step_within_it(max_loss: float | None, deploy: str) -> None:
    rows = [
        {"step": "teacher", "dir": "t", "validation": 0.900},
        {"step": "distilled", "dir": "distilled", "validation": 0.895},
        {"step": "pruned", "dir": "pruned", "validation": 0.870},
        {"step": "onnx-int8", "dir": "int8", "validation": 0.892},
    ]
    report = _report(_plan(max_loss), rows)
    assert report["deploy"] == deploy
    assert [row["points_lost"] for row in report["steps"]] == [0.0, 0.5, 3.0, 0.8]


def test_an_int8_export_its_parity_check_refused_is_listed_and_never_deployed() -> None:
    rows = [
        {
            "step": "teacher",
            "dir": "t",
            "metric": "accuracy",
            "validation": 0.9,
            "weights_bytes": 9,
            "seconds": 0,
        },
        {"step": "distilled", "dir": "d", "validation": 0.895, "weights_bytes": 5, "seconds": 1},
        {"step": "onnx-int8", "dir": None, "refused": "o/model.onnx: 98.00% keep their label"},
    ]
    report = _report(_plan(None), rows)
    assert report["deploy"] == "d"
    assert "| onnx-int8 | refused: o/model.onnx: 98.00% keep their label |" in render_report(report)


def with_policy(run: Path, copy: Path, **config: object) -> Path:
    """A copy of `run` whose config.json holds `config` (`bert_tasks` keys merged into its policy)."""
    shutil.copytree(run, copy)
    data = json.loads((copy / "config.json").read_text(encoding="utf-8"))
    data["bert_tasks"] |= config.pop("bert_tasks", {})
    (copy / "config.json").write_text(json.dumps(data | config), encoding="utf-8")
    return copy


def test_layers_none_runs_no_distill_checks(sentiment_run: Path, tmp_path: Path) -> None:
    """A multi-label or regression model cannot be distilled, but pruned and exported it can."""
    multi = with_policy(sentiment_run, tmp_path / "multi", bert_tasks={"multi_label": True})
    plan = plan_compress("sentiment", multi, tmp_path / "out", layers="none", heads="1", int8=False)
    assert (plan.steps, plan.distill_cfg.teacher) == (["pruned"], None)
    with pytest.raises(BertTasksError, match="is a multi-label model; distill teaches"):
        plan_compress("sentiment", multi, tmp_path / "out", layers="1", int8=False)
    assert not (tmp_path / "out").exists()


def test_a_teacher_that_does_not_load_leaves_no_out(sentiment_run: Path, tmp_path: Path) -> None:
    damaged = shutil.copytree(sentiment_run, tmp_path / "damaged")
    weights = damaged / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    plan = plan_compress("sentiment", damaged, tmp_path / "out", layers="none", heads="1", int8=False)
    with pytest.raises(BertTasksError, match=r"model\.safetensors is damaged"):
        compress(plan)
    assert not (tmp_path / "out").exists()


def test_every_mistake_is_one_line_before_torch(sentiment_run: Path, tmp_path: Path) -> None:
    no_recipe = shutil.copytree(sentiment_run, tmp_path / "no-recipe")
    (no_recipe / "recipe.yaml").unlink()
    used = tmp_path / "used"
    used.mkdir()
    (used / "notes.txt").write_text("mine")
    pruned = with_policy(sentiment_run, tmp_path / "pruned", pruned_heads={"0": [0, 1, 2], "1": [0, 1, 2]})
    model = ["compress", "sentiment", "--model", str(sentiment_run)]
    cases = [
        (  # the student keeps teacher layer 0 and its one head: none can go, said before distilling
            ["compress", "sentiment", "--model", str(pruned), "--out", "o", "--layers", "1", "--heads", "1"],
            "the model has 1 heads in 1 layers and each layer keeps one, so at most 0 can go",
        ),
        ([*model, "--out", str(used)], "exists and is not an empty dir"),
        ([*model, "--out", "o", "--layers", "9"], "student_layers=9: the teacher has 2 layers"),
        ([*model, "--out", "o", "--layers", "some"], "--layers some: give how many of the teacher's 2"),
        ([*model, "--out", "o", "--heads", "2.5"], "--heads 2.5: give the share of heads to remove"),
        ([*model, "--out", "o", "--recover-steps", "5"], "recovery fine-tunes a pruned model; give --heads"),
        ([*model, "--out", "o", "--layers", "none", "--no-int8"], "every step is off"),
        ([*model, "--out", "o", "--layers", "none", "epochs=2"], "--layers none runs none"),
        ([*model, "--out", "o", "--max-loss", "-1"], "--max-loss -1.0: give the points"),
        ([*model, "--out", "o", "alpha=2"], "alpha=2.0, must be in [0, 1]"),
        (["compress", "ner", "--model", str(sentiment_run), "--out", "o"], "not a ner model"),
        (
            ["compress", "sentiment", "--model", str(no_recipe), "--out", "o"],
            "has no recipe.yaml naming the data",
        ),
    ]
    for argv, message in cases:
        answer = probe(argv, tmp_path)
        lines = str(answer["stderr"]).strip().splitlines()
        assert answer["status"] == 1 and len(lines) == 1 and message in lines[0], (argv, answer)
        assert {"torch", "transformers"}.isdisjoint(answer["loaded"]), (argv, answer["loaded"])
        assert not (tmp_path / "o").exists(), argv
    assert [p.name for p in used.iterdir()] == ["notes.txt"]
