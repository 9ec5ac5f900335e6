"""What happens when training is cut short: SIGKILL (between checkpoints, during one), Ctrl-C, NaN/inf.

The killed and interrupted runs are real `bert-tasks finetune` processes driven by tests/interrupted_run.py,
which signals itself at an exact micro-batch or mid-checkpoint, so nothing depends on timing. Every
interrupted run is resumed and must end where the uninterrupted run with the same seed ends: weights,
validation scores and log. The run crosses an epoch boundary, accumulates gradients over two
micro-batches, logs every 4 updates and evaluates every 2, so all the state a checkpoint holds matters.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from accelerate import Accelerator
from safetensors.torch import load_file
from transformers import BertForSequenceClassification

from bert_tasks.cli import main
from bert_tasks.errors import BertTasksError
from bert_tasks.training import train
from bert_tasks.training.checkpoints import latest_checkpoint, save_best
from bert_tasks.training.stopping import TrainingInterrupted
from tests.helpers import fast_overrides, read_log, tiny_bert_config, tiny_config

DRIVER = Path(__file__).resolve().parent / "interrupted_run.py"
#: 40 rows in batches of 4, two micro-batches per update: 5 updates per epoch, 8 in all (epoch 2 at
#: update 6). Checkpoints at 3 and 6 (save_every) and 5 (epoch end), the newest two kept.
SETTINGS: dict[str, Any] = {
    "batch_size": 4,
    "grad_accum": 2,
    "max_steps": 8,
    "logging_steps": 4,
    "eval_every": 2,
    "early_stopping_patience": 5,
    "save_every": 3,
    "save_each_epoch": "true",
}


pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def uninterrupted(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run every interrupted one must end equal to."""
    return train(tiny_config("sentiment", tiny_model, tmp_path_factory.mktemp("run") / "full", **SETTINGS))


def run_interrupted(signal_name: str, point: str, overrides: list[str]) -> subprocess.CompletedProcess[str]:
    """`bert-tasks finetune sentiment` in a fresh process that gets `signal_name` at `point`."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    command = [sys.executable, str(DRIVER), signal_name, point, "finetune", "sentiment", *overrides]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)


def assert_same_run(resumed: Path, expected: Path) -> None:
    """Same weights (to float tolerance), same validation scores and best step, same log but throughput."""
    want, got = load_file(expected / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert want.keys() == got.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-6, rtol=1e-5, msg=name)
    want_metrics, got_metrics = (
        json.loads((run / "metrics.json").read_text()) for run in (expected, resumed)
    )
    assert got_metrics["best_step"] == want_metrics["best_step"]
    assert flat(got_metrics["validation"]) == pytest.approx(flat(want_metrics["validation"]))
    records = [[without_throughput(record) for record in read_log(run)] for run in (expected, resumed)]
    assert len(records[1]) == len(records[0])
    for got_record, want_record in zip(records[1], records[0], strict=True):
        assert got_record == pytest.approx(want_record)


def flat(scores: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested scores (per class, confusion matrix) as one level of numbers, which pytest.approx compares."""
    items: dict[str, Any] = {}
    for key, value in scores.items():
        if isinstance(value, dict):
            items |= flat(value, f"{prefix}{key}.")
        elif isinstance(value, list):
            items |= flat(dict(enumerate(value)), f"{prefix}{key}.")
        else:
            items[f"{prefix}{key}"] = value
    return items


def without_throughput(record: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in record.items() if key != "examples_per_s"}


def test_uninterrupted_run_keeps_the_newest_checkpoints(uninterrupted: Path) -> None:
    """save_every=3 and save_each_epoch (5 updates each) write 3, 5 and 6; keep_checkpoints=2 keeps 5, 6."""
    names = sorted(path.name for path in (uninterrupted / "checkpoints").iterdir())
    assert names == ["step-00000005", "step-00000006"]
    assert [record["step"] for record in read_log(uninterrupted) if "loss" in record] == [4, 8]


