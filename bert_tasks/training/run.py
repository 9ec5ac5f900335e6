"""THE training loop: `train(cfg) -> output dir`, one Accelerate loop for every task.

It knows no task: reading, encoding, collating and scoring come from `cfg.task`'s Task. Accelerate owns
devices, processes (`accelerate launch`), mixed precision and gradient accumulation; this file owns the
order of things: read -> encode -> load -> optimise -> evaluate -> keep the best -> save.
"""

from __future__ import annotations

import json
import math
import shlex
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from accelerate.utils import set_seed
from datasets import Dataset
from tqdm.auto import tqdm
from transformers import get_linear_schedule_with_warmup

from bert_tasks.allocator import reuse_freed_memory
from bert_tasks.checkpoints import (
    BEST_DIR,
    full_state_dict,
    latest_checkpoint,
    load_best,
    load_checkpoint,
    load_run_state,
    save_best,
    save_checkpoint,
)
from bert_tasks.config import Config, save_config
from bert_tasks.data.batching import eval_loader, model_inputs, train_loader
from bert_tasks.errors import BertTasksError
from bert_tasks.inference import collect_window_logits
from bert_tasks.modeling.load import load_model, load_tokenizer
from bert_tasks.modeling.patch import set_attention_dropout
from bert_tasks.precision import resolve_mixed_precision
from bert_tasks.stopping import StopWatch, TrainingInterrupted
from bert_tasks.tasks import Task, get_task
from bert_tasks.viz import plot_training_curves

#: What a run writes into its output dir (recipe.yaml first of all); any of them marks the dir as a run.
RUN_FILES = ("recipe.yaml", "train_log.jsonl", "metrics.json", "checkpoints", "best")


@dataclass
class RunState:
    """What the loop tracks between steps; saved with each checkpoint so a resumed run continues."""

    global_step: int = 0
    epoch: int = 0
    best_metric: float | None = None
    best_step: int | None = None
    best_scores: dict[str, Any] | None = None
    evals_without_improvement: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    #: The loss summed since the last log record (mean over processes) and its micro-batch count, so a
    #: run resumed between two log records writes the record the uninterrupted run would have.
    loss_since_log: float = 0.0
    micro_steps_since_log: int = 0


