"""Shared fixtures: a tiny random BERT built once per session, the bundled tokenizer, ../shared/data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from transformers import BertConfig

from bert_tasks.modeling.load import bundled_model_dir

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"

# Tests never touch the Hub: everything they load is local.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_EVALUATE_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def tiny_bert_config(**overrides: object) -> BertConfig:
    """A 2-layer, 32-wide BERT with the bundled tokenizer's vocabulary: fast, but real shapes."""
    settings: dict[str, object] = {
        "vocab_size": 30522,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 37,
        "max_position_embeddings": 128,
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
    }
    settings.update(overrides)
    return BertConfig(**settings)


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The real default model (all-MiniLM-L6-v2) from the installed package."""
    return bundled_model_dir()


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data; tests that need it fail loudly in CI when it is missing (never skip)."""
    if not SHARED_DATA.is_dir():
        pytest.fail(f"{SHARED_DATA} is missing: the end-to-end tests need ../shared/data beside the repo")
    return SHARED_DATA


@pytest.fixture
def padded_batch() -> dict[str, torch.Tensor]:
    """Three sequences of different lengths, right-padded: the case where masks matter."""
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(1000, 30000, (3, 11), generator=generator)
    attention_mask = torch.ones(3, 11, dtype=torch.long)
    attention_mask[1, 7:] = 0
    attention_mask[2, 3:] = 0
    input_ids[attention_mask == 0] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask}
