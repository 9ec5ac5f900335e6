"""Predictions on the user's own tokens (`{"tokens": [...]}`, optionally with its "text"): one tag per
token, the same tags as the training-time encoding of those tokens, through the library, `predict
--file`, `--out` and the server; each bad token list is one line; and a run saves the splitter its
corpus calls for and predicts raw text with it."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient

from bert_tasks.cli import main
from bert_tasks.data.ner_files import read_conll, read_jsonl_spans, read_jsonl_tokens
from bert_tasks.data.word_splitters import word_splitter
from bert_tasks.inference.predictor import EntityTagger
from bert_tasks.inference.serve_settings import ServeSettings
from bert_tasks.inference.server import create_app
from bert_tasks.model_dir import read_policy
from bert_tasks.training import train
from tests.helpers import FIXTURES, one_thread, tiny_config

TOKENS = ["Her", "hepatotoxicity", "improved", "after", "sodium", "valproate", "."]
TEXT = "Her  hepatotoxicity improved after sodium valproate."


@pytest.fixture(scope="module")
def tagger(ner_run: Path) -> EntityTagger:
    return EntityTagger(ner_run, progress=False)


def test_tokens_get_the_tags_the_training_encoding_gives_them(tagger: EntityTagger) -> None:
    """The tags of `{"tokens"}` records are the tags of the same sentences read as training data (the
    task's own encoding and decoding of a labelled split), one per given token."""
    raw = read_conll(FIXTURES / "run_ner_train.conll")
    expected = [
        tags for tags, _ in tagger.task.predict_tags(raw, *tagger.window_logits(raw), tagger.id2label)
    ]
    predicted = tagger([{"tokens": tokens} for tokens in raw["tokens"]])
    assert [p["tokens"] for p in predicted] == raw["tokens"]
    assert [p["tags"] for p in predicted] == expected
    assert all(len(p["tags"]) == len(p["tokens"]) for p in predicted)


def test_entities_are_token_slices_and_with_a_text_character_spans_too(tagger: EntityTagger) -> None:
    alone = tagger({"tokens": TOKENS})
    with_text = tagger({"tokens": TOKENS, "text": TEXT})
    assert list(alone) == ["tokens", "tags", "entities"]
    assert list(with_text) == ["text", "tokens", "tags", "entities"]
    assert with_text["tags"] == alone["tags"]
    for plain, placed in zip(alone["entities"], with_text["entities"], strict=True):
        assert plain == {k: placed[k] for k in ("label", "token_start", "token_end", "score")}
        assert TEXT[placed["start"] : placed["end"]] == placed["text"]
        first, last = TOKENS[placed["token_start"]], TOKENS[placed["token_end"] - 1]
        assert placed["text"].startswith(first) and placed["text"].endswith(last)
        assert all(tag != "O" for tag in alone["tags"][plain["token_start"] : plain["token_end"]])
    assert tagger.records([{"tokens": TOKENS}]) == [alone]
    # texts and token records mixed in one call: each gets its own shape
    text_result, token_result = tagger([TEXT, {"tokens": TOKENS}])
    assert isinstance(text_result, list) and token_result == alone


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"tokens": []}, "record 1: 'tokens' is an empty list; give at least one token to predict on"),
        ({"tokens": "Her fever"}, "record 1: 'tokens' is a string (\"Her fever\"), not a list of strings"),
        ({"tokens": ["Her", 5]}, "record 1: token 2 in 'tokens' is a number (5), not a string"),
        ({"tokens": ["Her", " \u200b "]}, "record 1: token 2 in 'tokens' is empty or invisible"),
        ({"tokens": ["Her", "\ud800"]}, "record 1: lone surrogate \\ud800 at character offset 0 of token 2"),
        (
            {"tokens": ["fever", "Her"], "text": "Her fever"},
            "record 1: token 2 'Her' does not occur in 'text' ",
        ),
        (
            {"tokens": ["Her"], "text": 5},
            "record 1: JSON line has no 'text' string field ('text' is a number",
        ),
    ],
)
def test_a_bad_token_list_is_one_line(tagger: EntityTagger, record: dict, message: str) -> None:
    from bert_tasks.errors import BertTasksError

    with pytest.raises(BertTasksError) as raised:
        tagger(record)
    assert str(raised.value).startswith(message) and "\n" not in str(raised.value)


def _tokens_file(tmp_path: Path, records: list[dict]) -> Path:
    path = tmp_path / "tokens.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return path


