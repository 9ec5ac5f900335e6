"""Profile: where a bert-tasks training step spends its time, and how far it is from its own floor.

Batches of the first `--rows` SST-2 train sentences, sorted by length and cut into batches of 32 (what
length grouping gives the runner), or `--shape 32x128` random full batches, through the default model
at the runner's precision (`--precision auto`: bf16 autocast where the CPU runs bf16 natively, fp32
elsewhere, as `mixed_precision=auto` picks) with the runner's update: forward, backward, the runner's
gradient clipping and word-embedding gradient (`--embedding-grad`, training/gradients.py), fused AdamW.
One untimed pass warms up; then the median of `--repeats` timed passes, and torch.profiler's self time
per op over one more pass, grouped into GEMMs, the optimizer, zero fills, dtype casts and the rest.
`--compare` times torch's own update (dense embedding gradient, `clip_grad_norm_`) in passes interleaved
with the runner's.

The floor is what the step cannot go below at equal arithmetic on this machine: every GEMM the profiled
pass ran, re-timed alone at its shapes in the step's dtype (the median of repeats), plus one fused AdamW
pass over the model's parameters, timed alone. The step's ratio to it is what fixed costs and small ops add.
Run from the repo root:

    python bench/profile_step.py                       # SST-2 batches, both cores, ~1 min
    python bench/profile_step.py --shape 32x128        # full 32 x 128 batches
    python bench/profile_step.py --compare             # the runner's update against torch's, same run
    python bench/profile_step.py --compile-layers      # then each BertLayer compiled (regional compile)
    python bench/profile_step.py --phases              # then forward, backward, clip, AdamW, zeroing timed

`--phases` times the step's parts with the clock alone, no profiler: torch.profiler's per-op bookkeeping
inflates some ops' self time (the gradient casts of the feed-forward weights read 1.2 ms a call under it,
0.07-0.2 ms timed by autograd hooks), so its shares say where to look, the phases how long each part takes.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from common import bf16_as_bert_tasks, machine_line, quiet, read_tsv
from torch.autograd.profiler_util import FunctionEvent
from torch.profiler import profile
from transformers import AutoTokenizer

from bert_tasks.modeling.load import bundled_model_dir, load_model
from bert_tasks.modeling.patch import set_attention_dropout
from bert_tasks.runtime import reuse_freed_memory
from bert_tasks.training.gradients import GradientBook

#: Self time of these ops, summed per group; everything else is "other".
GROUPS = {
    "GEMMs": ("aten::mm", "aten::addmm", "aten::bmm"),
    "optimizer (fused AdamW)": ("aten::_fused_adamw_",),
    "zero fills": ("aten::fill_", "aten::zero_"),
    "dtype casts": ("aten::copy_",),
}
Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
#: The parts of a step `--phases` times, in order.
PHASES = ("forward", "backward", "clip", "AdamW", "zeroing")
#: Timed repeats of each isolated GEMM / optimizer pass; the median counts.
FLOOR_REPEATS = 7


def sst2_batches(train_file: Path, rows: int, batch_size: int) -> list[Batch]:
    """(input_ids, attention_mask, labels) batches of length-sorted SST-2 sentences."""
    data = read_tsv(train_file, "sentence", "label", limit=rows)
    texts, labels = data["text"], data["label"]
    tokenizer = AutoTokenizer.from_pretrained(bundled_model_dir())
    encoded = tokenizer(texts, truncation=True, max_length=128)["input_ids"]
    order = sorted(range(len(encoded)), key=lambda row: len(encoded[row]))
    batches = []
    for start in range(0, len(order) - batch_size + 1, batch_size):
        chosen = order[start : start + batch_size]
        padded = tokenizer.pad({"input_ids": [encoded[row] for row in chosen]}, return_tensors="pt")
        targets = torch.tensor([int(labels[row]) for row in chosen])
        batches.append((padded["input_ids"], padded["attention_mask"], targets))
    return batches


def random_batches(shape: str, count: int) -> list[Batch]:
    """`count` batches of random token ids, every position real, e.g. shape "32x128"."""
    batch_size, length = (int(part) for part in shape.split("x"))
    generator = torch.Generator().manual_seed(0)
    return [
        (
            torch.randint(1000, 30000, (batch_size, length), generator=generator),
            torch.ones(batch_size, length, dtype=torch.long),
            torch.randint(0, 2, (batch_size,), generator=generator),
        )
        for _ in range(count)
    ]


def median_ms(fn: Callable[[], object]) -> float:
    """The median wall time of `fn()` in ms over FLOOR_REPEATS calls, after one warm-up call."""
    fn()
    times = []
    for _ in range(FLOOR_REPEATS):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def gemm_floor_ms(events: Sequence[FunctionEvent], steps: int, dtype: torch.dtype) -> float:
    """Per step: every profiled mm/addmm/bmm re-run alone at its shapes in `dtype`, times its count."""
    counts: dict[tuple[str, tuple], int] = defaultdict(int)
    for event in events:
        if event.name in GROUPS["GEMMs"]:
            counts[event.name, tuple(tuple(shape) for shape in event.input_shapes)] += 1
    total = 0.0
    for (name, shapes), count in counts.items():
        inputs = [torch.randn(shape, dtype=dtype) if shape else 1.0 for shape in shapes]
        op = {"aten::mm": torch.mm, "aten::bmm": torch.bmm, "aten::addmm": torch.addmm}[name]
        arguments = inputs[:3]  # addmm's beta/alpha scalars stay at their defaults
        total += median_ms(lambda op=op, arguments=arguments: op(*arguments)) * count
    return total / steps


def optimizer_floor_ms(model: torch.nn.Module) -> float:
    """One fused AdamW pass over copies of the model's parameters with random gradients."""
    params = [torch.nn.Parameter(p.detach().clone()) for p in model.parameters() if p.requires_grad]
    for param in params:
        param.grad = torch.randn_like(param)
    optimizer = torch.optim.AdamW(params, lr=5e-5, fused=True)
    return median_ms(optimizer.step)


