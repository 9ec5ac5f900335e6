"""Profile: where a bert-tasks training step on real SST-2 batches spends its time.

Batches of the first `--rows` SST-2 train sentences, sorted by length and cut into batches of 32 (what
length grouping gives the runner), through the default model under bf16 autocast with the runner's
update: forward, backward, gradient clipping, fused AdamW. One untimed pass warms up; then the mean
step time, and torch.profiler's self time per op over a second pass, grouped into GEMMs, the
optimizer, zero fills, dtype casts and the rest. Run from the repo root:

    OMP_NUM_THREADS=1 taskset -c 1 python bench/profile_step.py      # one core, ~1 min
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from pathlib import Path

import torch
from common import machine_line, quiet, read_tsv
from torch.profiler import profile
from transformers import AutoTokenizer

from bert_tasks.modeling.load import bundled_model_dir, load_model
from bert_tasks.modeling.patch import set_attention_dropout
from bert_tasks.runtime import reuse_freed_memory

#: Self time of these ops, summed per group; everything else is "other".
GROUPS = {
    "GEMMs": ("aten::mm", "aten::addmm", "aten::bmm"),
    "optimizer (fused AdamW)": ("aten::_fused_adamw_",),
    "zero fills": ("aten::fill_", "aten::zero_"),
    "dtype casts": ("aten::copy_",),
}
Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train-file", type=Path, default=Path("../shared/data/sst2/train.tsv"))
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--attention-dropout", type=float, default=0.0, help="the SST-2 recipe's 0")
    parser.add_argument("--top", type=int, default=15, help="ops listed by self time")
    args = parser.parse_args()
    quiet()
    reuse_freed_memory()
    torch.manual_seed(0)
    batches = sst2_batches(args.train_file, args.rows, batch_size=32)
    model = load_model("all-MiniLM-L6-v2", "sentiment", ["negative", "positive"]).train()
    set_attention_dropout(model, args.attention_dropout)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, fused=True)

    def step(batch: Batch) -> None:
        input_ids, attention_mask, labels = batch
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for batch in batches:  # warm-up
        step(batch)
    start = time.perf_counter()
    for batch in batches:
        step(batch)
    step_ms = (time.perf_counter() - start) / len(batches) * 1000
    with profile() as profiler:
        for batch in batches:
            step(batch)
    events = profiler.key_averages()
    total = sum(event.self_cpu_time_total for event in events)
    shares: dict[str, float] = defaultdict(float)
    for event in events:
        group = next((name for name, ops in GROUPS.items() if event.key in ops), "other")
        shares[group] += event.self_cpu_time_total / total
    tokens = sum(int(mask.sum()) for _, mask, _ in batches) / len(batches)
    print(machine_line())
    print(f"{len(batches)} batches of 32, {tokens:.0f} real tokens on average: {step_ms:.0f} ms a step")
    for group in (*GROUPS, "other"):
        print(f"  {group}: {shares[group]:.0%}")
    print(events.table(sort_by="self_cpu_time_total", row_limit=args.top))


if __name__ == "__main__":
    main()
