"""`prune_heads=[layer:head, ...]` on ordinary runs: the run starts from the model with those heads removed
(added to any it had lost already); a list the model cannot take is one line, before torch loads for a
local dir."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from bert_tasks.errors import BertTasksError
from bert_tasks.pruning import prune
from bert_tasks.pruning.heads import head_items, heads_by_layer
from bert_tasks.training import train
from tests.helpers import tiny_config
from tests.test_cli_startup import probe
from tests.tiny_encoders import build_tiny_encoder

pytestmark = pytest.mark.usefixtures("single_thread")


def test_items_and_layers_map_both_ways() -> None:
    assert heads_by_layer(["1:3", "0:2", "0:0"]) == {0: [0, 2], 1: [3]}
    assert head_items({"1": [3], "0": [2, 0]}) == ["0:0", "0:2", "1:3"]


def test_a_run_starts_from_the_model_with_those_heads_removed(sentiment_run: Path, tmp_path: Path) -> None:
    """From a dir that lost 2 heads already: the new ones join them, the weights hold the smaller shapes."""
    pruned = prune("sentiment", sentiment_run, "2", tmp_path / "pruned")
    before = {int(k): v for k, v in json.loads((pruned / "config.json").read_text())["pruned_heads"].items()}
    layer = next(layer for layer in (0, 1) if len(before.get(layer, [])) < 3)
    head = next(h for h in range(4) if h not in before.get(layer, []))
    cfg = tiny_config("sentiment", pruned, tmp_path / "run", max_steps=1, prune_heads=f"[{layer}:{head}]")
    out = train(cfg)
    want = {layer: sorted([*before.get(layer, []), head]) for layer in {*before, layer}}
    saved = json.loads((out / "config.json").read_text())["pruned_heads"]
    assert {int(k): v for k, v in saved.items()} == want
    weights = load_file(out / "model.safetensors")
    for index in (0, 1):
        kept = 4 - len(want.get(index, []))
        query = weights[f"bert.encoder.layer.{index}.attention.self.query.weight"]
        assert query.shape == torch.Size([kept * 8, 32]), (index, query.shape)


@pytest.mark.parametrize(
    ("heads", "message"),
    [
        ("[0-1]", "prune_heads=['0-1'], must be distinct layer:head items (0-based)"),
        ("[0:1,0:1]", "must be distinct layer:head items"),
        (
            "[2:0]",
            "prune_heads=2:0: model {model} has 2 layers of 4 heads (0-based layer:head); fix the list",
        ),
        ("[1:4]", "prune_heads=1:4: model {model} has 2 layers of 4 heads"),
        (
            "[0:0,0:1,0:2,0:3]",
            "prune_heads: removes every head of layer 0 of model {model}; each layer keeps one",
        ),
    ],
)
def test_a_list_the_model_cannot_take_is_one_line_before_torch(
    sentiment_run: Path, tmp_path: Path, heads: str, message: str
) -> None:
    argv = ["finetune", "sentiment", f"model={sentiment_run}", f"prune_heads={heads}"]
    answer = probe([*argv, f"output_dir={tmp_path / 'out'}"], tmp_path)
    assert answer["status"] == 1
    assert message.format(model=sentiment_run) in str(answer["stderr"]), answer["stderr"]
    assert str(answer["stderr"]).count("\n") == 1, answer["stderr"]
    assert {"torch", "transformers", "accelerate"}.isdisjoint(answer["loaded"]), answer["loaded"]
    assert not (tmp_path / "out").exists()


def test_a_head_pruned_already_is_named(sentiment_run: Path, tmp_path: Path) -> None:
    pruned = prune("sentiment", sentiment_run, "1", tmp_path / "pruned")
    (layer, (head,)), *_ = json.loads((pruned / "config.json").read_text())["pruned_heads"].items()
    cfg = tiny_config("sentiment", pruned, tmp_path / "run", prune_heads=f"[{layer}:{head}]")
    with pytest.raises(
        BertTasksError, match=f"prune_heads={layer}:{head}: model .* has no such head any more"
    ):
        train(cfg)
    assert not (tmp_path / "run").exists()


def test_an_encoder_without_the_fused_attention_is_refused(tmp_path: Path) -> None:
    roberta = build_tiny_encoder("roberta", tmp_path / "roberta")
    cfg = tiny_config("sentiment", roberta, tmp_path / "run", prune_heads="[0:1]")
    with pytest.raises(BertTasksError, match="prune_heads= needs bert-tasks' fused BERT attention"):
        train(cfg)
