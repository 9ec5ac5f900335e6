"""`train(cfg) -> model dir`: set up, loop, finish — the one training entry point for every task.

Everything that can be checked without a model is checked here first, before torch and transformers
load: the output dir (taken for this run at once, so a second run on it is refused), `--resume`'s
checkpoint, the trackers `report_to` names (installed, and a logs/ dir of the run's own to write into),
every data file (read and validated whole), a base model path that does not exist and, for a distill
run, the teacher against the data and the student (`training/distill.py`). A mistake in any
of them is answered in a second, and leaves the output dir as it was.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bert_tasks.config import AUTO
from bert_tasks.data.in_memory import split_data
from bert_tasks.data.splits import read_training_splits, without_demo_files
from bert_tasks.errors import BertTasksError
from bert_tasks.model_dir import check_dir_positions, check_model_name
from bert_tasks.pruning.heads import check_removable, heads_by_layer, read_shape
from bert_tasks.tasks import get_task
from bert_tasks.training.checkpoints import latest_checkpoint
from bert_tasks.training.class_weights import check_class_weights
from bert_tasks.training.distill import DistillPlan, plan_distillation
from bert_tasks.training.output_dir import OutputDir
from bert_tasks.training.trackers import LOGS_DIR, check_logs_dir, resolve_trackers

if TYPE_CHECKING:
    from bert_tasks.config import Config
    from bert_tasks.tasks.base import Task
    from bert_tasks.training.run import Run


def check_needs_validation(cfg: Config, has_validation: bool) -> None:
    """Refuse settings that act on validation scores in a run that has none: they would do nothing."""
    if has_validation:
        return
    if cfg.eval_at_start:
        raise BertTasksError(
            "eval_at_start=true: no validation split to score the model on before training; give "
            "validation_file= (or validation_split=), or drop eval_at_start"
        )
    if cfg.early_stopping_patience not in (AUTO, 0):
        raise BertTasksError(
            f"early_stopping_patience={cfg.early_stopping_patience}: no validation split to stop on; give "
            "validation_file= (or validation_split=), or drop early_stopping_patience"
        )


def train(cfg: Config, data: Any = None) -> Path:
    """Fine-tune `cfg.model` on `cfg.task` and return the directory holding the saved model.

    `data`: in-memory splits instead of files (`bert_tasks/data/in_memory.py`): one split (the training
    data) or a mapping of split name -> split, each a list of records, a pandas DataFrame or a
    `datasets.Dataset`, with the columns the config names. The task's demo files then go unused.
    With `cfg.seeds`, one run per seed under `output_dir/seed-N`, and their scores' mean +- std in
    `output_dir/seeds.json` (`training/seeds.py`); the dir returned is `output_dir`.
    """
    task = get_task(cfg)
    if data is not None:
        cfg = without_demo_files(task, cfg)
    if cfg.seeds:
        from bert_tasks.training.seeds import train_seeds

        return train_seeds(cfg, lambda one: train(one, data), data)
    if cfg.teacher is not None:  # a distill run's model is where its student starts (as load_recipe sets it)
        cfg = replace(cfg, model=cfg.student or cfg.teacher)
    check_model_name(cfg.model)
    output = claim_output_dir(cfg)
    try:
        # With --overwrite the claim has already refused anything foreign; what is there goes.
        foreign_logs = not cfg.overwrite and output.is_foreign(LOGS_DIR)
        check_logs_dir(output.path, resolve_trackers(cfg.report_to), foreign_logs)
        check_prune_heads(cfg)
        check_dir_positions(cfg.max_length, cfg.model)
        check_weight_average(cfg)
        raw, cfg = read_training_splits(task, cfg, data)  # an auto split that carved is named by its share
        if "train" not in raw:
            raise BertTasksError("no training data; set train_file or a dataset with a train split")
        check_needs_validation(cfg, "validation" in raw)
        if cfg.label_names is not None or isinstance(cfg.class_weights, list):
            # Given names are checked before anything is inferred (and logged); the run derives its own.
            labels = task.label_names(raw["train"], cfg)
        inferred = task.infer_options(raw["train"], cfg)
        if inferred:  # saved in recipe.yaml and the model's policy like options the user gave
            cfg = replace(cfg, **inferred)
            task = get_task(cfg)
        if isinstance(cfg.class_weights, list):
            check_class_weights(cfg.class_weights, labels)
        plan = plan_distillation(cfg, task, raw) if cfg.teacher is not None else None
        in_memory = list(split_data(data)) if data is not None else []
        run = _start(cfg, task, raw, output, in_memory, plan)
    except BaseException:
        output.abandon()  # a dir this run created and never wrote to goes again; the lock is released
        raise
    try:
        run.loop()
        return run.finish()
    finally:
        output.release()


def _start(
    cfg: Config,
    task: Task,
    raw: dict[str, Any],
    output: OutputDir,
    in_memory: list[str],
    plan: DistillPlan | None,
) -> Run:
    """The set-up Run, or DistillRun with a teacher; torch, transformers, accelerate load only now."""
    if plan is None:
        from bert_tasks.training.run import Run

        return Run.setup(cfg, task, raw, output, in_memory)
    from bert_tasks.training.distill_run import DistillRun

    return DistillRun.setup(cfg, task, raw, output, in_memory, plan=plan)


def claim_output_dir(cfg: Config) -> OutputDir:
    """Take `output_dir` for this run, or refuse in one line (in use, not ours to replace, nothing to resume).

    Under `accelerate launch` every process checks, but only the main one (RANK 0) takes the lock.
    """
    path = Path(cfg.output_dir if cfg.output_dir is not None else f"runs/{cfg.task}")
    reads = [
        Path(p)
        for p in (
            cfg.train_file,
            cfg.validation_file,
            cfg.test_file,
            cfg.model,
            cfg.teacher,
            cfg.transfer_file,
        )
        if p is not None
    ]
    if cfg.resume:
        _check_resumable(path)
    main = os.environ.get("RANK", "0") == "0"
    return OutputDir.claim(path, overwrite=cfg.overwrite, resume=cfg.resume, reads=reads, lock=main)


def check_prune_heads(cfg: Config) -> None:
    """`prune_heads=` against a local model dir's config.json, before torch loads (a hub id's after)."""
    config = Path(cfg.model).expanduser() / "config.json"
    if cfg.prune_heads and config.is_file():
        check_removable(heads_by_layer(cfg.prune_heads), read_shape(config.parent), cfg.model)


def check_weight_average(cfg: Config) -> None:
    """`ema_decay` under a sharding launcher, before torch loads: its processes each hold one shard of the
    weights, and a checkpoint would keep only the main process's shard of the average."""
    sharded = [name for name, flag in _SHARDING_LAUNCHERS.items() if _env_flag(flag)]
    if cfg.ema_decay and sharded:
        raise BertTasksError(
            f"ema_decay={cfg.ema_decay:g} is not supported under {sharded[0]}, whose processes hold "
            "different shards of the weights; set ema_decay=0, or launch with DDP (--multi_gpu)"
        )


#: what `accelerate launch` sets in each process's environment for the launchers that shard the weights
_SHARDING_LAUNCHERS = {"FSDP": "ACCELERATE_USE_FSDP", "DeepSpeed": "ACCELERATE_USE_DEEPSPEED"}


def _env_flag(name: str) -> bool:
    """Accelerate's own reading of a flag (`str_to_bool`), without importing it (it imports torch)."""
    return os.environ.get(name, "false").strip().lower() in {"y", "yes", "t", "true", "on", "1"}


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