def compiled_layers_ms(
    model: torch.nn.Module, one_pass: Callable[[], float], repeats: int
) -> tuple[float, float]:
    """Each encoder layer compiled on its own (one graph per layer, reused at every token count): the
    median ms a step over `repeats` passes after the first, and the first pass's seconds (compiling)."""
    for layer in model.bert.encoder.layer:
        layer.compile(dynamic=True)
    start = time.perf_counter()
    one_pass()
    compile_s = time.perf_counter() - start
    return statistics.median(one_pass() for _ in range(repeats)), compile_s


def batch_loss(model: torch.nn.Module, batch: Batch, bf16: bool) -> torch.Tensor:
    """The model's training loss on one batch, under the runner's precision."""
    input_ids, attention_mask, labels = batch
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        return model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss


def runner_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, book: GradientBook, batch: Batch, bf16: bool
) -> list[float]:
    """The runner's update (GradientBook's clipping and word-embedding gradient, fused AdamW) on one
    batch; the seconds each of `PHASES` took."""
    marks = [time.perf_counter()]
    loss = batch_loss(model, batch, bf16)
    marks.append(time.perf_counter())
    loss.backward()
    marks.append(time.perf_counter())
    book.clip(1.0)
    marks.append(time.perf_counter())
    optimizer.step()
    marks.append(time.perf_counter())
    optimizer.zero_grad(set_to_none=True)
    book.cleared()
    marks.append(time.perf_counter())
    return [end - start for start, end in itertools.pairwise(marks)]


def phases_ms(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    book: GradientBook,
    batches: list[Batch],
    bf16: bool,
) -> dict[str, float]:
    """`runner_step`'s parts, ms a step, over one pass over the batches; no profiler."""
    parts: dict[str, float] = defaultdict(float)
    for batch in batches:
        for name, seconds in zip(PHASES, runner_step(model, optimizer, book, batch, bf16), strict=True):
            parts[name] += seconds * 1000 / len(batches)
    return parts


