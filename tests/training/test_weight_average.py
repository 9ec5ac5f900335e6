"""`ema_decay`: the weights' moving average is TF's warmed-up EMA of the live weights, it is what a run
evaluates, keeps and saves, it never changes what the live weights train to, and it resumes exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from bert_tasks.config import load_recipe
from bert_tasks.errors import BertTasksError
from bert_tasks.model_dir import load_finetuned
from bert_tasks.training import train
from bert_tasks.training.weight_average import SAVED_AVERAGE, WeightAverage
from tests.helpers import DATA, read_log, tiny_config
from tests.test_cli_startup import probe

DECAY = 0.2  # reached at the second update: (1 + 1) / (10 + 1) = 0.18 is still the warm-up's


def _decay_after(updates: int) -> float:
    return min(DECAY, (1 + updates) / (10 + updates))


def test_average_follows_the_warmed_up_recurrence_and_swaps_back() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    model.bias.requires_grad_(False)  # frozen weights are not averaged
    average = WeightAverage(model, DECAY)
    expected = model.weight.detach().clone()
    for updates in range(4):
        with torch.no_grad():
            model.weight.add_(torch.randn(2, 3))
        average.update()
        decay = _decay_after(updates)
        expected = decay * expected + (1 - decay) * model.weight.detach()
    live = model.weight.detach().clone()
    with average.swapped_in():
        torch.testing.assert_close(model.weight.detach(), expected)
    torch.testing.assert_close(model.weight.detach(), live)  # the live weights again
    assert len(average.state_dict()["average"]) == 1 and average.state_dict()["updates"] == 4


def test_state_round_trips_into_a_fresh_average() -> None:
    model = torch.nn.Linear(3, 2)
    average = WeightAverage(model, DECAY)
    with torch.no_grad():
        model.weight.mul_(3)
    average.update()
    restored = WeightAverage(torch.nn.Linear(3, 2), DECAY)
    restored.load_state_dict(average.state_dict())
    assert restored.updates == 1
    for mine, theirs in zip(restored.state_dict()["average"], average.state_dict()["average"], strict=True):
        torch.testing.assert_close(mine, theirs)


@pytest.mark.parametrize("value", ["1.0", "-0.1", "1.5"])
def test_decay_outside_zero_to_one_is_refused(value: str) -> None:
    with pytest.raises(BertTasksError, match=rf"^bad config: ema_decay={value}, must be in \[0, 1\)"):
        load_recipe(None, [f"ema_decay={value}"], task="sentiment")


def _checkpoints(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "checkpoints").glob("step-*"))


def _average_at(checkpoint: Path) -> list[torch.Tensor]:
    return torch.load(checkpoint / SAVED_AVERAGE, weights_only=True)["average"]


def _trainable_names(run_dir: Path) -> list[str]:
    """The trained parameters' names in `model.parameters()` order, fused attention names (checkpoints')."""
    model = load_finetuned(run_dir).model
    return [name for name, param in model.named_parameters() if param.requires_grad]


def _assert_model_holds(run_dir: Path, average: list[torch.Tensor]) -> None:
    model = load_finetuned(run_dir).model
    params = [param for param in model.parameters() if param.requires_grad]
    for param, value in zip(params, average, strict=True):
        torch.testing.assert_close(param.detach(), value)


@pytest.mark.parametrize(
    ("flag", "launcher"), [("ACCELERATE_USE_FSDP", "FSDP"), ("ACCELERATE_USE_DEEPSPEED", "DeepSpeed")]
)
def test_a_sharding_launcher_is_refused_in_one_line_before_torch(
    flag: str, launcher: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(flag, "true")  # what `accelerate launch` sets in each process for FSDP / DeepSpeed
    argv = ["finetune", "sentiment", f"train_file={DATA['sentiment'][0]}", "ema_decay=0.999"]
    answer = probe([*argv, f"output_dir={tmp_path / 'out'}"], tmp_path)
    assert answer["status"] == 1
    assert f"ema_decay=0.999 is not supported under {launcher}" in str(answer["stderr"])
    assert str(answer["stderr"]).count("\n") == 1, answer["stderr"]
    assert {"torch", "transformers", "accelerate"}.isdisjoint(answer["loaded"]), answer["loaded"]
    assert not (tmp_path / "out").exists()


def test_a_run_averages_evaluates_and_saves_the_average(tiny_model: Path, tmp_path: Path) -> None:
    """Each checkpoint's average is the recurrence over the live weights it holds; the best step's average
    is the saved model; and the live weights train exactly as without an average."""
    settings = {"max_steps": 4, "save_every": 1, "keep_checkpoints": 4, "eval_every": 1, "lr": 1e-2}
    averaged = train(tiny_config("sentiment", tiny_model, tmp_path / "ema", ema_decay=DECAY, **settings))
    plain = train(tiny_config("sentiment", tiny_model, tmp_path / "plain", **settings))
    names = _trainable_names(averaged)
    checkpoints = _checkpoints(averaged)
    assert len(checkpoints) == 4
    previous = _average_at(checkpoints[0])
    for updates, checkpoint in enumerate(checkpoints[1:], start=1):
        live = load_file(checkpoint / "model.safetensors")
        decay = _decay_after(updates)
        expected = [decay * avg + (1 - decay) * live[name] for avg, name in zip(previous, names, strict=True)]
        current = _average_at(checkpoint)
        for name, mine, theirs in zip(names, current, expected, strict=True):
            torch.testing.assert_close(mine, theirs, msg=name)
        previous = current
    best_step = json.loads((averaged / "metrics.json").read_text())["best_step"]
    _assert_model_holds(averaged, _average_at(checkpoints[best_step - 1]))
    ours, theirs = (load_file(_checkpoints(run)[-1] / "model.safetensors") for run in (averaged, plain))
    for name in theirs:
        torch.testing.assert_close(ours[name], theirs[name], atol=0, rtol=0, msg=name)
    assert sum("eval_accuracy" in record for record in read_log(averaged)) == 4


def test_without_validation_the_saved_model_is_the_last_steps_average(
    tiny_model: Path, tmp_path: Path
) -> None:
    """No validation, no best step: the run ends with its last average (resume: test_train.py)."""
    settings = {"max_steps": 4, "save_every": 4, "validation_file": None, "ema_decay": 0.5, "lr": 1e-2}
    run = train(tiny_config("sentiment", tiny_model, tmp_path / "run", **settings))
    _assert_model_holds(run, _average_at(_checkpoints(run)[-1]))


@pytest.mark.parametrize(("saved", "asked"), [(0.5, 0.0), (0.5, 0.9), (0.0, 0.5)])
def test_resuming_with_another_decay_is_refused_and_touches_nothing(
    saved: float, asked: float, tiny_model: Path, tmp_path: Path
) -> None:
    """An average added, dropped or changed on --resume would make the resumed run another one."""
    settings = {"max_steps": 2, "save_every": 2, "validation_file": None, "lr": 1e-2}
    run = train(tiny_config("sentiment", tiny_model, tmp_path / "run", ema_decay=saved, **settings))
    for name in ("model.safetensors", "metrics.json"):  # as a run killed after its checkpoint leaves it
        (run / name).unlink()
    before = {path: path.stat().st_mtime_ns for path in run.rglob("*")}
    message = rf"^--resume: .*step-00000002 was saved with ema_decay={saved:g}, this run asks for "
    with pytest.raises(
        BertTasksError, match=message + rf"ema_decay={asked:g}; resume with ema_decay={saved:g}"
    ):
        train(tiny_config("sentiment", tiny_model, run, resume=True, ema_decay=asked, **settings))
    assert {path: path.stat().st_mtime_ns for path in run.rglob("*")} == before
