"""The word splitters, the choice of one from a corpus of tokens, and the agreement it promises: raw text
cut at prediction gives the training corpus' own words."""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

import pytest

from bert_tasks.config import Config, load_recipe
from bert_tasks.data.ner_files import read_conll, read_jsonl_spans, read_jsonl_tokens
from bert_tasks.data.splitter_choice import CANDIDATES, agreement, choose_splitter, raw_text
from bert_tasks.data.word_splitters import PRESETS, word_splitter
from bert_tasks.errors import BertTasksError
from bert_tasks.inference.predictor import EntityTagger
from bert_tasks.model_dir import ModelPolicy
from bert_tasks.tasks.ner import NerTask

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
DEMO = Path(__file__).resolve().parents[2] / "bert_tasks" / "resources" / "demo" / "ner"
SOCIAL = (
    "@maria_k landed in #Lisbon! pics: http://pics.example.com/lx1. Germany's U.S. team isn't 3,000 strong"
)


@pytest.mark.parametrize(
    ("name", "words"),
    [
        (
            "default",
            "@ maria_k landed in # Lisbon ! pics : http : / / pics . example . com / lx1 . "
            "Germany ' s U . S . team isn ' t 3 , 000 strong",
        ),
        (
            "ptb",
            "@ maria_k landed in # Lisbon ! pics : http : / / pics.example.com/lx1 . "
            "Germany 's U.S. team is n't 3,000 strong",
        ),
        (
            "social",
            "@maria_k landed in #Lisbon ! pics : http://pics.example.com/lx1 . "
            "Germany ' s U . S . team isn ' t 3 , 000 strong",
        ),
        ("whitespace", SOCIAL),
        (
            "regex:[\\w@#]+",
            "@maria_k landed in #Lisbon pics http pics example com lx1 Germany s U S team isn t 3 000 strong",
        ),
    ],
)
def test_each_splitter_cuts_a_text_its_way(name: str, words: str) -> None:
    found, offsets = word_splitter(name).split(SOCIAL)
    assert found == words.split(" ")
    assert [SOCIAL[start:end] for start, end in offsets] == found


@pytest.mark.parametrize("name", [*PRESETS, "regex:\\w+|\\s"])
@pytest.mark.parametrize(
    "text",
    [
        "bell\x07 tab\tnull\x00 rtl-mark\u200f zwsp\u200b end \u200b\u200b",
        "cafe\u0301 na\u0308ive",
        "",
        "   ",
    ],
)
def test_no_splitter_gives_an_empty_or_invisible_word(name: str, text: str) -> None:
    words, offsets = word_splitter(name).split(text)
    assert [text[start:end] for start, end in offsets] == words
    assert all(word.strip() and word.isprintable() for word in words)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("spacy", "must be one of default, ptb, social, whitespace or regex:<pattern>"),
        ("regex:", "has no pattern after regex:"),
        ("regex:(", r"is not a valid regular expression \(missing \) at position 1\); fix the pattern"),
        ("regex:(?=a)", "can match the empty string, and an empty match is no word"),
        ("regex:[a-z]*", "can match the empty string"),
        ("regex:[a-z]+|", "can match the empty string"),
    ],
)
def test_a_bad_word_splitter_is_one_line_from_the_config_and_the_policy(value: str, message: str) -> None:
    with pytest.raises(BertTasksError, match=rf"^bad config: word_splitter='{re.escape(value)}', {message}"):
        load_recipe(None, [f"word_splitter={value}"], task="ner")
    policy = {"task": "ner", "max_length": 64, "stride": 16, "word_splitter": value}
    with pytest.raises(
        BertTasksError, match=rf"^config.json: 'bert_tasks': word_splitter='{re.escape(value)}' {message}"
    ):
        ModelPolicy.from_json(policy, "config.json")
    with pytest.raises(BertTasksError, match=r"'bert_tasks.word_splitter' is 5, not a string"):
        ModelPolicy.from_json({**policy, "word_splitter": 5}, "config.json")


