"""Checkpoints stay plain Hugging Face BERT: what we save loads in vanilla transformers, and back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import (
    AutoModelForSequenceClassification,
    BertForSequenceClassification,
    BertForTokenClassification,
)

from bert_tasks import BertTasksError, load_model, patch_bert
from bert_tasks.modeling.attention import fused_qkv_names
from tests.helpers import at_real_tokens, tiny_bert_config

# Runs in a fresh interpreter in which `import bert_tasks` fails, so only vanilla transformers can load.
VANILLA_LOAD = """
import sys, json, torch
sys.modules["bert_tasks"] = None
from transformers import AutoModelForSequenceClassification
model = AutoModelForSequenceClassification.from_pretrained(sys.argv[1]).eval()
batch = torch.load(sys.argv[2])
with torch.no_grad():
    logits = model(**batch).logits
torch.save(logits, sys.argv[3])
print(json.dumps({"class": type(model).__name__, "labels": model.config.id2label}))
"""


@pytest.fixture
def fine_tuned_dir(tmp_path: Path) -> Path:
    """A patched model after one optimizer step (weights differ from init), saved with save_pretrained."""
    torch.manual_seed(0)
    config = tiny_bert_config(num_labels=2, id2label={0: "negative", 1: "positive"})
    config.label2id = {"negative": 0, "positive": 1}
    model = patch_bert(BertForSequenceClassification(config))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(input_ids=torch.randint(1000, 30000, (4, 9)), labels=torch.tensor([0, 1, 1, 0])).loss.backward()
    optimizer.step()
    model.eval().save_pretrained(tmp_path / "model")
    return tmp_path / "model"


def test_saved_state_dict_uses_hf_names(fine_tuned_dir: Path):
    keys = set(load_file(fine_tuned_dir / "model.safetensors"))
    assert "bert.encoder.layer.0.attention.self.query.weight" in keys
    assert "bert.encoder.layer.1.attention.self.value.bias" in keys
    assert not any("qkv" in key for key in keys)
    stock_keys = set(BertForSequenceClassification(tiny_bert_config(num_labels=2)).state_dict())
    assert keys == stock_keys


@pytest.mark.slow  # a fresh process that imports transformers
def test_vanilla_transformers_loads_saved_model_without_bert_tasks(
    fine_tuned_dir: Path, padded_batch, tmp_path
):
    patched = load_model(fine_tuned_dir, "sentiment")
    with torch.no_grad():
        expected = patched(**padded_batch).logits
    torch.save(padded_batch, tmp_path / "batch.pt")
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            VANILLA_LOAD,
            str(fine_tuned_dir),
            str(tmp_path / "batch.pt"),
            str(tmp_path / "out.pt"),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    info = json.loads(result.stdout.strip().splitlines()[-1])
    assert info == {"class": "BertForSequenceClassification", "labels": {"0": "negative", "1": "positive"}}
    torch.testing.assert_close(torch.load(tmp_path / "out.pt"), expected, atol=1e-6, rtol=1e-6)


def test_stock_checkpoint_loads_into_patched_model(tmp_path: Path, padded_batch):
    torch.manual_seed(0)
    stock = BertForTokenClassification(tiny_bert_config(num_labels=5)).eval()
    stock.save_pretrained(tmp_path / "stock")
    patched = load_model(tmp_path / "stock", "ner")
    assert not patched.training
    mask = padded_batch["attention_mask"]
    with torch.no_grad():
        torch.testing.assert_close(
            at_real_tokens(patched(**padded_batch).logits, mask),
            at_real_tokens(stock(**padded_batch).logits, mask),
            atol=1e-5,
            rtol=1e-5,
        )


def test_load_state_dict_accepts_hf_names(padded_batch):
    torch.manual_seed(0)
    stock = BertForSequenceClassification(tiny_bert_config()).eval()
    patched = patch_bert(BertForSequenceClassification(tiny_bert_config()).eval())
    patched.load_state_dict(stock.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(
            patched(**padded_batch).logits, stock(**padded_batch).logits, atol=1e-5, rtol=1e-5
        )


def test_new_labels_give_named_head(default_model_dir: Path):
    model = load_model("all-MiniLM-L6-v2", "ner", ["O", "B-Disease", "I-Disease"])
    assert model.config.id2label == {0: "O", 1: "B-Disease", 2: "I-Disease"}
    assert model.classifier.out_features == 3


def test_pruned_model_round_trips(tmp_path: Path, padded_batch):
    torch.manual_seed(0)
    model = patch_bert(BertForSequenceClassification(tiny_bert_config()).eval())
    model.prune_heads({1: [0, 2]})
    model.save_pretrained(tmp_path / "pruned")
    reloaded = load_model(tmp_path / "pruned", "sentiment")
    with torch.no_grad():
        torch.testing.assert_close(
            reloaded(**padded_batch).logits, model(**padded_batch).logits, atol=1e-6, rtol=1e-6
        )


def test_bad_model_dirs_give_clear_errors(tmp_path: Path):
    with pytest.raises(BertTasksError, match=r"no config\.json"):
        load_model(tmp_path, "sentiment")
    with pytest.raises(BertTasksError, match="no such directory"):
        load_model(tmp_path / "missing", "sentiment")
    (tmp_path / "t5").mkdir()
    (tmp_path / "t5" / "config.json").write_text(json.dumps({"model_type": "t5"}))
    with pytest.raises(BertTasksError, match="model_type 't5' is not a BERT-family encoder"):
        load_model(tmp_path / "t5", "sentiment")
    with pytest.raises(BertTasksError, match="unknown task"):
        load_model(tmp_path, "summarise")


def test_half_written_dir_and_pickle_weights_refused(tmp_path: Path):
    model = BertForSequenceClassification(tiny_bert_config())
    model.save_pretrained(tmp_path / "half")
    (tmp_path / "half" / "model.safetensors").unlink()
    with pytest.raises(BertTasksError, match="could not load weights"):
        load_model(tmp_path / "half", "sentiment")
    torch.save(model.state_dict(), tmp_path / "half" / "pytorch_model.bin")
    with pytest.raises(BertTasksError, match="allow_pickle"):
        load_model(tmp_path / "half", "sentiment")
    assert load_model(tmp_path / "half", "sentiment", allow_pickle=True) is not None


def test_vanilla_auto_class_reads_our_config(fine_tuned_dir: Path):
    model = AutoModelForSequenceClassification.from_pretrained(fine_tuned_dir)
    assert model.config.id2label[1] == "positive"


def test_fused_qkv_names_only_inside_the_block(padded_batch):
    """Training checkpoints keep the in-memory `qkv` names (FSDP's state dict needs attribute names);
    a model loads either form, and model dirs keep transformers' names outside the block."""
    torch.manual_seed(0)
    model = patch_bert(BertForSequenceClassification(tiny_bert_config()).eval())
    with fused_qkv_names(model):
        fused = model.state_dict()
    assert "bert.encoder.layer.0.attention.self.qkv.weight" in fused
    assert not any(".query." in name for name in fused)
    assert "bert.encoder.layer.0.attention.self.query.weight" in model.state_dict()
    reloaded = patch_bert(BertForSequenceClassification(tiny_bert_config()).eval())
    reloaded.load_state_dict(fused)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**padded_batch).logits, model(**padded_batch).logits)
