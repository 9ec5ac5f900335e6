"""The transformers internals bert-tasks relies on, pinned: an upgrade that changes one fails here, by name.

`bert_tasks/modeling/` and `training/checkpoints.py` subclass, class-swap and call into transformers' BERT
below its public API. Each test pins one such fact (tiny random models) and its message names the module
that depends on it and why. Internals (and bert_tasks, which imports them) are looked up inside the tests,
so a missing one fails its own test, not this file's collection.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from transformers import AutoConfig, BertConfig, DynamicCache, EncoderDecoderCache, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPastAndCrossAttentions
from transformers.models.bert import modeling_bert as mb

BERT = "transformers.models.bert.modeling_bert"
MASK = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])  # [B, T]: row 1 has two padding positions
IDS = torch.arange(10).view(2, 5)  # [B, T]


def resolve(path: str) -> Any:
    """The object at "module:qualname"; the module defaults to modeling_bert."""
    module, _, qualname = path.rpartition(":")
    target: Any = importlib.import_module(module or BERT)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


def tiny(head: str = "BertModel", impl: str = "sdpa", **overrides: Any) -> PreTrainedModel:
    sizes = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 37}
    config = BertConfig(vocab_size=100, **sizes, **overrides)
    return getattr(mb, head)._from_config(config, attn_implementation=impl).eval()


def self_attention_call(model: PreTrainedModel, **inputs: Any) -> tuple[tuple, dict[str, Any]]:
    """(args, kwargs) of the first layer's self-attention call in one forward."""
    calls: list[tuple[tuple, dict[str, Any]]] = []
    hook = model.base_model.encoder.layer[0].attention.self.register_forward_pre_hook(
        lambda _module, args, kwargs: calls.append((args, kwargs)), with_kwargs=True
    )
    with torch.no_grad():
        model(**inputs)
    hook.remove()
    return calls[0]


LAYER_ARGS = "self hidden_states attention_mask encoder_hidden_states encoder_attention_mask cache"
#: "module:name" (module defaults to modeling_bert) -> which bert_tasks code imports it.
IMPORTS = {
    **dict.fromkeys(["BertSelfAttention", "BertCrossAttention", "BertAttention"], "patch.py / attention.py"),
    **dict.fromkeys(["BertEncoder", "BertLayer"], "patch.py / unpad.py (UnpaddedBertEncoder)"),
    **{f"BertFor{n}": "patch.py (_FIRST_TOKEN_HEADS)" for n in ("SequenceClassification", "MultipleChoice")},
    "BertForNextSentencePrediction": "patch.py (_FIRST_TOKEN_HEADS)",
    **dict.fromkeys(["BertForMaskedLM", "BertForTokenClassification"], "load.py (HEADS)"),
    "transformers.pytorch_utils:prune_linear_layer": "patch.py (prune_heads)",
    "transformers.trainer_pt_utils:LengthGroupedSampler": "data/batching.py (EpochLengthGroupedSampler)",
    "transformers.modeling_outputs:BaseModelOutputWithPastAndCrossAttentions": "unpad.py",
}
#: Exact parameter names -> who overrides, mirrors or calls the callable by position.
SIGNATURES = {
    "BertSelfAttention.__init__": ("self config is_causal layer_idx", "attention.py mirrors it"),
    "BertSelfAttention.forward": ("self hidden_states attention_mask cache kwargs", "attention.py"),
    "BertEncoder.forward": (f"{LAYER_ARGS} use_cache kwargs", "unpad.py overrides it, calls it positionally"),
    "BertLayer.forward": (f"{LAYER_ARGS} kwargs", "unpad.py calls layer(packed, attention_mask, None)"),
    "BertSelfOutput.forward": ("self hidden_states input_tensor", "unpad.py (_first_tokens_through)"),
    "BertLayer.feed_forward_chunk": ("self attention_output", "unpad.py (_first_tokens_through)"),
    "transformers.pytorch_utils:prune_linear_layer": ("layer index dim", "patch.py (_prune_attention)"),
    "transformers:DynamicCache.update": ("self key_states value_states layer_idx args kwargs", "attention"),
}


@pytest.mark.parametrize(("path", "user"), IMPORTS.items(), ids=list(IMPORTS))
def test_import_paths(path: str, user: str) -> None:
    module, _, name = path.rpartition(":")
    assert hasattr(importlib.import_module(module or BERT), name), f"{path} is gone; {user} imports it"


@pytest.mark.parametrize(("path", "spec"), SIGNATURES.items(), ids=list(SIGNATURES))
def test_signatures(path: str, spec: tuple[str, str]) -> None:
    names = list(inspect.signature(resolve(path)).parameters)
    assert names == spec[0].split(), f"{path} now takes {names}, pinned ({spec[0]}); {spec[1]}"


