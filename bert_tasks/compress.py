"""`bert-tasks compress`: distil -> prune -> ONNX int8 in one command, each step the command of its own.

Thin by design: the steps are `train` with a teacher (training/distill_run.py), `pruning.prune` and
`export_onnx`, run one after the other into `OUT/<step>`, each reading the dir the step before wrote.
What this module adds is the comparison: every step's model (the teacher's too) is scored on the same
validation split, the one the teacher's recipe names (never the test split), and `--max-loss` picks the
smallest step that stays within that many points of the teacher there. Everything that can be refused
is refused before torch loads; a step that fails leaves the steps before it complete in OUT.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bert_tasks.config import Config, load_recipe, may_carve
from bert_tasks.errors import BertTasksError
from bert_tasks.model_dir import local_model_dir, read_policy, refuse_export
from bert_tasks.output_paths import refuse_inside
from bert_tasks.pruning.heads import ModelShape, read_shape
from bert_tasks.pruning.plan import heads_to_remove, plan_pruning
from bert_tasks.training.distill import student_layer_indices

if TYPE_CHECKING:
    from datasets import Dataset

logger = logging.getLogger(__name__)

#: What compress writes beside the steps' dirs.
REPORT_FILE = "compress.json"
#: The step dirs under OUT, in order.
DISTILLED, PRUNED, INT8 = "distilled", "pruned", "onnx-int8"


@dataclass(frozen=True)
class CompressPlan:
    """The request, checked: which steps run, and the distill config they start from."""

    task: str
    teacher: Path
    out: Path
    layers: int | None  # None: no distillation
    heads: str | None  # None: no pruning
    recover_steps: int
    int8: bool
    max_loss: float | None
    distill_cfg: Config

    @property
    def steps(self) -> list[str]:
        chosen = [(DISTILLED, self.layers is not None), (PRUNED, self.heads is not None), (INT8, self.int8)]
        return [name for name, wanted in chosen if wanted]


def plan_compress(
    task: str,
    model_dir: str | Path,
    out_dir: str | Path,
    layers: str = "half",
    heads: str | None = None,
    recover_steps: int = 0,
    int8: bool = True,
    max_loss: float | None = None,
    overrides: Sequence[str] = (),
) -> CompressPlan:
    """Check everything the steps will be asked, reading JSON and YAML only (no torch, no data)."""
    teacher = local_model_dir(model_dir)
    policy = read_policy(teacher, task)
    refuse_export(teacher, policy, "compress the fp32 model dir it was exported from")
    out = Path(out_dir)
    refuse_inside(out, teacher, "compress --out")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BertTasksError(f"compress: --out {out} exists and is not an empty dir; choose a new directory")
    if max_loss is not None and not max_loss >= 0:
        raise BertTasksError(f"--max-loss {max_loss}: give the points of validation score you accept to lose")
    if recover_steps < 0 or (recover_steps and heads is None):
        raise BertTasksError(
            f"--recover-steps {recover_steps}: recovery fine-tunes a pruned model; give --heads, and a "
            "count >= 0"
        )
    shape = read_shape(teacher)
    kept = _student_layers(layers, shape.layers)
    if not (kept or heads or int8):
        raise BertTasksError("compress: every step is off (--layers none, no --heads, --no-int8); choose one")
    if kept is None and overrides:
        raise BertTasksError(
            f"compress: {' '.join(overrides)} would configure the distillation, and --layers none runs none; "
            "drop them (prune and export read the model's own recipe.yaml)"
        )
    if heads is not None and kept is None:
        plan_pruning(task, teacher, heads, out / PRUNED)  # prunes the teacher itself: its own checks
    elif heads is not None:
        heads_to_remove(heads, _student_shape(shape, kept))  # the heads the student will have
    if int8:
        from bert_tasks.inference.onnx_backend import require

        for module in ("onnx", "onnxruntime", "onnxscript"):
            require(module, "compress (its ONNX int8 step; --no-int8 skips it)")
    distill_cfg = _distill_config(teacher, out, kept, overrides, task)
    return CompressPlan(task, teacher, out, kept, heads, recover_steps, int8, max_loss, distill_cfg)


def _student_layers(layers: str, total: int) -> int | None:
    """`--layers`: a count of the teacher's layers to keep, `half` (distill's default), or `none`."""
    if layers == "none":
        return None
    if layers == "half":
        return (total + 1) // 2
    try:
        count = int(layers)
    except ValueError:
        raise BertTasksError(
            f"--layers {layers}: give how many of the teacher's {total} layers the student keeps, half, "
            "or none"
        ) from None
    if count < 1:
        raise BertTasksError(
            f"--layers {layers}: keep at least one layer (or --layers none: no distillation)"
        )
    student_layer_indices(total, count, True)  # more than the teacher has: its one line
    return count


def _student_shape(teacher: ModelShape, layers: int) -> ModelShape:
    """The student's heads: the teacher's layers it keeps, with their pruned heads (as
    `modeling.layers.keep_layers` cuts them), so `--heads` is checked against what will be there."""
    kept = student_layer_indices(teacher.layers, layers, True) or list(range(teacher.layers))
    pruned = {new: teacher.pruned[old] for new, old in enumerate(kept) if old in teacher.pruned}
    return ModelShape(layers, teacher.heads, pruned)


def _distill_config(
    teacher: Path, out: Path, layers: int | None, overrides: Sequence[str], task: str
) -> Config:
    """The teacher's recipe with the user's keys: the distill run's config, and the data every step is
    scored on (its validation split)."""
    recipe = teacher / "recipe.yaml"
    named = {item.partition("=")[0].strip() for item in overrides}
    if not recipe.is_file() and not ({"train_file", "dataset"} & named and "validation_file" in named):
        # Without its recipe the config would fall back to the task's demo data: refuse, never guess.
        raise BertTasksError(
            f"compress: {teacher} has no recipe.yaml naming the data it was trained on; give "
            "train_file= (or dataset=) and validation_file= to distil on and compare the steps on"
        )
    # Without a distill step (--layers none) the config only names the data: no teacher, so no distill
    # check (a multi-label or regression teacher) refuses steps that can run.
    distill = [f"teacher={teacher}", f"student_layers={layers}"] if layers is not None else []
    values = [*overrides, *distill, f"output_dir={out / DISTILLED}"]
    cfg = load_recipe(recipe if recipe.is_file() else None, values, task=task)
    if not (cfg.validation_file or cfg.dataset or may_carve(cfg)):
        raise BertTasksError(
            f"compress: {recipe} names no validation data to compare the steps on; give validation_file= "
            "(or validation_split=)"
        )
    return cfg


def compress(plan: CompressPlan) -> dict[str, Any]:
    """Run the planned steps, score each on the validation split, write OUT/compress.json; return it."""
    from bert_tasks.data.splits import read_splits
    from bert_tasks.tasks import get_task

    task = get_task(plan.distill_cfg)
    validation = _validation(read_splits(task, plan.distill_cfg), plan)
    rows = [_row("teacher", plan.teacher, validation, 0.0)]  # a teacher that does not load: no OUT made
    plan.out.mkdir(parents=True, exist_ok=True)
    source = plan.teacher
    for step in plan.steps:
        started = time.perf_counter()
        try:
            source = _run_step(step, source, plan)
        except BertTasksError as error:
            if step == INT8:  # the export's parity check refused it: not deployable, the others are
                rows.append({"step": step, "dir": None, "refused": str(error)})
                break
            done = ", ".join(row["step"] for row in rows[1:]) or "none"
            raise BertTasksError(
                f"compress: the {step} step failed ({error}); steps complete in {plan.out}: {done}"
            ) from None
        rows.append(_row(step, source, validation, time.perf_counter() - started))
    report = _report(plan, rows)
    (plan.out / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return report


def _validation(splits: dict[str, Dataset], plan: CompressPlan) -> Dataset:
    if "validation" not in splits:
        raise BertTasksError(
            f"compress: the data of {plan.teacher / 'recipe.yaml'} has no validation split; give "
            "validation_file= (or validation_split=)"
        )
    return splits["validation"]


def _run_step(step: str, source: Path, plan: CompressPlan) -> Path:
    """One step from `source`'s dir into OUT/<step>; the dir it wrote."""
    target = plan.out / step
    if step == DISTILLED:
        from bert_tasks.training import train

        return train(plan.distill_cfg)
    if step == PRUNED:
        from bert_tasks.pruning import prune

        recovery = [f"recover_steps={plan.recover_steps}"] if plan.recover_steps else []
        return prune(plan.task, source, str(plan.heads), target, recovery)
    from bert_tasks.inference.onnx_export import export_onnx

    # Checked on the validation texts when they are a file: the 100 demo texts make one flip 1%.
    check = plan.distill_cfg.validation_file
    export_onnx(source, target, "int8", check if check and Path(check).is_file() else None)
    return target