def print_phases(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    book: GradientBook,
    batches: list[Batch],
    bf16: bool,
    repeats: int,
    gemms_ms: float,
) -> None:
    """The median of `repeats` passes of `phases_ms`, beside the GEMMs' own time."""
    runs = [phases_ms(model, optimizer, book, batches, bf16) for _ in range(repeats)]
    medians = {name: statistics.median(run[name] for run in runs) for name in PHASES}
    print(
        f"phases, no profiler (median of {repeats} passes): "
        + ", ".join(f"{name} {ms:.1f} ms" for name, ms in medians.items())
        + f"; sum {sum(medians.values()):.0f} ms; GEMMs alone {gemms_ms:.0f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train-file", type=Path, default=Path("../shared/data/sst2/train.tsv"))
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--attention-dropout", type=float, default=0.0, help="the SST-2 recipe's 0")
    parser.add_argument("--shape", help="random full batches, e.g. 32x128, instead of SST-2 sentences")
    parser.add_argument("--top", type=int, default=15, help="ops listed by self time")
    parser.add_argument("--repeats", type=int, default=5, help="timed passes over the batches; the median")
    parser.add_argument(
        "--precision", choices=("auto", "bf16", "fp32"), default="auto", help="auto: the runner's choice"
    )
    parser.add_argument("--embedding-grad", choices=("touched_rows", "dense"), default="touched_rows")
    parser.add_argument("--compare", action="store_true", help="also time torch's update, interleaved")
    parser.add_argument(
        "--compile-layers", action="store_true", help="then time the step with each BertLayer compiled"
    )
    parser.add_argument("--phases", action="store_true", help="then time the step's parts, no profiler")
    args = parser.parse_args()
    quiet()
    reuse_freed_memory()
    bf16 = args.precision == "bf16" or (args.precision == "auto" and bf16_as_bert_tasks())
    torch.manual_seed(0)
    if args.shape:
        batches = random_batches(args.shape, count=8)
    else:
        batches = sst2_batches(args.train_file, args.rows, batch_size=32)
    model = load_model("all-MiniLM-L6-v2", "sentiment", ["negative", "positive"]).train()
    set_attention_dropout(model, args.attention_dropout)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, fused=True)
    book = GradientBook(model, touched_rows=args.embedding_grad == "touched_rows")

    def step(batch: Batch) -> None:
        runner_step(model, optimizer, book, batch, bf16)  # `book` as it is now (--compare renews it)

    def torch_step(batch: Batch) -> None:
        """torch's update: the dense embedding gradient autograd makes, clip_grad_norm_."""
        batch_loss(model, batch, bf16).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def pass_ms(one_step: Callable[[Batch], None]) -> float:
        start = time.perf_counter()
        for batch in batches:
            one_step(batch)
        return (time.perf_counter() - start) / len(batches) * 1000

    pass_ms(step)  # warm-up
    runner_passes: list[float] = []
    torch_passes: list[float] = []
    for _ in range(args.repeats):
        runner_passes.append(pass_ms(step))
        if args.compare:
            book.release()  # the plain embedding, so autograd makes torch's dense gradient
            torch_passes.append(pass_ms(torch_step))
            book = GradientBook(model, touched_rows=args.embedding_grad == "touched_rows")
    step_ms = statistics.median(runner_passes)
    with profile(record_shapes=True) as profiler:
        for batch in batches:
            step(batch)
    gemms_ms = gemm_floor_ms(profiler.events(), len(batches), torch.bfloat16 if bf16 else torch.float32)
    adamw_ms = optimizer_floor_ms(model)
    events = profiler.key_averages()
    total = sum(event.self_cpu_time_total for event in events)
    shares: dict[str, float] = defaultdict(float)
    for event in events:
        group = next((name for name, ops in GROUPS.items() if event.key in ops), "other")
        shares[group] += event.self_cpu_time_total / total
    tokens = sum(int(mask.sum()) for _, mask, _ in batches) / len(batches)
    print(machine_line())
    size = len(batches[0][0])
    print(
        f"{len(batches)} batches of {size}, {tokens:.0f} real tokens on average: {step_ms:.0f} ms a step"
        f" (median of {args.repeats} passes; {'bf16 autocast' if bf16 else 'fp32'}; word-embedding gradient"
        f" {book.describe})"
    )
    if torch_passes:
        torch_ms = statistics.median(torch_passes)
        print(
            f"torch's update, interleaved: {torch_ms:.0f} ms a step; runner / torch {step_ms / torch_ms:.3f}"
        )
    floor_ms = gemms_ms + adamw_ms
    print(
        f"floor: GEMMs alone {gemms_ms:.0f} ms + one fused AdamW pass {adamw_ms:.0f} ms = {floor_ms:.0f} ms;"
        f" the step is {step_ms / floor_ms:.2f}x its floor"
    )
    for group in (*GROUPS, "other"):
        print(f"  {group}: {shares[group]:.0%}")
    print(events.table(sort_by="self_cpu_time_total", row_limit=args.top))
    if args.phases:
        print_phases(model, optimizer, book, batches, bf16, args.repeats, gemms_ms)
    if args.compile_layers:  # last: the profile and the floor above are eager's
        compiled_ms, compile_s = compiled_layers_ms(model, lambda: pass_ms(step), args.repeats)
        print(
            f"regional torch.compile (each BertLayer, dynamic shapes): {compile_s:.0f} s for the first pass,"
            f" then {compiled_ms:.0f} ms a step against eager {step_ms:.0f} ms ({compiled_ms / step_ms:.3f})"
        )


if __name__ == "__main__":
    main()
