"""What the pages refuse, and the parts of them that need no browser: --html paths and the tasks without a
page are one line before torch loads; a --compare model of another shape is one line; long texts are
capped, not refused; the NER scores PNG stays bounded; page data cannot end its script element."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch

from bert_tasks.errors import BertTasksError
from bert_tasks.inference.evaluate import EVALUATE_MARK
from bert_tasks.insight.attention_maps import attention_maps
from bert_tasks.insight.attention_page import write_attention_page
from bert_tasks.insight.html_page import script_json
from bert_tasks.insight.plots import plot_ner_scores
from tests.helpers import FIXTURES, build_tiny_model
from tests.test_cli_startup import probe

TEXT = "The patient suffers from severe headaches"

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["attention", "--html", "page.txt", TEXT], "attention --html page.txt: only HTML pages are written"),
        (["attention", "--html", "plots/p.html", TEXT], "attention --html plots/p.html: plots exists and is"),
        (
            ["attention", "--compare", "x", TEXT],
            "--compare shows two models on the HTML page only; add --html",
        ),
        (["attention", "--html", "p.html", "--out", "p.png", TEXT], "--out writes a PNG and --html a page"),
        (
            ["predict", "ner", "--model", "{ner}", "--html", "p.htm.txt", "a"],
            "predict --html p.htm.txt: only",
        ),
        (["predict", "sentiment", "--model", "{sentiment}", "--html", "p.html", "a"], "draws no HTML page"),
        (
            ["evaluate", "sentiment", "--model", "{sentiment}", "--data", "d.csv", "--html", "p.html"],
            "drop --html",
        ),
        (
            ["evaluate", "ner", "--model", "{ner}", "--data", "{conll}", "--html", "plots/p.html"],
            "pass --html",
        ),
    ],
)
@pytest.mark.slow
def test_a_bad_html_output_is_one_line_before_torch(
    argv: list[str], message: str, tmp_path: Path, ner_run: Path, sentiment_run: Path
) -> None:
    (tmp_path / "plots").write_text("a file, not a folder", encoding="utf-8")
    places = {"ner": ner_run, "sentiment": sentiment_run, "conll": FIXTURES / "ner_sample.conll"}
    answer = probe([part.format(**places) for part in argv], tmp_path)
    assert answer["status"] == 1 and message in answer["stderr"], answer
    assert len(answer["stderr"].strip().splitlines()) == 1
    assert answer["loaded"] == [], f"{argv} imported {answer['loaded']} before answering"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plots"]  # no page, no eval dir
    assert not list(ner_run.glob("eval-*"))


MINE = "<!doctype html><title>my own notes</title>\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["predict", "ner", "--model", "{ner}", "--html", "mine.html", "a"],
            "predict --html mine.html: exists",
        ),
        (
            ["evaluate", "ner", "--model", "{ner}", "--data", "{conll}", "--html", "mine.html", "--out", "e"],
            "evaluate --html mine.html: exists and was not written by bert-tasks",
        ),
        (["attention", "--html", "mine.html", TEXT], "attention --html mine.html: exists"),
        (["attention", "--out", "mine.png", TEXT], "attention --out mine.png: exists and was not written"),
        (
            ["evaluate", "ner", "--model", "{ner}", "--data", "{conll}", "--out", "reports"],
            "evaluate output reports: holds metrics.json, scores.png, not written by evaluate",
        ),
    ],
)
@pytest.mark.slow
def test_a_file_bert_tasks_did_not_write_is_never_replaced(
    argv: list[str], message: str, tmp_path: Path, ner_run: Path
) -> None:
    """A user's page, image or report of the name a command would write: one line, the file unchanged."""
    mine = {"mine.html": MINE, "mine.png": "not a bert-tasks image", "reports/metrics.json": "{}"}
    mine["reports/scores.png"] = "a plot of the user's own"
    for name, content in mine.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(content, encoding="utf-8")
    places = {"ner": ner_run, "conll": FIXTURES / "ner_sample.conll"}
    answer = probe([part.format(**places) for part in argv], tmp_path)
    assert answer["status"] == 1 and message in answer["stderr"], answer
    assert len(answer["stderr"].strip().splitlines()) == 1
    assert answer["loaded"] == [], f"{argv} imported {answer['loaded']} before answering"
    assert {name: (tmp_path / name).read_text(encoding="utf-8") for name in mine} == mine
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.html", "mine.png", "reports"]


@pytest.mark.slow
def test_a_command_replaces_its_own_page_plots_and_report(tmp_path: Path, ner_run: Path) -> None:
    """Run twice into the same paths: the second run replaces what the first wrote."""
    model, conll = str(ner_run), str(FIXTURES / "ner_sample.conll")
    commands = [
        ["predict", "ner", "--model", model, "--html", "p.html", "a"],
        ["evaluate", "ner", "--model", model, "--data", conll, "--out", "e", "--html", "e.html"],
        ["attention", "--model", model, "--out", "a.png", TEXT],
    ]
    for argv in commands:
        for _ in range(2):
            answer = probe(argv, tmp_path)
            assert answer["status"] == 0, answer
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png", "e", "e.html", "p.html"]
    assert sorted(p.name for p in (tmp_path / "e").iterdir()) == [
        EVALUATE_MARK,
        "metrics.json",
        "ner_scores.png",
    ]


def test_compare_refuses_a_model_of_another_shape_and_writes_nothing(
    tiny_model: Path, tmp_path: Path
) -> None:
    one_layer = build_tiny_model(tmp_path / "one-layer", num_hidden_layers=1)
    with pytest.raises(
        BertTasksError, match=r"^--compare .*one-layer: has 1 layers x 4 heads, .* has 2 x 4;"
    ):
        write_attention_page(TEXT, tmp_path / "page.html", tiny_model, compare=one_layer)
    assert not (tmp_path / "page.html").exists()


def test_a_capped_text_is_the_attention_of_its_first_pieces(tiny_model: Path) -> None:
    """Capped at 8 pieces: every row still sums to 1, and it is what the model gives the first 6 pieces."""
    capped = attention_maps(TEXT + " " + TEXT, tiny_model, max_pieces=8)
    assert (len(capped.tokens), capped.text_pieces) == (8, 16)
    assert capped.tokens[-1] == "[SEP]"
    torch.testing.assert_close(capped.probs.sum(-1), torch.ones(2, 4, 8))
    first_six = attention_maps("the patient suffers from severe headache", tiny_model)
    assert first_six.tokens == capped.tokens
    torch.testing.assert_close(capped.probs, first_six.probs)


@pytest.mark.slow
def test_the_ner_scores_png_stays_bounded_for_many_types(tmp_path: Path) -> None:
    per_type = {
        f"type{i:03d}": {"precision": 0.5, "recall": 0.4, "f1": 0.44, "support": i} for i in range(300)
    }
    errors = {"wrong_type": 3, "wrong_boundary": 1, "missed": 0, "spurious": 9, "examples": {}}
    path = plot_ner_scores(per_type, errors, tmp_path / "scores.png")
    width, height = struct.unpack(">II", path.read_bytes()[16:24])
    assert width == 12 * 120 and height <= round((1.2 + 0.45 * 30) * 120)


def test_page_data_cannot_close_its_script_element() -> None:
    text = script_json({"text": "</script><script>alert(1)</script> & <!--"})
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == {"text": "</script><script>alert(1)</script> & <!--"}