def train(cfg: Config) -> Path:
    """Fine-tune `cfg.model` on `cfg.task` and return the directory holding the saved model."""
    task = get_task(cfg)
    metric_name = cfg.metric_for_best or task.default_metric
    if metric_name not in task.metric_names:
        raise BertTasksError(
            f"metric_for_best={metric_name!r} is not a {task.name} metric; "
            f"choose one of {', '.join(task.metric_names)}"
        )
    # Accelerate keeps one process-wide state; a second train() in the same process (a sweep, a notebook,
    # the test suite) with another mixed_precision would be refused. Reset it, keeping the process group.
    AcceleratorState._reset_state(reset_partial_state=False)
    accelerator = Accelerator(
        # Without cpu=True, processes launched on a machine with no GPU (`accelerate launch --multi_gpu`,
        # torchrun) would each train alone on all the data instead of joining one gloo process group.
        cpu=not torch.accelerator.is_available(),
        mixed_precision=resolve_mixed_precision(cfg.mixed_precision),
        gradient_accumulation_steps=cfg.grad_accum,
    )
    if accelerator.device.type == "cpu":
        reuse_freed_memory()  # every step allocates the same large tensors again
    output_dir, replace_previous = _check_output_dir(cfg)
    set_seed(cfg.seed)
    tokenizer = load_tokenizer(cfg.model)

    with accelerator.main_process_first():
        raw = task.read(cfg)
        labels = task.label_names(raw["train"], cfg)
        label2id = {label: i for i, label in enumerate(labels)}
        encoded = {
            split: task.encode(data, tokenizer, label2id, cfg.max_length, cfg.stride)
            for split, data in raw.items()
        }

    model = load_model(cfg.model, task.name, labels, allow_pickle=cfg.allow_pickle)
    if cfg.attention_dropout is not None:
        set_attention_dropout(model, cfg.attention_dropout)
    _create_output_dir(cfg, output_dir, replace_previous, accelerator)
    model.config.bert_tasks = _inference_policy(cfg)
    if cfg.gradient_checkpointing:
        model.activation_checkpointing_enable()

    collate = task.collator(tokenizer)
    train_batches = train_loader(
        encoded["train"], collate, cfg.batch_size, cfg.seed, accelerator.num_processes
    )
    eval_batches = (
        eval_loader(encoded["validation"], collate, cfg.eval_batch_size) if "validation" in encoded else None
    )
    model, optimizer, train_batches = accelerator.prepare(model, _adamw(model, cfg), train_batches)
    if eval_batches is not None:
        eval_batches = accelerator.prepare(eval_batches)
    updates_per_epoch = math.ceil(len(train_batches) / cfg.grad_accum)  # per process, after sharding
    total_updates = cfg.max_steps or max(1, math.ceil(cfg.epochs * updates_per_epoch))
    # Accelerate's scheduler wrapper steps once per process per update, hence the factor.
    processes = accelerator.num_processes
    scheduler = accelerator.prepare(
        get_linear_schedule_with_warmup(
            optimizer, int(cfg.warmup_ratio * total_updates) * processes, total_updates * processes
        )
    )

    state = RunState()
    if cfg.resume:
        state = _resume(accelerator, model, output_dir)
    _log_start(accelerator, cfg, len(encoded["train"]), total_updates, output_dir)
    log_path = output_dir / "train_log.jsonl"
    progress = tqdm(
        total=total_updates,
        initial=state.global_step,
        desc="train",
        disable=not accelerator.is_local_main_process,
    )
    running_loss = torch.full((), state.loss_since_log, device=accelerator.device)
    micro_steps, examples = state.micro_steps_since_log, 0
    window_start = time.perf_counter()
    # A run checkpointed at its very end (Ctrl-C at the last update) has only _finish left to do.
    stop = state.global_step >= total_updates or _out_of_patience(cfg, state)

    with StopWatch(accelerator) as watch, progress:
        while not stop:
            model.train()
            train_batches.set_epoch(state.epoch)
            # On resume, skip the micro-batches the checkpointed run had already consumed in this epoch.
            done = min(
                (state.global_step - state.epoch * updates_per_epoch) * cfg.grad_accum, len(train_batches)
            )
            for batch in accelerator.skip_first_batches(train_batches, done) if done else train_batches:
                with accelerator.accumulate(model):
                    loss = model(**model_inputs(batch)).loss
                    accelerator.backward(loss)
                    if accelerator.sync_gradients:
                        grad_norm = accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                    optimizer.step()
                    scheduler.step()
                    optimizer.zero_grad(set_to_none=True)
                running_loss += loss.detach()
                micro_steps += 1
                examples += len(batch["row"]) * accelerator.num_processes
                if not accelerator.sync_gradients:
                    continue

                state.global_step += 1
                progress.update(1)
                watch.record_loss(running_loss, state.global_step)
                end_of_epoch = state.global_step % updates_per_epoch == 0
                last = state.global_step >= total_updates
                log_due = state.global_step % cfg.logging_steps == 0 or last
                eval_due = eval_batches is not None and (
                    last
                    or (cfg.eval_every and state.global_step % cfg.eval_every == 0)
                    or (not cfg.eval_every and end_of_epoch)
                )
                save_due = bool(cfg.save_every and state.global_step % cfg.save_every == 0) or (
                    cfg.save_each_epoch and end_of_epoch
                )
                # Checked before anything is logged, evaluated or saved: a NaN never reaches best/.
                bad_step, interrupted = watch.poll(due=log_due or eval_due or save_due)
                if bad_step is not None:
                    raise _diverged(cfg, "the training loss", bad_step, state, output_dir)
                if log_due:
                    mean_loss = accelerator.reduce(running_loss, "mean").item() / micro_steps
                    elapsed = time.perf_counter() - window_start
                    record = {
                        "step": state.global_step,
                        "epoch": round(state.global_step / updates_per_epoch, 3),
                        "loss": round(mean_loss, 5),
                        "lr": scheduler.get_last_lr()[0],
                        # None under DeepSpeed until its engine has computed a norm (it clips by itself).
                        "grad_norm": None if grad_norm is None else round(float(grad_norm), 4),
                        "examples_per_s": round(examples / elapsed, 1),
                    }
                    progress.set_postfix(
                        loss=f"{mean_loss:.4f}", lr=f"{record['lr']:.2e}", ex_s=record["examples_per_s"]
                    )
                    _append_log(accelerator, log_path, record, state)
                    running_loss.zero_()
                    micro_steps = examples = 0
                    window_start = time.perf_counter()
                if eval_due:
                    eval_start = time.perf_counter()
                    scores = _evaluate(
                        task, model, eval_batches, raw["validation"], encoded["validation"], accelerator
                    )
                    if scores is None:
                        what = "the model's outputs on the validation data"
                        raise _diverged(cfg, what, state.global_step, state, output_dir)
                    stop = _track_best(cfg, accelerator, model, scores, metric_name, state, output_dir)
                    record = {"step": state.global_step, **_prefixed(scores, "eval")}
                    _append_log(accelerator, log_path, record, state)
                    model.train()
                    window_start += time.perf_counter() - eval_start  # throughput counts training time only
                if save_due or interrupted:
                    checkpoint = _save_checkpoint(
                        cfg, accelerator, model, output_dir, state, running_loss, micro_steps
                    )
                if interrupted:
                    raise _interrupted(cfg, state.global_step, checkpoint, output_dir)
                if last or stop:
                    stop = True
                    break
            state.epoch += 1
    return _finish(cfg, task, accelerator, model, tokenizer, raw, encoded, state, metric_name, output_dir)


