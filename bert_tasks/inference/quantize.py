"""INT8 dynamic quantization for small CPU deployments, and an export that reloads it.

Dynamic quantization stores Linear weights as int8 (one scale per output channel) and quantizes the
activations on the fly, batch by batch: no calibration data, CPU only, ~4x smaller Linear weights and
faster int8 matmuls. It uses torch's eager-mode `torch.ao.quantization.quantize_dynamic`: deprecated in
favour of torchao (an extra dependency), but still shipped and working in torch 2.13.

torch is imported inside the functions that use it, so `export`'s output dir and model dir are checked
before it loads.
"""

from __future__ import annotations

import shutil
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from bert_tasks.errors import BertTasksError
from bert_tasks.model_dir import (
    POLICY_KEY,
    QUANTIZE_METHODS,
    check_export_source,
    check_method,
    load_finetuned,
)

if TYPE_CHECKING:
    from torch import nn
    from transformers import PreTrainedModel

#: Files of a model dir that travel with an export (torch or ONNX) besides weights, config and tokenizer.
EXTRA_FILES = ("recipe.yaml",)


@dataclass(frozen=True)
class SizeChange:
    """Weight bytes held in memory before and after quantization."""

    before: int
    after: int

    def __str__(self) -> str:
        return (
            f"{self.before / 2**20:.1f} MiB -> {self.after / 2**20:.1f} MiB ({self.after / self.before:.0%})"
        )


def quantize_model(model: PreTrainedModel, method: str = "int8") -> SizeChange:
    """Quantize the Linear layers of the encoder in place; return the weight bytes before/after.

    Quantized: every Linear of the encoder (`base_model`) but its pooler: in the transformer blocks (fused
    qkv, attention output, feed-forward), nearly all of the matmul work, whatever the family calls them
    (BERT's `encoder.layer`, DistilBERT's `transformer.layer`, ModernBERT's `layers`). Kept float: the
    embeddings (lookups, no matmul to speed up; their int8 forms are weight-only schemes), LayerNorm (its
    statistics need float range), and the pooler and task head (tiny, and the logits are where rounding
    shows most). Per-channel scales keep the rounding error of
    each output unit proportional to its own weights, which keeps predictions on the fp32 model's side.
    """
    from torch import nn
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    check_method(method)
    before = weight_bytes(model)
    with warnings.catch_warnings():  # deprecation notices about torch.ao, not about anything users do
        warnings.filterwarnings("ignore", message=r"(?s).*torch\.ao\.quantization is deprecated")
        warnings.filterwarnings("ignore", message=r"(?s).*quantize_per_(tensor|channel).*deprecated")
        encoder = model.base_model
        linears = {
            name: per_channel_dynamic_qconfig
            for name, module in encoder.named_modules()
            if isinstance(module, nn.Linear) and not name.startswith("pooler")
        }
        quantize_dynamic(encoder, linears, inplace=True)
    return SizeChange(before, weight_bytes(model))


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the weights a model holds: float parameters and buffers plus packed int8 Linear weights.

    Counted from the tensors themselves rather than from a serialized state_dict: a quantized model has
    no float state_dict (the fused attention's save hook writes float query/key/value tensors it no longer
    has), and pickled sizes add framing that says nothing about memory.
    """
    from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear

    tensors = {id(t): t for t in (*model.parameters(), *model.buffers())}  # tied weights once
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    for module in model.modules():
        if isinstance(module, DynamicQuantizedLinear):
            weight, bias = module.weight(), module.bias()  # int8 [out, in], float [out]
            # Per-channel scales (float64) and zero points (int64), one of each per output row.
            total += weight.numel() * weight.element_size() + weight.shape[0] * 16
            total += 0 if bias is None else bias.numel() * bias.element_size()
    return total


def export_quantized(model_dir: str | Path, out_dir: str | Path, method: str = "int8") -> SizeChange:
    """Write a reusable quantized model to `out_dir`; return the in-memory weight sizes before/after.

    The dir holds the fp32 checkpoint plus `bert_tasks.quantize = "int8"` in config.json, and prediction
    (`Predictor`, `bert-tasks predict/evaluate`) re-applies the quantization on load. Why not int8 weights
    on disk: packed quantized tensors do not fit in safetensors, and pickling them would make the dir one
    that must be loaded with arbitrary-code-running pickle. Dynamic quantization is a pure function of the
    fp32 weights, so re-applying it rebuilds the same int8 model every time, and the dir stays a plain
    Hugging Face checkpoint that vanilla transformers loads (in fp32). The saving is in memory, not on disk.

    Raises:
        BertTasksError: an unknown method, a bad model dir, or an `out_dir` that is a file, a symlink, a
            directory that is not empty, or a place that cannot be written (checked before the model
            loads); a failed write (a full disk) removes what the export wrote.
    """
    from bert_tasks.model_card import MODEL_CARD, export_card  # deferred: predict imports this module
    from bert_tasks.output_paths import CommandOutput

    if check_method(method) is None:
        raise BertTasksError(f"export: choose a quantization method ({', '.join(QUANTIZE_METHODS)})")
    check_export_source(model_dir, out_dir)
    out = Path(out_dir)
    todo = "choose a new directory you can write to"
    with CommandOutput(out, f"export {out}", todo, fresh=True) as target:
        loaded = load_finetuned(model_dir)
        model = loaded.model
        policy = replace(loaded.policy, quantize=method)
        setattr(model.config, POLICY_KEY, policy.to_json())
        card = export_card(model_dir, loaded.directory, out, method, loaded.task, policy)
        with target.writing():
            model.save_pretrained(out)
            loaded.tokenizer.save_pretrained(out)
            for name in EXTRA_FILES:
                if (Path(model_dir) / name).is_file():
                    shutil.copy2(Path(model_dir) / name, out / name)
            (out / MODEL_CARD).write_text(str(card), encoding="utf-8")
        return quantize_model(model, method)  # what loading will do: proves it works and measures it
