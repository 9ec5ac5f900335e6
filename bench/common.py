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
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import TrainingArguments

    from bert_tasks.inference.predictor import Predictor

# torch, transformers and datasets are imported by the functions that use them: a measuring child process
# (backends.py, ship_small.py) imports this module for its light helpers, and its memory and start-up must
# be those of what it measures (an ONNX row runs without torch).

T = TypeVar("T")
#: The score each task's rows are compared by.
METRIC = {"sentiment": "accuracy", "ner": "f1"}


def quiet() -> None:
    """Silence transformers' and datasets' per-load chatter, as bench/attention.py does."""
    import datasets
    import transformers

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
    """The CPU model and its bf16 instructions (AMX tiles or AVX512-BF16), what bf16 speed depends on;
    without them, its widest vector unit (AVX-512 or AVX2)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "cpu unknown"
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if "model name" in line), "?")
    flags = set(
        next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    )
    isa = [name for name in ("amx_bf16", "avx512_bf16") if name in flags]
    if not isa:  # the widest vector unit then sets fp32 speed (bf16 is emulated, slower than fp32)
        widest = next((name for name in ("avx512f", "avx2") if name in flags), "no avx2")
        isa = [widest, "no bf16 instructions"]
    return f"{model} ({', '.join(isa)})"


def bf16_as_bert_tasks() -> bool:
    """Whether bert-tasks' `mixed_precision=auto` takes bf16 on this machine (CUDA with bf16, or a CPU
    with AVX512-BF16 / AMX): the precision an anchor runs at, so both sides do the same arithmetic on
    every CPU kind (one without bf16 instructions emulates it, several times slower than fp32)."""
    from bert_tasks.runtime import resolve_mixed_precision

    return resolve_mixed_precision("auto") == "bf16"


def machine_line() -> str:
    """One line naming what the numbers depend on, printed above every table."""
    import torch
    import transformers

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
    import torch
    from transformers import TrainingArguments

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


def slice_recipe(task: str, train_rows: int, epochs: int, eval_rows: int) -> tuple[str, list[str]]:
    """The task's recipe and the overrides of a quick run on a slice of its data, as the Ship small benches
    train every teacher and student: the first `train_rows` training rows for `epochs`, evaluation at each
    epoch's end, no trackers or checkpoints. SST-2 picks its checkpoint on 10% of the slice
    (`validation_split`) and scores all of dev; BC5CDR picks on the first `eval_rows` dev sentences and
    scores the first `eval_rows` test sentences."""
    common = [f"epochs={epochs}", "eval_every=0", "report_to=none", "save_every=0"]
    if task == "sentiment":
        # lr and batch as tests/test_end_to_end.py's slice: the recipe's 3e-5 and 32 are for 6,000 updates,
        # and leave a teacher of a few dozen updates at chance.
        rows = [f"max_train_samples={train_rows}", "validation_split=0.1", "lr=1e-4", "batch_size=16"]
        return "recipes/sentiment_sst2.yaml", [*common, *rows]
    rows = [f"max_train_samples={train_rows}", f"max_eval_samples={eval_rows}"]
    return "recipes/ner_bc5cdr.yaml", [*common, *rows]


def model_splits(model_dir: Path) -> dict[str, Dataset]:
    """The splits a model dir's recipe.yaml reads (train, validation, test), as its run read them."""
    from bert_tasks import load_recipe
    from bert_tasks.data.splits import read_splits
    from bert_tasks.model_dir import read_policy
    from bert_tasks.tasks import task_class

    policy = read_policy(model_dir)
    cfg = load_recipe(model_dir / "recipe.yaml", [], policy.task)
    return read_splits(task_class(policy.task)(**policy.task_options), cfg)


def split_texts(raw: Dataset) -> list[str]:
    """A split's texts as `predict` takes them: sentences, or NER's words joined by spaces."""
    return list(raw["text"]) if "text" in raw.column_names else [" ".join(tokens) for tokens in raw["tokens"]]


def on_threads(predictor: Predictor, model_dir: str | Path, threads: int) -> None:
    """Run `predictor` on `threads` threads: torch's for a torch model, a new onnxruntime session with that
    many intra-op threads for an ONNX export (its session fixes them when it opens)."""
    if predictor.model is not None:
        import torch

        torch.set_num_threads(threads)
        return
    from bert_tasks.inference.onnx_backend import ONNX_FILE, OnnxBackend, open_session

    predictor.backend = OnnxBackend(open_session(Path(model_dir) / ONNX_FILE, threads))


def peak_rss_mib() -> float:
    """This process's peak resident memory (VmHWM: runtime, libraries and model together), in MiB.

    VmHWM, not ru_maxrss: Linux keeps ru_maxrss across exec, so a child would report its parent's peak.
    """
    status = Path("/proc/self/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1]) / 1024


def weights_mb(model_dir: Path) -> float:
    """Size on disk of a model dir's weights file (model.safetensors, or model.onnx of an export), in MB."""
    return (
        sum(f.stat().st_size for f in model_dir.iterdir() if f.name in ("model.safetensors", "model.onnx"))
        / 1e6
    )