def test_module_tree_and_attributes() -> None:
    model = tiny("BertForSequenceClassification", attention_probs_dropout_prob=0.3)
    assert model.base_model is model.bert, "patch.py (prune_heads) reaches the encoder via base_model"
    encoder = model.bert.encoder
    assert isinstance(encoder.layer, nn.ModuleList) and encoder.config is model.config, "unpad.py reads both"
    children = [name for name, _ in encoder.named_children()]
    assert not (encoder._parameters or encoder._buffers) and children == ["layer"], (
        "patch.py swaps BertEncoder's class to UnpaddedBertEncoder assuming it holds no state of its own"
    )
    attention = encoder.layer[0].attention
    assert attention.is_cross_attention is False, "patch.py tells self- from cross-attention by this flag"
    assert isinstance(attention.output.dense, nn.Linear), "patch.py (_prune_attention) prunes output.dense"
    stock = attention.self
    assert type(stock) is mb.BertSelfAttention, "patch.py swaps `attention.self` if a BertSelfAttention"
    assert {type(getattr(stock, n)) for n in ("query", "key", "value")} == {nn.Linear}, "from_stock fuses"
    for name, value in {"is_causal": False, "layer_idx": 0, "config": model.config}.items():
        assert getattr(stock, name) == value, f"attention.py (from_stock) copies BertSelfAttention.{name}"
    assert stock.scaling == 8**-0.5, "attention.py scales by head_size**-0.5 as BertSelfAttention does"
    assert not (model.config.is_decoder or model.config.chunk_size_feed_forward), "unpad.py (_can_unpad)"
    assert type(stock.dropout) is nn.Dropout and stock.dropout.p == 0.3, (
        "attention.py / patch.py (set_attention_dropout): nn.Dropout(config.attention_probs_dropout_prob)"
    )
    dropouts = [m for m in model.modules() if "Dropout" in type(m).__name__]
    assert len(dropouts) == 8 and all(type(m) is nn.Dropout for m in dropouts), (
        "patch.py (_swap_dropouts) replaces the modules whose type is exactly nn.Dropout"
    )


def test_decoder_and_cross_attention() -> None:
    model = tiny("BertLMHeadModel", is_decoder=True, add_cross_attention=True)
    layer = model.bert.encoder.layer[0]
    assert layer.attention.self.is_causal, "attention.py: a decoder's self-attention gets is_causal=True"
    assert layer.crossattention.is_cross_attention, "patch.py leaves modules with is_cross_attention alone"
    assert not issubclass(mb.BertCrossAttention, mb.BertSelfAttention), "patch.py: cross-attention not fused"
    _, kwargs = self_attention_call(model, input_ids=IDS, use_cache=False)
    assert kwargs["attention_mask"] is None, "attention.py: without padding a decoder gets no mask, is_causal"
    cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
    assert isinstance(cache.self_attention_cache, DynamicCache), "attention.py reads .self_attention_cache"


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_mask_forms(impl: str) -> None:
    model = tiny(impl=impl)
    why = f"attention.py (_as_sdpa_mask) and unpad.py (token_mask) expect this {impl} mask form"
    assert model.config._attn_implementation == impl, f"load.py: _from_config(attn_implementation=); {why}"
    for unpadded in ({}, {"attention_mask": torch.ones_like(MASK)}):
        mask = self_attention_call(model, input_ids=IDS, **unpadded)[1]["attention_mask"]
        assert mask is None, f"no padding: None; {why}"
    args, kwargs = self_attention_call(model, input_ids=IDS, attention_mask=MASK)
    assert len(args) == 1 and {"attention_mask", "cache"} <= set(kwargs), f"call form changed; {why}"
    mask = kwargs["attention_mask"]
    assert mask.shape == (2, 1, 5, 5), f"padding: [B, 1, T, T], got {tuple(mask.shape)}; {why}"
    assert mask.dtype == (torch.bool if impl == "sdpa" else torch.float32), f"dtype {mask.dtype}; {why}"
    keep = mask[:, 0] if impl == "sdpa" else mask[:, 0] == 0  # [B, T, T]
    if impl == "eager":
        assert bool((keep | (mask[:, 0] <= torch.finfo(torch.float32).min / 2)).all()), f"0 / min; {why}"
    assert torch.equal(keep, MASK.bool()[:, None, :].expand(2, 5, 5)), f"rows = key padding; {why}"


