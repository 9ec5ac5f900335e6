"""Which experiment trackers a run reports to (`report_to`), and what it gives them, through Accelerate.

Accelerate owns the trackers (`Accelerator(log_with=...)`, `init_trackers`, `log`, `end_training`); this
module only decides which ones, where their local files go and what they are sent. It is standard
library only, so a tracker that is named but not installed is answered before torch loads: presence is
checked with `importlib.util.find_spec`, which imports nothing.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bert_tasks.config import TRACKERS
from bert_tasks.errors import BertTasksError

if TYPE_CHECKING:
    from bert_tasks.config import Config

#: The top-level entry of output_dir the local trackers write into (TensorBoard events, wandb's run dir).
LOGS_DIR = "logs"
#: The project (wandb), experiment (MLflow) and TensorBoard folder under logs/ that every run reports to.
PROJECT = "bert-tasks"
#: tracker -> (importable modules, any one will do; the pip package to install).
_PACKAGES = {
    "tensorboard": (("tensorboard", "tensorboardX"), "tensorboard"),
    "wandb": (("wandb",), "wandb"),
    "mlflow": (("mlflow",), "mlflow"),
}
#: Trackers that write under output_dir/logs (MLflow writes to its own tracking store).
_LOCAL = ("tensorboard", "wandb")


def installed(tracker: str) -> bool:
    modules, _ = _PACKAGES[tracker]
    return any(importlib.util.find_spec(module) is not None for module in modules)


def resolve_trackers(report_to: str) -> tuple[str, ...]:
    """The trackers `report_to` names, in TRACKERS order: `auto` = tensorboard when installed, `all` = the
    installed ones, `none` = none; one named but not installed is a one-line error naming its package."""
    names = [name.strip() for name in report_to.split(",")]
    if names == ["none"]:
        return ()
    if names == ["auto"]:
        return ("tensorboard",) if installed("tensorboard") else ()
    if names == ["all"]:
        return tuple(name for name in TRACKERS if installed(name))
    missing = [name for name in names if not installed(name)]
    if missing:
        packages = " ".join(_PACKAGES[name][1] for name in missing)
        raise BertTasksError(
            f"report_to={report_to}: {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not "
            f"installed; pip install {packages}, "
            "or drop it from report_to (report_to=none reports to no tracker)"
        )
    return tuple(name for name in TRACKERS if name in names)


def check_logs_dir(output_dir: Path, trackers: tuple[str, ...], foreign: bool) -> None:
    """A `logs` entry that no run wrote (a resumed dir holding the user's own logs/) is never written into."""
    local = [name for name in trackers if name in _LOCAL]
    if local and foreign:
        raise BertTasksError(
            f"output_dir {output_dir} holds {LOGS_DIR}, which no bert-tasks run wrote, and {local[0]} would "
            f"write there; move it elsewhere, or pass report_to=none (or a tracker that writes elsewhere)"
        )


def tracker_options(
    trackers: tuple[str, ...], output_dir: Path, first_step: int
) -> dict[str, dict[str, Any]]:
    """Accelerate's `init_kwargs`: each tracker's run named after output_dir, its local files under logs/.

    `first_step` is the first step this process logs: a resumed run re-logs the steps after its
    checkpoint, so TensorBoard's `purge_step` hides the interrupted run's events from there on.
    """
    options: dict[str, dict[str, Any]] = {
        "tensorboard": {"purge_step": first_step} if first_step > 1 else {},
        "wandb": {"name": output_dir.name, "dir": str(output_dir / LOGS_DIR)},
        "mlflow": {"run_name": output_dir.name},
    }
    return {name: options[name] for name in trackers}


def hyperparameters(cfg: Config) -> dict[str, str | int | float | bool]:
    """The run's config as trackers take hyper-parameters: scalars, lists joined by commas, unset keys out."""
    values: dict[str, str | int | float | bool] = {}
    for key, value in cfg.to_dict().items():
        if isinstance(value, list):
            values[key] = ",".join(map(str, value))
        elif value is not None:
            values[key] = value
    return values


def tracker_scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """A train_log.jsonl record as tracker scalars: `loss` -> `train/loss`, `eval_f1` -> `eval/f1`.

    The prefix groups a dashboard's charts; `step` is the tracker's own step, and a value the record
    lacks (grad_norm under DeepSpeed) is left out rather than sent as a gap.
    """
    scalars = {}
    for key, value in record.items():
        if key == "step" or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        name = f"eval/{key.removeprefix('eval_')}" if key.startswith("eval_") else f"train/{key}"
        scalars[name] = value
    return scalars
