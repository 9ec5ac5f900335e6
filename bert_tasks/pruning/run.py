"""`bert-tasks prune`: score the heads, remove the least important ones step by step, recover, write a dir.

Michel et al. 2019's iterative pruning: score every head on the validation split (`insight.head_importance`,
normalised per layer), remove the lowest-scored heads (`plan.choose_heads`), score the smaller model on
validation, score the heads again, and so on until the asked number is gone. Optional recovery then
fine-tunes the pruned model for `recover_steps` updates with `train(cfg)`, the one training loop, on the
model's own training data (its recipe.yaml) or the files given: a run from the source dir with those heads
removed (`prune_heads`), which scores the pruned model before its first update, so the best-checkpoint
rule never ends it worse on validation than pruning left it. The result is a model dir like any other:
config.json's `pruned_heads` records what went, the weights hold the smaller shapes, and `load_model`
rebuilds them; beside it pruning.json (every step's heads and scores, and the recovery's) and
pruning.png, listed in the dir's manifest with the rest.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bert_tasks.data.splits import SPLIT_FILES, read_splits
from bert_tasks.errors import BertTasksError
from bert_tasks.inference.evaluate import check_known_labels
from bert_tasks.model_dir import label_names
from bert_tasks.output_paths import CommandOutput
from bert_tasks.pruning.plan import PrunePlan, choose_heads, plan_pruning, recovery_config
from bert_tasks.tasks import task_class
from bert_tasks.training.output_dir import OutputDir

if TYPE_CHECKING:
    import numpy as np
    from datasets import Dataset

    from bert_tasks.model_dir import FinetunedModel
    from bert_tasks.tasks.base import Task

logger = logging.getLogger(__name__)

#: What `prune` writes beside the model files.
RECORD_FILE = "pruning.json"
PLOT_FILE = "pruning.png"


def prune(
    task: str,
    model_dir: str | Path,
    heads: str,
    out_dir: str | Path | None = None,
    overrides: Sequence[str] = (),
) -> Path:
    """Remove `heads` (a fraction or a count) of the model's attention heads; return the new model dir.

    `overrides`: `steps=K` (pruning steps; default one per 10% of the heads), `recover_steps=S` (recovery
    fine-tuning updates; default 0) and config keys: the data (`validation_file=`, ...) and, with
    recovery, the training settings (`lr=`, ...) over the model's recipe.yaml and recovery's defaults
    (`plan.recovery_config`).

    Raises:
        BertTasksError: everything `plan_pruning` refuses (before torch loads), an `out_dir` that exists and
            is not empty, data that does not read or holds labels the model does not know; a failure
            removes what was written.
    """
    plan = plan_pruning(task, model_dir, heads, out_dir, overrides)
    todo = "pass --out a new directory you can write to"
    with CommandOutput(plan.out_dir, f"prune output {plan.out_dir}", todo, fresh=True) as target:
        raw = _read_data(plan)
        from bert_tasks.model_dir import load_finetuned  # torch and transformers: once the data is good

        loaded = load_finetuned(plan.model_dir, task, allow_pickle=plan.cfg.allow_pickle)
        record = _Pruning(plan, loaded, raw).run()
        if plan.recover_steps:
            record["recovery"] = _recover(plan, record)
        else:
            with target.writing():
                _save(plan, loaded, record)
            record["recovery"] = None
        with target.writing():
            _write_report(plan, loaded, record)
    logger.info("pruned model saved to %s (%s, %s)", plan.out_dir, RECORD_FILE, PLOT_FILE)
    return plan.out_dir


def _read_data(plan: PrunePlan) -> dict[str, Dataset]:
    """The splits of the plan's config, checked against the model's labels (before the model loads)."""
    model_task = task_class(plan.policy.task)(**plan.policy.task_options)
    raw = read_splits(model_task, plan.cfg)
    known = label_names(plan.model_dir)
    for split in ("validation", "test"):
        if split in raw:
            source = getattr(plan.cfg, SPLIT_FILES[split]) or f"{split} data"
            check_known_labels(model_task, raw[split], plan.cfg, known, source, "prune")
    if not plan.recover_steps:
        return raw
    if "train" not in raw:
        raise BertTasksError(
            f"recover_steps={plan.recover_steps}: {plan.cfg.dataset} has no training split; give train_file="
        )
    trained = model_task.label_names(raw["train"], plan.cfg)
    if trained != known:
        raise BertTasksError(
            f"recover_steps={plan.recover_steps}: the training data's labels ({', '.join(trained)}) are not "
            f"the model's ({', '.join(known)}), in the model's order; the head would start fresh; give "
            "train_file= with the model's labels (label_names= sets their order)"
        )
    return raw


class _Pruning:
    """The pruning steps on one loaded model, scored on the validation split."""

    def __init__(self, plan: PrunePlan, loaded: FinetunedModel, raw: dict[str, Dataset]) -> None:
        import torch

        self.plan, self.loaded, self.raw = plan, loaded, raw
        self.task: Task = loaded.task
        self.metric = plan.cfg.metric_for_best or self.task.default_metric
        if plan.cfg.threads is not None:
            torch.set_num_threads(plan.cfg.threads)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model = loaded.model.to(self.device)
        label2id = {label: i for i, label in loaded.id2label.items()}
        policy, tokenizer = loaded.policy, loaded.tokenizer
        self.encoded = {
            split: self.task.encode(raw[split], tokenizer, label2id, policy.max_length, policy.stride)
            for split in ("validation", "test")
            if split in raw
        }
        self.collate = self.task.collator(tokenizer)

    def run(self) -> dict[str, Any]:
        """Every step: heads removed, heads kept, validation scores, the importance the choice was made on."""
        from bert_tasks.insight.head_importance import normalise_per_layer, pruned_heads

        plan, started = self.plan, time.perf_counter()
        steps = [self._step({}, started)]
        maps = []
        for number, size in enumerate(plan.steps, start=1):
            importance = normalise_per_layer(self._importance())  # [L, H], NaN at pruned heads
            maps.append(importance)
            chosen = choose_heads(importance, size)
            self.model.prune_heads(chosen)
            steps.append(self._step(chosen, started))
            logger.info(
                "step %d/%d: removed %d heads (%s) | %d kept | validation %s %.4f (unpruned %.4f)",
                number,
                len(plan.steps),
                size,
                "; ".join(f"layer {layer}: {', '.join(map(str, heads))}" for layer, heads in chosen.items()),
                steps[-1]["heads_kept"],
                self.metric,
                steps[-1]["validation"][self.metric],
                steps[0]["validation"][self.metric],
            )
        if "test" in self.encoded:
            steps[-1]["test"] = _scalars(self._scores("test"))
        return {
            "source": str(plan.model_dir),
            "task": self.task.name,
            "metric": self.metric,
            "heads": {"before": plan.shape.present, "removed": plan.removed},
            "pruned_heads": {str(k): sorted(v) for k, v in sorted(pruned_heads(self.model.config).items())},
            "steps": steps,
            "importance": [_json_matrix(scores) for scores in maps],
        }

    def _step(self, chosen: dict[int, list[int]], started: float) -> dict[str, Any]:
        from bert_tasks.insight.head_importance import present_heads

        return {
            "heads_kept": sum(len(heads) for heads in present_heads(self.model.config)),
            "removed": {str(layer): heads for layer, heads in chosen.items()},
            "validation": _scalars(self._scores("validation")),
            "seconds": round(time.perf_counter() - started, 1),
        }

    def _scores(self, split: str) -> dict[str, Any]:
        from bert_tasks.data.batching import eval_loader
        from bert_tasks.inference.windows import collect_window_logits

        encoded = self.encoded[split]
        loader = eval_loader(encoded, self.collate, self.plan.cfg.eval_batch_size)
        logits = collect_window_logits(
            self.model, loader, len(encoded), device=self.device, description=split
        )
        return self.task.metrics(self.raw[split], encoded, logits, self.loaded.id2label)

    def _importance(self) -> np.ndarray:
        from tqdm.auto import tqdm

        from bert_tasks.data.batching import eval_loader
        from bert_tasks.insight.head_importance import head_importance
        from bert_tasks.runtime import progress_bars_wanted

        loader = eval_loader(self.encoded["validation"], self.collate, self.plan.cfg.eval_batch_size)
        shown = progress_bars_wanted()
        batches = tqdm(loader, desc="head importance", disable=not shown, leave=False, delay=2)
        return head_importance(self.model, batches, self.device, self.task.window_losses)


def _recover(plan: PrunePlan, record: dict[str, Any]) -> dict[str, Any]:
    """Train the pruned model for `recover_steps` updates with `train`, writing `plan.out_dir`.

    The run starts from the source dir with the heads this command removed (`prune_heads`, so its
    recipe.yaml reruns it) and scores the pruned model before its first update: the best-checkpoint rule
    keeps that model unless an evaluation during recovery beats it on validation.
    """
    from bert_tasks.training import train

    removed: dict[int, list[int]] = {}
    for step in record["steps"]:
        for layer, heads in step["removed"].items():
            removed.setdefault(int(layer), []).extend(heads)
    cfg = recovery_config(plan, removed)
    logger.info(
        "recovery: %d updates at lr %g (warmup %.0f%%), validation before the first and every %d; the best "
        "is kept, the pruned model included",
        cfg.max_steps,
        cfg.lr,
        100 * cfg.warmup_ratio,
        cfg.eval_every,
    )
    train(cfg)
    metrics = json.loads((plan.out_dir / "metrics.json").read_text(encoding="utf-8"))
    metric = metrics["metric_for_best"]
    log = [json.loads(line) for line in (plan.out_dir / "train_log.jsonl").read_text().splitlines()]
    evaluations = [
        {"step": row["step"], metric: row[f"eval_{metric}"]} for row in log if f"eval_{metric}" in row
    ]
    before, best = evaluations[0][metric], metrics["validation"][metric]
    recovery = {
        "steps": cfg.max_steps,
        "lr": cfg.lr,
        "warmup_ratio": cfg.warmup_ratio,
        "best_step": metrics["best_step"],
        "gain": round(best - before, 6),
        "evaluations": evaluations,
        **{split: _scalars(metrics[split]) for split in ("validation", "test") if split in metrics},
    }
    logger.info(recovery_line(recovery, metric))
    return recovery


def recovery_line(recovery: dict[str, Any], metric: str) -> str:
    """Whether recovery helped on validation, and by how much: the last line of a recovery."""
    first, best = recovery["evaluations"][0][metric], recovery["validation"][metric]
    if recovery["best_step"] == 0:
        later = max(recovery["evaluations"][1:], key=lambda e: e[metric])
        return (
            f"recovery did not help: no evaluation of its {recovery['steps']} updates beat the pruned model "
            f"on validation ({metric} {first:.4f} before; best after {later[metric]:.4f} at step "
            f"{later['step']}), so the pruned weights are kept as they were"
        )
    return (
        f"recovery helped: validation {metric} {first:.4f} -> {best:.4f} ({recovery['gain']:+.4f}) at step "
        f"{recovery['best_step']} of {recovery['steps']}; those weights are kept"
    )


def _save(plan: PrunePlan, loaded: FinetunedModel, record: dict[str, Any]) -> None:
    """Write the pruned model as it is: weights, tokenizer, the source's recipe.yaml, metrics.json."""
    from bert_tasks.inference.quantize import EXTRA_FILES

    out, last = plan.out_dir, record["steps"][-1]
    loaded.model.save_pretrained(out)
    loaded.tokenizer.save_pretrained(out)
    for name in EXTRA_FILES:
        if (plan.model_dir / name).is_file():
            shutil.copy2(plan.model_dir / name, out / name)
    metrics = {"validation": last["validation"], **({"test": last["test"]} if "test" in last else {})}
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")


