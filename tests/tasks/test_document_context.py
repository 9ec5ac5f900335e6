"""Document context for NER: neighbours within a document, read but never labelled or scored."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from datasets import Dataset
from transformers import AutoTokenizer

from bert_tasks.config import Config, load_recipe
from bert_tasks.data.document_context import AFTER, BEFORE, document_contexts
from bert_tasks.data.ner_files import read_conll
from bert_tasks.errors import BertTasksError
from bert_tasks.inference.evaluate import read_labelled_file
from bert_tasks.tasks.ner import DEFAULT_DOCUMENT_CONTEXT, IGNORE, NerTask, bio_label_names
from bert_tasks.training import train
from tests.helpers import tiny_config

# Two documents; the first holds two sentences, the second one. Each line: token POS chunk tag.
MARKED = """-DOCSTART- -X- -X- O

Jordan NNP B-NP B-PER
scored VBD B-VP O
. . O O

He PRP B-NP O
won VBD B-VP O
in IN B-PP O
Paris NNP B-NP B-LOC
. . O O

-DOCSTART- -X- -X- O

Rain NN B-NP O
in IN B-PP O
Oslo NNP B-NP B-LOC
"""


@pytest.fixture(scope="module")
def tokenizer(default_model_dir):
    return AutoTokenizer.from_pretrained(default_model_dir)


def _marked_file(tmp_path: Path) -> Path:
    path = tmp_path / "marked.txt"
    path.write_text(MARKED, encoding="utf-8")
    return path


def test_neighbours_stay_inside_their_document_and_the_limit():
    sentences = [["a", "b"], ["c"], ["d", "e", "f"], ["g"]]
    before, after = document_contexts(sentences, [0, 0, 0, 1], limit=2)
    assert before == [[], ["a", "b"], ["b", "c"], []]
    assert after == [["c", "d"], ["d", "e"], [], []]


def test_conll_reader_adds_context_only_when_the_file_marks_documents(tmp_path):
    raw = read_conll(_marked_file(tmp_path))
    assert raw[BEFORE] == [[], ["Jordan", "scored", "."], []]
    assert raw[AFTER] == [["He", "won", "in", "Paris", "."], [], []]
    unmarked = tmp_path / "unmarked.conll"
    unmarked.write_text(MARKED.replace("-DOCSTART- -X- -X- O\n", ""), encoding="utf-8")
    assert BEFORE not in read_conll(unmarked).column_names


def test_context_words_are_encoded_but_never_labelled(tmp_path, tokenizer):
    raw = read_conll(_marked_file(tmp_path))
    label2id = {label: i for i, label in enumerate(bio_label_names(raw["tags"]))}
    alone = NerTask(document_context=0).encode(raw, tokenizer, label2id, 64, 8)
    framed = NerTask(document_context=3).encode(raw, tokenizer, label2id, 64, 8)
    # sentence 1 ("He won in Paris .") is read after the last 3 words of sentence 0: "jordan scored ."
    assert len(framed[1]["input_ids"]) == len(alone[1]["input_ids"]) + 3
    assert tokenizer.convert_ids_to_tokens(framed[1]["input_ids"][1:4]) == ["jordan", "scored", "."]
    # the same labels on the same sentence words, none on the context; word ids point into the sentence
    for a, f in zip(alone, framed, strict=True):
        assert [x for x in f["labels"] if x != IGNORE] == [x for x in a["labels"] if x != IGNORE]
        assert [w for w in f["word_ids"] if w >= 0] == [w for w in a["word_ids"] if w >= 0]
    labelled = [w for w, x in zip(framed[0]["word_ids"], framed[0]["labels"], strict=True) if x != IGNORE]
    assert labelled == [0, 1, 2]


def _framed(sentence: list[str], each_side: int) -> Dataset:
    """One sentence between `each_side` one-sub-token words ("word") on each side."""
    context = [["word"] * each_side]
    return Dataset.from_dict(
        {"tokens": [sentence], "tags": [["O"] * len(sentence)], BEFORE: context, AFTER: context}
    )


def test_context_is_cut_to_one_window_beside_its_sentence(tokenizer):
    """Context never pushes a sentence that fits a window into a second: the farthest words go, the
    sides taking turns; a sentence longer than a window keeps none, so its windows are as without."""
    task = NerTask(document_context=20)
    framed = task.encode(_framed(["rain", "in", "oslo"], 20), tokenizer, None, 12, 2)  # room: 10
    assert len(framed) == 1
    pieces = tokenizer.convert_ids_to_tokens(framed[0]["input_ids"])
    assert pieces[1:-1] == ["word"] * 4 + ["rain", "in", "oslo"] + ["word"] * 3
    assert [w for w in framed[0]["word_ids"] if w >= 0] == [0, 1, 2]
    long = ["rain"] * 14
    alone = NerTask(document_context=0).encode(_framed(long, 20), tokenizer, None, 12, 2)
    assert task.encode(_framed(long, 20), tokenizer, None, 12, 2)["input_ids"] == alone["input_ids"]


def test_context_windows_merge_back_to_one_tag_per_sentence_word(tmp_path, tokenizer):
    """Sentences longer than a window, read with context, still get exactly their own words back."""
    raw = read_conll(_marked_file(tmp_path))
    task = NerTask(document_context=5, viterbi=False)
    encoded = task.encode(raw, tokenizer, None, 5, 1)  # 3 sub-tokens a window: sentences spill over
    labels = bio_label_names(raw["tags"])
    logits = [np.zeros((len(w), len(labels)), dtype=np.float32) for w in encoded["word_ids"]]
    tags = [tags for tags, _ in task.predict_tags(raw, encoded, logits, dict(enumerate(labels)))]
    assert [len(t) for t in tags] == [len(t) for t in raw["tokens"]]


def test_auto_is_the_default_count_for_marked_files_and_none_otherwise(tmp_path, caplog):
    marked = read_conll(_marked_file(tmp_path))
    cfg = Config(task="ner")
    assert NerTask().infer_options(marked, cfg)["document_context"] == DEFAULT_DOCUMENT_CONTEXT
    unmarked = marked.remove_columns([BEFORE, AFTER])
    assert NerTask().infer_options(unmarked, cfg)["document_context"] == 0
    given = Config(task="ner", document_context=4)
    assert "document_context" not in NerTask().infer_options(marked, given)
    assert "document_context" not in NerTask().infer_options(unmarked, given)
    assert "document_context=4: the training data marks no documents" in caplog.text


@pytest.mark.parametrize("value", [-1, 65, "wide", True])
def test_bad_counts_are_refused_in_one_line(value):
    with pytest.raises(BertTasksError, match="document_context"):
        load_recipe(None, [f"document_context={value}"], task="ner")
    with pytest.raises(BertTasksError, match="document_context"):  # a saved policy's value
        NerTask(document_context=value)


def test_the_count_is_saved_and_evaluate_can_override_it(tmp_path, tiny_model, caplog, single_thread):
    data = _marked_file(tmp_path)
    cfg = tiny_config("ner", tiny_model, tmp_path / "run", train_file=data, validation_file=data, max_steps=2)
    run_dir = Path(train(cfg))
    policy = json.loads((run_dir / "config.json").read_text())["bert_tasks"]
    assert policy["document_context"] == DEFAULT_DOCUMENT_CONTEXT
    caplog.set_level("INFO")
    _, saved = read_labelled_file(run_dir, str(data))
    assert saved.task_options["document_context"] == DEFAULT_DOCUMENT_CONTEXT
    _, changed = read_labelled_file(run_dir, str(data), ["document_context=0"])
    assert changed.task_options["document_context"] == 0
    assert f"document_context=0 differs from the model's training ({DEFAULT_DOCUMENT_CONTEXT})" in caplog.text
