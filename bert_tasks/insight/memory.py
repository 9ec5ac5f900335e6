"""Attention memory: the batch x heads x seq_len^2 x bytes formula, checked against a measurement.

Eager attention materialises two T x T matrices per head: the scores QK^T / sqrt(d) and the softmax
probabilities, both alive while softmax runs, so one layer needs 2 x B x H x T^2 x bytes on top of Q, K, V
and the output (4 x B x T x C x bytes, C = H x head size). The fused SDPA kernel (flash attention on CPU
and recent GPUs) never materialises the T x T matrices: it streams key/value blocks through an online
softmax and needs Q, K, V, the output and a small per-thread tile buffer.

The measurement loads the same checkpoint twice, as stock transformers BERT with eager attention and as
the patched model, runs one forward to capture the inputs each layer's self-attention receives, then
replays every layer's self-attention alone under `peak_memory_bytes` (CPU: live tensor bytes from the
torch profiler; CUDA: `max_memory_allocated`), and finally measures one whole forward of each model. The
batch has no padding, so neither path builds a mask and the comparison is attention against attention.
"""

from __future__ import annotations

import copy
import ctypes
import ctypes.util
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import BertModel

from bert_tasks.errors import BertTasksError
from bert_tasks.insight.peak_memory import peak_memory_bytes
from bert_tasks.model_dir import check_torch_weights
from bert_tasks.modeling.encoders import require_fused
from bert_tasks.modeling.load import DEFAULT_MODEL, load_config, load_model
from bert_tasks.runtime import reuse_freed_memory

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_MIB = 2**20
#: glibc's mallopt parameter M_MMAP_MAX (malloc.h) and its default: how many mmap'd chunks may exist.
_M_MMAP_MAX, _GLIBC_MMAP_MAX = -4, 65536


def attention_matrix_bytes(batch: int, heads: int, seq_len: int, bytes_per_element: int) -> int:
    """The formula: one T x T matrix per head and sequence, B x H x T^2 x bytes."""
    return batch * heads * seq_len**2 * bytes_per_element


@dataclass(frozen=True)
class LayerMemory:
    """One layer's self-attention memory in bytes: formula estimates and measured peaks."""

    layer: int
    heads: int
    scores_probs: int  # formula: eager's scores + probabilities, 2 x B x H x T^2 x bytes
    qkv_out: int  # formula: Q, K, V and the output, 4 x B x T x C x bytes (both paths)
    eager_peak: int  # measured: stock transformers eager self-attention
    fused_peak: int  # measured: the patched fused-QKV SDPA self-attention

    @property
    def eager_estimate(self) -> int:
        return self.scores_probs + self.qkv_out

    @property
    def fused_estimate(self) -> int:
        return self.qkv_out


@dataclass(frozen=True)
class MemoryReport:
    """Per-layer attention memory plus the measured peak of one whole forward of each model."""

    model: str
    batch: int
    seq_len: int
    dtype: str
    device: str
    layers: list[LayerMemory]
    eager_forward_peak: int
    fused_forward_peak: int

    @property
    def formula_check(self) -> float:
        """Measured (eager - fused) over the formula's scores + probabilities, averaged over layers: ~1."""
        ratios = [(lm.eager_peak - lm.fused_peak) / lm.scores_probs for lm in self.layers]
        return sum(ratios) / len(ratios)


