"""THE training loop: `train(cfg) -> output dir`, one Accelerate loop for every task.

It knows no task: reading, encoding, collating and scoring come from `cfg.task`'s Task. Accelerate owns
devices, processes (`accelerate launch`), mixed precision and gradient accumulation; this file owns the
order of things: read -> encode -> load -> optimise -> evaluate -> keep the best -> save.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from accelerate.utils import set_seed
from datasets import Dataset
from safetensors.torch import load_file
from tqdm.auto import tqdm
from transformers import get_linear_schedule_with_warmup

from bert_tasks.checkpoints import latest_checkpoint, load_run_state, save_checkpoint
from bert_tasks.config import Config, save_config
from bert_tasks.data.batching import eval_loader, model_inputs, train_loader
from bert_tasks.errors import BertTasksError
from bert_tasks.inference import collect_window_logits
from bert_tasks.modeling.load import load_model, load_tokenizer
from bert_tasks.precision import resolve_mixed_precision
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
    output_dir = _prepare_output_dir(cfg, accelerator)
    set_seed(cfg.seed)
    if accelerator.is_main_process:
        save_config(cfg, output_dir / "recipe.yaml")
    tokenizer = load_tokenizer(cfg.model)

    with accelerator.main_process_first():
        raw = task.read(cfg)
        labels = task.label_names(raw["train"], cfg)
        label2id = {label: i for i, label in enumerate(labels)}
        encoded = {
            split: task.encode(data, tokenizer, label2id, cfg.max_length, cfg.stride)
            for split, data in raw.items()
        }

    model = load_model(cfg.model, task.name, labels)
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
        state = _resume(accelerator, output_dir)
    _log_start(accelerator, cfg, len(encoded["train"]), total_updates, output_dir)
    log_path = output_dir / "train_log.jsonl"
    progress = tqdm(
        total=total_updates,
        initial=state.global_step,
        desc="train",
        disable=not accelerator.is_local_main_process,
    )
    running_loss = torch.zeros((), device=accelerator.device)
    micro_steps = examples = 0
    window_start = time.perf_counter()
    stop = False

    while not stop:
        model.train()
        train_batches.set_epoch(state.epoch)
        # On resume, skip the micro-batches the checkpointed run had already consumed in this epoch.
        done = min((state.global_step - state.epoch * updates_per_epoch) * cfg.grad_accum, len(train_batches))
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
            if state.global_step % cfg.logging_steps == 0 or state.global_step == total_updates:
                mean_loss = accelerator.reduce(running_loss, "mean").item() / micro_steps
                if not math.isfinite(mean_loss):
                    raise BertTasksError(
                        f"loss became {mean_loss} at step {state.global_step}; lower lr (now {cfg.lr}) "
                        "or use mixed_precision=bf16 instead of fp16"
                    )
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

            end_of_epoch = state.global_step % updates_per_epoch == 0
            last = state.global_step >= total_updates
            due = (cfg.eval_every and state.global_step % cfg.eval_every == 0) or (
                not cfg.eval_every and end_of_epoch
            )
            if eval_batches is not None and (due or last):
                eval_start = time.perf_counter()
                scores = _evaluate(
                    task, model, eval_batches, raw["validation"], encoded["validation"], accelerator
                )
                stop = _track_best(cfg, accelerator, model, scores, metric_name, state, output_dir)
                _append_log(
                    accelerator, log_path, {"step": state.global_step, **_prefixed(scores, "eval")}, state
                )
                model.train()
                window_start += time.perf_counter() - eval_start  # throughput counts training time only
            if cfg.save_every and state.global_step % cfg.save_every == 0:
                save_checkpoint(accelerator, output_dir, state.global_step, asdict(state))
            if last or stop:
                stop = True
                break
        state.epoch += 1
    progress.close()
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
    best_dir = output_dir / "best"
    unwrapped = accelerator.unwrap_model(model)
    if state.best_step is not None:
        unwrapped.load_state_dict(load_file(best_dir / "model.safetensors"))
        accelerator.wait_for_everyone()  # every process has read best/ before the main one deletes it
    metrics: dict[str, Any] = {"best_step": state.best_step, "metric_for_best": metric_name}
    if state.best_scores is not None:
        metrics["validation"] = state.best_scores  # scored when it was the best; no second pass
    for split in ("validation", "test"):
        if split in encoded and split not in metrics:
            loader = accelerator.prepare(
                eval_loader(encoded[split], task.collator(tokenizer), cfg.eval_batch_size)
            )
            metrics[split] = _evaluate(task, model, loader, raw[split], encoded[split], accelerator)
    if accelerator.is_main_process:
        unwrapped.save_pretrained(output_dir)
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
) -> dict[str, Any]:
    logits = collect_window_logits(model, loader, len(encoded), accelerator, description="evaluate")
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
        if accelerator.is_main_process:
            accelerator.unwrap_model(model).save_pretrained(output_dir / "best")
        accelerator.wait_for_everyone()
        return False
    state.evals_without_improvement += 1
    return (
        bool(cfg.early_stopping_patience) and state.evals_without_improvement >= cfg.early_stopping_patience
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


def _prepare_output_dir(cfg: Config, accelerator: Accelerator) -> Path:
    """Refuse to mix two runs in one directory; delete nothing but a previous run, and only on `overwrite`.

    Every process checks (so all of them stop with the same error), then only the main one deletes and
    creates: several processes deleting one tree race each other.
    """
    output_dir = Path(cfg.output_dir or f"runs/{cfg.task}")
    if cfg.resume:
        if latest_checkpoint(output_dir) is None:
            raise BertTasksError(
                f"--resume: {output_dir} holds no complete checkpoint (checkpoints/step-*); "
                "runs write them with save_every=N"
            )
        return output_dir
    replace = output_dir.exists() and any(output_dir.iterdir())
    if replace and not cfg.overwrite:
        raise BertTasksError(
            f"output_dir {output_dir} is not empty; pass --overwrite to replace it, "
            "--resume to continue its run, or choose another output_dir"
        )
    if replace and not any((output_dir / name).exists() for name in RUN_FILES):
        raise BertTasksError(
            f"output_dir {output_dir} is not a bert-tasks run (no {', '.join(RUN_FILES)}); "
            "refusing to delete it, choose another output_dir"
        )
    accelerator.wait_for_everyone()  # every process has looked before the main one changes anything
    if accelerator.is_main_process:
        if replace:
            shutil.rmtree(output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
    accelerator.wait_for_everyone()
    return output_dir


def _resume(accelerator: Accelerator, output_dir: Path) -> RunState:
    """Restore model, optimizer, scheduler, RNG states and the loop's own state from the newest checkpoint."""
    checkpoint = latest_checkpoint(output_dir)
    accelerator.load_state(str(checkpoint))
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
