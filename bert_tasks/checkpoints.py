"""Resumable checkpoints and the best weights: written whole or not at all, the newest few kept.

A checkpoint is Accelerate's `save_state` (model, optimizer, scheduler, grad scaler, every process's RNG
states) plus `run_state.json` (step, epoch, best metric, early-stopping count, log history, the loss not
yet logged). It is written to `step-N.tmp` and renamed only once complete, so a crash or SIGKILL
mid-write leaves the previous checkpoint as the latest usable one; the next save clears the debris.
Checkpoints are taken at optimizer updates only, so no half-accumulated gradient is ever part of one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from accelerate import Accelerator
from transformers import PreTrainedModel

CHECKPOINT_DIR = "checkpoints"
BEST_DIR = "best"
RUN_STATE = "run_state.json"
_COMPLETE = re.compile(r"step-(\d+)")


def save_checkpoint(
    accelerator: Accelerator, output_dir: Path, step: int, run_state: dict[str, Any], keep: int
) -> Path:
    """Save everything needed to continue at `step`, then keep only the newest `keep` checkpoints.

    Every process must call this (each writes its own RNG state).
    """
    folder = output_dir / CHECKPOINT_DIR
    final = folder / f"step-{step:08d}"
    partial = final.with_name(final.name + ".tmp")
    if accelerator.is_main_process:
        _remove_incomplete(folder)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(partial))
    accelerator.wait_for_everyone()  # every process writes its RNG state there: all must finish first
    if accelerator.is_main_process:
        (partial / RUN_STATE).write_text(json.dumps(run_state))
        os.replace(partial, final)
        for old in _complete_checkpoints(output_dir)[:-keep]:
            (old / RUN_STATE).unlink()  # first, so a deletion cut short never looks like a checkpoint
            shutil.rmtree(old)
    accelerator.wait_for_everyone()
    return final


def save_best(model: PreTrainedModel, output_dir: Path) -> None:
    """Replace `best/` with `model` through `best.tmp` and a rename: `best/` never holds half a model."""
    final = output_dir / BEST_DIR
    partial = final.with_name(final.name + ".tmp")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(partial, final)


def latest_checkpoint(output_dir: Path) -> Path | None:
    """The newest complete checkpoint, or None."""
    complete = _complete_checkpoints(output_dir)
    return complete[-1] if complete else None


def load_run_state(checkpoint: Path) -> dict[str, Any]:
    return json.loads((checkpoint / RUN_STATE).read_text())


def _complete_checkpoints(output_dir: Path) -> list[Path]:
    """`step-N` dirs holding run_state.json (written last), oldest first."""
    folder = output_dir / CHECKPOINT_DIR
    if not folder.is_dir():
        return []
    found = [
        path for path in folder.iterdir() if _COMPLETE.fullmatch(path.name) and (path / RUN_STATE).is_file()
    ]
    return sorted(found, key=lambda path: int(path.name.removeprefix("step-")))


def _remove_incomplete(folder: Path) -> None:
    """Delete what a killed run left half-written (`step-N.tmp`, a deletion cut short)."""
    if not folder.is_dir():
        return
    complete = set(_complete_checkpoints(folder.parent))
    for path in folder.iterdir():
        if path not in complete:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