def attention_memory(
    model: str | Path = DEFAULT_MODEL,
    batch: int = 8,
    seq_len: int = 512,
    dtype: str = "fp32",
    device: str | torch.device | None = None,
) -> MemoryReport:
    """Estimate and measure eager vs fused attention memory for `batch` x `seq_len` tokens of `model`.

    Raises:
        BertTasksError: a bad model dir, batch or seq_len below 1, seq_len above the model's positions,
            an unknown dtype, or a batch x seq_len whose measurement needs more memory than the device has
            available (`check_fits`, before anything of that size is allocated).
    """
    if dtype not in DTYPES:
        raise BertTasksError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if batch < 1 or seq_len < 1:
        raise BertTasksError(
            f"batch and seq_len must be at least 1, got batch {batch}, seq_len {seq_len}; "
            "pass --batch and --seq-len of 1 or more"
        )
    check_torch_weights(model)
    config = load_config(model)
    require_fused(config, "memory", model, "measure a BERT model (it compares fused with eager BERT)")
    positions = config.max_position_embeddings
    if seq_len > positions:
        raise BertTasksError(
            f"seq_len {seq_len} is longer than model {model}'s {positions} positions; "
            f"pass --seq-len {positions} or less"
        )
    if getattr(config, "pruned_heads", None):
        raise BertTasksError(f"model {model}: has pruned heads; stock eager BERT cannot load it to compare")
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch_dtype = DTYPES[dtype]
    check_fits(config, batch, seq_len, dtype, device)  # before anything of that size is allocated
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, config.vocab_size, (batch, seq_len), generator=generator)  # [B, T]
    input_ids = input_ids.to(device)

    fused = load_model(model, "base")
    # The same weights in stock transformers BERT: the patched state_dict carries HF's query/key/value names.
    # A copy of the config: _from_config would switch the patched model's config to eager too.
    eager = BertModel._from_config(copy.deepcopy(fused.config), attn_implementation="eager")
    eager.load_state_dict(fused.state_dict())
    with _large_tensors_from_fresh_pages():
        peaks = {
            name: _measure(bert.to(device=device, dtype=torch_dtype).eval(), input_ids, device)
            for name, bert in (("eager", eager), ("fused", fused))
        }

    size = torch.finfo(torch_dtype).bits // 8
    layers = []
    for index, layer in enumerate(fused.encoder.layer):
        attention = layer.attention.self
        heads, width = attention.num_attention_heads, attention.all_head_size
        layers.append(
            LayerMemory(
                layer=index,
                heads=heads,
                scores_probs=2 * attention_matrix_bytes(batch, heads, seq_len, size),
                qkv_out=4 * batch * seq_len * width * size,
                eager_peak=peaks["eager"][0][index],
                fused_peak=peaks["fused"][0][index],
            )
        )
    return MemoryReport(
        model=str(model),
        batch=batch,
        seq_len=seq_len,
        dtype=dtype,
        device=str(device),
        layers=layers,
        eager_forward_peak=peaks["eager"][1],
        fused_forward_peak=peaks["fused"][1],
    )


def measurement_bytes(config: Any, batch: int, seq_len: int, dtype: str, device: torch.device) -> int:
    """What `attention_memory` holds at its busiest on `device`, from the formula and the config alone.

    The busiest moment is one eager layer replayed on its captured input: that layer's eager estimate
    (2 x B x H x T^2 x bytes of scores and probabilities + 4 x B x T x C x bytes of q, k, v, output; or
    the feed-forward's 2 x B x T x I x bytes where T is short), on top of every layer's captured input
    and the hidden states (L + 1 x B x T x C x bytes) and the weights of both models (loaded in fp32,
    then cast on the way to the device). Within ~5% of the process's peak RSS on CPU (MiniLM, batch 64).
    """
    size = torch.finfo(DTYPES[dtype]).bits // 8
    layers, heads = config.num_hidden_layers, config.num_attention_heads
    width, inner = config.hidden_size, config.intermediate_size
    attention = 2 * attention_matrix_bytes(batch, heads, seq_len, size) + 4 * batch * seq_len * width * size
    feed_forward = 2 * batch * seq_len * inner * size
    activations = max(attention, feed_forward) + (layers + 1) * batch * seq_len * width * size
    weights = 2 * _parameter_count(config) * (4 if device.type == "cpu" else size)
    return activations + weights + batch * seq_len * 8  # + the int64 input ids


