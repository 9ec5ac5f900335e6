"""What `bert-tasks prune` will do, settled before torch loads, and the rule that picks the heads.

The plan reads only JSON and YAML: the model dir's policy and shape (config.json), how many heads go
(`--heads`: a fraction of the heads the model has, or a count), in how many steps, the data the heads are
scored on (the model's own recipe.yaml, with `key=value` overrides) and the recovery fine-tuning's
settings. Every mistake in them is one line before any model or data loads.

No layer loses its last head: a layer without heads would be an attention block that adds a constant (its
output bias) to every token, which transformers' BERT cannot hold (its attention views the projection as
[..., -1, head_size], undefined for zero heads), nor can an ONNX graph of the same code. So at most
`heads - layers` heads can go, and a head is passed over while it is the last of its layer.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bert_tasks.config import Config, exact_int, load_recipe, may_carve
from bert_tasks.errors import BertTasksError
from bert_tasks.model_dir import ModelPolicy, local_model_dir, read_policy, refuse_export
from bert_tasks.output_paths import refuse_inside
from bert_tasks.pruning.heads import ModelShape, head_items, read_shape
from bert_tasks.tasks import task_class
from bert_tasks.training.distill import check_whole_heads, transfer_kinds

#: Share of the model's heads removed per step when `steps=` is not given: Michel et al. 2019 prune
#: iteratively by 10% of the heads at a time, scoring the heads again after each step.
STEP_SHARE = 0.1
#: Recovery's lr is the recipe's times this: a smaller step away from weights that are trained already.
#: Measured against the recipe's own lr on SST-2 (BENCHMARKS.md, "Head pruning"): no difference outside
#: the noise; with step 0 a candidate neither can end below the pruned model on validation.
RECOVERY_LR_SHARE = 0.2
#: Recovery warms its lr up over this share of its updates (as a fine-tuning does).
RECOVERY_WARMUP = 0.1
#: Evaluations on validation spread over the recovery (and one before it): the best is kept.
RECOVERY_EVALUATIONS = 4
#: The keys `prune` adds to the config's own.
PRUNE_KEYS = ("steps", "recover_steps")
#: Config keys that say which data the heads are scored on (and the recovery trains on), how it is read,
#: and how the process runs: taken with or without recovery.
DATA_KEYS = (
    "dataset",
    "train_file",
    "validation_file",
    "test_file",
    "validation_split",
    "text_column",
    "label_column",
    "header",
    "format",
    "tokens_column",
    "tag_column",
    "conll_tag_index",
    "label_names",
    "max_train_samples",
    "max_eval_samples",
    "seed",
    "eval_batch_size",
    "metric_for_best",
    "threads",
    "allow_pickle",
)
#: Config keys `prune` sets itself, and what to give instead.
REFUSED_KEYS = {
    "model": "give the model to prune as --model DIR",
    "output_dir": "give where the pruned model goes as --out DIR",
    "max_steps": "the recovery fine-tuning runs recover_steps=S updates",
    "epochs": "the recovery fine-tuning runs recover_steps=S updates",
    "seeds": "prune writes one model",
    "resume": "prune writes a new dir",
    "overwrite": "prune writes a new dir (--out)",
    "prune_heads": "prune chooses the heads (--heads)",
    "eval_at_start": "recovery always scores the pruned model first, so it never ends worse on validation",
    "task": "the task is the command's",
}
#: Overrides that leave no data of the task's demo set in the config of a dir without a recipe.yaml.
_NO_DATA = ("dataset=none", "train_file=none", "validation_file=none", "test_file=none")


@dataclass(frozen=True)
class PrunePlan:
    """Everything `prune` was asked, checked."""

    model_dir: Path
    out_dir: Path
    policy: ModelPolicy
    shape: ModelShape
    #: Heads removed at each step, in order (their sum is how many go).
    steps: list[int]
    recover_steps: int
    #: The source's recipe with the overrides: the data to score heads on and, with recovery, to train on.
    cfg: Config
    #: The config keys given on the command line (they win over the recovery's defaults).
    given: frozenset[str] = frozenset()

    @property
    def removed(self) -> int:
        return sum(self.steps)


def plan_pruning(
    task: str,
    model_dir: str | Path,
    heads: str,
    out_dir: str | Path | None = None,
    overrides: Sequence[str] = (),
) -> PrunePlan:
    """Check the request and say what will happen; reads JSON and YAML only (no torch, no data).

    Raises:
        BertTasksError: a dir that is no fine-tuned `task` model, an export (ONNX or int8), `--heads` that is
            no fraction in (0, 1) or count, more heads than can go, bad `steps=`/`recover_steps=`, a key
            prune sets itself or one only the recovery reads without `recover_steps`, no validation data.
    """
    directory = local_model_dir(model_dir)
    policy = read_policy(directory, task)
    refuse_export(
        directory, policy, "prune the fp32 model dir it was exported from, then export the pruned dir"
    )
    shape = read_shape(directory)
    remove = heads_to_remove(heads, shape)
    prune_values, config_overrides = _split_overrides(overrides)
    steps = _whole(prune_values, "steps", None, 1)
    recover_steps = _whole(prune_values, "recover_steps", 0, 0)
    _check_keys(config_overrides, task_class(policy.task).options, recover_steps)
    cfg = _data_config(directory, policy.task, config_overrides, recover_steps)
    if recover_steps and cfg.teacher is not None:  # a distilled source recovers with its teacher
        check_whole_heads(transfer_kinds(cfg.transfer), ["the recovery's student (pruned here)"])
    if steps is None:
        steps = math.ceil(remove / math.ceil(STEP_SHARE * shape.present))
    if steps > remove:
        raise BertTasksError(
            f"steps={steps}: each step removes at least one head, and {remove} go; give steps=1 to {remove}"
        )
    out = Path(out_dir) if out_dir is not None else directory.parent / f"{directory.name}-pruned-{remove}"
    refuse_inside(out, directory, "prune --out")
    given = frozenset(item.partition("=")[0].strip() for item in config_overrides)
    sizes = step_sizes(remove, steps)
    return PrunePlan(directory, out, policy, shape, sizes, recover_steps, cfg, given)


def recovery_config(plan: PrunePlan, removed: dict[int, list[int]]) -> Config:
    """The recovery as a run of its own: the source dir with `removed` pruned (`prune_heads`), trained for
    `recover_steps` updates, scored before the first (step 0, so the pruned model itself is a candidate
    for the best) and `RECOVERY_EVALUATIONS` times after; its recipe.yaml reruns it.

    The lr, warmup and evaluation interval are recovery's defaults unless given on the command line. A
    distilled source (its recipe names a `teacher`) recovers as it was trained, on the teacher's soft
    targets, with the source whole as the student's start: a distill run's `model` is its `student`, or
    else the teacher, which would otherwise be cut again and recover in the source's place.
    """
    steps = plan.recover_steps
    source = os.path.abspath(plan.model_dir)
    student = {"student": source, "student_layers": None} if plan.cfg.teacher is not None else {}
    defaults = {
        "lr": plan.cfg.lr * RECOVERY_LR_SHARE,
        "warmup_ratio": RECOVERY_WARMUP,
        "eval_every": math.ceil(steps / RECOVERY_EVALUATIONS),
    }
    return dataclasses.replace(
        plan.cfg,
        **{key: value for key, value in defaults.items() if key not in plan.given},
        **student,
        model=source,
        prune_heads=head_items(removed),
        eval_at_start=True,
        output_dir=str(plan.out_dir),
        max_steps=steps,
        resume=False,
        overwrite=False,
        seeds=None,
    )


def heads_to_remove(spec: str, shape: ModelShape) -> int:
    """`--heads`: a fraction in (0, 1) of the heads the model has (rounded half up) or a whole count."""
    present, text = shape.present, str(spec).strip()
    try:
        count = int(text)
    except ValueError:
        try:
            fraction = float(text)
        except ValueError:
            fraction = math.nan
        if not 0 < fraction < 1:
            raise BertTasksError(
                f"--heads {spec}: give the share of heads to remove, a fraction between 0 and 1 (0.5), or a "
                "whole count (36)"
            ) from None
        count = math.floor(fraction * present + 0.5)
        if count == 0:
            raise BertTasksError(
                f"--heads {spec} of {present} heads is less than one head; give a larger fraction or a count"
            ) from None
    if count < 1:
        raise BertTasksError(f"--heads {spec}: remove at least one head (a count of 1 or more)")
    if count > shape.removable:
        raise BertTasksError(
            f"--heads {spec}: the model has {present} heads in {shape.layers} layers and each layer keeps "
            f"one, so at most {shape.removable} can go ({count} asked); give a smaller count or fraction"
        )
    return count


def step_sizes(remove: int, steps: int) -> list[int]:
    """`remove` heads over `steps` steps, as even as whole heads allow (none empty while steps <= remove)."""
    cuts = [i * remove // steps for i in range(steps + 1)]
    return [b - a for a, b in itertools.pairwise(cuts)]


def choose_heads(scores: np.ndarray, count: int) -> dict[int, list[int]]:
    """The `count` heads of lowest score ([L, H], NaN = already pruned), never a layer's last head.

    Ties go to the earlier layer and head, so a plan is reproducible. Returns {layer: [heads]} in the
    original numbering, as `model.prune_heads` takes it.
    """
    left = (~np.isnan(scores)).sum(axis=1)  # [L] heads each layer still has
    layers, heads = np.nonzero(~np.isnan(scores))
    ranked = sorted(
        (float(scores[layer, head]), layer, head) for layer, head in zip(layers, heads, strict=True)
    )
    chosen: dict[int, list[int]] = {}
    for _, layer, head in ranked:
        if count == 0:
            break
        if left[layer] > 1:
            chosen.setdefault(int(layer), []).append(int(head))
            left[layer] -= 1
            count -= 1
    if count:
        raise ValueError(f"choose_heads: {count} more heads asked than can go while each layer keeps one")
    return {layer: sorted(heads) for layer, heads in sorted(chosen.items())}


def _split_overrides(overrides: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """prune's own keys (the last of a key winning) and the config overrides, in order."""
    own, rest = {}, []
    for item in overrides:
        key, sep, value = item.partition("=")
        if sep and key.strip() in PRUNE_KEYS:
            own[key.strip()] = value.strip()
        else:
            rest.append(item)
    return own, rest


