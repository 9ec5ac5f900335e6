"""Resumable checkpoints: written whole or not at all, the newest few kept.

A checkpoint is Accelerate's `save_state` (model, optimizer, scheduler, grad scaler, every process's RNG
states) plus `run_state.json` (step, epoch, best metric, early-stopping count, log history). It is
written to `step-N.tmp` and renamed only once complete, so a crash mid-write leaves the previous
checkpoint as the latest usable one.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from accelerate import Accelerator

CHECKPOINT_DIR = "checkpoints"
RUN_STATE = "run_state.json"
#: How many step checkpoints to keep (the best model is kept separately).
KEEP_LAST = 2


def save_checkpoint(accelerator: Accelerator, output_dir: Path, step: int, run_state: dict[str, Any]) -> Path:
    """Save everything needed to continue at `step`; every process must call this."""
    final = output_dir / CHECKPOINT_DIR / f"step-{step:08d}"
    partial = final.with_name(final.name + ".tmp")
    if accelerator.is_main_process:
        shutil.rmtree(partial, ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(partial))
    accelerator.wait_for_everyone()  # every process writes its RNG state there: all must finish first
    if accelerator.is_main_process:
        (partial / RUN_STATE).write_text(json.dumps(run_state))
        os.replace(partial, final)
        for old in _complete_checkpoints(output_dir)[:-KEEP_LAST]:
            shutil.rmtree(old)
    accelerator.wait_for_everyone()
    return final


def latest_checkpoint(output_dir: Path) -> Path | None:
    """The newest complete checkpoint, or None."""
    complete = _complete_checkpoints(output_dir)
    return complete[-1] if complete else None


def load_run_state(checkpoint: Path) -> dict[str, Any]:
    return json.loads((checkpoint / RUN_STATE).read_text())


def _complete_checkpoints(output_dir: Path) -> list[Path]:
    folder = output_dir / CHECKPOINT_DIR
    if not folder.is_dir():
        return []
    found = [path for path in folder.glob("step-*") if path.suffix != ".tmp" and (path / RUN_STATE).is_file()]
    return sorted(found, key=lambda path: int(path.name.removeprefix("step-")))
