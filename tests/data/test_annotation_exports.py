"""NER data as annotation tools export it (Label Studio JSON, doccano JSONL), `format=` over the extension,
and the one-line refusals of each. The fixtures follow the tools' documented export formats."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from bert_tasks.config import Config, load_recipe
from bert_tasks.data.ner_files import read_jsonl_spans, read_ner_file
from bert_tasks.errors import BertTasksError
from tests.helpers import write_file

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LABEL_STUDIO = FIXTURES / "ner_label_studio.json"
CISPLATIN = ["B-Chemical", "O", "B-Disease", "I-Disease", "I-Disease", "O"]


def read(path: Path, **keys: str):  # type: ignore[no-untyped-def]
    return read_ner_file(path, Config(task="ner", **keys))


def refusal(path: Path, **keys: str) -> str:
    with pytest.raises(BertTasksError) as err:
        read(path, **keys)
    message = str(err.value)
    assert "\n" not in message
    return message


def task(text: str, *regions: dict, **fields: object) -> dict:
    """One Label Studio task with one submitted annotation of these `labels` regions."""
    result = [{"from_name": "label", "to_name": "text", "type": "labels", "value": r} for r in regions]
    return {"data": {"text": text}, "annotations": [{"result": result, "was_cancelled": False}], **fields}


def export(tmp_path: Path, tasks: list[dict]) -> Path:
    return write_file(tmp_path, "export.json", json.dumps(tasks, ensure_ascii=False))


@pytest.mark.parametrize("keys", [{}, {"format": "label-studio"}])
def test_a_label_studio_export_reads_its_first_submitted_annotations(
    caplog: pytest.LogCaptureFixture, keys: dict[str, str]
) -> None:
    with caplog.at_level(logging.WARNING, logger="bert_tasks"):
        data = read(LABEL_STUDIO, **keys)
    assert data["text"] == [
        "Cisplatin caused acute renal failure.",
        "Headache after 5-fluorouracil 😀 (مريض).",
        "No adverse events.",
    ]
    assert data["tags"][0] == CISPLATIN  # the relation item between the two regions is no span
    assert data["tags"][1][:5] == [
        "B-Disease",
        "O",
        "B-Chemical",
        "I-Chemical",
        "I-Chemical",
    ]  # 2nd annotation
    assert data["tags"][2] == ["O"] * 4
    [record] = caplog.records
    assert record.getMessage() == (
        f"{LABEL_STUDIO}: 1 of 4 task(s) have no submitted annotation (none, or all cancelled) and were left "
        f"out; first: {LABEL_STUDIO}: record 3 (task 103)"
    )


def test_label_studio_and_doccano_give_the_examples_the_jsonl_spans_reader_gives() -> None:
    spans = read_jsonl_spans(FIXTURES / "ner_spans.jsonl")
    for path in (LABEL_STUDIO, FIXTURES / "ner_doccano.jsonl"):
        data = read(path)
        assert data.column_names == spans.column_names
        assert data[:2] == spans[:2], path


@pytest.mark.parametrize(
    "record",
    [
        {"text": "No rash", "entities": [[3, 7, "Disease"]]},  # spaCy's entity triples
        {"text": "No rash", "entities": [{"start": 3, "end": 7, "label": "Disease"}]},
        {"text": "No rash", "label": [{"start": 3, "end": 7, "text": "rash", "labels": ["Disease"]}]},
    ],
    ids=["entity-triples", "start-end-objects", "label-studio-json-min"],
)
def test_the_other_span_shapes_of_jsonl_exports_are_read(tmp_path: Path, record: dict) -> None:
    """Label Studio's JSON-MIN export and spaCy-style triples: the same tags as doccano's own shape."""
    path = write_file(tmp_path, "export.jsonl", json.dumps(record) + "\n")
    assert read(path)["tags"] == [["O", "B-Disease"]]


def test_a_json_min_span_whose_text_is_not_at_its_offsets_is_refused(tmp_path: Path) -> None:
    record = {"text": "No rash", "label": [{"start": 3, "end": 7, "text": "itch", "labels": ["Disease"]}]}
    path = write_file(tmp_path, "export.jsonl", json.dumps(record) + "\n")
    assert "'itch'" in refusal(path)


@pytest.mark.parametrize(
    ("content", "where"),
    [
        ('["No rash", {"entities": [[3, 7, "Disease"]]}]\n["Fine", {"entities": []}]\n', "{path}:1"),
        ('[\n  ["No rash", {"entities": [[3, 7, "Disease"]]}]\n]\n', "{path}: record 1"),
    ],
    ids=["one-pair-per-line", "an-array-of-pairs"],
)
def test_spacy_training_pairs_are_named_as_such(tmp_path: Path, content: str, where: str) -> None:
    path = write_file(tmp_path, "train.json", content)
    assert refusal(path).startswith(where.format(path=path) + ": a [text, annotations] pair (spaCy's")


def test_doccano_with_relations_reads_its_entities() -> None:
    data = read(FIXTURES / "ner_doccano_entities.jsonl")
    assert data["tags"] == [CISPLATIN, ["O"] * 4]


@pytest.mark.parametrize("fmt", ["conll", "jsonl-tokens", "jsonl-spans", "doccano"])
def test_format_overrides_the_extension(tmp_path: Path, fmt: str) -> None:
    content = {
        "conll": (FIXTURES / "ner_test.annotated").read_text(encoding="utf-8"),
        "jsonl-tokens": '{"tokens": ["No", "rash"], "tags": ["O", "B-Disease"]}\n',
        "jsonl-spans": '{"text": "No rash", "spans": [{"start": 3, "end": 7, "label": "Disease"}]}\n',
        "doccano": '{"text": "No rash", "label": [[3, 7, "Disease"]]}\n',
    }[fmt]
    data = read(write_file(tmp_path, "test.annotated", content), format=fmt)
    assert data["tags"][-1] == ["O", "B-Disease"]


def test_an_unknown_extension_says_how_to_name_the_format() -> None:
    assert refusal(FIXTURES / "ner_test.annotated") == (
        f"{FIXTURES / 'ner_test.annotated'}: unknown NER file type '.annotated'; use .conll, .txt, .tsv, "
        ".iob, .jsonl, .json, or name the format (e.g. format=conll)"
    )


def test_an_unknown_format_is_one_line_before_anything_is_read() -> None:
    with pytest.raises(BertTasksError) as err:
        load_recipe(None, ["format=brat"], task="ner")
    assert str(err.value) == (
        "bad config: format='brat', must be one of auto, conll, jsonl-tokens, jsonl-spans, label-studio, "
        "doccano for ner data (on the command line)"
    )


def test_offsets_counted_in_utf16_units_are_read_where_their_text_is(tmp_path: Path) -> None:
    """Browsers count an emoji as two units: a span after one is off by one unless its text says where."""
    text = "😀 Fever after aspirin"
    utf16 = {"start": 15, "end": 22, "text": "aspirin", "labels": ["Chemical"]}  # code points: 14..21
    data = read(export(tmp_path, [task(text, utf16)]))
    assert data["tags"] == [["O", "O", "O", "B-Chemical"]]


LABEL_STUDIO_REFUSALS = [
    (
        [task("No rash", {"start": 3, "end": 9, "text": "rash", "labels": ["Disease"]}, id=7)],
        "{path}: record 1 (task 7): span {{'start': 3, 'end': 9, 'label': 'Disease', 'text': 'rash'}} needs "
        "integer start < end within the text (length 7); fix the offsets",
    ),
    (
        [task("No rash", {"start": 0, "end": 2, "text": "rash", "labels": ["Disease"]})],
        "{path}: record 1: span [0, 2) covers 'No' but says its text is 'rash'; fix the offsets or the "
        "span's text",
    ),
    (
        [task("No rash", {"start": 3, "end": 7, "labels": ["Disease", "Symptom"]})],
        '{path}: record 1: span 1 has labels a list (["Disease", "Symptom"]); BIO tags need exactly one '
        "label per span (make the Labels control single-choice, or split the span)",
    ),
    (
        [
            task(
                "renal failure",
                {"start": 0, "end": 13, "labels": ["Disease"]},
                {"start": 6, "end": 13, "labels": ["Disease"]},
            )
        ],
        "{path}: record 1: spans 'renal failure' [0, 13) and 'failure' [6, 13) overlap; keep one of them "
        "(nested entities are not supported)",
    ),
    (
        [{"data": {"text": "No rash"}, "annotations": [], "predictions": [{"result": []}]}],
        "{path}: none of its 1 task(s) has a submitted annotation (1 hold predictions only: pre-annotations, "
        "not gold); annotate them in Label Studio and export again",
    ),
    (
        [task("No rash", {"start": 3, "end": 7, "labels": ["Disease"]}) | {"data": {"sentence": "No rash"}}],
        "{path}: record 1: field 'data.text' must be a string; fix the record or set text_column",
    ),
]


@pytest.mark.parametrize(("tasks", "expected"), LABEL_STUDIO_REFUSALS)
def test_label_studio_mistakes_are_one_line_naming_the_task(
    tmp_path: Path, tasks: list[dict], expected: str
) -> None:
    path = export(tmp_path, tasks)
    assert refusal(path) == expected.format(path=path)


def test_an_empty_label_studio_export_is_one_line(tmp_path: Path) -> None:
    path = write_file(tmp_path, "export.json", "[]\n")
    assert refusal(path, format="label-studio") == (
        f"{path}: the Label Studio export holds no tasks; export the project again"
    )
    assert refusal(path) == f"{path}: no records found; give at least one JSON object"


def test_the_label_studio_text_field_follows_text_column(tmp_path: Path) -> None:
    tasks = [
        task("No rash", {"start": 3, "end": 7, "labels": ["Disease"]}) | {"data": {"sentence": "No rash"}}
    ]
    assert read(export(tmp_path, tasks), text_column="sentence")["tags"] == [["O", "B-Disease"]]


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        (
            '{"text": "No rash", "label": [[3, 7]]}',
            "{path}:1: doccano 'label' item 1 is a list ([3, 7]), not [start, end, \"TYPE\"] or an object "
            "with start_offset, end_offset and label (or start, end and label); fix the record",
        ),
        (
            '{"text": "No rash", "label": [[3, 70, "Disease"]]}',
            "{path}:1: span {{'start': 3, 'end': 70, 'label': 'Disease'}} needs integer start < end within "
            "the text (length 7); fix the offsets",
        ),
        (
            '{"text": "No rash", "entities": [{"start_offset": 3, "end_offset": 7}]}',
            "{path}:1: span label None must be an entity type such as 'Disease' (no B-/I- prefix)",
        ),
        (
            '{"text": "No rash", "entities": null}',
            "{path}:1: doccano 'entities' is null, not a list of spans; write [] for a text without entities",
        ),
        (
            '{"text": "No rash", "label": [[3, 7, "Disease"]]}\n{"text": "Fine", "label": null}',
            "{path}:2: doccano 'label' is null, not a list of spans; write [] for a text without entities",
        ),
        (
            '{"text": "No rash", "spans": [], "label": []}',
            "{path}: the first record fits more than one NER format (jsonl-spans, doccano); name it with "
            "format=jsonl-spans (or another)",
        ),
    ],
)
def test_doccano_mistakes_are_one_line(tmp_path: Path, record: str, expected: str) -> None:
    path = write_file(tmp_path, "export.jsonl", record + "\n")
    assert refusal(path) == expected.format(path=path)
