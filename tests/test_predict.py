"""Predictor, SentimentClassifier and EntityTagger on tiny trained runs: shapes, windowing, offsets, errors.

The models are random and barely trained, so the tests check what must hold for any weights: one result
per input, probabilities that add up, text[start:end] == entity text, long inputs seen to their end, and
clear errors for bad input.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bert_tasks.data.ner_files import words_with_offsets
from bert_tasks.errors import BertTasksError
from bert_tasks.inference.predictor import EntityTagger, Predictor, SentimentClassifier
from tests.helpers import LABELS, LONG_NER_TEXT, LONG_REVIEW

SHORT_TEXTS = ["Loved it.", "The battery died after a day, which was a shame.", "Fine.", "Not good at all."]
NER_TEXTS = ["Cisplatin nephrotoxicity was seen .", "Lithium carbonate induced nephrogenic diabetes ."]


pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def classifier(sentiment_run: Path) -> SentimentClassifier:
    """fp32, so batched and single predictions can be compared to float precision."""
    return SentimentClassifier.from_pretrained(sentiment_run, mixed_precision="no")


@pytest.fixture(scope="module")
def tagger(ner_run: Path) -> EntityTagger:
    return EntityTagger.from_pretrained(ner_run, mixed_precision="no")


def test_predictor_reads_the_saved_policy(classifier: SentimentClassifier, tagger: EntityTagger) -> None:
    """Prediction windows inputs the way training did (max_length/stride from config.json)."""
    assert (classifier.policy.max_length, classifier.policy.stride) == (32, 8)
    assert (tagger.policy.max_length, tagger.policy.stride) == (32, 8)
    assert list(classifier.id2label.values()) == LABELS["sentiment"]
    assert list(tagger.id2label.values()) == LABELS["ner"]


def test_sentiment_string_and_list(classifier: SentimentClassifier) -> None:
    """A string gives a one-item list; each result is a label, its probability and all probabilities."""
    [single] = classifier("Loved it.")
    batch = classifier(SHORT_TEXTS)
    assert len(batch) == len(SHORT_TEXTS)
    assert batch[0]["label"] == single["label"]
    assert batch[0]["score"] == pytest.approx(single["score"], abs=1e-6)
    for result in batch:
        assert set(result["scores"]) == set(LABELS["sentiment"])
        assert sum(result["scores"].values()) == pytest.approx(1.0)
        assert result["score"] == max(result["scores"].values()) == result["scores"][result["label"]]


@pytest.mark.slow
def test_sentiment_batching_does_not_change_results(sentiment_run: Path) -> None:
    """Padding, length-sorting and re-ordering of batches leave each text's probabilities unchanged."""
    batched = SentimentClassifier(sentiment_run, batch_size=3, mixed_precision="no")(SHORT_TEXTS)
    alone = [
        SentimentClassifier(sentiment_run, batch_size=1, mixed_precision="no")([t])[0] for t in SHORT_TEXTS
    ]
    for together, single in zip(batched, alone, strict=True):
        assert together["scores"]["positive"] == pytest.approx(single["scores"]["positive"], abs=1e-5)


def test_ner_string_and_list(tagger: EntityTagger) -> None:
    """A string gives its entity list; a list gives one entity list per text."""
    single = tagger(NER_TEXTS[0])
    batch = tagger(NER_TEXTS)
    assert len(batch) == len(NER_TEXTS)
    assert isinstance(single, list) and single == batch[0]
    for text, entities in zip(NER_TEXTS, batch, strict=True):
        for entity in entities:
            assert set(entity) == {"text", "label", "start", "end", "score"}
            assert entity["label"] in {"Chemical", "Disease"}
            assert text[entity["start"] : entity["end"]] == entity["text"]
            assert 0.0 < entity["score"] <= 1.0


@pytest.mark.parametrize("bad", ["", "   ", "\n\t"])
def test_empty_text_is_a_user_error(classifier: SentimentClassifier, tagger: EntityTagger, bad: str) -> None:
    """Empty or whitespace-only input fails with the 1-based position of the bad text."""
    with pytest.raises(BertTasksError, match="text 2 is empty"):
        classifier(["fine", bad])
    with pytest.raises(BertTasksError, match="text 1 is empty"):
        tagger(bad)


