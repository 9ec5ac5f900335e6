"""Benchmark: the CPU training levers of the performance issue, each measured alone, one run.

  dropout    torch's `F.dropout` against bert-tasks' `fast_dropout` (forward + backward) on the shapes a
             BERT layer drops: hidden states [B, T, 384] and attention probabilities [B, 12, T, T]; and
             the same draws with the mask multiplied in (`mask_by_mul`, what FastDropout did in bf16)
  attention  forward + backward of one attention call, [B, 12, T, 32] bf16 with a padding mask: SDPA's
             flash kernel (dropout 0), SDPA's math fallback with dropout 0.1 (what CPU training runs
             when dropout is on), and bert-tasks' math path with FastDropout 0.1 and without dropout
  allocator  a fresh 47 MB dense embedding gradient (zeros + one write), glibc's default (mmap'ed
             pages, faulted in each time) against `reuse_freed_memory` (set for the rest of the process,
             so it runs last)
  compile    (--compile) a bf16 training step of the default model at batch 32 x 16 tokens, eager
             against `torch.compile(dynamic=True)`, and the compile time
Implementations interleaved, medians of --repeats. Run from the repo root:

    python bench/levers.py --json bench/results/levers.json
    python bench/levers.py --compile --json bench/results/levers_compile.json     # + ~3 min of compiling
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from common import machine_line, quiet, write_json
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import BertConfig

from bert_tasks import load_model
from bert_tasks.modeling.attention import FusedBertSelfAttention
from bert_tasks.modeling.dropout import fast_dropout, keep_mask
from bert_tasks.runtime import reuse_freed_memory

HEADS, HEAD_SIZE, HIDDEN, VOCAB = 12, 32, 384, 30522


def median_ms(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median milliseconds of each function, run interleaved after one warm-up call each."""
    for fn in fns.values():
        fn()
    seconds: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            seconds[name].append(time.perf_counter() - start)
    return {name: 1e3 * statistics.median(values) for name, values in seconds.items()}


def forward_backward(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> Callable[[], None]:
    def run() -> None:
        fn(x).sum().backward()

    return run


def dropout_rows(repeats: int) -> list[dict[str, Any]]:
    rows = []
    for name, shape in (
        ("hidden 32x16", (32, 16, HIDDEN)),
        ("hidden 32x128", (32, 128, HIDDEN)),
        ("probs 32x128", (32, HEADS, 128, 128)),
    ):
        x = torch.randn(shape, dtype=torch.bfloat16, requires_grad=True)
        ms = median_ms(
            {
                "F.dropout": forward_backward(lambda t: F.dropout(t, 0.1, training=True), x),
                "fast_dropout": forward_backward(lambda t: fast_dropout(t, 0.1), x),
                # The same draws, the mask multiplied in (FastDropout before it selected with `where`).
                "mask_by_mul": forward_backward(
                    lambda t: t.mul(keep_mask(t.shape, 0.1, t.device)).mul_(1 / 0.9), x
                ),
            },
            repeats,
        )
        speedups = {
            "speedup": ms["F.dropout"] / ms["fast_dropout"],
            "where_vs_mul": ms["mask_by_mul"] / ms["fast_dropout"],
        }
        rows.append({"lever": "dropout", "shape": name, **ms, **speedups})
    return rows


def math_attention(p: float) -> FusedBertSelfAttention:
    """bert-tasks' attention in training mode, whose math path (`_attend_with_probs`) CPU training runs."""
    config = BertConfig(hidden_size=HIDDEN, num_attention_heads=HEADS, attention_probs_dropout_prob=p)
    return FusedBertSelfAttention(config).train()


def attention_rows(repeats: int) -> list[dict[str, Any]]:
    shapes = ((32, 16), (32, 64), (32, 128), (8, 256), (8, 512))
    return [attention_row(batch, seq_len, repeats) for batch, seq_len in shapes]


def attention_row(batch: int, seq_len: int, repeats: int) -> dict[str, Any]:
    q, k, v = (
        torch.randn(batch, HEADS, seq_len, HEAD_SIZE, dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    keep = torch.ones(batch, 1, 1, seq_len, dtype=torch.bool)
    keep[0, ..., seq_len // 2 :] = False  # one padded row

    def sdpa(backend: SDPBackend, p: float) -> Callable[[], None]:
        def run() -> None:
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=p).sum().backward()

        return run

    def ours(p: float) -> Callable[[], None]:
        attention = math_attention(p)

        def run() -> None:
            context, _ = attention._attend_with_probs(q, k, v, keep, is_causal=False)  # [B, H, T, D]
            context.sum().backward()

        return run

    ms = median_ms(
        {
            "sdpa flash p0": sdpa(SDPBackend.FLASH_ATTENTION, 0.0),
            "sdpa math p0.1": sdpa(SDPBackend.MATH, 0.1),
            "bert-tasks math p0.1": ours(0.1),
            "bert-tasks math p0": ours(0.0),
        },
        repeats,
    )
    return {"lever": "attention", "shape": f"{batch}x{seq_len}", **ms}


def allocator_rows(repeats: int) -> list[dict[str, Any]]:
    def fresh_gradient() -> None:
        grad = torch.zeros(VOCAB, HIDDEN)  # [V, C]: the word embeddings' dense gradient
        grad[:512] += 1.0

    default = median_ms({"default": fresh_gradient}, repeats)["default"]
    reuse_freed_memory()
    reused = median_ms({"reuse": fresh_gradient}, repeats)["reuse"]
    return [{"lever": "allocator", "shape": f"{VOCAB}x{HIDDEN} fp32", "glibc default": default,
             "reuse_freed_memory": reused, "speedup": default / reused}]  # fmt: skip


def compile_rows(repeats: int) -> list[dict[str, Any]]:
    model = load_model(task="sentiment", labels=["negative", "positive"]).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    compiled = torch.compile(model, dynamic=True)
    ids = torch.randint(1000, VOCAB, (32, 16))
    labels = torch.zeros(32, dtype=torch.long)

    def step(module: torch.nn.Module) -> Callable[[], None]:
        def run() -> None:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = module(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return run

    start = time.perf_counter()
    step(compiled)()
    compile_s = time.perf_counter() - start
    ms = median_ms({"eager": step(model), "compiled": step(compiled)}, repeats)
    return [{"lever": "compile", "shape": "32x16 bf16 step", **ms, "compile_s": compile_s,
             "speedup": ms["eager"] / ms["compiled"]}]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--compile", action="store_true", help="also measure torch.compile (slow)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    quiet()
    print(machine_line())
    rows = dropout_rows(args.repeats) + attention_rows(args.repeats)
    if args.compile:
        rows += compile_rows(args.repeats)
    rows += allocator_rows(args.repeats)  # last: the setting holds for the rest of the process
    for row in rows:
        cells = [
            f"{key} {value:.2f}" if isinstance(value, float) else f"{value}" for key, value in row.items()
        ]
        print(" | ".join(cells), flush=True)
    write_json(args.json, rows)


if __name__ == "__main__":
    main()