def _write_report(plan: PrunePlan, loaded: FinetunedModel, record: dict[str, Any]) -> None:
    """pruning.json, pruning.png and the model card, in the new dir."""
    from bert_tasks.insight.plots import plot_pruning
    from bert_tasks.model_card import MODEL_CARD, pruned_card

    out = plan.out_dir
    # The run's manifest lists these too, so `--overwrite` of the dir replaces them with the rest; a dir
    # without recovery has no run's manifest yet, and every file in it is prune's (it was new or empty).
    with OutputDir.reopen(out) as run:
        run.record(*sorted(os.listdir(out)), RECORD_FILE, PLOT_FILE, MODEL_CARD)
        (out / RECORD_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        plot_pruning(record, out / PLOT_FILE)
        card = pruned_card(plan.model_dir, out, loaded.task, loaded.policy, record)
        (out / MODEL_CARD).write_text(str(card), encoding="utf-8")


def _scalars(scores: dict[str, Any]) -> dict[str, float]:
    """The scalar scores of a task's metrics (per-class tables and matrices stay in metrics.json)."""
    return {k: v for k, v in scores.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def _json_matrix(scores: np.ndarray) -> list[list[float | None]]:
    """[L, H] as JSON lists, null at pruned heads."""
    return [[None if value != value else round(float(value), 6) for value in row] for row in scores]
