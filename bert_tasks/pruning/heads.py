"""Which attention heads a model has, and a list of heads to remove checked against them.

The config key `prune_heads=[layer:head, ...]` (original numbering) removes heads from the model a run
starts from: `bert-tasks prune` writes it into its recovery's recipe.yaml, so that recipe reruns the
recovery from the unpruned dir. Standard library only: `train` checks the list against a local model's
config.json before torch loads, and against the loaded model's config for a hub id.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bert_tasks.errors import BertTasksError

#: One item of `prune_heads`: `layer:head`, both 0-based.
HEAD_ITEM = re.compile(r"(\d+):(\d+)")


@dataclass(frozen=True)
class ModelShape:
    """Layers and heads of a BERT, and the heads already pruned from it."""

    layers: int
    heads: int  # per layer, before any pruning
    pruned: dict[int, list[int]]

    @property
    def present(self) -> int:
        return self.layers * self.heads - sum(len(heads) for heads in self.pruned.values())

    @property
    def removable(self) -> int:
        """Heads that can go while each layer keeps one."""
        return self.present - self.layers


def read_shape(directory: Path) -> ModelShape:
    """Layers, heads and pruned heads from a model dir's config.json (read_policy has checked it is JSON)."""
    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    return _shape(config, f"{directory / 'config.json'}", "save the model dir again")


def shape_of(config: Any, model: str) -> ModelShape:
    """The same from a loaded model's transformers config (a hub model's: no config.json to read first)."""
    keys = ("num_hidden_layers", "num_attention_heads", "pruned_heads")
    values = {key: getattr(config, key, None) for key in keys}
    return _shape(values, f"model {model}", "use a BERT with attention heads")


def _shape(config: Mapping[str, Any], where: str, todo: str) -> ModelShape:
    layers, heads = config.get("num_hidden_layers"), config.get("num_attention_heads")
    if not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in (layers, heads)):
        raise BertTasksError(
            f"{where}: num_hidden_layers / num_attention_heads are {layers!r} / {heads!r}, not positive "
            f"integers; {todo}"
        )
    pruned: dict[int, list[int]] = {}
    for layer, gone in (config.get("pruned_heads") or {}).items():
        if not (str(layer).isdigit() and int(layer) < layers and isinstance(gone, list)) or not all(
            isinstance(h, int) and 0 <= h < heads for h in gone
        ):
            raise BertTasksError(
                f"{where}: pruned_heads {{{layer!r}: {gone!r}}} names no layer below {layers} and heads "
                f"below {heads}; put back the config.json saved with these weights"
            )
        if len(set(gone)) >= heads:
            raise BertTasksError(f"{where}: pruned_heads removes every head of layer {layer}; prune again")
        pruned[int(layer)] = sorted(set(gone))
    return ModelShape(layers, heads, pruned)


def heads_by_layer(items: Sequence[str]) -> dict[int, list[int]]:
    """`["0:3", "0:1", "2:0"]` -> `{0: [1, 3], 2: [0]}` (the config has checked each item's form)."""
    found: dict[int, list[int]] = {}
    for item in items:
        layer, head = map(int, item.split(":"))
        found.setdefault(layer, []).append(head)
    return {layer: sorted(heads) for layer, heads in sorted(found.items())}


def head_items(heads: Mapping[int | str, Sequence[int]]) -> list[str]:
    """`{0: [1, 3], 2: [0]}` -> `["0:1", "0:3", "2:0"]`: what `prune_heads` takes."""
    return [
        f"{int(layer)}:{head}"
        for layer, gone in sorted(heads.items(), key=lambda i: int(i[0]))
        for head in sorted(gone)
    ]


def check_removable(heads: Mapping[int, Sequence[int]], shape: ModelShape, model: str) -> None:
    """Refuse heads the model does not have, has lost already, or whose removal empties a layer."""
    for layer, gone in heads.items():
        if layer >= shape.layers or any(head >= shape.heads for head in gone):
            raise BertTasksError(
                f"prune_heads={','.join(head_items({layer: gone}))}: model {model} has {shape.layers} layers "
                f"of {shape.heads} heads (0-based layer:head); fix the list"
            )
        already = sorted(set(gone) & set(shape.pruned.get(layer, [])))
        if already:
            raise BertTasksError(
                f"prune_heads={','.join(head_items({layer: already}))}: model {model} has no such head any "
                "more (its config.json's pruned_heads removed it); drop it from the list"
            )
        if len(gone) + len(shape.pruned.get(layer, [])) >= shape.heads:
            raise BertTasksError(
                f"prune_heads: removes every head of layer {layer} of model {model}; each layer keeps one "
                "(a layer without heads is no attention block), so drop one of them"
            )
