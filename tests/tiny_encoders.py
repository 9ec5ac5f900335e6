"""Tiny random encoders that are not BERT, each with a tokenizer of its own family, built offline.

Each tokenizer is trained with the `tokenizers` library on the committed run fixtures (a few hundred
sentences and words) and wrapped in the family's own transformers class, so its special tokens, their
layout and its model inputs are the family's: RoBERTa's byte-level BPE (`<s> ... </s>`, no token types),
DeBERTa-v2's SentencePiece-style Unigram (`[CLS] ... [SEP]`, `▁` word markers, token types the model
ignores) and DistilBERT's WordPiece (`[CLS] ... [SEP]`, no token types; the bundled vocabulary).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from tokenizers import ByteLevelBPETokenizer, SentencePieceUnigramTokenizer
from transformers import (
    AutoModel,
    DebertaV2Config,
    DebertaV2Tokenizer,
    DistilBertConfig,
    DistilBertTokenizer,
    PretrainedConfig,
    PreTrainedTokenizerBase,
    RobertaConfig,
    RobertaTokenizer,
)

from bert_tasks.modeling.load import bundled_model_dir
from tests.helpers import DATA, LONG_NER_TEXT, LONG_REVIEW

#: hidden 32, 2 layers, 4 heads, as the tiny BERT of tests/helpers.py.
SIZES = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 37}


def corpus() -> list[str]:
    """The text every run fixture and long test text holds, for training the tokenizers."""
    texts = [LONG_REVIEW, LONG_NER_TEXT]
    for train_file, validation_file in DATA.values():
        for path in (train_file, validation_file):
            lines = path.read_text(encoding="utf-8").splitlines()
            if path.suffix == ".jsonl":
                texts += [json.loads(line)["text"] for line in lines if line.strip()]
            else:  # CoNLL: one word per line
                texts += [line.split()[0] for line in lines if line.strip()]
    return texts


def roberta_tokenizer() -> PreTrainedTokenizerBase:
    bpe = ByteLevelBPETokenizer()
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    bpe.train_from_iterator(corpus(), vocab_size=600, special_tokens=specials, show_progress=False)
    model = json.loads(bpe.to_str())["model"]
    return RobertaTokenizer(vocab=model["vocab"], merges=[tuple(pair) for pair in model["merges"]])


def deberta_tokenizer() -> PreTrainedTokenizerBase:
    unigram = SentencePieceUnigramTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    unigram.train_from_iterator(
        corpus(), vocab_size=500, special_tokens=specials, unk_token="[UNK]", show_progress=False
    )
    model = json.loads(unigram.to_str())["model"]
    return DebertaV2Tokenizer(vocab=[tuple(piece) for piece in model["vocab"]], unk_id=model["unk_id"])


def distilbert_tokenizer() -> PreTrainedTokenizerBase:
    return DistilBertTokenizer.from_pretrained(bundled_model_dir())


def roberta_config(tokenizer: PreTrainedTokenizerBase) -> PretrainedConfig:
    # RoBERTa counts positions from padding_idx + 1: 128 tokens need 130 positions.
    return RobertaConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=130,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **SIZES,
    )


def deberta_config(tokenizer: PreTrainedTokenizerBase) -> PretrainedConfig:
    # DeBERTa-v3's layout: relative positions only, disentangled content/position attention.
    return DebertaV2Config(
        vocab_size=len(tokenizer),
        max_position_embeddings=128,
        relative_attention=True,
        position_buckets=32,
        pos_att_type=["p2c", "c2p"],
        position_biased_input=False,
        pad_token_id=tokenizer.pad_token_id,
        **SIZES,
    )


def distilbert_config(tokenizer: PreTrainedTokenizerBase) -> PretrainedConfig:
    return DistilBertConfig(
        vocab_size=len(tokenizer), dim=32, n_layers=2, n_heads=4, hidden_dim=37, max_position_embeddings=128
    )


Family = tuple[Callable[[], PreTrainedTokenizerBase], Callable[..., PretrainedConfig], str, str]
#: family -> (tokenizer, config from tokenizer, the encoder class, transformers' attention implementation).
FAMILIES: dict[str, Family] = {
    "roberta": (roberta_tokenizer, roberta_config, "RobertaModel", "sdpa"),
    "deberta-v2": (deberta_tokenizer, deberta_config, "DebertaV2Model", "eager"),
    "distilbert": (distilbert_tokenizer, distilbert_config, "DistilBertModel", "sdpa"),
}


def build_tiny_encoder(family: str, directory: Path) -> Path:
    """Save a seeded random 2-layer encoder of `family` with its tokenizer: a base model dir."""
    make_tokenizer, make_config, _, _ = FAMILIES[family]
    tokenizer = make_tokenizer()
    with torch.random.fork_rng():
        torch.manual_seed(0)
        AutoModel.from_config(make_config(tokenizer)).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
