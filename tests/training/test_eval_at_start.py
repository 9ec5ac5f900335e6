"""`eval_at_start=true` on ordinary runs: the model a run starts from is scored on validation before the
first update (step 0) and is a candidate of the best-checkpoint rule like every later evaluation, so a run
whose updates only spoil the model ends with the weights it started from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from bert_tasks.training import train
from tests.helpers import DATA, read_log, tiny_config
from tests.test_cli_startup import probe

pytestmark = pytest.mark.usefixtures("single_thread")


def scores(run_dir: Path) -> list[tuple[int, float]]:
    return [(row["step"], row["eval_accuracy"]) for row in read_log(run_dir) if "eval_accuracy" in row]


def test_step_0_is_scored_and_a_run_that_improves_keeps_its_later_best(
    tiny_model: Path, tmp_path: Path
) -> None:
    """From the random tiny BERT (a fresh head: chance) to fitting its 40 training rows, validated on them."""
    cfg = tiny_config(
        "sentiment",
        tiny_model,
        tmp_path / "run",
        epochs=20,
        lr=1e-3,
        validation_file=DATA["sentiment"][0],
        eval_at_start=True,
        early_stopping_patience=0,  # it sits at chance for epochs before it fits
    )
    out = train(cfg)
    found = scores(out)
    assert [step for step, _ in found] == list(range(0, 101, 5)), "step 0, then each epoch's end"
    assert found[0][1] == 0.5
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["best_step"] > 0 and metrics["validation"]["accuracy"] == 1.0
    assert (out / "training_curves.png").is_file()


@pytest.mark.parametrize("at_start", [True, False])
def test_a_run_that_only_spoils_the_model_ends_with_the_weights_it_started_from(
    fitted_sentiment_run: Path, tmp_path: Path, at_start: bool
) -> None:
    """lr=1 wrecks the fitted model within an update; with eval_at_start its start is kept, bit for bit,
    and without it the best of the spoiled steps is what the run saves."""
    cfg = tiny_config(
        "sentiment",
        fitted_sentiment_run,
        tmp_path / "run",
        max_steps=4,
        eval_every=1,
        lr=1.0,
        validation_file=DATA["sentiment"][0],
        eval_at_start=at_start,
        early_stopping_patience=0,  # every spoiled step is scored
    )
    out = train(cfg)
    found = scores(out)
    metrics = json.loads((out / "metrics.json").read_text())
    start, saved = load_file(fitted_sentiment_run / "model.safetensors"), load_file(out / "model.safetensors")
    assert saved.keys() == start.keys()
    if at_start:
        assert found[0] == (0, 1.0) and all(score < 1.0 for _, score in found[1:]), found
        assert metrics["best_step"] == 0 and metrics["validation"]["accuracy"] == 1.0
        assert all(torch.equal(saved[key], start[key]) for key in start)
    else:
        assert [step for step, _ in found] == [1, 2, 3, 4]
        assert metrics["best_step"] > 0 and metrics["validation"]["accuracy"] < 1.0
        assert not all(torch.equal(saved[key], start[key]) for key in start)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (
            "eval_at_start=true",
            "eval_at_start=true: no validation split to score the model on before training",
        ),
        # was accepted, and the run trained every epoch without a word
        ("early_stopping_patience=3", "early_stopping_patience=3: no validation split to stop on; give "),
    ],
)
def test_validation_settings_without_validation_data_are_one_line_before_torch(
    tmp_path: Path, setting: str, message: str
) -> None:
    argv = [
        "finetune",
        "sentiment",
        f"train_file={DATA['sentiment'][0]}",  # the demo's validation file goes with the demo data
        setting,
        f"output_dir={tmp_path / 'out'}",
    ]
    answer = probe(argv, tmp_path)
    assert answer["status"] == 1
    assert message in str(answer["stderr"])
    assert str(answer["stderr"]).count("\n") == 1, answer["stderr"]
    assert {"torch", "transformers", "accelerate"}.isdisjoint(answer["loaded"]), answer["loaded"]
    assert not (tmp_path / "out").exists()