def test_empty_list_gives_no_predictions(classifier: SentimentClassifier, tagger: EntityTagger) -> None:
    """No texts, no predictions (a filtered batch can be empty), not a datasets ValueError."""
    assert classifier([]) == []
    assert tagger([]) == []


def test_wrong_task_dir_names_the_right_command(sentiment_run: Path, ner_run: Path) -> None:
    """Loading a model with the other task's predictor says which command fits it."""
    with pytest.raises(BertTasksError, match=r"holds a ner model.*bert-tasks predict ner"):
        SentimentClassifier(ner_run)
    with pytest.raises(BertTasksError, match=r"holds a sentiment model.*bert-tasks predict sentiment"):
        EntityTagger(sentiment_run)


def test_base_model_dir_is_not_a_predictor(tiny_model: Path, tmp_path: Path) -> None:
    """A plain encoder (not fine-tuned) is refused with a pointer to finetune; a missing dir is too."""
    with pytest.raises(
        BertTasksError, match=r"not a fine-tuned model of a bert-tasks task.*bert-tasks finetune"
    ):
        Predictor(tiny_model)
    with pytest.raises(BertTasksError, match="no such directory"):
        SentimentClassifier(tmp_path / "missing")


def test_long_sentiment_text_is_windowed_and_read_to_the_end(classifier: SentimentClassifier) -> None:
    """A ~65-word text is several windows but one prediction, and its last words change the score."""
    raw = classifier.task.texts_to_raw([LONG_REVIEW, "Short."])
    encoded = classifier.task.encode(
        raw, classifier.tokenizer, None, classifier.policy.max_length, classifier.policy.stride
    )
    assert len(encoded) >= len(raw) + 2  # the long text alone is 3+ windows
    results = classifier([LONG_REVIEW, "Short."])
    assert len(results) == 2
    ending_changed = classifier(LONG_REVIEW.replace("very convenient.", "a terrible nightmare."))[0]
    assert ending_changed["scores"]["positive"] != pytest.approx(results[0]["scores"]["positive"], abs=1e-7)


def test_long_ner_text_offsets_hold_past_the_first_window(tagger: EntityTagger) -> None:
    """A ~50-word sentence is windowed; entities are found after the first window, with exact offsets."""
    raw = tagger.task.texts_to_raw([LONG_NER_TEXT])
    encoded = tagger.task.encode(raw, tagger.tokenizer, None, tagger.policy.max_length, tagger.policy.stride)
    assert len(encoded) >= 3
    covered = {word for window in encoded["word_ids"] for word in window if word >= 0}
    words, offsets = words_with_offsets(LONG_NER_TEXT)
    assert covered == set(range(len(words)))
    first_window_end = offsets[max(encoded["word_ids"][0])][1]

    [entities] = tagger([LONG_NER_TEXT])
    assert entities == tagger(LONG_NER_TEXT)
    starts = [entity["start"] for entity in entities]
    assert starts == sorted(starts)
    for entity in entities:
        assert LONG_NER_TEXT[entity["start"] : entity["end"]] == entity["text"]
        assert entity["text"] == entity["text"].strip()
    assert any(start >= first_window_end for start in starts), "nothing tagged after the first window"


def test_ner_entities_start_and_end_on_word_boundaries(tagger: EntityTagger) -> None:
    """Spans begin at a word's first character and end at a word's last, even with odd spacing."""
    _, offsets = words_with_offsets(LONG_NER_TEXT)
    starts, ends = {start for start, _ in offsets}, {end for _, end in offsets}
    for entity in tagger(LONG_NER_TEXT):
        assert entity["start"] in starts and entity["end"] in ends


def test_evaluate_counts_each_long_text_once(classifier: SentimentClassifier) -> None:
    """Predictor.evaluate merges windows: the confusion matrix holds one count per labelled text."""
    raw = classifier.task.texts_to_raw([LONG_REVIEW, "Loved it.", LONG_REVIEW + " Again."])
    raw = raw.add_column("label", ["negative", "positive", "negative"])
    metrics = classifier.evaluate(raw)
    assert int(np.sum(metrics["confusion_matrix"])) == 3
    assert metrics["labels"] == LABELS["sentiment"]
