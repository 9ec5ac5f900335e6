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
import time
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
    command = driver_command(signal_name, point, overrides)
    return subprocess.run(command, capture_output=True, text=True, env=process_env(), timeout=300)


def driver_command(signal_name: str, point: str, overrides: list[str]) -> list[str]:
    """tests/interrupted_run.py's command line for `finetune sentiment` with `overrides`."""
    return [sys.executable, str(DRIVER), signal_name, point, "finetune", "sentiment", *overrides]


def process_env() -> dict[str, str]:
    """One thread and no Hub for the real processes, as in the test process itself."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def start_paused(point: str, overrides: list[str], stderr: Path) -> subprocess.Popen[bytes]:
    """`bert-tasks finetune sentiment` in a fresh process that stops itself (SIGSTOP) at `point`.

    Returns once it has stopped there, holding whatever it holds (output_dir's lock) until SIGCONT or a
    kill. Its stderr goes to a file: a pipe nobody reads could fill up and block it before `point`.
    """
    with stderr.open("wb") as log:
        process = subprocess.Popen(
            driver_command("SIGSTOP", point, overrides), stdout=log, stderr=log, env=process_env()
        )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        pid, status = os.waitpid(process.pid, os.WUNTRACED | os.WNOHANG)
        if pid and os.WIFSTOPPED(status):
            return process
        assert not pid, f"it ended before {point}:\n{stderr.read_text()[-2000:]}"
        time.sleep(0.05)
    process.kill()
    pytest.fail(f"it did not reach {point} in 300 s:\n{stderr.read_text()[-2000:]}")


def bert_tasks(*argv: str) -> subprocess.CompletedProcess[str]:
    """The `bert-tasks` command (`python -m bert_tasks`) in a fresh process."""
    command = [sys.executable, "-m", "bert_tasks", *argv]
    return subprocess.run(command, capture_output=True, text=True, env=process_env(), timeout=300)


def assert_in_use(refused: subprocess.CompletedProcess[str], run: Path, holder: int) -> None:
    """Exit status 1 and one line: `run` is in use by the bert-tasks process `holder`."""
    assert refused.returncode == 1, refused.stderr[-2000:]
    [line] = refused.stderr.strip().splitlines()
    assert line.startswith(
        f"bert-tasks: error: output_dir {run} is in use by another bert-tasks run (pid {holder})"
    )


def files(root: Path) -> list[str]:
    """Every file under `root`, as paths relative to it."""
    return sorted(str(path.relative_to(root)) for path in root.rglob("*") if path.is_file())


def resume_with_the_printed_command(
    interrupted: subprocess.CompletedProcess[str], status: int, run: Path, uninterrupted: Path
) -> None:
    """An interruption during update 7: exit `status`, no traceback, and exactly one `bert-tasks:` line
    (the last) naming step 7's checkpoint and the command that continues; that command, run, ends where
    the uninterrupted run ends."""
    assert interrupted.returncode == status, interrupted.stderr[-2000:]
    assert "Traceback" not in interrupted.stderr
    lines = interrupted.stderr.strip().splitlines()
    assert [line for line in lines if line.startswith("bert-tasks: ")] == lines[-1:]
    checkpoint = run / "checkpoints" / "step-00000007"
    recipe = shlex.quote(str(run / "recipe.yaml"))
    assert lines[-1] == (
        f"bert-tasks: interrupted at step 7; checkpoint saved to {checkpoint}; "
        f"continue with: bert-tasks finetune sentiment --recipe {recipe} --resume"
    )
    assert latest_checkpoint(run) == checkpoint
    command = shlex.split(lines[-1].split("continue with: ")[1])
    assert main(command[1:]) == 0
    assert_same_run(run, uninterrupted)


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


@pytest.mark.slow
def test_uninterrupted_run_keeps_the_newest_checkpoints(uninterrupted: Path) -> None:
    """save_every=3 and save_each_epoch (5 updates each) write 3, 5 and 6; keep_checkpoints=2 keeps 5, 6."""
    names = sorted(path.name for path in (uninterrupted / "checkpoints").iterdir())
    assert names == ["step-00000005", "step-00000006"]
    assert [record["step"] for record in read_log(uninterrupted) if "loss" in record] == [4, 8]


@pytest.mark.slow
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
    resume_with_the_printed_command(interrupted, 130, run, uninterrupted)


@pytest.mark.slow  # real processes, interrupted and resumed
def test_sigterm_checkpoints_exits_143_and_the_printed_command_resumes(
    uninterrupted: Path, tiny_model: Path, tmp_path: Path
) -> None:
    """Slurm's time limit, a Kubernetes eviction or `timeout` sends SIGTERM during update 7's first
    micro-batch: as with Ctrl-C, update 7 finishes and is checkpointed, exit status 143 (128 + 15) and one
    line with the checkpoint and the command that continues; that command ends the run."""
    run = tmp_path / "run"
    interrupted = run_interrupted(
        "SIGTERM", "micro-batch:13", fast_overrides("sentiment", tiny_model, run, **SETTINGS)
    )
    resume_with_the_printed_command(interrupted, 128 + signal.SIGTERM, run, uninterrupted)


@pytest.mark.slow  # real processes, one paused while another starts
@pytest.mark.parametrize(
    ("point", "flags"),
    [("loading", []), ("micro-batch:7", ["--overwrite"])],
    ids=["same-command-while-loading", "overwrite-while-training"],
)
def test_a_second_run_on_a_dir_in_use_is_refused_at_once(
    point: str, flags: list[str], uninterrupted: Path, tiny_model: Path, tmp_path: Path
) -> None:
    """A job submitted twice, or a second `--overwrite` typed in another terminal, while the first run
    loads its model (the dir is still empty: only the lock keeps the second out) or trains (the second
    would delete its files): the second exits 1 at once, in one line naming the first's pid, the first
    finishes undisturbed, and the dir holds that one run's files."""
    run = tmp_path / "run"
    overrides = fast_overrides("sentiment", tiny_model, run, **SETTINGS)
    first = start_paused(point, overrides, tmp_path / "first.log")
    try:
        if point == "loading":
            assert list(run.iterdir()) == []
        assert_in_use(bert_tasks("finetune", "sentiment", *overrides, *flags), run, first.pid)
    finally:
        first.send_signal(signal.SIGCONT)
        first.wait(timeout=300)
    assert first.returncode == 0, (tmp_path / "first.log").read_text()[-2000:]
    assert files(run) == files(uninterrupted)
    assert_same_run(run, uninterrupted)


@pytest.mark.slow  # real processes, one killed
@pytest.mark.parametrize("flag", ["--resume", "--overwrite"])
def test_a_killed_runs_lock_goes_with_it(
    flag: str, uninterrupted: Path, tiny_model: Path, tmp_path: Path
) -> None:
    """A run killed mid-update 7 (the OOM killer, `scancel`, `kill -9`), while a second one was refused
    its dir: right after the kill, `--resume` or `--overwrite` is accepted (no stale lock to remove by
    hand) and ends where the uninterrupted run ends."""
    run = tmp_path / "run"
    overrides = fast_overrides("sentiment", tiny_model, run, **SETTINGS)
    first = start_paused("micro-batch:14", overrides, tmp_path / "first.log")
    try:
        assert_in_use(bert_tasks("finetune", "sentiment", *overrides, flag), run, first.pid)
    finally:
        first.kill()
        first.wait(timeout=60)
    assert first.returncode == -signal.SIGKILL
    assert main(["finetune", "sentiment", *overrides, flag]) == 0
    assert files(run) == files(uninterrupted)
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


def test_a_second_sigterm_stops_at_once_with_the_sigterm_status(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A scheduler that sends SIGTERM twice sees 143 (not Ctrl-C's 130) and no checkpoint is written."""
    backward, calls = Accelerator.backward, []

    def terminated_twice(self: Accelerator, loss: torch.Tensor, **kwargs: Any) -> None:
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
        backward(self, loss, **kwargs)

    monkeypatch.setattr(Accelerator, "backward", terminated_twice)
    out = tmp_path / "run"
    overrides = fast_overrides("sentiment", tiny_model, out, max_steps=5, validation_file=None)
    assert main(["finetune", "sentiment", *overrides]) == 128 + signal.SIGTERM
    assert capsys.readouterr().err.splitlines()[-1] == (
        "bert-tasks: stopped at once by a second signal, without a checkpoint"
    )
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
