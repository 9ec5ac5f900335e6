"""`debug data`: a pre-flight report on a task's data, read exactly as `finetune` reads it, no model loaded.

The splits come from the same reader and split rule (`read_unchecked_splits`), so a bad file is the same
one-line error; the checks training runs on the splits (`split_problems`) are collected rather than
raised at the first, so the report shows every one of them. Lengths and windows come from the task's own
`encode` with the recipe's `max_length`/`stride`, which is what training feeds the model, so "windowed"
means exactly what training will split. What only a task knows (labels, entity types, repaired tags)
comes from `Task.profile_split`; this module assembles and shows the rest the same way for every task.

Errors (the report's exit status is 1 with any) are what training refuses, plus an evaluation split that
is wholly contained in the training split (its scores would measure memory alone). Everything else is a
warning: rare labels, empty rows, duplicates (with conflicting labels called out), overlap with train,
repaired tags.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from bert_tasks.data.files import is_blank
from bert_tasks.data.splits import read_unchecked_splits, split_problems
from bert_tasks.errors import BertTasksError
from bert_tasks.tasks import get_task
from bert_tasks.training.class_weights import check_class_weights

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase

    from bert_tasks.config import Config
    from bert_tasks.tasks.base import SplitProfile, Task

#: A label with fewer examples (entities) than this in a split is reported as rare.
RARE_BELOW = 10
#: The text table shows this many label rows (the most frequent in train); the JSON report has them all.
SHOWN_LABELS = 30
#: Names listed in one warning line before "...".
SHOWN_NAMES = 10


def data_report(cfg: Config, rare_below: int = RARE_BELOW) -> dict[str, Any]:
    """Read `cfg`'s splits and the tokenizer of `cfg.model` (never its weights) and describe the data.

    Returns a plain-JSON dict: the settings it was judged with, `splits` (per split: where it came from,
    counts, sub-token lengths and windows, the label distribution, duplicates and overlap with train, and
    the task's own counts), the label set a model would get, and the `errors` and `warnings` found.

    Raises:
        BertTasksError: a file or hub split that cannot be read, a config or tokenizer that does not load
            (the same one-line errors as `finetune`); problems of the data itself are reported instead.
    """
    if rare_below < 1:
        raise BertTasksError(f"--rare must be at least 1, got {rare_below}")
    task = get_task(cfg)
    splits, sources = read_unchecked_splits(task, cfg)
    errors = _training_errors(task, splits, sources, cfg)
    labels = _model_labels(task, splits, cfg, errors)
    profiles = {name: task.profile_split(data) for name, data in splits.items()}
    from bert_tasks.modeling.load import load_tokenizer  # transformers: once the data has read

    tokenizer = load_tokenizer(cfg.model, **task.tokenizer_options)
    train = profiles.get("train")
    report: dict[str, Any] = {}
    warnings: list[str] = []
    for name, data in splits.items():
        lengths, windows = token_lengths(task, data, tokenizer, cfg.max_length, cfg.stride)
        profile = profiles[name]
        report[name] = _split_report(sources[name], profile, lengths, windows, rare_below)
        if name != "train" and train is not None:
            report[name] |= _against_train(profile, train)
            if 0 < report[name]["in_train"] == report[name]["examples"] - report[name]["empty"]:
                errors.append(
                    f"{sources[name]}: every row also occurs in the training data ({sources['train']}), "
                    "so its scores would measure memory, not generalisation; evaluate on held-out rows"
                )
        warnings += [f"{name}: {warning}" for warning in _warnings(report[name], profile, rare_below)]
    unit = next(iter(profiles.values())).unit
    return {
        "task": task.name,
        "tokenizer": cfg.model,
        "max_length": cfg.max_length,
        "stride": cfg.stride,
        "rare_below": rare_below,
        "unit": unit,
        "labels": labels,
        "splits": report,
        "errors": errors,
        "warnings": warnings,
    }


def token_lengths(
    task: Task, raw: Dataset, tokenizer: PreTrainedTokenizerBase, max_length: int, stride: int
) -> tuple[np.ndarray, np.ndarray]:
    """Sub-tokens per example (special tokens included) and windows per example, from the task's `encode`.

    An example in one window is that long; the few in several are encoded again with a window that holds
    them whole (no longer than all their windows together), so both numbers follow training's rule.
    """
    import pyarrow.compute as pc

    encoded = task.encode(raw, tokenizer, None, max_length, stride)
    example_id = np.asarray(encoded["example_id"][:], dtype=np.int64)  # [W]
    window_lengths = pc.list_value_length(encoded.data.column("input_ids")).to_numpy()  # [W]
    windows = np.bincount(example_id, minlength=len(raw))  # [N]
    lengths = np.zeros(len(raw), dtype=np.int64)  # [N]
    np.add.at(lengths, example_id, window_lengths)  # exact where windows == 1, an upper bound elsewhere
    split = np.flatnonzero(windows > 1)
    if split.size:
        whole = task.encode(raw.select(split), tokenizer, None, int(lengths[split].max()), stride)
        if len(whole) != split.size:
            raise RuntimeError(
                f"{len(whole)} windows for {split.size} examples encoded whole: a windowing bug"
            )
        lengths[split] = pc.list_value_length(whole.data.column("input_ids")).to_numpy()
    return lengths, windows


def _training_errors(
    task: Task, splits: dict[str, Dataset], sources: dict[str, str], cfg: Config
) -> list[str]:
    """What `finetune` would refuse in these splits, in its own words."""
    if "train" not in splits:
        return ["no training data; set train_file or a dataset with a train split"]
    return split_problems(task, splits, sources, cfg)


def _model_labels(task: Task, splits: dict[str, Dataset], cfg: Config, errors: list[str]) -> list[str] | None:
    """The label set a model trained on this data gets, in id order; None (and an error) when it has none."""
    if "train" not in splits:
        return None
    try:
        labels = task.label_names(splits["train"], cfg)
    except BertTasksError as error:  # e.g. label_names that lack a tag of the training data
        errors.append(str(error))
        return None
    try:  # a weight list must match the label set finetune's loss gets
        check_class_weights(cfg.class_weights, labels)
    except BertTasksError as error:
        errors.append(str(error))
    return labels


def _split_report(
    source: str, profile: SplitProfile, lengths: np.ndarray, windows: np.ndarray, rare_below: int
) -> dict[str, Any]:
    """One split's own numbers (plain JSON); `in_train` and `missing_from_train` are None until
    `_against_train` fills them for an evaluation split."""
    duplicates, conflicting = _duplicates(profile.keys, profile.golds)
    return {
        "source": source,
        "examples": len(profile.keys),
        "empty": sum(1 for key in profile.keys if is_blank(key)),
        "duplicates": duplicates,
        "conflicting": conflicting,
        "in_train": None,
        "sub_tokens": _summary(lengths),
        "windowed": int((windows > 1).sum()),
        "windows": int(windows.sum()),
        "labels": dict(sorted(profile.labels.items())),
        "rare": sorted(label for label, count in profile.labels.items() if count < rare_below),
        "missing_from_train": None,
        **profile.counts,
    }


def _against_train(profile: SplitProfile, train: SplitProfile) -> dict[str, Any]:
    """An evaluation split's rows whose (non-empty) text is in train, and its labels train never shows."""
    train_keys = set(train.keys)
    return {
        "in_train": sum(1 for key in profile.keys if key in train_keys and not is_blank(key)),
        "missing_from_train": sorted(set(profile.labels) - set(train.labels)),
    }


def _duplicates(keys: Sequence[str], golds: Sequence[Hashable]) -> tuple[int, list[str]]:
    """Rows repeating an earlier row's (non-empty) text, and the texts whose copies differ in their labels."""
    first: dict[str, Hashable] = {}
    repeats, conflicting = 0, {}
    for key, gold in zip(keys, golds, strict=True):
        if is_blank(key):
            continue
        if key not in first:
            first[key] = gold
            continue
        repeats += 1
        if gold != first[key]:
            conflicting[key] = None  # a dict keeps the order the texts came in
    return repeats, list(conflicting)


def _summary(lengths: np.ndarray) -> dict[str, float]:
    if not lengths.size:
        return {}
    return {
        "min": int(lengths.min()),
        "median": float(np.median(lengths)),
        "p95": float(np.percentile(lengths, 95)),
        "max": int(lengths.max()),
    }


def _warnings(split: dict[str, Any], profile: SplitProfile, rare_below: int) -> list[str]:
    """The split's warnings, one line each: rare labels, empty rows, duplicates, overlap, the task's own."""
    warnings = []
    if split["rare"]:
        named = [f"{label} ({split['labels'][label]})" for label in split["rare"]]
        warnings.append(f"{len(named)} label(s) with fewer than {rare_below} {profile.unit}: {_some(named)}")
    if split["empty"]:
        warnings.append(f"{split['empty']} empty row(s) (no text): they teach nothing; drop them")
    if split["duplicates"]:
        line = f"{split['duplicates']} row(s) repeat an earlier row's text"
        if split["conflicting"]:
            shown = _some([repr(_clip(text)) for text in split["conflicting"]])
            line += f"; {len(split['conflicting'])} text(s) appear with conflicting labels: {shown}"
        warnings.append(line)
    if split["in_train"]:
        warnings.append(
            f"{split['in_train']} of {split['examples']} row(s) also occur in the training data (exact "
            "text); their scores reward memory"
        )
    return warnings + profile.warnings


def _some(names: Sequence[str]) -> str:
    return ", ".join(names[:SHOWN_NAMES]) + (
        f", ... ({len(names)} in all)" if len(names) > SHOWN_NAMES else ""
    )


def _clip(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def render_data_report(report: dict[str, Any]) -> str:
    """The report as text for people: settings, one column per split, then errors and warnings."""
    splits = report["splits"]
    labels = ", ".join(report["labels"]) if report["labels"] is not None else "none (see errors)"
    header = (
        f"debug data: {report['task']} | tokenizer {report['tokenizer']} | max_length "
        f"{report['max_length']}, stride {report['stride']} | model labels: {labels}"
    )
    lines = [header, "", *_table(_rows(report), list(splits)), ""]
    lines += [f"{name:<12}{split['source']}" for name, split in splits.items()]
    for kind in ("errors", "warnings"):
        found = report[kind]
        lines += ["", f"{kind}: {len(found) or 'none'}", *(f"  - {line}" for line in found)]
    return "\n".join(lines)


def _rows(report: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """(row name, one cell per split) for the text table."""
    splits = list(report["splits"].values())

    def row(name: str, cell: Any) -> tuple[str, list[str]]:
        return name, [_cell(cell(split)) for split in splits]

    rows = [
        row("examples", lambda s: s["examples"]),
        row("empty rows", lambda s: s["empty"]),
        row("duplicate rows", lambda s: s["duplicates"]),
        row("  conflicting texts", lambda s: len(s["conflicting"])),
        row("rows also in train", lambda s: s["in_train"]),
        row("sub-tokens min", lambda s: s["sub_tokens"].get("min")),
        row("sub-tokens median", lambda s: s["sub_tokens"].get("median")),
        row("sub-tokens p95", lambda s: s["sub_tokens"].get("p95")),
        row("sub-tokens max", lambda s: s["sub_tokens"].get("max")),
        row(f"windowed (> {report['max_length']})", lambda s: s["windowed"]),
        row("windows", lambda s: s["windows"]),
    ]
    rows += _count_rows(report["unit"], [split["labels"] for split in splits])
    extra = [key for key in splits[0] if key not in _GENERIC_KEYS]
    for key in extra:
        name = key.replace("_", " ")
        if isinstance(splits[0][key], dict):
            rows += _count_rows(name, [split.get(key, {}) for split in splits])
        else:
            rows.append(row(name, lambda s, key=key: s.get(key)))
    return rows


_GENERIC_KEYS = {
    "source",
    "examples",
    "empty",
    "duplicates",
    "conflicting",
    "in_train",
    "sub_tokens",
    "windowed",
    "windows",
    "labels",
    "rare",
    "missing_from_train",
}


def _count_rows(name: str, tables: list[dict[str, int]]) -> list[tuple[str, list[str]]]:
    """One row per key of the tables, the most frequent in the first split first; at most SHOWN_LABELS."""
    keys = sorted({key for table in tables for key in table}, key=lambda k: (-tables[0].get(k, 0), k))
    rows = [(f"{name} {key}", [_cell(table.get(key, 0)) for table in tables]) for key in keys[:SHOWN_LABELS]]
    if len(keys) > SHOWN_LABELS:
        rows.append((f"{name}: {len(keys) - SHOWN_LABELS} more", ["(--json)"] * len(tables)))
    return rows


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _table(rows: list[tuple[str, list[str]]], columns: list[str]) -> list[str]:
    first = max(len(name) for name, _ in rows)
    widths = [max(len(column), *(len(cells[i]) for _, cells in rows)) for i, column in enumerate(columns)]
    lines = [" " * first + "".join(f"  {column:>{w}}" for column, w in zip(columns, widths, strict=True))]
    for name, cells in rows:
        lines.append(
            f"{name:<{first}}" + "".join(f"  {cell:>{w}}" for cell, w in zip(cells, widths, strict=True))
        )
    return lines