def _row(step: str, model_dir: Path, validation: Dataset, seconds: float) -> dict[str, Any]:
    """One step's model scored on the validation split, with its weights' size on disk."""
    from bert_tasks.inference.predictor import Predictor

    predictor = Predictor(model_dir, progress=False)
    metrics = predictor.evaluate(validation)
    metric = predictor.task.default_metric
    weights = [p for p in model_dir.iterdir() if p.suffix in (".safetensors", ".onnx", ".bin")]
    return {
        "step": step,
        "dir": str(model_dir),
        "metric": metric,
        "validation": float(metrics[metric]),
        "weights_bytes": sum(p.stat().st_size for p in weights),
        "seconds": round(seconds, 1),
    }


def _report(plan: CompressPlan, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The rows with their loss against the teacher, and the dir to deploy: with `max_loss`, the last step
    within that many points of the teacher on validation (the teacher itself if none is), else the last
    scored one (an int8 export its parity check refused is listed, never deployed)."""
    teacher = rows[0]["validation"]
    scored = [row for row in rows if "refused" not in row]
    for row in scored:
        row["points_lost"] = round(100 * (teacher - row["validation"]), 2)
    fitting = [row for row in scored if plan.max_loss is None or row["points_lost"] <= plan.max_loss]
    return {
        "task": plan.task,
        "max_loss": plan.max_loss,
        "steps": rows,
        "deploy": fitting[-1]["dir"],
        "settings": {
            "layers": plan.layers,
            "heads": plan.heads,
            "recover_steps": plan.recover_steps,
            "int8": plan.int8,
            "alpha": plan.distill_cfg.alpha,
            "temperature": plan.distill_cfg.temperature,
        },
    }


def render_report(report: dict[str, Any]) -> str:
    """The steps as a table, then the dir to deploy."""
    metric = report["steps"][0]["metric"]
    lines = [f"| step | validation {metric} | points lost | weights MiB | seconds |", "|---|---|---|---|---|"]
    for row in report["steps"]:
        if "refused" in row:
            lines.append(f"| {row['step']} | refused: {row['refused']} | | | |")
            continue
        lines.append(
            f"| {row['step']} | {row['validation']:.4f} | {row['points_lost']:.2f} | "
            f"{row['weights_bytes'] / (1 << 20):.1f} | "
            f"{row['seconds']} |"
        )
    within = "" if report["max_loss"] is None else f" (the smallest within {report['max_loss']} points)"
    return "\n".join([*lines, f"deploy: {report['deploy']}{within}"])