def test_output_attentions_capture() -> None:
    model = tiny(impl="eager")
    recorded = mb.BertPreTrainedModel._can_record_outputs
    assert recorded["attentions"] is mb.BertSelfAttention and recorded["hidden_states"] is mb.BertLayer, (
        "attention.py: FusedBertSelfAttention subclasses BertSelfAttention so isinstance-matched hooks "
        "find it; unpad.py: hidden states are captured per BertLayer"
    )
    _, kwargs = self_attention_call(model, input_ids=IDS, output_attentions=True)
    assert kwargs.get("output_attentions") is True, "attention.py reads output_attentions from its kwargs"
    stock = model.encoder.layer[0].attention.self
    assert model._output_capturing_hooks_installed and len(stock._forward_hooks) == 1, (
        "attention.py (from_stock) copies _forward_hooks: capturing hooks are installed once, per instance"
    )
    assert not (stock._forward_hooks_with_kwargs or stock._forward_hooks_always_called), (
        "attention.py (from_stock) copies _forward_hooks alone, not their with_kwargs / always_called flags"
    )
    outputs: list[tuple] = []
    stock.register_forward_hook(lambda _module, _args, output: outputs.append(output))
    attentions = model(IDS, output_attentions=True).attentions
    assert attentions[0] is outputs[0][1], "attention.py: output_attentions collects output[1] (the probs)"


def test_eager_attention_op_order() -> None:
    model = tiny(impl="eager")
    stock, seen = model.encoder.layer[0].attention.self, []
    stock.register_forward_hook(lambda _m, args, kw, out: seen.append((args[0], kw, out)), with_kwargs=True)
    with torch.no_grad():
        model(IDS, attention_mask=MASK, output_attentions=True)
        hidden, kwargs, (_, probs) = seen[0]
        q, k = (getattr(stock, n)(hidden).view(2, 5, 4, 8).transpose(1, 2) for n in ("query", "key"))
        scores = torch.matmul(q, k.transpose(2, 3)) * stock.scaling + kwargs["attention_mask"]
    assert torch.equal(probs, torch.softmax(scores, dim=-1)), (
        "attention.py (_attend_with_probs) mirrors eager_attention_forward op for op (attention maps)"
    )


def test_layer_is_its_parts() -> None:
    model = tiny()
    layer, hidden = model.encoder.layer[0], torch.randn(2, 5, 32)
    with torch.no_grad():
        parts = layer.feed_forward_chunk(layer.attention.output(layer.attention.self(hidden)[0], hidden))
        assert torch.equal(layer(hidden), parts), "unpad.py (_first_tokens_through) recomposes BertLayer"
    assert layer.gradient_checkpointing is False, "unpad.py (_runs_in_full) reads gradient_checkpointing"
    model.activation_checkpointing_enable()
    assert layer.gradient_checkpointing is True, "unpad.py (_runs_in_full): checkpointing is a per-layer flag"


@pytest.mark.parametrize("head", ["SequenceClassification", "MultipleChoice", "NextSentencePrediction"])
def test_first_token_heads_read_first_token_only(head: str) -> None:
    from bert_tasks.modeling.unpad import FIRST_TOKEN_KWARG

    model, seen = tiny(f"BertFor{head}"), []

    def noise_after_first(_module: nn.Module, _args: tuple, kwargs: dict[str, Any], output: Any) -> Any:
        seen.append(kwargs)
        hidden = output.last_hidden_state.clone()  # [B, T, C]
        hidden[:, 1:] = torch.randn_like(hidden[:, 1:])
        return BaseModelOutputWithPastAndCrossAttentions(last_hidden_state=hidden)

    ids = IDS[None] if head == "MultipleChoice" else IDS  # MultipleChoice: [B, choices, T]
    with torch.no_grad():
        plain = model(ids).logits
        model.bert.encoder.register_forward_hook(noise_after_first, with_kwargs=True)
        noisy = model(ids, **{FIRST_TOKEN_KWARG: True}).logits
    assert seen[0].get(FIRST_TOKEN_KWARG) is True, "patch.py passes first_token_only down through the head"
    assert torch.equal(plain, noisy), "patch.py's first-token shortcut: the head reads position 0 only"


def test_checkpoint_names_and_files(tmp_path: Path) -> None:
    from bert_tasks.modeling.patch import patch_bert

    model = tiny("BertForSequenceClassification")
    stock_names = set(model.state_dict())
    layer = "bert.encoder.layer.0.attention."
    expected = {f"{layer}self.{p}.{s}" for p in ("query", "key", "value") for s in ("weight", "bias")}
    assert expected | {f"{layer}output.dense.weight"} <= stock_names, "attention.py saves under these names"
    patched = patch_bert(model)
    patched.config.pruned_heads = {0: [1]}
    params = inspect.signature(type(patched).from_pretrained).parameters
    assert {"config", "use_safetensors"} <= set(params), "load.py passes them to from_pretrained"
    patched.save_pretrained(tmp_path, state_dict=patched.state_dict())  # checkpoints.py (save_best)
    assert set(load_file(tmp_path / "model.safetensors")) == stock_names, (
        "checkpoints.py (load_best) reads best/model.safetensors, saved with the state dict's names unchanged"
    )
    assert AutoConfig.from_pretrained(tmp_path).pruned_heads == {"0": [1]}, "load.py rebuilds pruned heads"