def test_a_text_the_saved_splitter_finds_no_words_in_is_one_warning(
    ner_run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Its prediction is no entities, which said nothing of why."""
    model = shutil.copytree(ner_run, tmp_path / "model")
    config = json.loads((model / "config.json").read_text())
    config["bert_tasks"]["word_splitter"] = "regex:[a-z]+"
    (model / "config.json").write_text(json.dumps(config))
    with caplog.at_level(logging.WARNING, logger="bert_tasks"):
        predictions = EntityTagger(model).predict(["aspirin rash", "123 456", "ASPIRIN"])
    assert predictions[1:] == [[], []]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned == [
        f"text {n}: the model's word_splitter 'regex:[a-z]+' finds no words in this text, so no entity "
        "can be found in it; give it as 'tokens', or use a model whose splitter cuts such text"
        for n in (2, 3)
    ]


def test_a_policy_without_a_splitter_cuts_as_before() -> None:
    """Model dirs saved before `word_splitter` existed keep the rule prediction always used."""
    old = ModelPolicy.from_json({"task": "ner", "max_length": 64, "stride": 16}, "config.json")
    assert NerTask(**old.task_options).splitter.spec == "default"


def test_texts_with_spans_are_cut_by_the_models_splitter(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    path.write_text(
        '{"text": "@maria_k flew to #Lisbon.", "spans": [{"start": 0, "end": 8, "label": "person"}]}\n'
    )
    assert read_jsonl_spans(path)["tokens"] == [["@", "maria_k", "flew", "to", "#", "Lisbon", "."]]
    social = read_jsonl_spans(path, splitter=word_splitter("social"))
    assert social["tokens"] == [["@maria_k", "flew", "to", "#Lisbon", "."]]
    assert social["tags"] == [["B-person", "O", "O", "O", "O"]]
    task = NerTask(word_splitter="social")
    assert task.read_file(str(path), Config(task="ner"))["tokens"] == social["tokens"]
    assert task.texts_to_raw(["@maria_k flew"])["tokens"] == [["@maria_k", "flew"]]


@pytest.mark.slow
def test_raw_text_writes_tokens_back_as_people_write() -> None:
    tokens = ["Selegiline", "-", "induced", "hypotension", "in", "Parkinson", "'", "s", "(", "PD", ")", "."]
    text, spans = raw_text(tokens)
    assert text == "Selegiline - induced hypotension in Parkinson 's (PD)."
    assert [text[start:end] for start, end in spans] == tokens


#: The committed corpora of tokens, the splitter their convention calls for, and the agreement that
#: splitter reaches on them (what each corpus allows: the social one keeps ":)" and "!!" whole, which no
#: candidate does).
CORPORA = [
    (FIXTURES / "run_ner_train.conll", "default", 1.0),
    (DEMO / "train.conll", "default", 1.0),
    (FIXTURES / "ner_sample.conll", "default", 1.0),
    (FIXTURES / "ner_newswire.conll", "ptb", 1.0),
    (FIXTURES / "ner_social.jsonl", "social", 0.94),
]


def _tokens(path: Path) -> list[list[str]]:
    return read_jsonl_tokens(path)["tokens"] if path.suffix == ".jsonl" else read_conll(path)["tokens"]


@pytest.mark.parametrize(("path", "expected", "allowed"), CORPORA, ids=lambda v: getattr(v, "name", None))
def test_the_chosen_splitter_gives_prediction_the_training_words(
    path: Path, expected: str, allowed: float
) -> None:
    """The corpus' sentences written back as raw text and cut by the prediction path (`texts_to_raw`) of a
    task with the chosen splitter come out as the corpus' own tokens, at least as often as the corpus
    allows, and no other candidate does better."""
    sentences = _tokens(path)
    choice = choose_splitter(sentences)
    print(f"{path.name}: {choice.describe()}")
    assert choice.splitter == expected
    assert choice.agreement[expected] == max(choice.agreement.values())
    texts = [raw_text(tokens) for tokens in sentences]
    predicted = NerTask(word_splitter=choice.splitter).texts_to_raw([text for text, _ in texts])
    same = sum(
        len({tuple(o) for o in offsets} & set(spans))
        for offsets, (_, spans) in zip(predicted["word_offsets"], texts, strict=True)
    )
    words = sum(len(row) for row in predicted["tokens"])
    rate = 2 * same / (words + sum(len(tokens) for tokens in sentences))
    print(f"{path.name}: training words and prediction words agree at {rate:.1%}")
    assert rate == pytest.approx(choice.agreement[expected]) and rate >= allowed
    assert all(agreement(word_splitter(name), sentences) <= rate for name in CANDIDATES)


def test_agreement_is_one_only_when_every_token_comes_back() -> None:
    assert agreement(word_splitter("default"), [["A", "b", "."]]) == 1.0
    assert agreement(word_splitter("whitespace"), [["A", "b", "."]]) == pytest.approx(2 * 1 / (3 + 2))
    assert agreement(word_splitter("default"), []) == 1.0


def test_ties_go_to_the_default(caplog: pytest.LogCaptureFixture) -> None:
    choice = choose_splitter([["Fever", "and", "rash", "."]])
    assert choice.splitter == "default" and choice.agreement["social"] == choice.agreement["default"] == 1.0
    assert NerTask().infer_options(read_conll(FIXTURES / "ner_sample.conll"), Config(task="ner")) == {
        "document_context": 0,  # the fixture marks no documents
        "word_splitter": "default",
    }
    with caplog.at_level(logging.INFO, logger="bert_tasks"):
        NerTask().infer_options(read_jsonl_tokens(FIXTURES / "ner_social.jsonl"), Config(task="ner"))
    said = [r.getMessage().split(":")[0] for r in caplog.records if r.name == "bert_tasks.tasks.ner"]
    assert said == ["word_splitter=social"]


def test_a_users_splitter_wins_and_spans_keep_the_splitter_they_were_read_with() -> None:
    social = read_jsonl_tokens(FIXTURES / "ner_social.jsonl")
    given = Config(task="ner", word_splitter="whitespace")
    assert NerTask().infer_options(social, given) == {"document_context": 0}  # no documents marked
    spans = read_jsonl_spans(FIXTURES / "ner_spans.jsonl", splitter=word_splitter("ptb"))
    kept = {"document_context": 0, "word_splitter": "ptb"}
    assert NerTask(word_splitter="ptb").infer_options(spans, Config(task="ner")) == kept


#: Slices of the shared corpora: the splitter each calls for and the agreement measured on the slice
#: (BC5CDR and NCBI-disease split punctuation off as `default` does; CoNLL-2003 follows the Penn
#: Treebank, whose "2." enumerations, initials "M." and "vs." no regex without a lexicon keeps whole).
SHARED = [("bc5cdr/train.tsv", "default", 0.999), ("conll2003/train.txt", "ptb", 0.975)]
SHARED += [("ncbi_disease/train.tsv", "default", 0.999)]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "expected", "allowed"), SHARED, ids=[row[0].split("/")[0] for row in SHARED]
)
def test_the_shared_corpora_get_the_splitter_their_tokens_follow(
    shared_data: Path, name: str, expected: str, allowed: float
) -> None:
    sentences = read_conll(shared_data / name)["tokens"][:3000]
    choice = choose_splitter(sentences)
    print(f"{name}: {choice.describe()}")
    assert choice.splitter == expected and choice.agreement[expected] == max(choice.agreement.values())
    texts = [raw_text(tokens)[0] for tokens in sentences]
    words = NerTask(word_splitter=expected).texts_to_raw(texts)["tokens"]
    exact = sum(found == tokens for found, tokens in zip(words, sentences, strict=True)) / len(sentences)
    print(f"{name}: {exact:.1%} of the sentences come out of their raw text word for word")
    assert choice.agreement[expected] >= allowed
