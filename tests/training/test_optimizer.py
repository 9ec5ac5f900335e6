"""AdamW's parameter groups: BERT's no-decay rule, and layer-wise learning-rate decay wired into a run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import BertForTokenClassification, get_linear_schedule_with_warmup

from bert_tasks.config import load_recipe
from bert_tasks.errors import BertTasksError
from bert_tasks.training import train
from bert_tasks.training.optimizer import adamw, layer_depths
from tests.helpers import one_thread, tiny_bert_config, tiny_config

LR = 1e-3


@pytest.fixture
def model() -> BertForTokenClassification:
    torch.manual_seed(0)
    return BertForTokenClassification(tiny_bert_config(num_labels=3))  # 2 layers


def group_of(optimizer: torch.optim.Optimizer, param: torch.nn.Parameter) -> dict:
    [group] = [g for g in optimizer.param_groups if any(p is param for p in g["params"])]
    return group


def test_depths_run_from_the_embeddings_through_each_block_to_the_head(model) -> None:
    depths, top = layer_depths(model)
    assert top == 3
    assert depths["bert.embeddings.word_embeddings.weight"] == 0
    assert depths["bert.embeddings.LayerNorm.bias"] == 0
    assert depths["bert.encoder.layer.0.output.dense.weight"] == 1
    assert depths["bert.encoder.layer.1.output.dense.weight"] == 2
    assert depths["classifier.weight"] == 3


def test_without_decay_two_groups_split_by_bert_s_no_decay_rule(model) -> None:
    optimizer = adamw(model, LR, 0.01)
    assert [len(g["params"]) > 0 for g in optimizer.param_groups] == [True, True]
    for name, param in model.named_parameters():
        group = group_of(optimizer, param)
        assert group["lr"] == LR
        assert group["weight_decay"] == (0.01 if param.ndim >= 2 else 0.0), name
    every = [p for g in optimizer.param_groups for p in g["params"]]
    assert len(every) == len(list(model.parameters()))


def test_each_layer_down_trains_at_a_decayed_rate_that_the_schedule_keeps(model) -> None:
    optimizer = adamw(model, LR, 0.01, layer_lr_decay=0.5)
    expected = {
        "classifier.weight": LR,
        "bert.encoder.layer.1.output.dense.weight": LR * 0.5,
        "bert.encoder.layer.0.output.LayerNorm.weight": LR * 0.25,
        "bert.embeddings.word_embeddings.weight": LR * 0.125,
    }
    params = dict(model.named_parameters())
    for name, lr in expected.items():
        assert group_of(optimizer, params[name])["lr"] == pytest.approx(lr), name
    assert group_of(optimizer, params["bert.embeddings.LayerNorm.weight"])["weight_decay"] == 0.0
    assert optimizer.param_groups[0]["lr"] == LR  # what the train log reports as the run's lr
    schedule = get_linear_schedule_with_warmup(optimizer, 2, 10)
    for _ in range(5):
        optimizer.step()
        schedule.step()
    head = group_of(optimizer, params["classifier.weight"])["lr"]
    embeddings = group_of(optimizer, params["bert.embeddings.word_embeddings.weight"])["lr"]
    assert embeddings / head == pytest.approx(0.125)
    assert 0 < head < LR


def test_decay_on_a_model_without_blocks_is_refused_in_one_line() -> None:
    flat = torch.nn.Sequential(torch.nn.Linear(4, 2))
    adamw(flat, LR, 0.0)  # no decay asked: fine
    with pytest.raises(BertTasksError, match=r"^layer_lr_decay=0.8: the model has no `layer.N.` blocks") as e:
        adamw(flat, LR, 0.0, layer_lr_decay=0.8)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("value", ["0.0", "-0.5", "1.5"])
def test_a_decay_outside_zero_to_one_is_refused(value: str) -> None:
    with pytest.raises(BertTasksError, match=rf"^bad config: layer_lr_decay={value}, must be in \(0, 1\]"):
        load_recipe(None, [f"layer_lr_decay={value}"], task="sentiment")


def word_embeddings(model_dir: Path) -> torch.Tensor:
    return load_file(model_dir / "model.safetensors")["bert.embeddings.word_embeddings.weight"]


def test_a_run_with_a_steep_decay_leaves_the_embeddings_where_they_were(
    tiny_model: Path, tmp_path: Path
) -> None:
    """The run's optimizer is the decayed one: at 1e-3 ** 3 of the rate the embeddings stay put, while
    at the same rate everywhere they move."""
    start = load_file(tiny_model / "model.safetensors")["embeddings.word_embeddings.weight"]
    moved = {}
    with one_thread():
        for decay in ("1", "0.001"):
            cfg = tiny_config("sentiment", tiny_model, tmp_path / decay, lr="1e-2", layer_lr_decay=decay)
            moved[decay] = (word_embeddings(train(cfg)) - start).abs().max().item()
    assert moved["1"] > 1e-3
    assert moved["0.001"] < 1e-6
    assert "layer_lr_decay: 0.001" in (tmp_path / "0.001" / "recipe.yaml").read_text()
