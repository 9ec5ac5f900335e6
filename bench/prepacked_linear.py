"""Benchmark: a Linear as prediction ran it before (`F.linear`: oneDNN reordering a bf16 weight on every
call, MKL's GEMM in fp32) against the same weight prepacked once for oneDNN (`inference/prepacked_linear.py`),
at MiniLM's four Linear shapes, in bf16 and fp32.

For each dtype, row count (the unpadded tokens of a batch) and shape, the two run interleaved on the same
input, median ms of --calls calls each, with the largest difference between their outputs (bf16: 0, the
same bits; fp32: another summation order). Prints the machine line first: the ratio depends on the CPU
(oneDNN's kernels differ between AMX and AVX512-BF16).

    python bench/prepacked_linear.py                       # ~1 min
    python bench/prepacked_linear.py --rows 1 16 400 4096 --calls 50 --json bench/results/prepacked.json
"""

from __future__ import annotations

import argparse
import copy
import itertools
import statistics
import time
from pathlib import Path

import torch
from common import machine_line, write_json
from torch import nn

from bert_tasks.inference.prepacked_linear import PrepackedLinear, prepack_linears

#: (in, out) of MiniLM's (384 wide, 1,536 inner) fused q/k/v, attention output, intermediate, output.
SHAPES = ((384, 1152), (384, 384), (384, 1536), (1536, 384))


def time_calls(layer: nn.Module, x: torch.Tensor, calls: int, times: list[float]) -> None:
    """Append the time of `calls` forwards of `layer` on `x`, one at a time, to `times`."""
    for _ in range(calls):
        start = time.perf_counter()
        layer(x)
        times.append((time.perf_counter() - start) * 1e3)


def table_line(row: dict[str, object]) -> str:
    return (
        f"| {row['dtype']} | {row['rows']} | {row['shape']} | {row['plain_ms']:.3f} | "
        f"{row['packed_ms']:.3f} | {row['ratio']:.2f}x | {row['packed_gflops']:.0f} | {row['max_diff']:.1e} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16, 128, 512, 2900, 8192])
    parser.add_argument("--dtypes", nargs="+", default=["bf16", "fp32"], choices=["bf16", "fp32"])
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of --calls each")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args()
    print(machine_line())
    print("| dtype | rows | in x out | F.linear ms | prepacked ms | ratio | GFLOP/s prepacked | max diff |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    rows = []
    torch.manual_seed(0)
    for dtype, n, (fan_in, fan_out) in itertools.product(args.dtypes, args.rows, SHAPES):
        torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
        plain = nn.Linear(fan_in, fan_out).to(torch_dtype).eval()
        holder = nn.Sequential(copy.deepcopy(plain))
        if prepack_linears(holder) != 1:
            raise SystemExit(f"this torch cannot prepack a {dtype} Linear here: nothing to compare")
        packed: PrepackedLinear = holder[0]
        x = torch.randn(n, fan_in).to(torch_dtype)  # [N, in]
        times: dict[str, list[float]] = {"plain": [], "packed": []}
        with torch.inference_mode():
            max_diff = (plain(x).float() - packed(x).float()).abs().max().item()
            for layer in (plain, packed):
                time_calls(layer, x, 5, [])  # warm-up: oneDNN builds its primitive for this shape
            for _ in range(args.rounds):
                time_calls(plain, x, args.calls, times["plain"])
                time_calls(packed, x, args.calls, times["packed"])
        plain_ms, packed_ms = (statistics.median(times[k]) for k in ("plain", "packed"))
        row = {
            "dtype": dtype,
            "rows": n,
            "shape": f"{fan_in}x{fan_out}",
            "plain_ms": round(plain_ms, 4),
            "packed_ms": round(packed_ms, 4),
            "ratio": round(plain_ms / packed_ms, 3),
            "packed_gflops": round(2 * n * fan_in * fan_out / packed_ms / 1e6, 1),
            "max_diff": max_diff,
        }
        rows.append(row)
        print(table_line(row), flush=True)
    write_json(args.json, rows)


if __name__ == "__main__":
    main()
