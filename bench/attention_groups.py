"""Benchmark: one self-attention layer of the default model in inference, its batch attended in one [B, T]
layout or in groups of similar length (`Unpadding.in_groups`), at several group ratios.

A server's micro-batch mixes short and long texts; padded to its longest, every sequence pays the longest
one's attention. The batches are SST-2 dev sentences as the default model's tokenizer cuts them: drawn at
random (a server's batch) or consecutive in length order (the library's sorted batches). Timed: the whole
`FusedBertSelfAttention` forward on the packed tokens (fused q/k/v projection, scatter, SDPA, gather) in
bf16 autocast on one thread, median of --repeats; the ratio column is `_GROUP_LENGTH_RATIO` (inf: one
layout, as before grouping). Run from the repo root:

    python bench/attention_groups.py
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

import torch
from common import machine_line, quiet, read_tsv, table_header, table_row
from transformers import AutoConfig, AutoTokenizer

from bert_tasks.modeling import unpad
from bert_tasks.modeling.attention import FusedBertSelfAttention
from bert_tasks.modeling.load import bundled_model_dir
from bert_tasks.modeling.unpad import UNPADDING_KWARG, Unpadding

SST2_DEV = Path(__file__).resolve().parents[2] / "shared" / "data" / "sst2" / "dev.tsv"
RATIOS = [float("inf"), 3.0, 2.0, 1.5, 1.25]


def layer_ms(
    attention: FusedBertSelfAttention, lengths: list[int], ratio: float, repeats: int
) -> tuple[float, int]:
    """Median ms of one attention forward over a right-padded batch of `lengths`, and its group count."""
    seq_len = -(-max(lengths) // 8) * 8  # the tasks pad to a multiple of 8
    tokens = torch.arange(seq_len)[None, :] < torch.tensor(lengths)[:, None]  # [B, T]
    mask = tokens[:, None, None, :].expand(len(lengths), 1, seq_len, seq_len)  # transformers' sdpa form
    unpad._GROUP_LENGTH_RATIO = ratio
    unpadding = Unpadding.from_token_mask(tokens, bucketed=True).in_groups(mask)
    hidden = torch.randn(unpadding.rows, attention.config.hidden_size)  # [rows, C]
    kwargs = {UNPADDING_KWARG: unpadding}
    runs = []
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        for _ in range(3):
            attention(hidden, mask, **kwargs)
        for _ in range(repeats):
            start = time.perf_counter()
            attention(hidden, mask, **kwargs)
            runs.append(time.perf_counter() - start)
    return 1000 * statistics.median(runs), max(1, len(unpadding.groups))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[4, 16, 64])
    parser.add_argument("--draws", type=int, default=5, help="batches of each kind and size")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    quiet()
    torch.set_num_threads(1)
    model_dir = bundled_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    config = AutoConfig.from_pretrained(model_dir)
    attention = FusedBertSelfAttention(config).eval()
    texts = read_tsv(SST2_DEV, "sentence", "label")["text"]
    lengths = [len(ids) for ids in tokenizer(texts)["input_ids"]]
    ordered = sorted(lengths)
    print(machine_line())
    print("one self-attention layer of all-MiniLM-L6-v2, bf16 autocast, 1 thread; ms: mean over the draws")
    table_header(["texts", "batch", *(f"ratio {ratio:g}: ms (groups)" for ratio in RATIOS)])
    draws = random.Random(0)
    for size in args.sizes:
        batches = {
            "random": [draws.sample(lengths, size) for _ in range(args.draws)],
            "length-sorted": [
                ordered[start : start + size]
                for start in (draws.randrange(len(ordered) - size) for _ in range(args.draws))
            ],
        }
        for kind, drawn in batches.items():
            cells = []
            for ratio in RATIOS:
                measured = [layer_ms(attention, batch, ratio, args.repeats) for batch in drawn]
                ms = statistics.mean(m for m, _ in measured)
                groups = statistics.mean(g for _, g in measured)
                cells.append(f"{ms:.2f} ({groups:.1f})")
            table_row([size, kind, *cells])


if __name__ == "__main__":
    main()
