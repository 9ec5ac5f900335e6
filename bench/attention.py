"""Benchmark: bert-tasks' fused attention against stock transformers BERT (eager and sdpa), one run.

For each sequence length, dtype (fp32, bf16 autocast) and mode (inference forward; training forward +
backward + fused AdamW step with the model's dropout), the implementations run interleaved over several
repeats on the same padded batches (~30% padding), and the table reports the median real-token
throughput, the ratio to HF sdpa, the peak tensor memory of one step, and the model FLOP utilisation:
real tokens/s x FLOP per token (the issue's 67.4 MFLOP for a training step of the default model at 128
tokens, a third of it for a forward) over the peak matmul rate of this machine in that dtype: a 4096^3
GEMM (the faster of plain and prepacked) timed after every repeat, their median (the last column).
"bert-tasks attn-drop 0" is bert-tasks trained with `attention_dropout=0` (training rows only: inference
has no dropout), the setting that lets long inputs use SDPA's flash kernel.
"bert-tasks as predict" (inference rows only) is the model as `predict` and `Predictor` run it on CPU:
each Linear's weight prepacked for oneDNN (`inference/prepacked_linear.py`), in bf16 cast to bf16 first.

    python bench/attention.py                      # default model, batch 32, seq 128 and 512
    python bench/attention.py --seq-lens 128 --repeats 5 --json bench/results/attention.json
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import torch
import transformers
from common import machine_line, timed, write_json
from transformers import BertForSequenceClassification

from bert_tasks import load_model
from bert_tasks.inference.prepacked_linear import linear_weights_in_bf16, prepack_linears
from bert_tasks.insight.peak_memory import peak_memory_bytes
from bert_tasks.modeling.load import resolve_model_path
from bert_tasks.modeling.patch import set_attention_dropout

NO_ATTENTION_DROPOUT = "bert-tasks attn-drop 0"
#: The model as `predict` and the library run it on CPU: bf16 Linear weights cast once and prepacked,
#: and in fp32 (`mixed_precision=no`) the fp32 weights prepacked.
AS_PREDICT = {"bf16": "bert-tasks as predict", "fp32": "bert-tasks as predict fp32"}
IMPLEMENTATIONS = ("hf-eager", "hf-sdpa", "bert-tasks", NO_ATTENTION_DROPOUT, *AS_PREDICT.values())
#: FLOP per real token of the default model (6 layers, 384 wide, 128 tokens): training, and a forward.
TRAIN_FLOP_PER_TOKEN = 67.4e6
FORWARD_FLOP_PER_TOKEN = TRAIN_FLOP_PER_TOKEN / 3


def build_model(name: str, model_path: str) -> torch.nn.Module:
    if name.startswith("bert-tasks"):
        model = load_model(model_path, "sentiment", ["negative", "positive"])
        if name == NO_ATTENTION_DROPOUT:
            set_attention_dropout(model, 0.0)
        if name == AS_PREDICT["bf16"]:
            linear_weights_in_bf16(model)
        if name in AS_PREDICT.values():
            prepack_linears(model)
        return model
    attn = name.removeprefix("hf-")
    return BertForSequenceClassification.from_pretrained(model_path, num_labels=2, attn_implementation=attn)


def padded_batch(batch: int, seq_len: int, vocab: int, seed: int) -> dict[str, torch.Tensor]:
    """Random ids with lengths uniform in [0.4, 1] x seq_len: about 30% padding, like real batches."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(int(0.4 * seq_len), seq_len + 1, (batch,), generator=generator)
    lengths[0] = seq_len  # the longest row sets the padded width
    input_ids = torch.randint(1000, vocab, (batch, seq_len), generator=generator)
    attention_mask = (torch.arange(seq_len)[None, :] < lengths[:, None]).long()  # [B, T]
    return {
        "input_ids": input_ids * attention_mask,
        "attention_mask": attention_mask,
        "labels": torch.randint(0, 2, (batch,), generator=generator),
    }


def make_step(
    model: torch.nn.Module, mode: str, dtype: str, batch: dict[str, torch.Tensor]
) -> Callable[[], None]:
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bf16" else nullcontext()
    if mode == "inference":
        model.eval()

        def step() -> None:
            with torch.inference_mode(), autocast:
                model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])

        return step
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)

    def step() -> None:
        with autocast:
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def runs_in(name: str, mode: str, dtype: str) -> bool:
    """Whether an implementation has a row here: no dropout to switch off in inference, and a
    prepacked model only predicts, in its own dtype."""
    if name in AS_PREDICT.values():
        return mode == "inference" and name == AS_PREDICT[dtype]
    return mode == "train" or name != NO_ATTENTION_DROPOUT


