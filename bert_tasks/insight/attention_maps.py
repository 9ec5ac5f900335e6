"""Attention maps: a model's attention probabilities for one text, and heatmaps of them.

BERT's fused attention hands out probabilities only through its math path (`output_attentions=True`), which
mirrors transformers' eager attention op for op, so a heatmap shows the very numbers stock BERT computes,
not an approximation recovered from the SDPA kernel. Every other encoder runs transformers' own eager
attention here (SDPA returns no probabilities), whose `output_attentions` are its own numbers too.

torch, transformers and matplotlib are imported inside the functions that use them, so `draw_attention`
checks its output path before any of them loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bert_tasks.config import DEFAULT_MODEL
from bert_tasks.errors import BertTasksError
from bert_tasks.model_dir import check_torch_weights
from bert_tasks.output_paths import CommandOutput, check_png_path, check_replaceable

if TYPE_CHECKING:
    import torch

#: Heads per row when one layer's heads are drawn as a grid.
_HEADS_PER_ROW = 4
#: What to do about an --out that cannot be written.
_TODO = "pass --out a .png path in a directory you can write to"


@dataclass(frozen=True)
class AttentionMaps:
    """Attention probabilities of every layer and head of a model for one text."""

    model: str  # the model as named by the caller, for titles
    tokens: list[str]  # the T word pieces, [CLS] and [SEP] included
    probs: torch.Tensor  # [L, H, T, T]: layer, head, query token, key token; every row sums to 1
    text_pieces: int  # word pieces of the whole text, [CLS] and [SEP] included: > T when it was capped

    @property
    def num_layers(self) -> int:
        return self.probs.shape[0]

    @property
    def num_heads(self) -> int:
        return self.probs.shape[1]


def attention_maps(
    text: str, model: str | Path = DEFAULT_MODEL, max_pieces: int | None = None
) -> AttentionMaps:
    """Run `text` through `model` (an encoder dir, the bundled default or a hub id) once.

    `max_pieces` caps what the model reads at that many word pieces ([CLS] + the text's first pieces +
    [SEP]), so every row is still a whole distribution; `text_pieces` says how long the text was.

    Raises:
        BertTasksError: empty text, a text longer than the model's positions, a head-pruned model, or a
            model dir that does not load.
    """
    if not text.strip():
        raise BertTasksError("the text is empty; give at least one word to draw attention for")
    check_torch_weights(model)
    import torch

    from bert_tasks.modeling.encoders import is_fused
    from bert_tasks.modeling.load import load_config, load_model, load_tokenizer

    if getattr(load_config(model), "pruned_heads", None):  # before its smaller weights fail to load
        raise BertTasksError(
            f"model {model}: has pruned heads; attention maps need every head of every layer"
        )
    tokenizer = load_tokenizer(model)
    encoder = load_model(model, "base").eval()
    if not is_fused(encoder):
        encoder.set_attn_implementation("eager")  # the implementation that returns its probabilities
    text_pieces = len(tokenizer(text, verbose=False)["input_ids"])
    # RoBERTa-style position ids start after the padding index: its tokenizer knows the real limit.
    limit = min(encoder.config.max_position_embeddings, tokenizer.model_max_length)
    if text_pieces > limit and (max_pieces is None or max_pieces > limit):
        raise BertTasksError(f"the text is {text_pieces} word pieces; model {model} reads at most {limit}")
    cap = {} if max_pieces is None else {"truncation": True, "max_length": max_pieces}
    inputs = tokenizer(text, return_tensors="pt", **cap)  # input_ids [1, T]
    with torch.inference_mode():
        attentions = encoder(**inputs, output_attentions=True).attentions  # L x [1, H, T, T]
    probs = torch.cat(attentions).float()  # [L, H, T, T]
    tokens = tokenizer.convert_ids_to_tokens(inputs["input_ids"][0].tolist())
    return AttentionMaps(model=_display_name(model), tokens=tokens, probs=probs, text_pieces=text_pieces)


def parse_layer(layer: int | str | None, num_layers: int) -> int | None:
    """A layer index (0-based; None = the last layer), or None for "all"; out-of-range is a user error."""
    if layer is None:
        return num_layers - 1
    if layer == "all":
        return None
    try:
        index = int(layer)
    except ValueError:
        raise BertTasksError(f"layer must be a layer number or 'all', got {layer!r}") from None
    if not 0 <= index < num_layers:
        raise BertTasksError(
            f"layer {index} is out of range: the model has {num_layers} layers (0-{num_layers - 1})"
        )
    return index


def check_head(head: int | None, num_heads: int) -> None:
    """Heads are 0-based; out-of-range is a user error."""
    if head is not None and not 0 <= head < num_heads:
        raise BertTasksError(
            f"head {head} is out of range: each layer has {num_heads} heads (0-{num_heads - 1})"
        )


def draw_attention(
    text: str,
    model: str | Path = DEFAULT_MODEL,
    layer: int | str | None = None,
    head: int | None = None,
    out: str | Path | None = None,
) -> tuple[Path, AttentionMaps]:
    """Write a heatmap PNG of `text`'s attention and return its path with the probabilities.

    `layer` None draws the last layer, "all" every layer; `head` None draws every head of the chosen
    layer(s). So: one layer + one head -> one large labelled heatmap; one layer -> a grid of its heads;
    "all" -> a layers x heads overview of small multiples (one head: a column of layers).

    Raises:
        BertTasksError: what `attention_maps`, `parse_layer` and `check_head` refuse; an `out` that does
            not end in .png or is a directory; a folder for it that cannot be created or written
            (`CommandOutput`, checked before the model loads).
    """
    if out is not None:
        check_png_path(out)
        check_replaceable(Path(out), "attention --out")
    what = f"attention output {out}" if out is not None else f"attention output dir {Path.cwd()}"
    with CommandOutput(Path(out or "x.png").parent, what, _TODO) as target:  # checked before the model loads
        maps = attention_maps(text, model)
        index = parse_layer(layer, maps.num_layers)
        check_head(head, maps.num_heads)
        if out is None:
            which_head = "" if head is None else f"_head{head}"
            out = f"attention_{'all' if index is None else f'layer{index}'}{which_head}.png"
            check_replaceable(Path(out), "attention output")
        with target.writing():
            return _draw(maps, index, head, out)


def _draw(
    maps: AttentionMaps, index: int | None, head: int | None, out: str | Path
) -> tuple[Path, AttentionMaps]:
    """The heatmap(s) of `maps`: one head, one layer's heads as a grid, or every layer (`index` None)."""
    from bert_tasks.insight.plots import plot_attention_grid, plot_attention_head

    heads = list(range(maps.num_heads)) if head is None else [head]
    layers = list(range(maps.num_layers)) if index is None else [index]
    probs = maps.probs[layers][:, heads].numpy()  # [L', H', T, T]
    if len(layers) == 1 and len(heads) == 1:
        title = f"{maps.model} | layer {index} | head {head}"
        return plot_attention_head(probs[0, 0], maps.tokens, title, out), maps
    which = "all layers" if index is None else f"layer {index}"
    title = f"{maps.model} | {which} | {'all heads' if head is None else f'head {head}'}"
    if index is None:  # layers as rows, heads as columns
        titles = [f"head {h}" if row == 0 else "" for row in range(len(layers)) for h in heads]
        path = plot_attention_grid(
            probs.reshape(-1, *probs.shape[2:]),  # [L * H', T, T]
            maps.tokens,
            title,
            out,
            ncols=len(heads),
            panel_titles=titles,
            row_labels=[f"layer {lay}" for lay in layers],
        )
        return path, maps
    ncols = min(len(heads), _HEADS_PER_ROW)
    path = plot_attention_grid(probs[0], maps.tokens, title, out, ncols, [f"head {h}" for h in heads])
    return path, maps


def _display_name(model: str | Path) -> str:
    """A short name for titles: the checkpoint name, or the directory's name for a path."""
    name = str(model)
    return Path(name).name if Path(name).expanduser().exists() else name
