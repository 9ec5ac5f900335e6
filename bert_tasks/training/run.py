"""THE training loop as one object: `Run.setup` -> `run.loop()` -> `run.finish()`, for every task.

It knows no task: encoding, collating and scoring come from the run's Task. Accelerate owns devices,
processes (`accelerate launch`), mixed precision and gradient accumulation; this file owns the order of
things: encode -> load -> optimise -> evaluate -> keep the best -> save. Everything the run tracks lives
on the Run: its progress (`RunState`, saved with each checkpoint) and the loss not yet logged
(`LossWindow`), so a resumed run continues exactly where the checkpointed one was.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import shlex
import shutil
import time
from collections.abc import Collection
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from accelerate.utils import DistributedType, ProjectConfiguration, set_seed
from datasets import Dataset
from tqdm.auto import tqdm
from transformers import get_linear_schedule_with_warmup

from bert_tasks.config import AUTO, Config, save_config
from bert_tasks.data.batching import eval_loader, train_loader
from bert_tasks.data.fingerprint import rows_digest
from bert_tasks.data.validation_split import AUTO_MIN_ROWS
from bert_tasks.errors import BertTasksError
from bert_tasks.inference.quantize import weight_bytes
from bert_tasks.inference.windows import collect_window_logits
from bert_tasks.insight.plots import plot_training_curves
from bert_tasks.model_card import (
    MODEL_CARD,
    RunFacts,
    describe_data,
    in_memory_note,
    library_versions,
    run_card,
    versions_note,
)
from bert_tasks.model_dir import POLICY_KEY, ModelPolicy, check_positions
from bert_tasks.modeling.encoders import attention_path, require_fused
from bert_tasks.modeling.load import check_tokenizer_fits, load_model, load_tokenizer
from bert_tasks.modeling.patch import set_attention_dropout
from bert_tasks.pruning.heads import check_removable, heads_by_layer, shape_of
from bert_tasks.runtime import (
    logs_above_progress_bars,
    openmp_waits,
    progress_bars_wanted,
    resolve_mixed_precision,
)
from bert_tasks.tasks.base import Task
from bert_tasks.training.checkpoints import (
    ANOTHER_RUNS_CHECKPOINT,
    BEST_DIR,
    full_state_dict,
    latest_checkpoint,
    load_best,
    load_checkpoint,
    load_run_state,
    save_best,
    save_checkpoint,
    written_whole,
)
from bert_tasks.training.class_weights import resolve_class_weights
from bert_tasks.training.gradients import GradientBook
from bert_tasks.training.objectives import TaskLoss
from bert_tasks.training.optimizer import adamw
from bert_tasks.training.output_dir import OutputDir
from bert_tasks.training.stopping import StopSignals, TrainingInterrupted
from bert_tasks.training.together import failing_together
from bert_tasks.training.trackers import (
    LOGS_DIR,
    PROJECT,
    hyperparameters,
    resolve_trackers,
    tracker_options,
    tracker_scalars,
)
from bert_tasks.training.weight_average import WeightAverage, saved_decay

logger = logging.getLogger(__name__)

#: Where the final model dir is written before its files move into output_dir.
STAGING_DIR = ".model.tmp"
#: Keys of a checkpoint's run_state.json that hold the LossWindow, not the RunState.
_WINDOW_KEYS = ("loss_since_log", "micro_steps_since_log")
#: The key of run_state.json that records what the run was trained with: labels, head, plan settings.
_TRAINED_WITH = "trained_with"
#: Settings a resumed run must keep, and why: each fixes the plan of updates (their batches, their number,
#: the learning rate at each) or lives in the optimizer's saved state, so a new value on --resume would
#: silently continue another plan from this one's state, or be ignored. `ema_decay`: `_check_same_average`.
PLAN_SETTINGS = {
    "batch_size": "it makes each epoch's batches, so the updates per epoch and the batches already done",
    "grad_accum": "it sets the micro-batches per update, so the updates per epoch and the batches done",
    "epochs": "with max_steps=0 it sets the number of updates the learning rate decays over",
    "max_steps": "it sets the number of updates the learning rate decays over",
    "warmup_ratio": "it sets the updates the learning rate warms up over",
    "lr": "the optimizer's saved state and schedule keep the learning rate the run started with",
    "layer_lr_decay": "the optimizer's saved state keeps each layer's learning rate",
    "weight_decay": "the optimizer's saved state keeps the weight decay the run started with",
    "seed": "it orders each epoch's batches, so which ones the checkpoint had done",
    "max_train_samples": "it picks the training rows, so each epoch's batches",
    "max_length": "it cuts the texts into windows, so each epoch's batches",
    "stride": "it cuts the texts into windows, so each epoch's batches",
}
#: `early_stopping_patience=auto`: stop once this many epochs' evaluations bring no improvement. Two, not
#: one: dev scores wander by about a point from epoch to epoch (BENCHMARKS.md, "Defaults chosen by a
#: protocol"), and one flat epoch would stop runs that were still learning.
AUTO_PATIENCE_EPOCHS = 2


@dataclass
class RunState:
    """How far the run is; saved with each checkpoint so a resumed run continues."""

    global_step: int = 0
    epoch: int = 0
    best_metric: float | None = None
    best_step: int | None = None
    best_scores: dict[str, Any] | None = None
    evals_without_improvement: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class LossWindow:
    """What the next log record averages: the loss summed since the last one, kept on the device.

    Reading the loss every micro-batch would wait for the device each time; the sum is read only when a
    record is written or a checkpoint saves it.
    """

    total: torch.Tensor
    micro_steps: int = 0
    examples: int = 0
    started: float = field(default_factory=time.perf_counter)

    def add(self, loss: torch.Tensor, examples: int) -> None:
        self.total += loss.detach()
        self.micro_steps += 1
        self.examples += examples

    def restart(self) -> None:
        self.total.zero_()
        self.micro_steps = self.examples = 0
        self.started = time.perf_counter()


@dataclass(frozen=True)
class Due:
    """What an optimizer update is due for."""

    log: bool
    evaluate: bool
    save: bool
    last: bool


class Run:
    """One fine-tuning run; build it with `Run.setup`.

    `DistillRun` (training/distill_run.py) is this run with a teacher: it overrides the hooks below that
    say which labels, rows, model and objective the run trains (`_label_names`, `_add_training_rows`,
    `_build_model`, `_objective`) and what metrics.json records besides (`_provenance`); the loop is this one.
    """

    #: The command that runs (and resumes) it, for the start line and the Ctrl-C line.
    command = "finetune"

    def __init__(self, cfg: Config, task: Task, raw: dict[str, Dataset], output: OutputDir) -> None:
        self.cfg, self.task, self.raw, self.output = cfg, task, raw, output
        self.output_dir = output.path
        self.metric_name = cfg.metric_for_best or task.default_metric
        self.state = RunState()
        self.stopped = False
        self.grad_norm: torch.Tensor | None = None
        self.gradients: GradientBook | None = None
        self.average: WeightAverage | None = None

    @classmethod
    def setup(
        cls,
        cfg: Config,
        task: Task,
        raw: dict[str, Dataset],
        output: OutputDir,
        in_memory: Collection[str] = (),
        **context: Any,
    ) -> Run:
        """Accelerator, tokenizer, encoded splits, model, loaders, optimizer, schedule; resumed if asked.

        `in_memory` names the splits given as in-memory data (the card and recipe.yaml say so); `context`
        goes to the constructor (a DistillRun's plan)."""
        run = cls(cfg, task, raw, output, **context)
        run._start_accelerator()
        set_seed(cfg.seed)
        run.tokenizer = load_tokenizer(cfg.model, **task.tokenizer_options)
        run.labels = run._label_names()
        run.data_sources = describe_data(
            cfg, raw, in_memory
        )  # sizes and SHA-256 of what was read, for the card
        label2id = {label: i for i, label in enumerate(run.labels)}
        with run.accelerator.main_process_first():
            run.encoded = {
                split: task.encode(data, run.tokenizer, label2id, cfg.max_length, cfg.stride)
                for split, data in raw.items()
            }
        run.class_weights = resolve_class_weights(
            cfg.class_weights, run.labels, run.encoded["train"]["labels"]
        )
        run._add_training_rows()  # after the class weights: they count gold labels only
        run._load_model()
        run._prepare_training()
        if cfg.resume:
            run._resume()
        run._write_recipe()  # only now: a model or checkpoint that does not load leaves output_dir as it was
        run._start_trackers()
        run._log_start()
        return run

    # Setting up.

    def _start_accelerator(self) -> None:
        # Accelerate keeps one process-wide state; a second train() in the same process (a sweep, a
        # notebook, the test suite) with another mixed_precision would be refused. Reset it, keeping the
        # process group.
        AcceleratorState._reset_state(reset_partial_state=False)
        if self.cfg.threads is not None:
            torch.set_num_threads(self.cfg.threads)
        self.trackers = resolve_trackers(self.cfg.report_to)
        self.accelerator = Accelerator(
            # Without cpu=True, processes launched on a machine with no GPU (`accelerate launch
            # --multi_gpu`, torchrun) would each train alone on all the data instead of joining one gloo
            # process group.
            cpu=not torch.accelerator.is_available(),
            mixed_precision=resolve_mixed_precision(self.cfg.mixed_precision),
            gradient_accumulation_steps=self.cfg.grad_accum,
            log_with=list(self.trackers) or None,
            project_config=ProjectConfiguration(
                project_dir=str(self.output_dir), logging_dir=str(self.output_dir / LOGS_DIR)
            ),
        )

    def _label_names(self) -> list[str]:
        """The run's labels in id order: the training data's."""
        return self.task.label_names(self.raw["train"], self.cfg)

    def _add_training_rows(self) -> None:
        """Encoded rows to train on besides the labelled ones (none here)."""

    def _build_model(self) -> torch.nn.Module:
        """The model to train: `cfg.model` with the task's head for the run's labels."""
        cfg = self.cfg
        return load_model(
            cfg.model, self.task.name, self.labels, allow_pickle=cfg.allow_pickle, attention=cfg.attention
        )

    def _objective(self, weights: torch.Tensor | None) -> Any:
        """What the loop minimises per batch, called as `objective(model, batch)`."""
        return TaskLoss(weights)

    def _load_model(self) -> None:
        cfg = self.cfg
        model = self._build_model()
        self.task.prepare_model(model)
        check_tokenizer_fits(self.tokenizer, model, cfg.model)
        check_positions(cfg.max_length, model.config.max_position_embeddings, cfg.model)
        if cfg.prune_heads:
            require_fused(model.config, "prune_heads=", cfg.model, "drop prune_heads, or train a BERT")
            heads = heads_by_layer(cfg.prune_heads)
            check_removable(heads, shape_of(model.config, cfg.model), cfg.model)
            model.prune_heads(heads)
        if cfg.attention_dropout is not None:
            todo = "drop attention_dropout (the model's config.json sets its attention dropout)"
            require_fused(model.config, "attention_dropout=", cfg.model, todo)
            set_attention_dropout(model, cfg.attention_dropout)
        if self.task.problem_type is not None:  # the head's loss, and how vanilla transformers reads it
            model.config.problem_type = self.task.problem_type
        setattr(model.config, POLICY_KEY, self._policy())
        if cfg.gradient_checkpointing:
            model.activation_checkpointing_enable()
        if cfg.freeze_embeddings:
            # No gradient, no AdamW state: half of MiniLM's parameters left out of every update.
            model.get_input_embeddings().weight.requires_grad_(False)
        self.model = model

    def _policy(self) -> dict[str, Any]:
        """The policy saved with the weights: the config's windows and the task's options as they stand
        (settled by the data, and by validation at the end of the run)."""
        return ModelPolicy.for_run(self.cfg, self.task.option_values).to_json()

    def _write_recipe(self) -> None:
        """Replace the previous run (on `overwrite`) and write recipe.yaml, once data, model and (on
        `resume`) checkpoint loaded.

        So a bad file, model dir or checkpoint leaves `output_dir` as it was. Only the main process deletes
        and writes: several processes deleting one tree race each other. recipe.yaml records the run, not how
        this command started it (`resume`, `overwrite`): the precision Accelerate runs (never `auto`) and,
        as a comment, the library versions; reusing it as a recipe repeats the run, never resumes or deletes.
        """
        self.recipe = replace(
            self.cfg,
            validation_split=self._recorded_validation_split(),
            resume=False,
            overwrite=False,
            mixed_precision=self.accelerator.mixed_precision,
            report_to=",".join(self.trackers) or "none",
        )
        self.versions = library_versions()
        self.accelerator.wait_for_everyone()  # every process has looked before the main one changes anything
        with failing_together(self.accelerator, "writing recipe.yaml"):
            if self.accelerator.is_main_process:
                if self.cfg.overwrite:
                    self.output.clear_previous()
                self.output.record("recipe.yaml", self.log_path.name)
                notes = [versions_note(self.versions), *in_memory_note(self.data_sources)]
                notes += [self.class_weights.describe()] if self.class_weights is not None else []
                save_config(self.recipe, self.output_dir / "recipe.yaml", notes)

    def _recorded_validation_split(self) -> float | str | None:
        """recipe.yaml's `validation_split`: none for an auto that found no validation set and carved
        none (too few rows), so a later `prune` or `compress` on the model dir refuses at its plan check
        instead of finding no validation split half-way; a share carved is already a number here."""
        if self.cfg.validation_split == AUTO and "validation" not in self.raw:
            return None
        return self.cfg.validation_split

    def _prepare_training(self) -> None:
        cfg, accelerator = self.cfg, self.accelerator
        self.collate = self.task.collator(self.tokenizer)
        batches = train_loader(
            self.encoded["train"], self.collate, cfg.batch_size, cfg.seed, accelerator.num_processes
        )
        self.model, self.optimizer, self.train_batches = accelerator.prepare(
            self.model, adamw(self.model, cfg.lr, cfg.weight_decay, cfg.layer_lr_decay), batches
        )
        # One process only: DDP, FSDP and DeepSpeed reduce and clip gradients their own way (gradients.py).
        single = accelerator.distributed_type == DistributedType.NO
        self.gradients = (
            GradientBook(self.model, touched_rows=cfg.embedding_grad == "touched_rows") if single else None
        )
        self.average = self._weight_average()
        self.eval_batches = None
        if "validation" in self.encoded:
            self.eval_batches = accelerator.prepare(
                eval_loader(self.encoded["validation"], self.collate, cfg.eval_batch_size)
            )
        self.updates_per_epoch = math.ceil(len(self.train_batches) / cfg.grad_accum)  # per process, sharded
        self.total_updates = cfg.max_steps or max(1, math.ceil(cfg.epochs * self.updates_per_epoch))
        self.eval_every = self._evaluation_interval()
        self.patience = self._patience()
        # Accelerate's scheduler wrapper steps once per process per update, hence the factor.
        processes = accelerator.num_processes
        warmup = int(cfg.warmup_ratio * self.total_updates) * processes
        schedule = get_linear_schedule_with_warmup(self.optimizer, warmup, self.total_updates * processes)
        self.scheduler = accelerator.prepare(schedule)
        self.window = LossWindow(torch.zeros((), device=accelerator.device))
        weights = self.class_weights
        self.loss = self._objective(
            None if weights is None else torch.tensor(weights.weights, device=accelerator.device)
        )
        self.log_path = self.output_dir / "train_log.jsonl"

    def _weight_average(self) -> WeightAverage | None:
        """The weights' moving average (`ema_decay`), saved with each checkpoint; none when it is 0."""
        if not self.cfg.ema_decay:  # (refused under FSDP and DeepSpeed before torch loaded)
            return None
        average = WeightAverage(self.accelerator.unwrap_model(self.model), self.cfg.ema_decay)
        self.accelerator.register_for_checkpointing(average)
        return average

    def _evaluation_interval(self) -> int:
        """`eval_every`, or 0 (each epoch) when it is longer than the run: the best checkpoint would else be
        chosen from one evaluation, at the very end."""
        every = self.cfg.eval_every
        if every > self.total_updates and self.eval_batches is not None:
            logger.warning(
                "eval_every=%d is longer than the run (%d updates): evaluating at each epoch's end instead",
                every,
                self.total_updates,
            )
            return 0
        return every

    def _patience(self) -> int:
        """`early_stopping_patience` in evaluations; auto: as many as `AUTO_PATIENCE_EPOCHS` epochs hold,
        so a run evaluated every few hundred updates is not stopped by one noisy stretch of them."""
        given = self.cfg.early_stopping_patience
        if given != AUTO:
            return given
        per_epoch = self.updates_per_epoch / self.eval_every if self.eval_every else 1
        return max(AUTO_PATIENCE_EPOCHS, math.ceil(AUTO_PATIENCE_EPOCHS * per_epoch))

    def _resume(self) -> None:
        """Restore model, optimizer, scheduler, RNG states, the run's state and its unlogged loss."""
        checkpoint = latest_checkpoint(self.output_dir)
        saved = load_run_state(checkpoint)
        trained_with = saved.pop(_TRAINED_WITH, None)  # None: a checkpoint of an older bert-tasks
        if trained_with is not None:
            self._check_same_labels(checkpoint, trained_with)
            self._check_same_plan(checkpoint, trained_with.get("settings", {}))
            self._check_same_rows(checkpoint, trained_with.get("train_rows"))
        self._check_same_average(checkpoint)
        load_checkpoint(self.accelerator, self.model, checkpoint)
        window = {key: saved.pop(key) for key in _WINDOW_KEYS}
        self.state = RunState(**saved)
        self.window.total.fill_(window["loss_since_log"])
        self.window.micro_steps = window["micro_steps_since_log"]
        with failing_together(self.accelerator, "rewriting train_log.jsonl"):
            if self.accelerator.is_main_process:
                logger.info("resuming from %s", checkpoint)
                # The log may hold records written after the checkpoint; the resumed run writes them again.
                history = "".join(json.dumps(record) + "\n" for record in self.state.history)
                self.log_path.write_text(history)

    def _check_same_average(self, checkpoint: Path) -> None:
        """A resumed run averages as it was started: a changed `ema_decay` would make it another run (and
        an average added on resume has no saved state to continue from)."""
        saved = saved_decay(checkpoint)
        if saved != self.cfg.ema_decay:
            raise _changed_setting(checkpoint, "ema_decay", saved, self.cfg.ema_decay)

    def _trained_with(self) -> dict[str, Any]:
        """What a checkpoint records so that --resume can refuse another run's data or plan (see
        `_check_same_labels`, `_check_same_plan`)."""
        settings = {key: getattr(self.cfg, key) for key in PLAN_SETTINGS}
        rows = {"rows": len(self.encoded["train"]), "sha256": self._train_digest}
        return {
            "labels": self.labels,
            "problem_type": self.task.problem_type,
            "settings": settings,
            "train_rows": rows,
        }

    @functools.cached_property
    def _train_digest(self) -> str:
        """The encoded training rows' digest (`rows_digest`), taken once: the rows do not change in a run."""
        return rows_digest(self.encoded["train"])

    def _check_same_labels(self, checkpoint: Path, trained_with: dict[str, Any]) -> None:
        """The checkpoint's head is for its labels: other labels (or another label shape) are another run,
        not a damaged checkpoint, and nothing in it is to be deleted."""
        saved = (list(trained_with["labels"]), trained_with["problem_type"])
        asked = (list(self.labels), self.task.problem_type)
        if saved != asked:
            raise BertTasksError(
                f"--resume: {checkpoint} was trained with {_head(*saved)}, this run's data and settings give "
                f"{_head(*asked)}; {ANOTHER_RUNS_CHECKPOINT}"
            )

    def _check_same_rows(self, checkpoint: Path, saved: dict[str, Any] | None) -> None:
        """A resumed run trains on the rows it was started on: with others (another train file, the same
        file edited, another tokenizer) the checkpoint's place in the epoch points at other batches."""
        if saved is None:  # a checkpoint of a bert-tasks that did not record them
            return
        rows = len(self.encoded["train"])
        if saved["rows"] != rows:
            found = f"was trained on {saved['rows']:,} encoded training rows, this run reads {rows:,}"
        elif saved["sha256"] != self._train_digest:
            found = f"was trained on other training rows than this run reads (as many, {rows:,}, but other"
            found += " texts, labels or token ids: another train file, the file edited, or another tokenizer)"
        else:
            return
        raise BertTasksError(f"--resume: {checkpoint} {found}; {ANOTHER_RUNS_CHECKPOINT}")

    def _check_same_plan(self, checkpoint: Path, settings: dict[str, Any]) -> None:
        """A resumed run continues the plan it was started with (`PLAN_SETTINGS` says why for each)."""
        cfg = self.cfg
        changed = [key for key in PLAN_SETTINGS if key in settings and settings[key] != getattr(cfg, key)]
        if settings.get("max_steps") and "max_steps" not in changed and "epochs" in changed:
            changed.remove("epochs")  # max_steps > 0 sets the run's length: epochs plans nothing
        if not changed:
            return
        key, more = changed[0], f" (and {len(changed) - 1} more setting(s))" if len(changed) > 1 else ""
        raise _changed_setting(checkpoint, key, settings[key], getattr(cfg, key), more, PLAN_SETTINGS[key])

    def _start_trackers(self) -> None:
        """Start Accelerate's trackers (main process), after `overwrite` cleared the previous run's logs/.

        A resumed run's TensorBoard already holds the original run's hyper-parameters: only trackers that
        start a new run of their own (wandb, MLflow) are given them again.
        """
        if not self.trackers:
            return
        accelerator, options = self.accelerator, {}
        with failing_together(accelerator, "starting the trackers"):
            if accelerator.is_main_process:
                self.output.record(LOGS_DIR)
                (self.output_dir / LOGS_DIR).mkdir(exist_ok=True)
                options = tracker_options(self.trackers, self.output_dir, self.state.global_step + 1)
                accelerator.init_trackers(PROJECT, init_kwargs=options)
                params = hyperparameters(self.recipe)
                for tracker in accelerator.trackers:
                    if not (self.cfg.resume and tracker.name == "tensorboard"):
                        tracker.store_init_configuration(params)

    def _log_start(self) -> None:
        if not self.accelerator.is_main_process:
            return
        cfg, accelerator = self.cfg, self.accelerator
        effective = cfg.batch_size * cfg.grad_accum * accelerator.num_processes
        logger.info(
            f"bert-tasks {self.command} {cfg.task}: model {cfg.model} | "
            f"{len(self.encoded['train'])} training windows | "
            f"{accelerator.num_processes} process(es) on {accelerator.device} | "
            f"batch {cfg.batch_size} per device x accum {cfg.grad_accum} = effective {effective} | "
            f"{self.total_updates} updates | precision {accelerator.mixed_precision} | "
            f"{torch.get_num_threads()} CPU thread(s), OpenMP waits {openmp_waits()} | "
            f"output {self.output_dir} | trackers {', '.join(self.trackers) or 'none'}"
        )
        gradient = self.gradients.describe if self.gradients is not None else "dense"
        gradient = "none (frozen)" if self.cfg.freeze_embeddings else gradient
        logger.info(f"attention: {attention_path(accelerator.unwrap_model(self.model))}")
        logger.info(f"word-embedding gradient: {gradient}")
        if self.class_weights is not None:
            logger.info(self.class_weights.describe())
        if self.average is not None:
            logger.info(
                f"weight average: decay {self.average.decay:g} (warming up over the first updates); the "
                "average is evaluated, kept and saved"
            )
        if self.eval_batches is not None:
            stopping = f"after {self.patience} evaluation(s) without improvement" if self.patience else "off"
            logger.info(f"early stopping: {stopping} (best checkpoint by {self.metric_name})")
        elif self.cfg.validation_split == AUTO:  # said here, not at the read: a refusal stays one line
            logger.info(
                f"validation_split=auto: {len(self.raw['train'])} training row(s) are too few to carve a "
                f"validation set from (fewer than {AUTO_MIN_ROWS}); every row trains and the last step's "
                "model is kept"
            )

    # The loop.

    def loop(self) -> None:
        """Train until the last update, early stopping, divergence (raises) or Ctrl-C/SIGTERM (raises)."""
        progress = tqdm(
            total=self.total_updates,
            initial=self.state.global_step,
            desc="train",
            disable=not (self.accelerator.is_local_main_process and progress_bars_wanted()),
        )
        # A run checkpointed at its very end (Ctrl-C at the last update) has only `finish` left to do.
        self.stopped = self.state.global_step >= self.total_updates or self._out_of_patience()
        with StopSignals(self.accelerator) as self.signals, progress, logs_above_progress_bars():
            self.progress = progress
            if self.cfg.eval_at_start and self.state.global_step == 0:  # a resumed run scored it already
                self._evaluate_and_keep_best()
            while not self.stopped:
                self.model.train()
                self.train_batches.set_epoch(self.state.epoch)
                for batch in self._batches_left_in_epoch():
                    self._micro_step(batch)
                    if self.accelerator.sync_gradients:
                        self._after_update()
                        if self.stopped:
                            break
                self.state.epoch += 1

    def _batches_left_in_epoch(self) -> Any:
        """The epoch's micro-batches; on resume, without those the checkpointed run had consumed."""
        done = (self.state.global_step - self.state.epoch * self.updates_per_epoch) * self.cfg.grad_accum
        done = min(done, len(self.train_batches))
        return self.accelerator.skip_first_batches(self.train_batches, done) if done else self.train_batches

    def _micro_step(self, batch: dict[str, torch.Tensor]) -> None:
        accelerator = self.accelerator
        with accelerator.accumulate(self.model):
            loss = self.loss(self.model, batch)
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                self.grad_norm = self._clipped_norm()
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            if accelerator.sync_gradients and self.gradients is not None:
                self.gradients.cleared()
            if accelerator.sync_gradients and self.average is not None:
                self.average.update()
        self.window.add(loss, len(batch["row"]) * accelerator.num_processes)

    def _clipped_norm(self) -> torch.Tensor | None:
        """The gradients' norm before clipping (0 = measured, never clipped: an infinite bound)."""
        max_norm = self.cfg.max_grad_norm
        if self.gradients is None:
            return self.accelerator.clip_grad_norm_(self.model.parameters(), max_norm or math.inf)
        self.accelerator.unscale_gradients()  # fp16's loss scale, as Accelerate's clipping does first
        return self.gradients.clip(max_norm)

    def _after_update(self) -> None:
        """Log, evaluate, checkpoint or stop, as this update is due; a NaN never reaches best/."""
        state = self.state
        state.global_step += 1
        self.progress.update(1)
        self.signals.record_loss(self.window.total, state.global_step)
        due = self._due()
        bad_step, interrupted = self.signals.poll(due=due.log or due.evaluate or due.save)
        if bad_step is not None:
            raise self._diverged("the training loss", bad_step)
        if due.log:
            self._log_loss()
        if due.evaluate:
            self._evaluate_and_keep_best()
        checkpoint = self._save_checkpoint() if due.save or interrupted else None
        if interrupted:
            raise self._interrupted(checkpoint)
        self.stopped = self.stopped or due.last

    def _due(self) -> Due:
        cfg, step = self.cfg, self.state.global_step
        end_of_epoch = step % self.updates_per_epoch == 0
        last = step >= self.total_updates
        evaluate = self.eval_batches is not None and (
            last
            or (self.eval_every and step % self.eval_every == 0)
            or (not self.eval_every and end_of_epoch)
        )
        save = bool(cfg.save_every and step % cfg.save_every == 0) or (cfg.save_each_epoch and end_of_epoch)
        return Due(log=step % cfg.logging_steps == 0 or last, evaluate=bool(evaluate), save=save, last=last)

    def _log_loss(self) -> None:
        window = self.window
        mean_loss = self.accelerator.reduce(window.total, "mean").item() / window.micro_steps
        record = {
            "step": self.state.global_step,
            "epoch": round(self.state.global_step / self.updates_per_epoch, 3),
            "loss": round(mean_loss, 5),
            "lr": self.scheduler.get_last_lr()[0],
            # None under DeepSpeed until its engine has computed a norm (it clips by itself).
            "grad_norm": None if self.grad_norm is None else round(float(self.grad_norm), 4),
            "examples_per_s": round(window.examples / (time.perf_counter() - window.started), 1),
        }
        self.progress.set_postfix(
            loss=f"{mean_loss:.4f}", lr=f"{record['lr']:.2e}", ex_s=record["examples_per_s"]
        )
        self._append_log(record)
        window.restart()

    def _evaluate_and_keep_best(self) -> None:
        started = time.perf_counter()
        with self._averaged():  # with ema_decay, the average is what is scored and kept
            scores = self._scores(self.eval_batches, "validation")
            self._keep_if_best(scores)
        self._append_log({"step": self.state.global_step, **_prefixed(scores, "eval")})
        if self.accelerator.is_main_process:
            logger.info(self._evaluation_line(scores))
        self.model.train()
        self.window.started += time.perf_counter() - started  # throughput counts training time only

    def _evaluation_line(self, scores: dict[str, Any]) -> str:
        """`step 250/6315 (epoch 1.19) | validation accuracy 0.8620, macro_f1 0.8617 | best accuracy 0.8620
        (step 250)`: what Trainer, spaCy and Flair print after each evaluation."""
        state, metric = self.state, self.metric_name
        epoch = state.global_step / self.updates_per_epoch
        return (
            f"step {state.global_step}/{self.total_updates} (epoch {epoch:.2f}) | "
            f"validation {_scalars(scores, self.task.metric_names)} | "
            f"best {metric} {state.best_metric:.4f} (step {state.best_step})"
        )

    def _keep_if_best(self, scores: dict[str, Any]) -> None:
        """Save the weights when the metric improves; stop once early stopping's patience is spent."""
        state, value = self.state, float(scores[self.metric_name])
        if state.best_metric is not None and value <= state.best_metric:
            state.evals_without_improvement += 1
            self.stopped = self._out_of_patience()
            return
        state.best_metric, state.best_step, state.evals_without_improvement = value, state.global_step, 0
        state.best_scores = scores
        weights = full_state_dict(self.accelerator, self.model)  # every process: gathering FSDP shards
        with failing_together(self.accelerator, "saving the best weights"):
            if self.accelerator.is_main_process:
                self.output.record(BEST_DIR, f"{BEST_DIR}.tmp")  # a kill mid-write leaves best.tmp: ours too
                save_best(self.accelerator.unwrap_model(self.model), self.output_dir, weights)

    def _averaged(self) -> Any:
        """The weights' average swapped into the model for a block (`ema_decay`), else the live weights."""
        return self.average.swapped_in() if self.average is not None else contextlib.nullcontext()

    def _out_of_patience(self) -> bool:
        """Early stopping: `early_stopping_patience` evaluations in a row without improvement."""
        return bool(self.patience) and self.state.evals_without_improvement >= self.patience

    def _scores(self, loader: Any, split: str, calibrate: bool = False) -> dict[str, Any]:
        """The task's scores on one split; a model whose outputs hold NaN/inf has diverged. `calibrate`:
        the task first tunes its options on these logits (multi-label thresholds, on validation)."""
        logits = collect_window_logits(
            self.model, loader, len(self.encoded[split]), self.accelerator, description="evaluate"
        )
        if not all(np.isfinite(window).all() for window in logits):
            raise self._diverged(f"the model's outputs on the {split} data", self.state.global_step)
        id2label = self.accelerator.unwrap_model(self.model).config.id2label
        if calibrate:
            self.task.calibrate(self.raw[split], self.encoded[split], logits, id2label)
        return self.task.metrics(self.raw[split], self.encoded[split], logits, id2label)

    def _save_checkpoint(self) -> Path:
        """Checkpoint this update with the loss not logged yet, so a resumed run logs what this one would."""
        window = {
            "loss_since_log": self.accelerator.reduce(self.window.total, "mean").item(),
            "micro_steps_since_log": self.window.micro_steps,
        }
        with failing_together(self.accelerator, "recording the checkpoints dir"):
            if self.accelerator.is_main_process:
                self.output.record("checkpoints")
        return save_checkpoint(
            self.accelerator,
            self.model,
            self.output_dir,
            self.state.global_step,
            {**asdict(self.state), **window, _TRAINED_WITH: self._trained_with()},
            self.cfg.keep_checkpoints,
        )

    def _append_log(self, record: dict[str, Any]) -> None:
        """One record to train_log.jsonl and the same scalars, at the same step, to the trackers."""
        self.state.history.append(record)
        with failing_together(self.accelerator, "writing train_log.jsonl"):
            if self.accelerator.is_main_process:
                with self.log_path.open("a") as log:
                    log.write(json.dumps(record) + "\n")
                self.accelerator.log(tracker_scalars(record), step=record["step"])

    def _diverged(self, what: str, step: int) -> BertTasksError:
        """The one line for a NaN/inf loss or output; best/ keeps the last finite improvement."""
        kept = ""
        if self.state.best_step is not None:
            kept = (
                f"; the best weights so far (step {self.state.best_step}) are in {self.output_dir / BEST_DIR}"
            )
        return BertTasksError(
            f"training diverged: {what} became NaN/inf at step {step}; lower lr (now {self.cfg.lr:g}) or use "
            f"mixed_precision=bf16 instead of fp16, and train again{kept}"
        )

    def _interrupted(self, checkpoint: Path | None) -> TrainingInterrupted:
        """Where the checkpoint is and the command that continues from it (the saved recipe)."""
        recipe = shlex.quote(str(self.output_dir / "recipe.yaml"))
        signal_number = self.signals.signal_number
        return TrainingInterrupted(
            f"interrupted at step {self.state.global_step}; checkpoint saved to {checkpoint}; "
            f"continue with: bert-tasks {self.command} {self.cfg.task} --recipe {recipe} --resume",
            *([] if signal_number is None else [signal_number]),
        )

    # Finishing.

    def finish(self) -> Path:
        """Restore the best weights, score every held-out split, save model + tokenizer + card + metrics."""
        accelerator, state = self.accelerator, self.state
        unwrapped = accelerator.unwrap_model(self.model)
        if state.best_step is not None:
            load_best(unwrapped, self.output_dir)
            accelerator.wait_for_everyone()  # every process has read best/ before the main one deletes it
        elif self.average is not None:  # no validation: the last step's average is the model
            self.average.copy_into_model()
        metrics: dict[str, Any] = {"best_step": state.best_step, "metric_for_best": self.metric_name}
        calibrate = self.task.calibrates and "validation" in self.encoded
        if state.best_scores is not None and not calibrate:
            metrics["validation"] = state.best_scores  # scored when it was the best; no second pass
        for split in ("validation", "test"):  # validation first: a task that calibrates tunes on it
            if split in self.encoded and split not in metrics:
                loader = eval_loader(self.encoded[split], self.collate, self.cfg.eval_batch_size)
                metrics[split] = self._scores(
                    accelerator.prepare(loader), split, calibrate and split == "validation"
                )
        setattr(unwrapped.config, POLICY_KEY, self._policy())
        metrics.update(self._provenance())
        weights = full_state_dict(accelerator, self.model)  # every process: gathering FSDP shards
        with failing_together(accelerator, "saving the model"):
            if accelerator.is_main_process:
                self._save_model(unwrapped, weights, metrics)
                for line in self._summary(metrics):
                    logger.info(line)
        self._release_processes()
        return self.output_dir

    def _summary(self, metrics: dict[str, Any]) -> list[str]:
        """The run's last lines: the best step, each split's scores, where the model is, what to run next."""
        cfg, state, names = self.cfg, self.state, self.task.metric_names
        if state.best_step is None:
            lines = [f"no validation split: the model is the last step's ({state.global_step})"]
        else:
            lines = [f"best {self.metric_name} {state.best_metric:.4f} at step {state.best_step}"]
        for split, role in (("validation", "picked the best step"), ("test", "held out")):
            if split in metrics:
                lines.append(f"{split} ({role}): {_scalars(metrics[split], names)}")
        model = shlex.quote(str(self.output_dir))
        data = next((path for path in (cfg.test_file, cfg.validation_file) if path is not None), None)
        lines += [
            f"model saved to {self.output_dir}",
            f'next: bert-tasks predict {cfg.task} --model {model} "your text here"',
            f"      bert-tasks evaluate {cfg.task} --model {model} --data "
            + (shlex.quote(data) if data is not None else "FILE"),
        ]
        return lines

    def _release_processes(self) -> None:
        """Drop the prepared objects, then end the process group while every process is still there.

        DDP's reducer holds the process group: freed only when train() returned, after another process
        had exited, gloo's destructor could wait forever for that peer (seen under load in
        tests/test_distributed.py). Freed first, with a barrier behind it, nothing waits on a process gone.
        """
        if self.gradients is not None:
            self.gradients.release()
        self.model = self.optimizer = self.scheduler = self.train_batches = self.eval_batches = None
        self.accelerator.free_memory()
        self.accelerator.wait_for_everyone()
        self.accelerator.end_training()

    def _save_model(
        self, model: torch.nn.Module, weights: dict[str, torch.Tensor], metrics: dict[str, Any]
    ) -> None:
        """Write the model dir beside the run (`.model.tmp`), then move its files in; metrics.json last.

        metrics.json marks a finished run, so a failed write (a full disk) never leaves a dir that looks
        finished: the staging dir is removed and the line says what is intact (best/, checkpoints). A file
        of the user's in output_dir (a README.md added to a resumed run's dir) is never replaced.
        """
        output_dir = self.output_dir
        staging = output_dir / STAGING_DIR
        self.output.record(STAGING_DIR)  # before anything is written there, so --overwrite may clear it
        shutil.rmtree(staging, ignore_errors=True)
        needed = weight_bytes(model) + 2**20  # the weights, and about 1 MiB of tokenizer and plots
        with written_whole(staging, f"the model to {output_dir}", needed, self._what_is_intact()):
            model.save_pretrained(staging, state_dict=self.task.saved_weights(model, weights))
            self.tokenizer.save_pretrained(staging)
            plot_training_curves(self.state.history, staging / "training_curves.png")
            facts = RunFacts(output_dir, self.recipe, self.labels, self.data_sources, metrics, self.versions)
            (staging / MODEL_CARD).write_text(str(run_card(facts, self.task)), encoding="utf-8")
            (staging / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        names = sorted(path.name for path in staging.iterdir())
        for name in [name for name in names if self.output.is_foreign(name)]:
            logger.warning(
                "output_dir %s holds %s, which no bert-tasks run wrote: kept it; the run's %s is not saved",
                output_dir,
                name,
                name,
            )
            (staging / name).unlink()
            names.remove(name)
        self.output.record(*names)
        for name in sorted(names, key=lambda name: name == "metrics.json"):
            os.replace(staging / name, output_dir / name)
        staging.rmdir()
        shutil.rmtree(output_dir / BEST_DIR, ignore_errors=True)

    def _provenance(self) -> dict[str, Any]:
        """What metrics.json records beside the scores of the run's own splits (nothing here)."""
        return {}

    def _what_is_intact(self) -> str:
        best = self.output_dir / BEST_DIR
        checkpoint = latest_checkpoint(self.output_dir)
        if self.state.best_step is not None and best.is_dir():
            return f"no model was saved; the best weights (step {self.state.best_step}) are intact in {best}"
        if checkpoint is not None:
            return f"no model was saved; the last complete checkpoint is {checkpoint} (free space, --resume)"
        return "no model was saved"


def _head(labels: list[str], problem_type: str | None) -> str:
    """`labels negative, positive` or `label value (regression)`: what a head was trained for, in words."""
    shown = ", ".join(labels[:8]) + (f", ... ({len(labels)} in all)" if len(labels) > 8 else "")
    return f"label{'s' if len(labels) != 1 else ''} {shown}" + (f" ({problem_type})" if problem_type else "")


def _changed_setting(
    checkpoint: Path, key: str, saved: Any, asked: Any, more: str = "", why: str = ""
) -> BertTasksError:
    """The one line of a --resume that asks for another value of a setting the checkpoint was saved with."""
    reason = f" ({why})" if why else ""
    was, now = _shown(saved), _shown(asked)
    return BertTasksError(
        f"--resume: {checkpoint} was saved with {key}={was}, this run asks for {key}={now}{more}; resume "
        f"with {key}={was}{reason}, or train again with --overwrite"
    )


def _shown(value: Any) -> str:
    """A setting as it is written on the command line (`none`, `3`, `5e-05`)."""
    if value is None:
        return "none"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _prefixed(scores: dict[str, Any], prefix: str) -> dict[str, float]:
    """The scalar metrics of an evaluation, for the log and the curves."""
    return {f"{prefix}_{k}": v for k, v in scores.items() if isinstance(v, int | float)}


def _scalars(scores: dict[str, Any], names: tuple[str, ...]) -> str:
    """`accuracy 0.8620, macro_f1 0.8617`: the task's named metrics, in its order."""
    return ", ".join(f"{name} {scores[name]:.4f}" for name in names if name in scores)
