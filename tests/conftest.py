"""Shared fixtures: a tiny random BERT built once per session, the bundled tokenizer, ../shared/data."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from bert_tasks.modeling.load import bundled_model_dir
from bert_tasks.training import train
from tests.helpers import DATA, build_tiny_model, one_thread, tiny_config

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"

# Tests never touch the Hub: everything they load is local.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_EVALUATE_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_collection_finish(session: pytest.Session) -> None:
    """Move the objects that collection imported (torch, transformers, every test module) out of the
    cyclic collector's sight: accelerate's `free_memory` runs a full `gc.collect` at the end of every
    training run, and each one walked them all again (19 s of a 100 s fast suite, measured)."""
    gc.collect()
    gc.freeze()


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


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random tiny BERT + the bundled tokenizer saved as a model dir; runs only read it."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="module")
def single_thread() -> Iterator[None]:
    """One torch thread for modules of many tiny runs: thread start-up costs more than it buys there."""
    with one_thread():
        yield


@pytest.fixture(scope="session")
def sentiment_run(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny sentiment run, shared read-only by every module (copy it before changing it)."""
    with one_thread():
        return train(tiny_config("sentiment", tiny_model, tmp_path_factory.mktemp("run") / "sentiment"))


@pytest.fixture(scope="session")
def ner_run(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny NER run, shared read-only by every module (copy it before changing it)."""
    with one_thread():
        return train(tiny_config("ner", tiny_model, tmp_path_factory.mktemp("run") / "ner"))


@pytest.fixture(scope="session")
def fitted_sentiment_run(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny sentiment run trained to fit its 40 training rows, and validated on them (accuracy 1.0).

    The runs above stay at chance on their validation split, where no later step can score worse than
    the first; tests of what the best-checkpoint rule keeps need a model a bad update can spoil.
    """
    train_file = DATA["sentiment"][0]
    with one_thread():
        cfg = tiny_config(
            "sentiment",
            tiny_model,
            tmp_path_factory.mktemp("run") / "fitted",
            epochs=20,
            lr=1e-3,
            validation_file=train_file,
            early_stopping_patience=0,  # it sits at chance for epochs before it fits
        )
        return train(cfg)
