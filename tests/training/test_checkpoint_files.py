"""A checkpoint lists what its save wrote: a file the user puts in a step-N dir is never deleted with it."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest

from bert_tasks.errors import BertTasksError
from bert_tasks.training import train
from bert_tasks.training.checkpoints import drop_old_checkpoints, latest_checkpoint, load_run_state
from bert_tasks.training.output_dir import CHECKPOINT_FILES, RUN_STATE, OutputDir
from tests.helpers import tiny_config

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("single_thread")]  # one real run, ~2 s


@pytest.fixture(scope="module")
def checkpointed_run(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny run that keeps a checkpoint of each of its two updates."""
    settings = {"max_steps": 2, "save_every": 1, "keep_checkpoints": 2}
    return train(tiny_config("sentiment", tiny_model, tmp_path_factory.mktemp("run") / "run", **settings))


def copied_run(checkpointed_run: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the run and its latest (real) checkpoint."""
    run = shutil.copytree(checkpointed_run, tmp_path / "run")
    checkpoint = latest_checkpoint(run)
    assert checkpoint is not None
    return run, checkpoint


def test_a_checkpoint_lists_exactly_what_its_save_wrote(checkpointed_run: Path) -> None:
    """The list is taken from the real save (accelerate's files), and is no part of the run's state."""
    checkpoints = sorted((checkpointed_run / "checkpoints").iterdir())
    assert [path.name for path in checkpoints] == ["step-00000001", "step-00000002"]
    for checkpoint in checkpoints:
        listed = json.loads((checkpoint / RUN_STATE).read_text())[CHECKPOINT_FILES]
        assert listed == sorted(set(os.listdir(checkpoint)) - {RUN_STATE})
        assert "model.safetensors" in listed
        assert CHECKPOINT_FILES not in load_run_state(checkpoint)


def test_an_old_checkpoint_holding_a_users_file_is_kept_and_the_others_go(
    checkpointed_run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """keep_checkpoints=1: of two older checkpoints, the one holding notes.txt stays whole (one warning,
    as it leaves the newest), the other, of an older bert-tasks (no list, so wholly the run's), goes."""
    run, latest = copied_run(checkpointed_run, tmp_path)
    shutil.rmtree(run / "checkpoints" / "step-00000001")
    older = [run / "checkpoints" / f"step-0000000{n}" for n in (0, 1)]
    for step in older:
        shutil.copytree(latest, step)
    (older[0] / "notes.txt").write_text("what I tried")
    state = json.loads((older[1] / RUN_STATE).read_text())
    del state[CHECKPOINT_FILES]
    (older[1] / RUN_STATE).write_text(json.dumps(state))
    (older[1] / "extra.bin").write_text("saved by an older bert-tasks")
    with caplog.at_level(logging.WARNING):
        drop_old_checkpoints(run, keep=2)  # step 0 leaves the newest two
        drop_old_checkpoints(run, keep=1)  # step 1 leaves the newest one; step 0 is not named again
    assert sorted(path.name for path in (run / "checkpoints").iterdir()) == ["step-00000000", latest.name]
    assert (older[0] / "notes.txt").read_text() == "what I tried"
    assert (older[0] / "model.safetensors").is_file()
    warned = [record.getMessage() for record in caplog.records if "notes.txt" in record.getMessage()]
    assert len(warned) == 1 and "kept rather than deleted" in warned[0], warned


def test_overwrite_names_a_users_file_inside_a_checkpoint_and_deletes_nothing(
    checkpointed_run: Path, tmp_path: Path
) -> None:
    run, checkpoint = copied_run(checkpointed_run, tmp_path)
    (checkpoint / "notes.txt").write_text("what I tried")
    before = sorted(str(path.relative_to(run)) for path in run.rglob("*"))
    with pytest.raises(BertTasksError) as refused:
        OutputDir.claim(run, overwrite=True, resume=False, reads=())
    assert str(refused.value) == (
        f"output_dir {run} holds checkpoints/{checkpoint.name}/notes.txt, which no bert-tasks run wrote; "
        "nothing was deleted, move it elsewhere or choose another output_dir"
    )
    assert sorted(str(path.relative_to(run)) for path in run.rglob("*")) == before