def test_length_grouped_sampler_reseeds_through_generator() -> None:
    sampler_class = resolve("transformers.trainer_pt_utils:LengthGroupedSampler")
    generator = torch.Generator().manual_seed(0)
    sampler = sampler_class(4, lengths=list(range(32)), generator=generator)
    assert sampler.generator is generator, "data/batching.py (set_epoch) reseeds sampler.generator"
    orders = []
    for seed in (7, 7, 8):
        sampler.generator.manual_seed(seed)
        orders.append(list(sampler))
    assert orders[0] == orders[1] != orders[2], "data/batching.py: an epoch's order is a function of its seed"
    assert sorted(orders[0]) == list(range(32)), "LengthGroupedSampler yields every index once"


def test_loading_info_and_head_initialisation(tmp_path: Path) -> None:
    """modeling/load.py judges a checkpoint by from_pretrained's loading info (missing, unexpected and
    mis-shaped keys, after transformers' renames) and re-draws a relabelled head with `_init_weights`,
    which skips tensors flagged `_is_hf_initialized`."""
    tiny("BertModel").save_pretrained(tmp_path)
    model, info = mb.BertForTokenClassification.from_pretrained(
        tmp_path, num_labels=3, output_loading_info=True, ignore_mismatched_sizes=True
    )
    assert set(info) >= {"missing_keys", "unexpected_keys", "mismatched_keys"}, "modeling/load.py reads these"
    assert {"classifier.weight", "classifier.bias"} <= set(info["missing_keys"]), "a base lacks the head"
    before = model.classifier.weight.detach().clone()
    for tensor in model.classifier.parameters():
        tensor._is_hf_initialized = False
    model._init_weights(model.classifier)
    assert not torch.equal(model.classifier.weight, before), "_init_weights re-draws an unflagged head"


def test_auto_heads_map_configs_to_family_heads() -> None:
    """modeling/encoders.py picks a task's head as its Auto class would (`_model_mapping`, config class ->
    model class), tells encoders by transformers' masked-LM table, and takes BERT's classes for the fused
    path by their base class; tasks/base.py (`saves_as`) maps a saved `architectures` name back to its task
    by the `<Family>For<Kind>` naming every Auto head follows."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

    families = {"bert": "Bert", "roberta": "Roberta", "deberta-v2": "DebertaV2", "distilbert": "DistilBert"}
    for auto_name in ("AutoModelForSequenceClassification", "AutoModelForTokenClassification", "AutoModel"):
        mapping = getattr(transformers, auto_name)._model_mapping
        kind = auto_name.removeprefix("AutoModel") or "Model"
        for model_type, family in families.items():
            head = mapping[type(AutoConfig.for_model(model_type))]
            assert head.__name__ == f"{family}{kind}", f"encoders.py (head_class), base.py (saves_as): {head}"
            fused = issubclass(head, mb.BertPreTrainedModel)
            assert fused == (model_type == "bert"), "encoders.py (takes_fused_path) reads the base class"
    assert set(families) <= set(MODEL_FOR_MASKED_LM_MAPPING_NAMES), "encoders.py (check_encoder)"
    assert not {"gpt2", "llama", "t5"} & set(MODEL_FOR_MASKED_LM_MAPPING_NAMES), "encoders.py (check_encoder)"
    assert AutoConfig.for_model("bart").is_encoder_decoder, "encoders.py (check_encoder) refuses these"


def test_attention_implementation_is_read_and_switched() -> None:
    """encoders.py (attention_path) names `config._attn_implementation`; insight/attention_maps.py switches
    another encoder to eager with `set_attn_implementation`, the implementation that returns probabilities;
    modeling/load.py (`_in_encoder`) finds the encoder under `base_model_prefix`."""
    from transformers import RobertaConfig, RobertaForSequenceClassification

    config = RobertaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4)
    model = RobertaForSequenceClassification._from_config(config).eval()
    assert model.config._attn_implementation == "sdpa", "the default where a family offers SDPA"
    assert model.base_model_prefix == "roberta" and model.base_model is model.roberta
    model.set_attn_implementation("eager")
    assert model.config._attn_implementation == "eager"
    attentions = model(IDS, attention_mask=MASK, output_attentions=True).attentions
    assert len(attentions) == 2 and attentions[0].shape == (2, 4, 5, 5), "attention_maps.py: L x [B, H, T, T]"
