"""`bert-tasks debug data`: the numbers on small committed fixtures, its exit status, --json, no model.

The expected numbers are counted by hand from tests/fixtures/debug_data/. Every word there is one entry
of the bundled tokenizer's vocab.txt (uncased), so an example is its word count + 2 sub-tokens ([CLS] and
[SEP]), and at max_length=12, stride=2 a window holds 10 words, the next one starting 2 words back.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bert_tasks.cli import main
from bert_tasks.config import load_recipe
from bert_tasks.errors import BertTasksError
from bert_tasks.insight.data_report import RARE_BELOW, data_report, token_lengths
from bert_tasks.modeling.load import load_tokenizer
from bert_tasks.tasks import get_task
from tests.helpers import LONG_REVIEW, cli_error_line, write_conll, write_jsonl

DATA = Path(__file__).resolve().parent / "fixtures" / "debug_data"
NER = {"train": "ner_train.conll", "validation": "ner_validation.conll", "test": "ner_test.conll"}
SENTIMENT = {
    "train": "sentiment_train.jsonl",
    "validation": "sentiment_validation.jsonl",
    "test": "sentiment_test.jsonl",
}


FIX_THEM = "listed in the report; fix them before training"


def files(names: dict[str, str]) -> list[str]:
    return [f"{split}_file={DATA / name}" for split, name in names.items()]


def test_ner_numbers_are_the_fixtures() -> None:
    cfg = load_recipe(None, [*files(NER), "max_length=12", "stride=2"], task="ner")
    report = data_report(cfg, rare_below=5)
    assert report["labels"] == ["O", "B-Chemical", "I-Chemical", "B-Disease", "I-Disease"]
    assert report["unit"] == "entities" and report["errors"] == []
    train, validation, test = (report["splits"][split] for split in ("train", "validation", "test"))
    assert train == {
        "source": str(DATA / "ner_train.conll"),
        "examples": 6,
        "empty": 0,
        "duplicates": 2,  # sentence 3 repeats 1, sentence 4 repeats 2 with "diabetes" untagged
        "conflicting": ["Insulin was given for diabetes ."],
        "in_train": None,
        "sub_tokens": {"min": 7, "median": 8.0, "p95": 15.25, "max": 17},  # lengths 7 8 7 8 10 17
        "windowed": 1,  # the 15-word sentence: words 0-9, then 8-14
        "windows": 7,
        "labels": {"Chemical": 4, "Disease": 5},  # "heart attack" counts once, as B-Disease I-Disease
        "rare": ["Chemical"],
        "missing_from_train": None,
        "tags": {"O": 33, "B-Disease": 5, "B-Chemical": 4, "I-Disease": 3},
        "repaired_tags": 1,  # "heart" was I-Disease after O
    }
    assert validation["in_train"] == 1 and validation["missing_from_train"] == []
    assert validation["sub_tokens"] == {"min": 7, "median": 9.0, "p95": 9.0, "max": 9}
    assert validation["labels"] == {"Chemical": 1, "Disease": 3} and validation["rare"] == [
        "Chemical",
        "Disease",
    ]
    assert (validation["duplicates"], validation["windowed"], validation["repaired_tags"]) == (0, 0, 0)
    assert test["examples"] == 2 and test["in_train"] == 0 and test["labels"] == {"Chemical": 1, "Disease": 2}
    assert report["warnings"] == [
        "train: 1 label(s) with fewer than 5 entities: Chemical (4)",
        "train: 2 row(s) repeat an earlier row's text; 1 text(s) appear with conflicting labels: "
        "'Insulin was given for diabetes .'",
        "train: the reader repaired 1 stray I- tag(s) (I-X not continuing an X entity -> B-X, as seqeval "
        "reads them) in 1 sentence(s)",
        "validation: 2 label(s) with fewer than 5 entities: Chemical (1), Disease (3)",
        "validation: 1 of 3 row(s) also occur in the training data (exact text); their scores reward memory",
        "test: 2 label(s) with fewer than 5 entities: Chemical (1), Disease (2)",
    ]


def test_sentiment_numbers_are_the_fixtures_and_the_table_shows_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["debug", "data", "sentiment", *files(SENTIMENT)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("debug data: sentiment | tokenizer all-MiniLM-L6-v2 | max_length 128, stride 32 | ")
    assert "model labels: negative, neutral, positive" in out
    rows = {line[:20].strip(): line[20:].split() for line in out.splitlines()[3:17]}
    assert rows["examples"] == ["7", "2", "2"]
    assert rows["duplicate rows"] == ["2", "0", "0"] and rows["conflicting texts"] == ["1", "0", "0"]
    assert rows["rows also in train"] == ["-", "1", "0"]
    assert rows["sub-tokens median"] == ["4", "4.5", "4"] and rows["sub-tokens p95"] == ["4.7", "4.95", "4"]
    assert rows["windowed (> 128)"] == ["0", "0", "0"]
    assert rows["examples positive"] == ["4", "1", "1"] and rows["examples neutral"] == ["1", "0", "0"]
    assert (
        f"train: 3 label(s) with fewer than {RARE_BELOW} examples: negative (2), neutral (1), positive (4)"
        in out
    )
    assert "1 text(s) appear with conflicting labels: 'boring plot'" in out
    assert "errors: none" in out


def test_the_json_report_is_one_object_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["debug", "data", "ner", *files(NER), "--json", "--rare", "3"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report) == {
        "task",
        "tokenizer",
        "max_length",
        "stride",
        "rare_below",
        "unit",
        "labels",
        "splits",
        "errors",
        "warnings",
    }
    assert (report["task"], report["max_length"], report["stride"], report["rare_below"]) == (
        "ner",
        256,
        32,
        3,
    )
    assert list(report["splits"]) == ["train", "validation", "test"]
    assert report["splits"]["train"]["windowed"] == 0 and report["splits"]["train"]["rare"] == []


@pytest.mark.parametrize(
    ("case", "error"),
    [
        ("unseen type", "ner_test_unseen_type.conll: entity type 'Gene' never occurs in the training data"),
        ("validation is train", "ner_train.conll: every row also occurs in the training data"),
        ("one label", "the training data has one label only ('O')"),
        ("label_names", "label_names=['O', 'B-Disease', 'I-Disease'] lacks ['B-Chemical', 'I-Chemical']"),
        ("no train", "no training data; set train_file or a dataset with a train split"),
        ("class_weights", "class_weights has 2 weight(s) but the training data has 5 labels"),
    ],
)
@pytest.mark.slow
def test_errors_print_the_report_and_exit_1(
    case: str, error: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    overrides = files(NER)
    if case == "unseen type":
        overrides[2] = f"test_file={DATA / 'ner_test_unseen_type.conll'}"
    elif case == "validation is train":
        overrides[1] = f"validation_file={DATA / 'ner_train.conll'}"
    elif case == "one label":
        overrides[0] = f"train_file={write_conll(tmp_path / 'o.conll', [[('fever', 'O')]])}"
    elif case == "label_names":
        overrides.append("label_names=[O,B-Disease,I-Disease]")
    elif case == "class_weights":
        overrides.append("class_weights=[1,3]")
    else:
        overrides[0] = "train_file=none"
    capsys.readouterr()
    assert main(["debug", "data", "ner", *overrides, "--json"]) == 1
    out, err = capsys.readouterr()
    errors = json.loads(out)["errors"]
    assert any(error in message for message in errors), errors
    assert "Traceback" not in err  # above the last line: the readers' warnings (a repaired tag)
    last = err.strip().splitlines()[-1]
    assert last == f"bert-tasks: error: the data has {len(errors)} error(s), {FIX_THEM}"


def test_unseen_labels_are_all_listed_though_training_names_the_first(tmp_path: Path) -> None:
    validation = write_jsonl(
        tmp_path / "v.jsonl", [{"text": "meh", "label": "mixed"}, {"text": "so so", "label": "bland"}]
    )
    overrides = [f"train_file={DATA / SENTIMENT['train']}", f"validation_file={validation}"]
    report = data_report(load_recipe(None, overrides, task="sentiment"))
    assert report["splits"]["validation"]["missing_from_train"] == ["bland", "mixed"]
    [error] = report["errors"]
    assert error.startswith(f"{validation}: label 'bland' never occurs in the training data")


def test_a_file_that_does_not_read_is_the_error_finetune_gives(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.conll"
    bad.write_text("fever\tDisease\n", encoding="utf-8")
    debug = cli_error_line(["debug", "data", "ner", f"train_file={bad}"], capsys)
    finetune = cli_error_line(
        ["finetune", "ner", f"train_file={bad}", f"output_dir={tmp_path / 'out'}"], capsys
    )
    assert debug == finetune and f"{bad}:1: tag 'Disease' is not BIO" in debug
    with pytest.raises(BertTasksError, match="--rare must be at least 1, got 0"):
        data_report(load_recipe(None, files(NER), task="ner"), rare_below=0)


def test_windowed_examples_are_measured_whole() -> None:
    """A text in several windows is as long as its untruncated tokenization; a short one is one window."""
    cfg = load_recipe(None, ["max_length=32", "stride=8"], task="sentiment")
    tokenizer = load_tokenizer()
    from datasets import Dataset

    raw = Dataset.from_dict({"text": [LONG_REVIEW, "great film"], "label": ["negative", "positive"]})
    lengths, windows = token_lengths(get_task(cfg), raw, tokenizer, cfg.max_length, cfg.stride)
    assert lengths.tolist() == [len(tokenizer(LONG_REVIEW)["input_ids"]), 4]
    assert windows[0] > 2 and windows[1] == 1


#: In a fresh interpreter: the report on a model dir that holds a tokenizer and config.json but no
#: weights, and whether transformers' BERT modelling code was ever imported.
PROBE = """
import json, sys
from bert_tasks.cli import main
status = main(json.loads(sys.argv[1]))
print(json.dumps({"status": status, "bert_code": "transformers.models.bert.modeling_bert" in sys.modules}))
"""


@pytest.mark.slow
def test_a_model_dir_without_weights_is_enough(tmp_path: Path) -> None:
    from transformers import BertConfig

    from bert_tasks.modeling.load import bundled_model_dir

    BertConfig.from_pretrained(bundled_model_dir()).save_pretrained(tmp_path)
    load_tokenizer().save_pretrained(tmp_path)
    assert not list(tmp_path.glob("*.safetensors")) and not list(tmp_path.glob("*.bin"))
    argv = ["--quiet", "debug", "data", "ner", f"model={tmp_path}", *files(NER), "--json"]
    result = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(argv)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    *report, probe = result.stdout.strip().splitlines()
    report = json.loads("\n".join(report))
    assert json.loads(probe) == {"status": 0, "bert_code": False}
    assert report["tokenizer"] == str(tmp_path) and report["splits"]["train"]["examples"] == 6


def test_empty_rows_are_counted_and_never_duplicates(tmp_path: Path) -> None:
    records = [{"tokens": [], "tags": []}] * 2 + [
        {"tokens": ["flu"], "tags": ["B-Disease"]},
        {"tokens": ["cough"], "tags": ["O"]},
    ]
    train = write_jsonl(tmp_path / "train.jsonl", records)
    report = data_report(load_recipe(None, [f"train_file={train}", "validation_file=none"], task="ner"))
    split = report["splits"]["train"]
    assert (split["examples"], split["empty"], split["duplicates"], split["windows"]) == (4, 2, 0, 4)
    assert split["sub_tokens"] == {"min": 2, "median": 2.5, "p95": 3.0, "max": 3}  # [CLS] [SEP] alone: 2
    assert "train: 2 empty row(s) (no text): they teach nothing; drop them" in report["warnings"]


def test_the_help_names_the_librarys_rare_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit:
        main(["debug", "data", "--help"])
    assert exit.value.code == 0
    assert f"(default {RARE_BELOW})" in " ".join(capsys.readouterr().out.split())