def available_bytes(device: torch.device) -> int | None:
    """What an allocation can get now: the GPU's free memory or the machine's MemAvailable; None: unknown."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:  # not Linux: free pages (page cache not counted, so an underestimate)
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (OSError, ValueError, AttributeError):
        return None


def check_fits(config: Any, batch: int, seq_len: int, dtype: str, device: torch.device) -> None:
    """Refuse, in one line, a measurement that needs more memory than `device` has available.

    Without it, a --batch far beyond the machine is not an error but the kernel's OOM killer (or a CUDA
    out-of-memory traceback) minutes later.
    """
    needed, available = measurement_bytes(config, batch, seq_len, dtype, device), available_bytes(device)
    if available is None or needed <= available:
        return
    where = "this machine" if device.type == "cpu" else str(device)
    raise BertTasksError(
        f"memory: batch {batch} x seq_len {seq_len} in {dtype} would need about {needed / 2**30:,.1f} GiB "
        f"(eager attention's 2 x B x H x T^2 x bytes, the layer inputs and two copies of the weights) but "
        f"{where} has {available / 2**30:,.1f} GiB available; pass a smaller --batch or --seq-len"
    )


@contextmanager
def _large_tensors_from_fresh_pages() -> Iterator[None]:
    """While measuring, let glibc serve large allocations with mmap again (its default), then restore.

    The CLI turns mmap off (`reuse_freed_memory`: a training step's tensors reuse freed heap memory).
    The measurement instead allocates a few huge, short-lived T x T matrices between the profiler's many
    small records, which fragments that heap: the process grew to ~7x the live peak (MiniLM, batch 64:
    16 GiB for a 2.2 GiB estimate) and the OOM killer ended runs `check_fits` had let through. With mmap,
    each matrix's pages go back to the system when it is freed. A no-op where the CLI's setting is not on.
    """
    cli_setting = reuse_freed_memory.cache_info().currsize > 0 and reuse_freed_memory()
    mallopt = _mallopt() if cli_setting else None
    if mallopt is not None:
        mallopt(_M_MMAP_MAX, _GLIBC_MMAP_MAX)
    try:
        yield
    finally:
        if mallopt is not None:
            mallopt(_M_MMAP_MAX, 0)


def _mallopt() -> Any:
    """glibc's mallopt (there whenever reuse_freed_memory returned True), or None."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).mallopt if name else None
    except (OSError, AttributeError):
        return None


def _parameter_count(config: Any) -> int:
    """Parameters of a BertModel with `config`: embeddings, L encoder layers, pooler."""
    width, inner = config.hidden_size, config.intermediate_size
    rows = config.vocab_size + config.max_position_embeddings + getattr(config, "type_vocab_size", 2)
    embeddings = rows * width + 2 * width  # + LayerNorm
    layer = 4 * (width * width + width) + 2 * width  # q, k, v, output; LayerNorm
    layer += width * inner + inner + inner * width + width + 2 * width  # feed-forward; LayerNorm
    return embeddings + config.num_hidden_layers * layer + width * width + width  # + pooler


def _measure(bert: BertModel, input_ids: torch.Tensor, device: torch.device) -> tuple[list[int], int]:
    """Peak bytes of each layer's self-attention on its real inputs, and of one whole forward."""
    captured: list[tuple[nn.Module, tuple[Any, ...], dict[str, Any]]] = []

    def capture(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        captured.append((module, args, kwargs))

    hooks = [
        layer.attention.self.register_forward_pre_hook(capture, with_kwargs=True)
        for layer in bert.encoder.layer
    ]
    try:
        with torch.inference_mode():
            bert(input_ids=input_ids)  # also the warm-up: kernels chosen, workspaces allocated
    finally:
        for hook in hooks:
            hook.remove()

    def run_layer(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        with torch.inference_mode():
            module(*args, **kwargs)

    def run_forward() -> None:
        with torch.inference_mode():
            bert(input_ids=input_ids)

    per_layer = [peak_memory_bytes(lambda c=call: run_layer(*c), device) for call in captured]
    captured.clear()  # free the captured hidden states before measuring the whole forward
    return per_layer, peak_memory_bytes(run_forward, device)


def render_memory(report: MemoryReport) -> str:
    """The report as a table for people, with the formulas it uses and how the measurement compares."""
    layers = report.layers
    lines = [
        f"attention memory: {report.model} | batch {report.batch} | seq_len {report.seq_len} | "
        f"{report.dtype} | {report.device}",
        "formula per layer: eager = 2 x B x H x T^2 x bytes (scores + probabilities, the T x T part)",
        "  + 4 x B x T x C x bytes (q, k, v, output); fused SDPA = the q, k, v, output term only",
        "",
        _row(
            "layer", "heads", "T x T part", "eager est.", "eager meas.", "fused est.", "fused meas.", "saved"
        ),
    ]
    for lm in layers:
        estimates = (lm.scores_probs, lm.eager_estimate, lm.eager_peak, lm.fused_estimate, lm.fused_peak)
        lines.append(_row(lm.layer, lm.heads, *map(_mib, estimates), _ratio(lm.eager_peak, lm.fused_peak)))
    totals = [
        sum(getattr(lm, key) for lm in layers) for key in ("scores_probs", "eager_estimate", "fused_estimate")
    ]
    eager_peak, fused_peak = report.eager_forward_peak, report.fused_forward_peak
    lines += [
        _row(
            "total",
            sum(lm.heads for lm in layers),
            _mib(totals[0]),
            _mib(totals[1]),
            "",
            _mib(totals[2]),
            "",
            "",
        ),
        _row("forward", "", "", "", _mib(eager_peak), "", _mib(fused_peak), _ratio(eager_peak, fused_peak)),
        "",
        f"check: measured (eager - fused) / formula T x T part = {report.formula_check:.3f} (1: exact)",
        "total: every layer summed, which one forward allocates in turn and a training step holds",
        "(autograd keeps each layer's probabilities for backward); forward: the measured peak of one",
        "inference forward, about one layer's, since inference frees each layer's matrices in turn.",
    ]
    return "\n".join(lines)


def _row(*cells: object) -> str:
    layer, heads, *rest = cells
    return (f"{layer!s:>7} {heads!s:>5}" + "".join(f"{cell!s:>13}" for cell in rest)).rstrip()


def _mib(value: int) -> str:
    return f"{value / _MIB:.1f} MiB"


def _ratio(eager: int, fused: int) -> str:
    return f"{eager / max(fused, 1):.1f}x"