def test_predict_file_and_out_take_token_records(
    ner_run: Path, tagger: EntityTagger, tmp_path: Path, capsys
) -> None:
    records = [
        {"id": 7, "tokens": TOKENS},
        {"id": 8, "tokens": TOKENS, "text": TEXT},
        {"id": 9, "text": TEXT},
    ]
    path = _tokens_file(tmp_path, records)
    assert main(["predict", "ner", "--model", str(ner_run), "--file", str(path), "--json"]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    expected = tagger.records([{k: v for k, v in r.items() if k != "id"} for r in records])
    assert printed == expected
    out = tmp_path / "out.jsonl"
    assert main(["predict", "ner", "--model", str(ner_run), "--file", str(path), "--out", str(out)]) == 0
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert written == [{"id": r["id"], **e} for r, e in zip(records, expected, strict=True)]
    capsys.readouterr()
    assert main(["predict", "ner", "--model", str(ner_run), "--file", str(path)]) == 0
    blocks = capsys.readouterr().out.strip().split("\n\n")
    unmarked = [re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", block.splitlines()[0]) for block in blocks]
    assert unmarked == [" ".join(TOKENS), TEXT, TEXT]  # tokens alone are shown joined by spaces
    assert all(line.split()[1].startswith("#") for line in blocks[0].splitlines()[1:] if "(no" not in line)


def test_a_bad_token_record_in_a_file_is_one_line_with_its_line_before_torch(
    ner_run: Path, tmp_path: Path
) -> None:
    path = _tokens_file(tmp_path, [{"tokens": TOKENS}, {"tokens": ["Her", ""]}])
    code = (
        "import sys; from bert_tasks.cli import main; status = main(sys.argv[1:]); "
        "assert 'torch' not in sys.modules, 'torch was imported'; sys.exit(status)"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "predict",
            "ner",
            "--model",
            str(ner_run),
            "--file",
            str(path),
            "--json",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip() == (
        f"bert-tasks: error: {path}:2: token 2 in 'tokens' is empty or invisible (whitespace, control or "
        "format characters only); remove it"
    )


def test_label_studio_needs_the_text_of_token_records(ner_run: Path, tmp_path: Path) -> None:
    """Refused at the record's line while the file is read: it came after the model had predicted it all."""
    from tests.test_cli_startup import probe

    path = _tokens_file(tmp_path, [{"tokens": TOKENS, "text": TEXT}, {"tokens": TOKENS}])
    answer = probe(
        ["predict", "ner", "--model", str(ner_run), "--file", str(path), "--format", "label-studio"], tmp_path
    )
    assert answer["status"] == 1 and answer["loaded"] == [], answer
    assert (
        f"{path}:2: --format label-studio marks entities in a text, and a record of 'tokens' without its "
        in (answer["stderr"])
    )


def test_the_server_takes_token_records(ner_run: Path, tagger: EntityTagger) -> None:
    with TestClient(create_app(ServeSettings(str(ner_run), "ner"), tagger)) as client:
        answer = client.post("/predict", json={"records": [{"id": "a", "tokens": TOKENS, "text": TEXT}]})
        assert answer.status_code == 200, answer.text
        assert answer.json()["records"] == [{"id": "a", **tagger({"tokens": TOKENS, "text": TEXT})}]
        bad = client.post("/predict", json={"records": [{"tokens": ["fine"]}, {"tokens": []}]})
        assert bad.status_code == 422
        assert bad.json()["detail"].startswith("record 2: 'tokens' is an empty list")


@pytest.mark.slow
def test_a_run_saves_the_splitter_its_corpus_calls_for_and_predicts_raw_text_with_it(
    tiny_model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Trained on tweets tokenized with @handles, #hashtags and URLs whole, the model is saved with
    `social` (one INFO line with the agreement), and raw text is cut that way at prediction; a splitter the
    user names wins."""
    social = FIXTURES / "ner_social.jsonl"
    with one_thread(), caplog.at_level(logging.INFO, logger="bert_tasks"):
        run = train(
            tiny_config("ner", tiny_model, tmp_path / "social", train_file=social, validation_file="none")
        )
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("word_splitter=")]
    assert len(said) == 1 and said[0].startswith("word_splitter=social: its words agree with the training")
    assert read_policy(run).task_options["word_splitter"] == "social"
    assert yaml.safe_load((run / "recipe.yaml").read_text())["word_splitter"] == "social"
    raw = EntityTagger(run, progress=False).task.texts_to_raw(
        ["thanks @jo_smith! #travel http://x.example/y."]
    )
    assert raw["tokens"] == [["thanks", "@jo_smith", "!", "#travel", "http://x.example/y", "."]]
    assert read_jsonl_tokens(social)["tokens"][6][1] == "@jo_smith"  # as the corpus has it
    with one_thread():
        mine = train(
            tiny_config(
                "ner",
                tiny_model,
                tmp_path / "mine",
                train_file=social,
                validation_file="none",
                word_splitter="whitespace",
            )
        )
    assert read_policy(mine).task_options["word_splitter"] == "whitespace"


def test_evaluate_reads_span_files_with_the_splitter_it_is_given(ner_run: Path, caplog) -> None:
    from bert_tasks.inference.evaluate import read_labelled_file

    spans = FIXTURES / "ner_spans.jsonl"
    saved, policy = read_labelled_file(ner_run, str(spans))
    assert policy.task_options["word_splitter"] == "default"
    with caplog.at_level(logging.INFO, logger="bert_tasks"):
        other, policy = read_labelled_file(ner_run, str(spans), ["word_splitter=whitespace"])
    assert policy.task_options["word_splitter"] == "whitespace"
    assert "word_splitter=whitespace differs from the model's training (default)" in caplog.text
    assert other["tokens"] != saved["tokens"]
    assert other["tokens"][0] == read_jsonl_spans(spans, splitter=word_splitter("whitespace"))["tokens"][0]
