"""What the fine-tuning and prediction benchmarks share: timing, markdown rows, JSON, readers, HF baselines.

The readers here do not use bert_tasks' own readers, so each plain-transformers baseline gets from the
files to its numbers without any toolkit code.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import datasets
import torch
import transformers
from transformers import TrainingArguments

T = TypeVar("T")


def quiet() -> None:
    """Silence transformers' and datasets' per-load chatter, as bench/attention.py does."""
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    """`fn()`'s result and its wall time in seconds."""
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def cpu_name() -> str:
    """The CPU model and its bf16 instructions (AMX tiles or AVX512-BF16): what bf16 speed depends on."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "cpu unknown"
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if "model name" in line), "?")
    flags = set(
        next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    )
    isa = [name for name in ("amx_bf16", "avx512_bf16") if name in flags]
    return f"{model} ({', '.join(isa) or 'no bf16 instructions'})"


def machine_line() -> str:
    """One line naming what the numbers depend on, printed above every table."""
    bf16 = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return (
        f"{cpu_name()} | torch {torch.__version__} | transformers {transformers.__version__} | "
        f"threads {torch.get_num_threads()} | CPU bf16 {'native' if bf16 else 'emulated'} | "
        f"cuda {torch.cuda.is_available()}"
    )


def table_header(columns: Sequence[str]) -> None:
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns), flush=True)


def table_row(values: Sequence[object]) -> None:
    print("| " + " | ".join(str(value) for value in values) + " |", flush=True)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """`numerator / denominator` rounded for tables and JSON, or None when either side was not run."""
    if not numerator or not denominator:
        return None
    return round(numerator / denominator, 3)


def times(value: float | None) -> str:
    """A ratio as a table cell: `1.23x`, or `-` for one not measured."""
    return "-" if value is None else f"{value:.2f}x"


def write_json(path: Path | None, payload: Any) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")


def read_tsv(
    path: str | Path, text_column: str, label_column: str, limit: int | None = None
) -> dict[str, list[str]]:
    """GLUE-style TSV (header, tabs, no quoting) -> {"text": [...], "label": [...]}, first `limit` rows."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    header = lines[0].split("\t")
    text_at, label_at = header.index(text_column), header.index(label_column)
    rows = [line.split("\t") for line in lines[1:] if line.strip()][:limit]
    return {"text": [row[text_at] for row in rows], "label": [row[label_at].strip() for row in rows]}


def read_conll(path: str | Path, limit: int | None = None) -> tuple[list[list[str]], list[list[str]]]:
    """Token-per-line BIO file -> (words, tags) per sentence: token first, tag last, -DOCSTART- skipped."""
    words: list[list[str]] = [[]]
    tags: list[list[str]] = [[]]
    for line in Path(path).read_text(encoding="utf-8").split("\n"):
        columns = line.split("\t") if "\t" in line else line.split()
        if not columns or not line.strip() or columns[0] == "-DOCSTART-":
            if words[-1]:
                words.append([])
                tags.append([])
            continue
        words[-1].append(columns[0])
        tags[-1].append(columns[-1])
    if not words[-1]:
        words.pop()
        tags.pop()
    return words[:limit], tags[:limit]


def training_args(output_dir: str | Path, seed: int = 42, **settings: Any) -> TrainingArguments:
    """TrainingArguments with everything not being measured switched off: no saving, logging or reports.

    `settings` carries what the benchmark compares (epochs, batch size, lr, bf16, sampling, optimizer);
    `seed` seeds the data order and dropout.
    """
    return TrainingArguments(
        output_dir=str(output_dir),
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        eval_strategy="no",
        dataloader_num_workers=0,
        seed=seed,
        use_cpu=not torch.cuda.is_available(),  # transformers 5 refuses bf16 on CPU without it
        **settings,
    )
