"""Parity on the real default model (all-MiniLM-L6-v2), not just a tiny random one."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoTokenizer, BertForSequenceClassification

from bert_tasks import patch_bert

TEXTS = [
    "The patient suffers from severe headaches and occasional nausea.",
    "Great film!",
    "Cisplatin-induced acute renal failure was observed in two of the seven patients treated.",
]


@pytest.fixture(scope="module")
def models_and_batch(default_model_dir):
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(default_model_dir)
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    stock = BertForSequenceClassification.from_pretrained(
        default_model_dir, num_labels=2, attn_implementation="eager"
    ).eval()
    return stock, patch_bert(copy.deepcopy(stock)), batch


@pytest.mark.slow
def test_eval_logits_and_attention_match(models_and_batch):
    stock, patched, batch = models_and_batch
    with torch.no_grad():
        expected = stock(**batch, output_attentions=True)
        actual = patched(**batch, output_attentions=True)
        fast = patched(**batch)
    torch.testing.assert_close(actual.logits, expected.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fast.logits, expected.logits, atol=1e-5, rtol=1e-5)
    assert len(actual.attentions) == 6
    for got, want in zip(actual.attentions, expected.attentions, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_train_gradients_match(models_and_batch):
    stock, patched, batch = models_and_batch
    stock, patched = copy.deepcopy(stock), copy.deepcopy(patched)
    labels = torch.tensor([0, 1, 0])
    for model in (stock, patched):
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        model.train()
        model(**batch, labels=labels).loss.backward()
    grads = dict(stock.named_parameters())
    for name, param in patched.named_parameters():
        if ".qkv." in name:
            prefix, suffix = name.rsplit(".qkv.", 1)
            want = torch.cat([grads[f"{prefix}.{p}.{suffix}"].grad for p in ("query", "key", "value")])
        else:
            want = grads[name].grad
        torch.testing.assert_close(param.grad, want, atol=1e-6, rtol=1e-4, msg=name)


def test_bf16_autocast_matches(models_and_batch):
    stock, patched, batch = models_and_batch
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = stock(**batch).logits.float()
        actual = patched(**batch).logits.float()
    torch.testing.assert_close(actual, expected, atol=3e-2, rtol=3e-2)
