"""The task registry, the only one: task name -> Task class, and a saved model's architecture -> task.

Built-in tasks register below; a task of your own registers with `register_task(MyTask)` and then works
everywhere a task name is taken (config, `train`, `Predictor`, `evaluate_file`, `export`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bert_tasks.errors import BertTasksError
from bert_tasks.tasks.base import SplitProfile, Task
from bert_tasks.tasks.ner import NerTask
from bert_tasks.tasks.sentiment import SentimentTask

if TYPE_CHECKING:
    from bert_tasks.config import Config

_TASKS: dict[str, type[Task]] = {}


def register_task(task: type[Task]) -> type[Task]:
    """Make `task` available by its name (usable as a class decorator); a name is registered once."""
    if task.name in _TASKS and _TASKS[task.name] is not task:
        raise ValueError(f"a task named {task.name!r} is already registered ({_TASKS[task.name].__name__})")
    _TASKS[task.name] = task
    return task


def task_names() -> tuple[str, ...]:
    """Every registered task name, built-ins first."""
    return tuple(_TASKS)


def task_class(name: str) -> type[Task]:
    """The Task class registered as `name`."""
    if name not in _TASKS:
        raise BertTasksError(f"unknown task {name!r}; choose one of {', '.join(_TASKS)}")
    return _TASKS[name]


def get_task(cfg: Config) -> Task:
    """The task named by `cfg.task`, with its options from the config."""
    return task_class(cfg.task).from_config(cfg)


def task_of_architecture(architecture: str | None) -> str | None:
    """The task whose head a saved model's `architectures[0]` names (model dirs without a policy)."""
    found = [name for name, task in _TASKS.items() if task.saves_as(architecture)]
    return found[0] if found else None


register_task(SentimentTask)
register_task(NerTask)

__all__ = [
    "NerTask",
    "SentimentTask",
    "SplitProfile",
    "Task",
    "get_task",
    "register_task",
    "task_class",
    "task_names",
    "task_of_architecture",
]