def test_resuming_a_finished_run_is_refused(uninterrupted: Path, tiny_model: Path, tmp_path: Path) -> None:
    """A finished run still has checkpoints, but --resume has nothing to continue: it says so."""
    run = shutil.copytree(uninterrupted, tmp_path / "run")
    with pytest.raises(BertTasksError, match=r"holds a finished run \(metrics\.json\).*--overwrite"):
        train(tiny_config("sentiment", tiny_model, run, resume=True, **SETTINGS))


@pytest.mark.slow  # real processes, killed and resumed
def test_sigkill_between_checkpoints_then_resume(
    uninterrupted: Path, tiny_model: Path, tmp_path: Path
) -> None:
    """Killed in the middle of update 7 (one of its two micro-batches done): resume from step 6."""
    overrides = fast_overrides("sentiment", tiny_model, tmp_path / "run", **SETTINGS)
    killed = run_interrupted("SIGKILL", "micro-batch:14", overrides)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert latest_checkpoint(tmp_path / "run").name == "step-00000006"
    assert main(["finetune", "sentiment", *overrides, "--resume"]) == 0
    assert_same_run(tmp_path / "run", uninterrupted)


@pytest.mark.slow  # real processes, killed and resumed
def test_sigkill_during_a_checkpoint_write_then_resume(
    uninterrupted: Path, tiny_model: Path, tmp_path: Path
) -> None:
    """Killed while step 6 is written: the half-written step-6.tmp is ignored, step 5 (an epoch end) is
    the latest, the resumed run rewrites step 6 and clears the debris."""
    run = tmp_path / "run"
    overrides = fast_overrides("sentiment", tiny_model, run, **SETTINGS)
    killed = run_interrupted("SIGKILL", "checkpoint:step-00000006", overrides)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    partial = run / "checkpoints" / "step-00000006.tmp"
    assert (partial / "optimizer.bin").is_file() and not (partial / "run_state.json").exists()
    assert latest_checkpoint(run).name == "step-00000005"
    assert main(["finetune", "sentiment", *overrides, "--resume"]) == 0
    assert_same_run(run, uninterrupted)
    assert sorted(path.name for path in (run / "checkpoints").iterdir()) == ["step-00000005", "step-00000006"]


@pytest.mark.slow  # real processes, killed and resumed
def test_ctrl_c_checkpoints_exits_130_and_the_printed_command_resumes(
    uninterrupted: Path, tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SIGINT during update 7's first micro-batch: update 7 finishes, is checkpointed, exit status 130 and
    one line saying where the checkpoint is and which command continues; that command ends the run."""
    run = tmp_path / "run"
    interrupted = run_interrupted(
        "SIGINT", "micro-batch:13", fast_overrides("sentiment", tiny_model, run, **SETTINGS)
    )
    assert interrupted.returncode == 130, interrupted.stderr[-2000:]
    last_line = interrupted.stderr.strip().splitlines()[-1]
    checkpoint = run / "checkpoints" / "step-00000007"
    assert last_line.startswith(f"bert-tasks: interrupted at step 7; checkpoint saved to {checkpoint}; ")
    assert "Traceback" not in interrupted.stderr
    assert latest_checkpoint(run) == checkpoint
    command = shlex.split(last_line.split("continue with: ")[1])
    assert command[:2] == ["bert-tasks", "finetune"] and command[-1] == "--resume"
    assert main(command[1:]) == 0
    assert_same_run(run, uninterrupted)


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_in_library_use_raises_keyboard_interrupt_and_restores_the_handler(
    presses: int, tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """train() in a notebook: Ctrl-C is a KeyboardInterrupt after a checkpoint; a second Ctrl-C stops at
    once without one; either way the caller's SIGINT handler is back afterwards."""
    backward, calls = Accelerator.backward, []

    def pressing_ctrl_c(self: Accelerator, loss: torch.Tensor, **kwargs: Any) -> None:
        calls.append(1)
        if len(calls) == 3:
            for _ in range(presses):
                os.kill(os.getpid(), signal.SIGINT)
        backward(self, loss, **kwargs)

    monkeypatch.setattr(Accelerator, "backward", pressing_ctrl_c)
    handler = signal.getsignal(signal.SIGINT)
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt) as interrupt:
        train(tiny_config("sentiment", tiny_model, out, max_steps=5, validation_file=None))
    assert signal.getsignal(signal.SIGINT) is handler
    if presses == 1:
        assert isinstance(interrupt.value, TrainingInterrupted)
        assert "interrupted at step 3" in str(interrupt.value)
        assert latest_checkpoint(out).name == "step-00000003"
    else:
        assert not isinstance(interrupt.value, TrainingInterrupted)
        assert latest_checkpoint(out) is None