def _finish(
    cfg: Config,
    task: Task,
    accelerator: Accelerator,
    model: torch.nn.Module,
    tokenizer: Any,
    raw: dict[str, Dataset],
    encoded: dict[str, Dataset],
    state: RunState,
    metric_name: str,
    output_dir: Path,
) -> Path:
    """Restore the best weights, score every held-out split, save model + tokenizer + recipe + metrics."""
    best_dir = output_dir / BEST_DIR
    unwrapped = accelerator.unwrap_model(model)
    if state.best_step is not None:
        load_best(unwrapped, output_dir)
        accelerator.wait_for_everyone()  # every process has read best/ before the main one deletes it
    metrics: dict[str, Any] = {"best_step": state.best_step, "metric_for_best": metric_name}
    if state.best_scores is not None:
        metrics["validation"] = state.best_scores  # scored when it was the best; no second pass
    for split in ("validation", "test"):
        if split in encoded and split not in metrics:
            loader = accelerator.prepare(
                eval_loader(encoded[split], task.collator(tokenizer), cfg.eval_batch_size)
            )
            scores = _evaluate(task, model, loader, raw[split], encoded[split], accelerator)
            if scores is None:
                raise _diverged(
                    cfg, f"the model's outputs on the {split} data", state.global_step, state, output_dir
                )
            metrics[split] = scores
    weights = full_state_dict(accelerator, model)  # every process: gathering FSDP shards is collective
    if accelerator.is_main_process:
        unwrapped.save_pretrained(output_dir, state_dict=weights)
        tokenizer.save_pretrained(output_dir)
        (output_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        plot_training_curves(state.history, output_dir / "training_curves.png")
        shutil.rmtree(best_dir, ignore_errors=True)
        _print_summary(metrics, metric_name, output_dir)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return output_dir


def _evaluate(
    task: Task,
    model: torch.nn.Module,
    loader: Any,
    raw: Dataset,
    encoded: Dataset,
    accelerator: Accelerator,
) -> dict[str, Any] | None:
    """The task's scores, or None when the model's outputs hold NaN/inf: a diverged model scores nothing."""
    logits = collect_window_logits(model, loader, len(encoded), accelerator, description="evaluate")
    if not all(np.isfinite(window).all() for window in logits):
        return None
    id2label = accelerator.unwrap_model(model).config.id2label
    return task.metrics(raw, encoded, logits, id2label)


def _track_best(
    cfg: Config,
    accelerator: Accelerator,
    model: torch.nn.Module,
    scores: dict[str, Any],
    metric_name: str,
    state: RunState,
    output_dir: Path,
) -> bool:
    """Save the weights when `metric_name` improves; return True when early stopping says stop."""
    value = float(scores[metric_name])
    if state.best_metric is None or value > state.best_metric:
        state.best_metric, state.best_step, state.evals_without_improvement = value, state.global_step, 0
        state.best_scores = scores
        weights = full_state_dict(accelerator, model)  # every process: gathering FSDP shards is collective
        if accelerator.is_main_process:
            save_best(accelerator.unwrap_model(model), output_dir, weights)
        accelerator.wait_for_everyone()
        return False
    state.evals_without_improvement += 1
    return _out_of_patience(cfg, state)


def _out_of_patience(cfg: Config, state: RunState) -> bool:
    """Early stopping: `early_stopping_patience` evaluations in a row without improvement."""
    return (
        bool(cfg.early_stopping_patience) and state.evals_without_improvement >= cfg.early_stopping_patience
    )


def _save_checkpoint(
    cfg: Config,
    accelerator: Accelerator,
    model: torch.nn.Module,
    output_dir: Path,
    state: RunState,
    running_loss: torch.Tensor,
    micro_steps: int,
) -> Path:
    """Checkpoint this update with the loss not logged yet, so a resumed run logs what this one would."""
    state.loss_since_log = accelerator.reduce(running_loss, "mean").item()
    state.micro_steps_since_log = micro_steps
    return save_checkpoint(
        accelerator, model, output_dir, state.global_step, asdict(state), cfg.keep_checkpoints
    )


def _diverged(cfg: Config, what: str, step: int, state: RunState, output_dir: Path) -> BertTasksError:
    """The one line for a NaN/inf loss or output; best/ keeps the last finite improvement."""
    kept = ""
    if state.best_step is not None:
        kept = f"; the best weights so far (step {state.best_step}) are in {output_dir / BEST_DIR}"
    return BertTasksError(
        f"training diverged: {what} became NaN/inf at step {step}; lower lr (now {cfg.lr:g}) or use "
        f"mixed_precision=bf16 instead of fp16, and train again{kept}"
    )


def _interrupted(cfg: Config, step: int, checkpoint: Path, output_dir: Path) -> TrainingInterrupted:
    """Where the Ctrl-C checkpoint is and the command that continues from it (the saved recipe)."""
    recipe = shlex.quote(str(output_dir / "recipe.yaml"))
    return TrainingInterrupted(
        f"interrupted at step {step}; checkpoint saved to {checkpoint}; "
        f"continue with: bert-tasks finetune {cfg.task} --recipe {recipe} --resume"
    )


def _adamw(model: torch.nn.Module, cfg: Config) -> torch.optim.Optimizer:
    """AdamW without decay on biases and LayerNorm weights (BERT's recipe), fused kernel where available."""
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (no_decay if param.ndim < 2 else decay).append(param)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # The fused kernel is one op per step instead of several per parameter: ~110 ms -> ~17 ms per step
    # for MiniLM on two CPU cores, which matters when steps on short sentences take ~100 ms.
    return torch.optim.AdamW(groups, lr=cfg.lr, fused=True)


def _inference_policy(cfg: Config) -> dict[str, Any]:
    """How inputs were windowed and decoded; saved in config.json so prediction does the same."""
    return {
        "task": cfg.task,
        "max_length": cfg.max_length,
        "stride": cfg.stride,
        "label_all_subtokens": cfg.label_all_subtokens,
        "viterbi": cfg.viterbi,
    }


def _check_output_dir(cfg: Config) -> tuple[Path, bool]:
    """Refuse to mix two runs in one directory; return it and whether a previous run is to be replaced.

    Every process checks (so all of them stop with the same error) before anything is read or written.
    """
    output_dir = Path(cfg.output_dir or f"runs/{cfg.task}")
    if cfg.resume:
        if latest_checkpoint(output_dir) is None:
            raise BertTasksError(
                f"--resume: {output_dir} holds no complete checkpoint (checkpoints/step-*); "
                "runs write them with save_every=N or save_each_epoch=true, and on Ctrl-C"
            )
        if (output_dir / "metrics.json").exists():
            raise BertTasksError(
                f"--resume: {output_dir} holds a finished run (metrics.json); nothing to continue, "
                "pass --overwrite to train it again"
            )
        return output_dir, False
    replace_previous = output_dir.exists() and any(output_dir.iterdir())
    if replace_previous and not cfg.overwrite:
        raise BertTasksError(
            f"output_dir {output_dir} is not empty; pass --overwrite to replace it, "
            "--resume to continue its run, or choose another output_dir"
        )
    if replace_previous and not any((output_dir / name).exists() for name in RUN_FILES):
        raise BertTasksError(
            f"output_dir {output_dir} is not a bert-tasks run (no {', '.join(RUN_FILES)}); "
            "refusing to delete it, choose another output_dir"
        )
    return output_dir, replace_previous


def _create_output_dir(
    cfg: Config, output_dir: Path, replace_previous: bool, accelerator: Accelerator
) -> None:
    """Replace the previous run (only on `overwrite`) and write recipe.yaml, once data and model loaded.

    So a bad file or model dir leaves `output_dir` as it was. Only the main process deletes and creates:
    several processes deleting one tree race each other. recipe.yaml records the run, not how this
    command started it (`resume`, `overwrite`), so reusing it as a recipe never resumes or deletes.
    """
    accelerator.wait_for_everyone()  # every process has looked before the main one changes anything
    if accelerator.is_main_process:
        if replace_previous:
            shutil.rmtree(output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        save_config(replace(cfg, resume=False, overwrite=False), output_dir / "recipe.yaml")
    accelerator.wait_for_everyone()


def _resume(accelerator: Accelerator, model: torch.nn.Module, output_dir: Path) -> RunState:
    """Restore model, optimizer, scheduler, RNG states and the loop's own state from the newest checkpoint."""
    checkpoint = latest_checkpoint(output_dir)
    load_checkpoint(accelerator, model, checkpoint)
    state = RunState(**load_run_state(checkpoint))
    if accelerator.is_main_process:
        print(f"resuming from {checkpoint}")
        # The log may hold records written after the checkpoint; the resumed run writes them again.
        records = "".join(json.dumps(record) + "\n" for record in state.history)
        (output_dir / "train_log.jsonl").write_text(records)
    return state


def _append_log(accelerator: Accelerator, path: Path, record: dict[str, Any], state: RunState) -> None:
    state.history.append(record)
    if accelerator.is_main_process:
        with path.open("a") as log:
            log.write(json.dumps(record) + "\n")


def _prefixed(scores: dict[str, Any], prefix: str) -> dict[str, float]:
    """The scalar metrics of an evaluation, for the log and the curves."""
    return {f"{prefix}_{k}": v for k, v in scores.items() if isinstance(v, int | float)}


def _log_start(
    accelerator: Accelerator, cfg: Config, num_windows: int, total_updates: int, output_dir: Path
) -> None:
    if not accelerator.is_main_process:
        return
    effective = cfg.batch_size * cfg.grad_accum * accelerator.num_processes
    print(
        f"bert-tasks finetune {cfg.task}: model {cfg.model} | {num_windows} training windows | "
        f"{accelerator.num_processes} process(es) on {accelerator.device} | "
        f"batch {cfg.batch_size} per device x accum {cfg.grad_accum} = effective {effective} | "
        f"{total_updates} updates | "
        f"precision {accelerator.mixed_precision} | output {output_dir}"
    )


def _print_summary(metrics: dict[str, Any], metric_name: str, output_dir: Path) -> None:
    for split in ("validation", "test"):
        if split in metrics:
            scalars = ", ".join(f"{k} {v:.4f}" for k, v in metrics[split].items() if isinstance(v, float))
            print(f"{split}: {scalars}")
    best = f" (best {metric_name} at step {metrics['best_step']})" if metrics["best_step"] is not None else ""
    print(f"model saved to {output_dir}{best}")
