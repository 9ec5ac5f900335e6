"""The Run with a teacher: `bert-tasks distill` is a finetune whose model is the student and whose
objective adds the teacher's soft targets (training/objectives.py, `DistillLoss`).

Everything else is the one Run's: evaluation, the best checkpoint, early stopping, checkpoints and exact
resume, Ctrl-C, the model dir. The teacher is loaded beside the student, frozen, in eval mode; it is never
prepared by Accelerate, so it is in no checkpoint (a resumed run loads it again and recomputes its logits).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from datasets import Dataset, concatenate_datasets

from bert_tasks.config import Config
from bert_tasks.errors import BertTasksError
from bert_tasks.model_dir import load_finetuned
from bert_tasks.modeling.layers import keep_layers
from bert_tasks.modeling.load import load_model
from bert_tasks.tasks.base import Task
from bert_tasks.training.distill import DistillPlan, Shape, StudentLayers, student_layers
from bert_tasks.training.objectives import DistillLoss, DistillSettings
from bert_tasks.training.output_dir import OutputDir
from bert_tasks.training.run import Run

logger = logging.getLogger(__name__)


class DistillRun(Run):
    """A Run that trains a student on a teacher's soft targets (and the gold labels)."""

    command = "distill"

    def __init__(
        self, cfg: Config, task: Task, raw: dict[str, Dataset], output: OutputDir, plan: DistillPlan
    ) -> None:
        super().__init__(cfg, task, raw, output)
        self.plan = plan

    def _label_names(self) -> list[str]:
        """The teacher's labels, in its id order: the soft targets are over its classes."""
        return list(self.plan.labels)

    def _add_training_rows(self) -> None:
        """`transfer_file`'s texts as training windows after the labelled ones, marked as having no gold."""
        self.gold_windows = len(self.encoded["train"])
        if not self.plan.transfer_records:
            return
        cfg = self.cfg
        rows = self.task.transfer_rows(self.plan.transfer_records, self.labels)
        label2id = {label: i for i, label in enumerate(self.labels)}
        with self.accelerator.main_process_first():
            extra = self.task.encode(rows, self.tokenizer, label2id, cfg.max_length, cfg.stride)
        self.encoded["train"] = concatenate_datasets([self.encoded["train"], extra])

    def _build_model(self) -> torch.nn.Module:
        """The student (its start cut to the planned layers), after loading the teacher beside it."""
        cfg, plan = self.cfg, self.plan
        teacher = load_finetuned(plan.teacher, self.task.name, allow_pickle=cfg.allow_pickle)
        if teacher.tokenizer.get_vocab() != self.tokenizer.get_vocab():  # a hub student, fetched only now
            raise BertTasksError(
                f"student {cfg.model}: its tokenizer is not the teacher's ({len(self.tokenizer)} vs "
                f"{len(teacher.tokenizer)} tokens); the student must read the teacher's token ids"
            )
        student = load_model(
            cfg.model, self.task.name, self.labels, allow_pickle=cfg.allow_pickle, attention=cfg.attention
        )
        config = student.config
        self.layers = plan.student or student_layers(
            cfg,
            plan.teacher_shape,
            Shape(config.num_hidden_layers, config.hidden_size, config.num_attention_heads),
        )
        if self.layers.kept is not None:
            keep_layers(student, self.layers.kept)
        self.teacher = teacher.model.requires_grad_(False).to(self.accelerator.device)
        return student

    def _objective(self, weights: torch.Tensor | None) -> DistillLoss:
        cfg, plan = self.cfg, self.plan
        gold = torch.zeros(len(self.encoded["train"]), dtype=torch.bool, device=self.accelerator.device)
        gold[: self.gold_windows] = True
        settings = DistillSettings(
            cfg.alpha, cfg.temperature, plan.transfer, tuple(self.layers.transfer_layers), cfg.transfer_weight
        )
        return DistillLoss(self.teacher, settings, gold, weights, self.accelerator.autocast)

    def _log_start(self) -> None:
        super()._log_start()
        if not self.accelerator.is_main_process:
            return
        cfg, plan = self.cfg, self.plan
        transfer = "none"
        if plan.transfer:
            transfer = f"{','.join(plan.transfer)} from teacher layers {self.layers.transfer_layers}"
        extra = len(self.encoded["train"]) - self.gold_windows
        logger.info(
            f"distilling teacher {plan.teacher} ({plan.teacher_shape.layers} layers) into "
            f"{_describe_layers(cfg, self.layers)} | alpha {cfg.alpha:g}, temperature "
            f"{cfg.temperature:g} | transfer {transfer} | {self.gold_windows} labelled + {extra} unlabelled "
            "training windows"
        )

    def _provenance(self) -> dict[str, Any]:
        """The teacher, how the student was made from it, and the teacher's scores as its own run
        measured them (on its own validation and test data)."""
        plan, cfg = self.plan, self.cfg
        teacher = {
            "model": str(plan.teacher),
            "layers": plan.teacher_shape.layers,
            "student_start": "teacher" if cfg.student is None else cfg.student,
            "student_layers": self.layers.kept,
            "transfer_layers": self.layers.transfer_layers,
            "transfer_texts": len(plan.transfer_records),
            **{
                split: plan.teacher_metrics[split]
                for split in ("validation", "test")
                if split in plan.teacher_metrics
            },
        }
        return {"teacher": teacher}


def _describe_layers(cfg: Config, layers: StudentLayers) -> str:
    """`3 layers [0, 2, 4] of the teacher`, or `all layers of <student>`."""
    start = "the teacher" if cfg.student is None else cfg.student
    if layers.kept is None:
        return f"all layers of {start}"
    return f"{len(layers.kept)} layers {layers.kept} of {start}"