def test_a_failed_best_write_keeps_the_previous_best(tmp_path: Path) -> None:
    """A write of best/ that dies half-way (here: a full disk) leaves the previous best/ as it was."""
    save_best(BertForSequenceClassification(tiny_bert_config()), tmp_path)
    before = (tmp_path / "best" / "model.safetensors").read_bytes()

    class DiskFull(BertForSequenceClassification):
        def save_pretrained(self, directory: Path, **kwargs: Any) -> None:
            Path(directory).mkdir()
            (Path(directory) / "model.safetensors").write_bytes(b"half")
            raise OSError("No space left on device")

    with pytest.raises(
        BertTasksError, match=r"could not write the best weights .*\(No space left on device\)"
    ):
        save_best(DiskFull(tiny_bert_config()), tmp_path)
    assert (tmp_path / "best" / "model.safetensors").read_bytes() == before
    assert not (tmp_path / "best.tmp").exists()  # the half-written copy does not keep the space


def test_nan_loss_stops_at_its_exact_step(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """lr=1e30 after a warmup whose first update has lr 0: the weights blow up at update 2, the loss is
    NaN from update 3. The message names step 3 although the log is only written every 20 updates."""
    overrides = fast_overrides(
        "sentiment", tiny_model, tmp_path / "run", lr=1e30, warmup_ratio=0.5, max_steps=10, logging_steps=20
    )
    assert main(["finetune", "sentiment", *overrides, "validation_file=none"]) == 1
    [line] = capsys.readouterr().err.strip().splitlines()[-1:]
    assert line.startswith(
        "bert-tasks: error: training diverged: the training loss became NaN/inf at step 3;"
    )
    assert "lower lr (now 1e+30)" in line


def test_nan_outputs_never_replace_the_best_weights(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Evaluating every update: step 1 is the best, update 2 blows the weights up, and the evaluation at
    step 2 stops the run before it can score (or save) NaN outputs. best/ still holds the step-1 weights,
    the same ones the step-1 checkpoint holds; no checkpoint of the blown-up model is written."""
    run = tmp_path / "run"
    settings = {"lr": 1e30, "warmup_ratio": 0.5, "max_steps": 10, "eval_every": 1, "save_every": 1}
    assert main(["finetune", "sentiment", *fast_overrides("sentiment", tiny_model, run, **settings)]) == 1
    [line] = capsys.readouterr().err.strip().splitlines()[-1:]
    expected = "the model's outputs on the validation data became NaN/inf at step 2;"
    assert line.startswith(f"bert-tasks: error: training diverged: {expected}")
    assert line.endswith(f"the best weights so far (step 1) are in {run / 'best'}")
    best = load_file(run / "best" / "model.safetensors")
    step_1 = _transformers_names(load_file(run / "checkpoints" / "step-00000001" / "model.safetensors"))
    assert best.keys() == step_1.keys()
    for name in best:
        torch.testing.assert_close(best[name], step_1[name], msg=name)
    assert latest_checkpoint(run).name == "step-00000001"


def _transformers_names(checkpoint: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A training checkpoint's weights (the fused `qkv` names) under a model dir's query/key/value names."""
    named = {}
    for name, tensor in checkpoint.items():
        if ".qkv." in name:
            prefix, suffix = name.split(".qkv.")
            for part, chunk in zip(("query", "key", "value"), tensor.chunk(3), strict=True):
                named[f"{prefix}.{part}.{suffix}"] = chunk
        else:
            named[name] = tensor
    return named
