"""The task registry: `cfg.task` -> the Task that reads, encodes, scores and decodes it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bert_tasks.errors import BertTasksError
from bert_tasks.tasks.base import Task
from bert_tasks.tasks.ner import NerTask
from bert_tasks.tasks.sentiment import SentimentTask

if TYPE_CHECKING:
    from bert_tasks.config import Config

TASK_NAMES = ("sentiment", "ner")


def get_task(cfg: Config) -> Task:
    """Build the task named by `cfg.task`, with its task-specific options from the config."""
    return make_task(cfg.task, label_all_subtokens=cfg.label_all_subtokens, viterbi=cfg.viterbi)


def make_task(name: str, label_all_subtokens: bool = False, viterbi: bool = True) -> Task:
    """Build a task by name (prediction builds it from the policy saved with the model)."""
    if name == "sentiment":
        return SentimentTask()
    if name == "ner":
        return NerTask(label_all_subtokens=label_all_subtokens, viterbi=viterbi)
    raise BertTasksError(f"unknown task {name!r}; choose one of {', '.join(TASK_NAMES)}")


__all__ = ["TASK_NAMES", "NerTask", "SentimentTask", "Task", "get_task", "make_task"]
