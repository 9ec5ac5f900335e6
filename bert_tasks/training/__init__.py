"""`train(cfg) -> model dir`: set up, loop, finish — the one training entry point for every task.

Everything that can be checked without a model is checked here first, before torch and transformers
load: the output dir (taken for this run at once, so a second run on it is refused), `--resume`'s
checkpoint, and every data file (read and validated whole). A mistake in any of them is answered in a
second, and leaves the output dir as it was.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from bert_tasks.data.splits import read_splits
from bert_tasks.errors import BertTasksError
from bert_tasks.tasks import get_task
from bert_tasks.training.checkpoints import latest_checkpoint
from bert_tasks.training.class_weights import check_class_weights
from bert_tasks.training.output_dir import OutputDir

if TYPE_CHECKING:
    from bert_tasks.config import Config


def train(cfg: Config) -> Path:
    """Fine-tune `cfg.model` on `cfg.task` and return the directory holding the saved model."""
    task = get_task(cfg)
    output = claim_output_dir(cfg)
    try:
        raw = read_splits(task, cfg)
        if "train" not in raw:
            raise BertTasksError("no training data; set train_file or a dataset with a train split")
        if isinstance(cfg.class_weights, list):
            check_class_weights(cfg.class_weights, task.label_names(raw["train"], cfg))
        from bert_tasks.training.run import Run  # torch, transformers, accelerate: once the input is good

        run = Run.setup(cfg, task, raw, output)
    except BaseException:
        output.abandon()  # a dir this run created and never wrote to goes again; the lock is released
        raise
    try:
        run.loop()
        return run.finish()
    finally:
        output.release()


def claim_output_dir(cfg: Config) -> OutputDir:
    """Take `output_dir` for this run, or refuse in one line (in use, not ours to replace, nothing to resume).

    Under `accelerate launch` every process checks, but only the main one (RANK 0) takes the lock.
    """
    path = Path(cfg.output_dir if cfg.output_dir is not None else f"runs/{cfg.task}")
    reads = [
        Path(p) for p in (cfg.train_file, cfg.validation_file, cfg.test_file, cfg.model) if p is not None
    ]
    if cfg.resume:
        _check_resumable(path)
    main = os.environ.get("RANK", "0") == "0"
    return OutputDir.claim(path, overwrite=cfg.overwrite, resume=cfg.resume, reads=reads, lock=main)


def _check_resumable(path: Path) -> None:
    if latest_checkpoint(path) is None:
        raise BertTasksError(
            f"--resume: {path} holds no complete checkpoint (checkpoints/step-*); "
            "runs write them with save_every=N or save_each_epoch=true, on Ctrl-C and on SIGTERM"
        )
    if (path / "metrics.json").exists():
        raise BertTasksError(
            f"--resume: {path} holds a finished run (metrics.json); nothing to continue, "
            "pass --overwrite to train it again"
        )


__all__ = ["train"]
