"""NerTask: label alignment, windows and their merge, BIO-constrained decoding, offsets, metrics."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from datasets import Dataset
from transformers import AutoTokenizer

from bert_tasks.config import Config
from bert_tasks.data.batching import RowCollator, with_rows
from bert_tasks.data.splits import read_splits
from bert_tasks.errors import BertTasksError
from bert_tasks.tasks.ner import IGNORE, NerTask, bio_label_names, entity_spans, viterbi_decode

LABELS = ["O", "B-Chemical", "I-Chemical", "B-Disease", "I-Disease"]
LABEL2ID = {label: i for i, label in enumerate(LABELS)}
ID2LABEL = dict(enumerate(LABELS))
DEMO = Path(__file__).resolve().parents[2] / "bert_tasks" / "resources" / "demo" / "ner"


@pytest.fixture(scope="module")
def tokenizer(default_model_dir):
    return AutoTokenizer.from_pretrained(default_model_dir)


def window_logits(
    encoded: Dataset, word_tags: list[list[str]], wrong_at_cuts: bool = False
) -> list[np.ndarray]:
    """Logits that predict `word_tags` on every sub-token; optionally `O` where a window cuts the sentence.

    Tokens next to a cut have the least context, so a model is most likely to be wrong there: the
    max-context merge must take those words from the window where they sit inside.
    """
    logits = []
    for example, word_ids in zip(encoded["example_id"], encoded["word_ids"], strict=True):
        rows = np.zeros((len(word_ids) + 3, len(LABELS)), dtype=np.float32)  # +3: collator padding
        content = [p for p, w in enumerate(word_ids) if w >= 0]
        last_word = len(word_tags[example]) - 1
        for p in content:
            cut = (p == content[0] and word_ids[p] != 0) or (p == content[-1] and word_ids[p] != last_word)
            rows[p, LABEL2ID["O" if wrong_at_cuts and cut else word_tags[example][word_ids[p]]]] = 8.0
        logits.append(rows)
    return logits


def test_label_names_o_first_then_b_i_per_type():
    train = Dataset.from_dict({"tokens": [["a", "b"]], "tags": [["I-Disease", "B-Chemical"]]})
    assert bio_label_names(train["tags"]) == LABELS
    assert NerTask().label_names(train, Config(task="ner")) == LABELS
    with pytest.raises(BertTasksError, match=r"lacks \['I-Disease'\]"):
        NerTask().label_names(
            train, Config(task="ner", label_names=["O", "B-Chemical", "I-Chemical", "B-Disease"])
        )


@pytest.mark.parametrize(
    ("names", "problem"),
    [
        (["O", "B-Disease", "I-Disease", "Disease"], r"names \['Disease'\] are not BIO"),
        (["O", "b-x", "B-Disease", "I-Disease"], r"names \['b-x'\] are not BIO"),
        (["O", "I-", "B-Disease", "I-Disease"], r"names \['I-'\] are not BIO"),
        (["O", "B-Disease", "I-Disease", "B-Gene"], r"lacks \['I-Gene'\]"),
    ],
)
def test_label_names_that_are_not_bio_are_refused_before_training(names, problem):
    train = Dataset.from_dict({"tokens": [["a"]], "tags": [["B-Disease"]]})
    with pytest.raises(BertTasksError, match=rf"label_names=.*: {problem}; give O plus B-TYPE"):
        NerTask().label_names(train, Config(task="ner", label_names=names))


def test_read_demo_and_reject_eval_types_unseen_in_train(tmp_path):
    cfg = Config(
        task="ner", train_file=str(DEMO / "train.conll"), validation_file=str(DEMO / "validation.conll")
    )
    splits = read_splits(NerTask(), cfg)
    assert (len(splits["train"]), len(splits["validation"])) == (400, 100)
    gene = tmp_path / "dev.conll"
    gene.write_text("BRCA1\tB-Gene\nmutation\tO\n", encoding="utf-8")
    cfg = Config(
        task="ner", train_file=str(DEMO / "train.conll"), validation_file=str(gene), max_train_samples=5
    )
    with pytest.raises(
        BertTasksError, match=rf"{gene}: entity type 'Gene' never occurs in the training data"
    ):
        read_splits(NerTask(), cfg)


@pytest.mark.parametrize(
    ("label_all_subtokens", "expected"),
    [
        # [CLS] cis ##pl ##atin ne ##ph ##rot ##ox ##ici ##ty [SEP]
        (False, ["-", "B-Chemical", "-", "-", "B-Disease", "-", "-", "-", "-", "-", "-"]),
        (True, ["-", "B-Chemical", "I-Chemical", "I-Chemical", "B-Disease"] + ["I-Disease"] * 5 + ["-"]),
    ],
)
def test_label_alignment(tokenizer, label_all_subtokens, expected):
    raw = Dataset.from_dict(
        {"tokens": [["Cisplatin", "nephrotoxicity"]], "tags": [["B-Chemical", "B-Disease"]]}
    )
    encoded = NerTask(label_all_subtokens=label_all_subtokens).encode(raw, tokenizer, LABEL2ID, 64, 8)
    assert tokenizer.convert_ids_to_tokens(encoded[0]["input_ids"])[1:4] == ["cis", "##pl", "##atin"]
    assert [ID2LABEL.get(i, "-") for i in encoded[0]["labels"]] == expected
    assert encoded[0]["word_ids"] == [-1, 0, 0, 0, 1, 1, 1, 1, 1, 1, -1]
    assert encoded.column_names == [
        "input_ids",
        "token_type_ids",
        "attention_mask",
        "example_id",
        "word_ids",
        "labels",
    ]


def test_window_that_starts_inside_a_word(tokenizer):
    # 8 one-piece words, then a 6-piece word: with 10 content tokens per window and a 4-token overlap, the
    # third window starts at "##ici", in the middle of "nephrotoxicity" (word 8).
    words = [
        *"abcdefgh",
        "nephrotoxicity",
        "resolved",
        "after",
        "two",
        "weeks",
        "of",
        "rest",
        "and",
        "fluids",
    ]
    tags = ["O"] * 8 + ["B-Disease"] + ["O"] * 8
    raw = Dataset.from_dict({"tokens": [words], "tags": [tags]})
    for all_pieces, continuation in ((False, IGNORE), (True, LABEL2ID["I-Disease"])):
        encoded = NerTask(label_all_subtokens=all_pieces).encode(raw, tokenizer, LABEL2ID, 12, 4)
        assert [row["word_ids"][1] for row in encoded] == [0, 6, 8]
        assert encoded[2]["labels"][1] == continuation
        # In the other two windows the word is labelled B- exactly where its first piece is.
        assert [encoded[k]["labels"][encoded[k]["word_ids"].index(8)] for k in (0, 1)] == [
            LABEL2ID["B-Disease"]
        ] * 2
    logits = window_logits(encoded, [tags], wrong_at_cuts=True)
    assert NerTask().predict_tags(raw, encoded, logits, ID2LABEL)[0][0] == tags


def test_entity_across_window_edge_comes_out_whole_and_once(tokenizer):
    text = (
        "The patient was given one dose and then developed acute renal failure after cisplatin therapy "
        "and recovered slowly over many weeks."
    )
    raw = NerTask().texts_to_raw([text])
    gold = ["O"] * len(raw[0]["tokens"])
    first = raw[0]["tokens"].index("acute")
    gold[first : first + 3] = ["B-Disease", "I-Disease", "I-Disease"]
    gold[raw[0]["tokens"].index("cisplatin")] = "B-Chemical"
    encoded = NerTask().encode(raw, tokenizer, None, 12, 4)
    assert len(encoded) > 2 and "labels" not in encoded.column_names
    # "acute" is the last token of window 0 and inside window 1.
    assert encoded[0]["word_ids"][-2] == first and first in encoded[1]["word_ids"]
    logits = window_logits(encoded, [gold], wrong_at_cuts=True)
    [entities] = NerTask().decode(raw, encoded, logits, ID2LABEL)
    assert [(e["text"], e["label"]) for e in entities] == [
        ("acute renal failure", "Disease"),
        ("cisplatin", "Chemical"),
    ]
    for entity in entities:
        assert text[entity["start"] : entity["end"]] == entity["text"]
        assert 0.99 < entity["score"] <= 1.0


def test_every_word_is_covered_by_some_window(tokenizer):
    raw = Dataset.from_dict({"tokens": [[f"word{i}" for i in range(300)]], "tags": [["O"] * 300]})
    encoded = NerTask().encode(raw, tokenizer, LABEL2ID, 16, 4)
    assert max(len(ids) for ids in encoded["input_ids"]) <= 16
    assert set().union(*encoded["word_ids"]) - {-1} == set(range(300))


def test_words_without_sub_tokens_become_unk(tokenizer):
    # Zero-width and control characters normalise to nothing; they are fed as [UNK] and keep their tag.
    words = ["Aspirin", "\u200b", "caused", "\x07", "rash"]
    tags = ["B-Chemical", "O", "O", "O", "B-Disease"]
    raw = Dataset.from_dict({"tokens": [words], "tags": [tags]})
    encoded = NerTask().encode(raw, tokenizer, LABEL2ID, 32, 4)
    assert encoded[0]["word_ids"] == [-1, 0, 0, 0, 1, 2, 3, 4, -1]
    pieces = tokenizer.convert_ids_to_tokens(encoded[0]["input_ids"])
    assert pieces[4] == pieces[6] == tokenizer.unk_token
    assert NerTask().metrics(raw, encoded, window_logits(encoded, [tags]), ID2LABEL)["f1"] == 1.0


def test_viterbi_repairs_an_invalid_argmax():
    labels = ["O", "B-Disease", "I-Disease"]
    probs = np.array(
        [
            [0.2, 0.1, 0.7],  # argmax I-Disease: cannot start a sentence
            [0.1, 0.1, 0.8],
            [0.9, 0.05, 0.05],
            [0.1, 0.4, 0.5],  # argmax I-Disease after O: invalid
            [0.1, 0.1, 0.8],
        ]
    )
    assert [labels[i] for i in probs.argmax(axis=1)] == [
        "I-Disease",
        "I-Disease",
        "O",
        "I-Disease",
        "I-Disease",
    ]
    # Best valid path: B I O B I (0.1*0.8*0.9*0.4*0.8) beats O O O B I and the other valid ones.
    assert [labels[i] for i in viterbi_decode(np.log(probs), labels)] == [
        "B-Disease",
        "I-Disease",
        "O",
        "B-Disease",
        "I-Disease",
    ]
    # I-X after B-Y is invalid too.
    mixed = ["O", "B-Chemical", "I-Chemical", "B-Disease", "I-Disease"]
    scores = np.log(np.array([[0.1, 0.8, 0.05, 0.0249, 0.0251], [0.1, 0.05, 0.3, 0.05, 0.5]]) + 1e-9)
    assert [mixed[i] for i in viterbi_decode(scores, mixed)] == ["B-Chemical", "I-Chemical"]


def test_viterbi_false_gives_argmax(tokenizer):
    raw = Dataset.from_dict({"tokens": [["rash", "fever"]], "tags": [["I-Disease", "O"]]})
    encoded = NerTask().encode(raw, tokenizer, None, 16, 4)
    logits = window_logits(encoded, [["I-Disease", "O"]])
    assert NerTask(viterbi=False).predict_tags(raw, encoded, logits, ID2LABEL)[0][0] == ["I-Disease", "O"]
    assert NerTask(viterbi=True).predict_tags(raw, encoded, logits, ID2LABEL)[0][0][0] in ("O", "B-Disease")


def test_decode_without_text_gives_word_tags(tokenizer):
    raw = Dataset.from_dict(
        {"tokens": [["Aspirin", "caused", "rash"], []], "tags": [["B-Chemical", "O", "B-Disease"], []]}
    )
    encoded = NerTask().encode(raw, tokenizer, LABEL2ID, 16, 4)
    decoded = NerTask().decode(raw, encoded, window_logits(encoded, raw["tags"]), ID2LABEL)
    entities = [{k: v for k, v in e.items() if k != "score"} for e in decoded[0].pop("entities")]
    assert decoded == [
        {"tokens": ["Aspirin", "caused", "rash"], "tags": ["B-Chemical", "O", "B-Disease"]},
        {"tokens": [], "tags": [], "entities": []},
    ]
    assert entities == [
        {"label": "Chemical", "token_start": 0, "token_end": 1},
        {"label": "Disease", "token_start": 2, "token_end": 3},
    ]


def test_decode_raw_text_offsets_round_trip(tokenizer):
    texts = ["Le patient 😀 a eu une céphalée après l'aspirine.", "صداع بعد الأسبرين", "", "  \x07\u200f "]
    raw = NerTask().texts_to_raw(texts)
    tags = [["B-Disease" if i % 3 == 0 else "I-Disease" for i in range(len(t))] for t in raw["tokens"]]
    encoded = NerTask().encode(raw, tokenizer, None, 12, 4)
    decoded = NerTask().decode(raw, encoded, window_logits(encoded, tags), ID2LABEL)
    assert len(decoded) == 4 and decoded[2] == decoded[3] == []
    for text, entities in zip(texts, decoded, strict=True):
        for entity in entities:
            assert text[entity["start"] : entity["end"]] == entity["text"]
            assert entity["label"] == "Disease"


def test_metrics_on_demo_with_oracle_logits(tokenizer):
    raw = read_splits(NerTask(), Config(task="ner", train_file=str(DEMO / "validation.conll")))["train"]
    encoded = NerTask().encode(raw, tokenizer, LABEL2ID, 16, 4)
    scores = NerTask().metrics(
        raw, encoded, window_logits(encoded, raw["tags"], wrong_at_cuts=True), ID2LABEL
    )
    assert scores["f1"] == scores["strict_f1"] == 1.0
    assert set(scores["per_type"]) == {"Chemical", "Disease"}


def test_collator_pads_and_drops_bookkeeping(tokenizer):
    raw = Dataset.from_dict(
        {
            "tokens": [["Aspirin"], ["Aspirin", "caused", "rash"]],
            "tags": [["B-Chemical"], ["B-Chemical", "O", "B-Disease"]],
        }
    )
    encoded = with_rows(NerTask().encode(raw, tokenizer, LABEL2ID, 16, 4))
    batch = RowCollator(NerTask().collator(tokenizer))(list(encoded))
    assert set(batch) == {"input_ids", "attention_mask", "token_type_ids", "labels", "row"}
    assert batch["input_ids"].shape == batch["labels"].shape == (2, 8)  # 6 tokens padded to a multiple of 8
    assert batch["labels"][0, 3:].eq(IGNORE).all()


def test_stride_too_large_is_a_user_error(tokenizer):
    raw = Dataset.from_dict({"tokens": [["a"]], "tags": [["O"]]})
    with pytest.raises(BertTasksError, match="stride=10 must be"):
        NerTask().encode(raw, tokenizer, LABEL2ID, 12, 10)


def test_unknown_tag_at_encode_time(tokenizer):
    raw = Dataset.from_dict({"tokens": [["BRCA1"]], "tags": [["B-Gene"]]})
    with pytest.raises(BertTasksError, match="tag 'B-Gene' is not one of the model's labels"):
        NerTask().encode(raw, tokenizer, LABEL2ID, 12, 4)


def test_entity_spans_read_bio_exactly_as_seqeval() -> None:
    """Prediction's own BIO reader (no scikit-learn import) against seqeval's, on random tag sequences
    with stray I- tags, type changes and adjacent entities."""
    from seqeval.metrics.sequence_labeling import get_entities

    rng = np.random.default_rng(0)
    vocabulary = ["O", "B-Disease", "I-Disease", "B-Chemical", "I-Chemical"]
    for _ in range(500):
        tags = [vocabulary[i] for i in rng.integers(0, len(vocabulary), rng.integers(0, 12))]
        assert entity_spans(tags) == get_entities(tags), tags