class PeakGemm:
    """A square GEMM in one dtype, its operands built once: the MFU denominator, read again and again.

    The GEMM also runs with its weight prepacked for oneDNN, as prediction runs it (in bf16 about 6%
    faster on an EPYC), and the faster of the two counts, so that prepacking cannot lift an MFU above
    the peak.
    """

    def __init__(self, dtype: str, size: int = 4096) -> None:
        torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
        a, b = (torch.randn(size, size, dtype=torch_dtype) for _ in range(2))  # [size, size] each
        self.products: list[Callable[[], object]] = [lambda: a @ b]
        prepacked = torch.nn.Sequential(torch.nn.Linear(size, size, bias=False).to(torch_dtype))
        if prepack_linears(prepacked):
            self.products.append(lambda: prepacked(a))
        self.flop = 2 * size**3
        with torch.inference_mode():
            for product in self.products:
                product()  # warm-up: oneDNN picks and caches its kernel

    def flops(self, repeats: int) -> float:
        """The best FLOP/s of `repeats` calls of each product."""
        with torch.inference_mode():
            best = min(timed(product)[1] for product in self.products for _ in range(repeats))
        return self.flop / best


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="all-MiniLM-L6-v2")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--modes", nargs="+", default=["inference", "train"], choices=["inference", "train"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()

    model_path = resolve_model_path(args.model)
    models = {name: build_model(name, model_path) for name in IMPLEMENTATIONS}
    vocab = models["hf-sdpa"].config.vocab_size
    print(f"model {args.model} | batch {args.batch} | {machine_line()}")
    gemms = {dtype: PeakGemm(dtype) for dtype in args.dtypes}
    for dtype, gemm in gemms.items():
        print(f"peak {dtype} matmul at start {gemm.flops(5) / 1e12:.3f} TFLOP/s")
    rows = []
    for seq_len in args.seq_lens:
        batch = padded_batch(args.batch, seq_len, vocab, seed=seq_len)
        real_tokens = int(batch["attention_mask"].sum())
        for dtype in args.dtypes:
            for mode in args.modes:
                steps = {
                    name: make_step(model, mode, dtype, batch)
                    for name, model in models.items()
                    if runs_in(name, mode, dtype)
                }
                for step in steps.values():
                    step()  # warm-up: allocator, oneDNN kernels, optimizer state
                times: dict[str, list[float]] = {name: [] for name in steps}
                # the peak again in every repeat, beside the steps: these shared machines drift by 10-15%
                # within minutes, and an MFU over a peak read at another moment would drift with them
                peak_samples = []
                for _ in range(args.repeats):
                    for name, step in steps.items():  # interleaved: machine noise hits all alike
                        start = time.perf_counter()
                        step()
                        times[name].append(time.perf_counter() - start)
                    peak_samples.append(gemms[dtype].flops(repeats=1))
                peak = statistics.median(peak_samples)
                peaks = {name: peak_memory_bytes(step) for name, step in steps.items()}
                base = real_tokens / statistics.median(times["hf-sdpa"])
                for name in steps:
                    tokens_per_s = real_tokens / statistics.median(times[name])
                    flop_per_token = TRAIN_FLOP_PER_TOKEN if mode == "train" else FORWARD_FLOP_PER_TOKEN
                    row = {
                        "seq_len": seq_len,
                        "dtype": dtype,
                        "mode": mode,
                        "impl": name,
                        "tokens_per_s": round(tokens_per_s, 1),
                        "vs_hf_sdpa": round(tokens_per_s / base, 3),
                        "peak_mib": round(peaks[name] / 2**20, 1),
                        "mfu": round(tokens_per_s * flop_per_token / peak, 3),
                        "peak_tflops": round(peak / 1e12, 3),
                    }
                    rows.append(row)
                    print(
                        f"| {seq_len} | {dtype} | {mode} | {name} | {row['tokens_per_s']:.0f} | "
                        f"{row['vs_hf_sdpa']:.2f}x | {row['peak_mib']:.0f} | {row['mfu']:.0%} | "
                        f"{row['peak_tflops']:.3f} |",
                        flush=True,
                    )
    write_json(args.json, rows)


if __name__ == "__main__":
    main()
