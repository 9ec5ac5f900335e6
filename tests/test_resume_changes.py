"""--resume into a run trained with other labels, another label shape, another plan or other training
rows, and the user's own files inside the run's checkpoints/: each refusal is one `bert-tasks: error:`
line that names what the checkpoint was trained with and what this run asks for, and nothing under the
run dir changes.

The run is tiny (3 updates, a checkpoint after each, no validation split so its end needs no best/), and
its end is lost (no metrics.json), as a run killed after its last checkpoint leaves it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from bert_tasks.cli import main
from bert_tasks.training import train
from tests.helpers import DATA, cli_error_line, fast_overrides, one_thread, tiny_config, write_jsonl

SETTINGS: dict[str, Any] = {"save_every": 1, "max_steps": 3, "validation_file": None}
STEP_2, STEP_3 = "checkpoints/step-00000002", "checkpoints/step-00000003"


@pytest.fixture(scope="module")
def checkpointed(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run with checkpoints at 2 and 3 and no metrics.json: resumable."""
    with one_thread():
        run = train(tiny_config("sentiment", tiny_model, tmp_path_factory.mktemp("ckpt") / "run", **SETTINGS))
    (run / "metrics.json").unlink()
    return run


@pytest.fixture
def run(checkpointed: Path, tmp_path: Path) -> Path:
    return shutil.copytree(checkpointed, tmp_path / "run")


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every entry below `folder`: (size, mtime), so a deletion, a write or a new entry shows."""
    return {
        str(path.relative_to(folder)): (path.lstat().st_size, path.lstat().st_mtime_ns)
        for path in [folder, *folder.rglob("*")]
    }


def resume(tiny_model: Path, run: Path, **overrides: Any) -> list[str]:
    """The argv of `bert-tasks finetune sentiment ... --resume` into `run`; keyword args win."""
    return [
        "finetune",
        "sentiment",
        *fast_overrides("sentiment", tiny_model, run, **SETTINGS | overrides),
        "--resume",
    ]


def refused(argv: list[str], run: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """One error line, exit status 1, and the run dir as it was. Returns the line without its prefix."""
    before = snapshot(run)
    line = cli_error_line(argv, capsys)
    assert snapshot(run) == before
    return line.removeprefix("bert-tasks: error: ")


def three_labels(tmp_path: Path) -> Path:
    """The training rows, every third one relabelled `neutral`."""
    rows = [json.loads(line) for line in DATA["sentiment"][0].read_text().splitlines()]
    return write_jsonl(
        tmp_path / "three.jsonl",
        [row | {"label": "neutral"} if i % 3 == 0 else row for i, row in enumerate(rows)],
    )


def numbers(tmp_path: Path) -> Path:
    """The training texts with numeric labels (a regression run's)."""
    rows = [json.loads(line) for line in DATA["sentiment"][0].read_text().splitlines()]
    return write_jsonl(
        tmp_path / "numbers.jsonl", [row | {"label": float(i % 5)} for i, row in enumerate(rows)]
    )


@pytest.mark.slow
def test_resuming_with_a_third_label_names_both_label_sets(
    run: Path, tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not "damaged, delete it": the checkpoint is sound, it is another run's."""
    argv = resume(tiny_model, run, train_file=three_labels(tmp_path))
    assert refused(argv, run, capsys) == (
        f"--resume: {run / STEP_3} was trained with labels negative, positive, this run's data and settings "
        "give labels negative, neutral, positive; resume with the data and settings it was trained with, or "
        "start a new output_dir (or --overwrite); nothing was deleted"
    )


@pytest.mark.slow
def test_resuming_as_regression_names_both_label_shapes(
    run: Path, tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = resume(tiny_model, run, train_file=numbers(tmp_path), regression="true")
    line = refused(argv, run, capsys)
    assert line.startswith(
        f"--resume: {run / STEP_3} was trained with labels negative, positive, this run's data and settings "
        "give label value (regression); resume with the data and settings it was trained with"
    )


@pytest.mark.slow
def test_an_older_checkpoint_without_its_labels_names_the_shapes(
    run: Path, tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A checkpoint of an earlier bert-tasks records no labels: its head's shape tells, still not damage."""
    for step in (STEP_2, STEP_3):
        state_file = run / step / "run_state.json"
        state = json.loads(state_file.read_text())
        del state["trained_with"]
        state_file.write_text(json.dumps(state))
    argv = resume(tiny_model, run, train_file=three_labels(tmp_path))
    assert refused(argv, run, capsys) == (
        f"--resume: checkpoint {run / STEP_3} was trained with classifier.weight of shape [2, 32] and this "
        "run's model has [3, 32]: other labels or another label shape; resume with the data and settings it "
        "was trained with, or start a new output_dir (or --overwrite); nothing was deleted"
    )


def edited(tmp_path: Path, extra_rows: int = 0) -> Path:
    """The training rows with the same labels, one text changed, `extra_rows` of them written twice."""
    rows = [json.loads(line) for line in DATA["sentiment"][0].read_text().splitlines()]
    rows[0] = rows[0] | {"text": rows[0]["text"] + " Edited."}
    return write_jsonl(tmp_path / "edited.jsonl", rows + rows[:extra_rows])


@pytest.mark.slow
def test_resuming_on_other_training_rows_with_the_same_labels_is_refused(
    run: Path, tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Same labels and settings, one text edited: the checkpoint's place in the epoch is in other batches."""
    rows = len(DATA["sentiment"][0].read_text().splitlines())
    line = refused(resume(tiny_model, run, train_file=edited(tmp_path)), run, capsys)
    assert line == (
        f"--resume: {run / STEP_3} was trained on other training rows than this run reads (as many, "
        f"{rows:,}, but other texts, labels or token ids: another train file, the file edited, or another "
        "tokenizer); "
        "resume with the data and settings it was trained with, or start a new output_dir (or --overwrite); "
        "nothing was deleted"
    )
    line = refused(resume(tiny_model, run, train_file=edited(tmp_path, extra_rows=2)), run, capsys)
    assert line.startswith(
        f"--resume: {run / STEP_3} was trained on {rows:,} encoded training rows, this run reads "
        f"{rows + 2:,}; "
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("key", "saved", "asked"),
    [
        ("batch_size", "8", "4"),
        ("grad_accum", "1", "2"),
        ("max_steps", "3", "5"),
        ("warmup_ratio", "0", "0.1"),
        ("lr", "0.0001", "0.001"),
        ("seed", "42", "7"),
        ("max_length", "32", "64"),
    ],
)
def test_resuming_with_another_plan_is_refused(
    key: str, saved: str, asked: str, run: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each of these would continue another plan of updates from this one's state (or be ignored)."""
    line = refused(resume(tiny_model, run, **{key: asked}), run, capsys)
    assert line.startswith(
        f"--resume: {run / STEP_3} was saved with {key}={saved}, this run asks for {key}={asked}; resume "
        f"with {key}={saved} ("
    )
    assert line.endswith("), or train again with --overwrite")


@pytest.mark.slow
def test_resume_keeps_a_users_file_in_checkpoints_and_takes_settings_that_plan_nothing(
    run: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """From step 2, the resumed run writes step 3 again (and clears what it left half-written): the user's
    notes beside the checkpoints stay. epochs (max_steps sets the length) and logging_steps plan nothing."""
    shutil.rmtree(run / STEP_3)
    notes = run / "checkpoints" / "notes.txt"
    notes.write_text("what I tried")
    (run / "checkpoints" / "step-00000003.tmp").mkdir()  # a write cut short: the run's own
    assert main(resume(tiny_model, run, epochs=2, logging_steps=2)) == 0
    assert "resuming from" in capsys.readouterr().err
    assert notes.read_text() == "what I tried" and (run / "metrics.json").is_file()
    assert sorted(path.name for path in (run / "checkpoints").iterdir()) == [
        "notes.txt",
        "step-00000002",
        "step-00000003",
    ]


@pytest.mark.slow
def test_overwrite_refuses_a_users_file_in_checkpoints(
    run: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (run / "checkpoints" / "notes.txt").write_text("what I tried")
    argv = ["finetune", "sentiment", *fast_overrides("sentiment", tiny_model, run, **SETTINGS), "--overwrite"]
    assert refused(argv, run, capsys) == (
        f"output_dir {run} holds checkpoints/notes.txt, which no bert-tasks run wrote; nothing was deleted, "
        "move it elsewhere or choose another output_dir"
    )