def _whole(values: dict[str, str], key: str, default: int | None, low: int) -> int | None:
    if key not in values:
        return default
    text = values[key]
    number = exact_int(text)
    if number is None or not low <= number <= 2**31 - 1:
        raise BertTasksError(f"{key}={text!r} on the command line: expected a whole number >= {low}")
    return number


def _check_keys(overrides: list[str], task_options: tuple[str, ...], recover_steps: int) -> None:
    """Refuse keys prune sets itself, the saved windows and decoding, and training keys without recovery."""
    policy_keys = ("max_length", "stride", *task_options)
    known = {field.name for field in dataclasses.fields(Config)}
    for item in overrides:
        key = item.partition("=")[0].strip()
        if key in REFUSED_KEYS:
            raise BertTasksError(f"{key}= on the command line is prune's to set: {REFUSED_KEYS[key]}")
        if key in policy_keys:
            raise BertTasksError(
                f"{key}= on the command line: prune keeps the model's windows and decoding "
                f"({', '.join(policy_keys)}), so the heads are scored as the model predicts"
            )
        if key in known and key not in DATA_KEYS and recover_steps == 0:
            raise BertTasksError(
                f"{key}= on the command line sets the recovery fine-tuning, which runs only with "
                "recover_steps=S (S > 0); add it or drop the key"
            )


def _data_config(directory: Path, task: str, overrides: list[str], recover_steps: int) -> Config:
    """The source's recipe.yaml with the overrides; without one, only the data the overrides name."""
    recipe = directory / "recipe.yaml"
    has_recipe = recipe.is_file()
    cfg = load_recipe(recipe if has_recipe else None, [*([] if has_recipe else _NO_DATA), *overrides], task)
    where = f"{recipe}" if has_recipe else f"model dir {directory} (it has no recipe.yaml)"
    if cfg.validation_file is None and cfg.dataset is None and not may_carve(cfg):
        raise BertTasksError(
            f"{where}: no validation data to score the heads on; give validation_file=FILE (or "
            "validation_split=0.05 with train_file=FILE)"
        )
    if recover_steps and cfg.train_file is None and cfg.dataset is None:
        raise BertTasksError(
            f"{where}: no training data for recover_steps={recover_steps}; give train_file=FILE"
        )
    return cfg
