"""`seeds=[42,43,44]`: the same recipe once per seed, and every score as mean +- std over the seeds.

One seed is one number: a comparison of two settings within the seed spread says nothing. Each seed is
a whole, ordinary run in `output_dir/seed-N` (its own model dir, card, checkpoints, --resume), so this
module only orders them and aggregates their `metrics.json` into `output_dir/seeds.json`. The parent dir
is claimed like a run's (manifest, lock), so --overwrite replaces a previous seeds run and nothing else.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shlex
import statistics
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bert_tasks.config import save_config
from bert_tasks.data.splits import read_splits
from bert_tasks.errors import BertTasksError
from bert_tasks.output_paths import write_atomically
from bert_tasks.tasks import get_task
from bert_tasks.training.checkpoints import latest_checkpoint
from bert_tasks.training.output_dir import OutputDir
from bert_tasks.training.stopping import TrainingInterrupted

if TYPE_CHECKING:
    from collections.abc import Callable

    from bert_tasks.config import Config

logger = logging.getLogger(__name__)

#: The aggregate: every scalar score of each split, mean and sample std over the seeds, and each value.
SUMMARY = "seeds.json"
SPLITS = ("validation", "test")


def train_seeds(cfg: Config, train_one: Callable[[Config], Path], data: Any = None) -> Path:
    """Run `cfg` once per seed in `cfg.seeds` (with `train_one`, i.e. `train`), then write seeds.json.

    `data`: the in-memory splits `train` was given (each seed's run reads them again), or None.

    A seed whose dir holds a finished run is kept on --resume, one with a checkpoint is resumed, and the
    others train from the start; Ctrl-C/SIGTERM in any seed says how to continue them all.
    """
    assert cfg.seeds is not None
    parent = Path(cfg.output_dir if cfg.output_dir is not None else f"runs/{cfg.task}")
    main = os.environ.get("RANK", "0") == "0"
    reads = [Path(p) for p in (cfg.train_file, cfg.validation_file, cfg.test_file, cfg.model) if p]
    output = OutputDir.claim(parent, overwrite=cfg.overwrite, resume=cfg.resume, reads=reads, lock=main)
    try:
        read_splits(get_task(cfg), cfg, data)  # bad data is answered before a previous seeds run is replaced
        if main:
            output.clear_previous()
            output.record("recipe.yaml", *(f"seed-{seed}" for seed in cfg.seeds))
            save_config(replace(cfg, resume=False, overwrite=False), parent / "recipe.yaml")
        dirs = {seed: _train_seed(cfg, seed, parent / f"seed-{seed}", train_one) for seed in cfg.seeds}
        summary = summarise({seed: _metrics(path) for seed, path in dirs.items()})
        if main:
            output.record(SUMMARY)
            write_atomically(parent / SUMMARY, json.dumps(summary, indent=2) + "\n")
            _log_summary(summary, parent, dirs)
        return parent
    finally:
        output.release()


def _train_seed(cfg: Config, seed: int, out: Path, train_one: Callable[[Config], Path]) -> Path:
    finished = (out / "metrics.json").is_file()
    if cfg.resume and finished:
        logger.info("seed %d: finished before, kept (%s)", seed, out)
        return out
    resumable = cfg.resume and latest_checkpoint(out) is not None
    # A seed dir left without a checkpoint (stopped before its first one) is this run's to start again.
    again = cfg.resume and not resumable and out.exists()
    one = replace(cfg, seed=seed, seeds=None, output_dir=str(out), resume=resumable, overwrite=again)
    logger.info("seed %d of %s: %s", seed, cfg.seeds, out)
    try:
        return train_one(one)
    except TrainingInterrupted as stop:
        recipe = shlex.quote(str(out.parent / "recipe.yaml"))
        raise TrainingInterrupted(
            f"{stop} (seed {seed}); continue every seed with: "
            f"bert-tasks finetune {cfg.task} --recipe {recipe} --resume",
            stop.signal_number,
        ) from None


def _metrics(run: Path) -> dict[str, Any]:
    try:
        return json.loads((run / "metrics.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise BertTasksError(f"{run}/metrics.json cannot be read ({error}); train that seed again") from None


def summarise(per_seed: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """{split: {metric: {mean, std, values}}} over the seeds' scalar scores; std is the sample std (n-1).

    A metric missing from a seed's scores (a split it did not have) is left out of that split.
    """
    summary: dict[str, Any] = {"seeds": list(per_seed), "std": "sample standard deviation (n - 1)"}
    for split in SPLITS:
        scores = [metrics.get(split) for metrics in per_seed.values()]
        if not all(isinstance(s, dict) for s in scores):
            continue
        names = [name for name, value in scores[0].items() if _is_scalar(value)]
        common = [name for name in names if all(_is_scalar(s.get(name)) for s in scores)]
        summary[split] = {name: _spread([float(s[name]) for s in scores]) for name in common}
    return summary


def _is_scalar(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _spread(values: list[float]) -> dict[str, Any]:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"mean": statistics.fmean(values), "std": std, "values": values}


def _log_summary(summary: dict[str, Any], parent: Path, dirs: dict[int, Path]) -> None:
    seeds = len(dirs)
    for split in SPLITS:
        if split in summary:
            shown = ", ".join(
                f"{name} {spread['mean']:.4f} +- {spread['std']:.4f}"
                for name, spread in summary[split].items()
            )
            logger.info("%s over %d seeds: %s", split, seeds, shown)
    logger.info(
        "seeds summary in %s; the seeds' models: %s", parent / SUMMARY, ", ".join(map(str, dirs.values()))
    )
