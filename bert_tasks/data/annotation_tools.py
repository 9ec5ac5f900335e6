"""The span formats of two annotation tools, read as the JSONL-spans reader's examples; and Label Studio's
pre-annotation tasks, written from predictions.

- **Label Studio** JSON export: a list of tasks `{"id", "data": {"text": ...}, "annotations": [{"result":
  [{"type": "labels", "value": {"start", "end", "text", "labels": [TYPE]}}], "was_cancelled"}]}`. Of
  several annotations per task the first one not cancelled (skipped) is read; tasks without one are
  left out with one warning. Result items of other types (relations, choices, text areas) are not spans
  and are passed over.
- **doccano** JSONL export: `{"text", "label": [[start, end, TYPE], ...]}` (older versions: `labels`), or
  `{"text", "entities": [{"start_offset", "end_offset", "label"}]}` (projects with relations).

Both become `{"start", "end", "label"[, "text"]}` spans, checked by the one span check in ner_files.py
(offsets, the span's own text, overlaps); errors name `file: record N` (or `file:line`) and the task id.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bert_tasks.data.files import describe, json_records
from bert_tasks.data.ner_files import SpanExample, span_text
from bert_tasks.errors import BertTasksError

if TYPE_CHECKING:
    from bert_tasks.tasks.base import Task

logger = logging.getLogger(__name__)

#: The Label Studio controls `predict ner --format label-studio` fills, as in Label Studio's "Named Entity
#: Recognition" template: `<Labels name="label" toName="text">` over `<Text name="text" value="$text">`.
LABELS_CONTROL, TEXT_OBJECT = "label", "text"
#: Why an input without a text (NER's tokens alone) cannot become a Label Studio task.
NO_TEXT_TO_MARK = (
    "--format label-studio marks entities in a text, and a record of 'tokens' without its 'text' has none; "
    "add the 'text', or use --json"
)


def is_label_studio(record: dict[str, Any]) -> bool:
    """A Label Studio task: a `data` object and annotations (or predictions only: a pre-annotation file)."""
    return isinstance(record.get("data"), dict) and ("annotations" in record or "predictions" in record)


def is_doccano(record: dict[str, Any], text_field: str) -> bool:
    """A doccano record: the text and `entities` objects or a list of `label`/`labels` triples (`entities`
    names doccano whatever its value, so a null there is refused as doccano's; a `label` string is a
    sentiment record's)."""
    return text_field in record and (
        "entities" in record or any(isinstance(record.get(key), list) for key in ("label", "labels"))
    )


def label_studio_examples(path: Path, raw: str, text_field: str) -> Iterator[SpanExample]:
    """(where, text, spans) of each task of a Label Studio JSON export with a submitted annotation."""
    tasks = predictions_only = 0
    skipped: list[str] = []
    for where, task in json_records(path, raw):
        tasks += 1
        where = f"{where} (task {task['id']})" if "id" in task else where
        data = task.get("data")
        if not isinstance(data, dict):
            raise BertTasksError(
                f"{where}: no 'data' object holding the text; a Label Studio JSON export has one per task"
            )
        annotation = _first_annotation(where, task.get("annotations", []))
        if annotation is None:
            skipped.append(where)
            predictions_only += bool(task.get("predictions"))
            continue
        text = span_text(where, data.get(text_field), f"data.{text_field}")
        yield where, text, _label_studio_spans(where, annotation.get("result", []))
    if not tasks:
        raise BertTasksError(f"{path}: the Label Studio export holds no tasks; export the project again")
    if len(skipped) == tasks:
        raise BertTasksError(
            f"{path}: none of its {tasks} task(s) has a submitted annotation ({predictions_only} hold "
            "predictions only: pre-annotations, not gold); annotate them in Label Studio and export again"
        )
    if skipped:
        logger.warning(
            "%s: %d of %d task(s) have no submitted annotation (none, or all cancelled) and were left out; "
            "first: %s",
            path,
            len(skipped),
            tasks,
            skipped[0],
        )


def _first_annotation(where: str, annotations: Any) -> dict[str, Any] | None:
    """The first annotation that was not cancelled (skipped by the annotator), or None."""
    if not isinstance(annotations, list) or not all(isinstance(a, dict) for a in annotations):
        raise BertTasksError(
            f"{where}: 'annotations' must be a list of objects, found {describe(annotations)}"
        )
    return next((a for a in annotations if not a.get("was_cancelled")), None)


def _label_studio_spans(where: str, result: Any) -> list[dict[str, Any]]:
    """The `labels` items of one annotation's result as `{"start", "end", "label"[, "text"]}` spans."""
    if not isinstance(result, list) or not all(isinstance(item, dict) for item in result):
        raise BertTasksError(f"{where}: an annotation's 'result' must be a list of objects; fix the export")
    spans = []
    for number, item in enumerate((i for i in result if i.get("type") == "labels"), start=1):
        value = item.get("value") if isinstance(item.get("value"), dict) else {}
        labels = value.get("labels")
        if not (isinstance(labels, list) and len(labels) == 1):
            raise BertTasksError(
                f"{where}: span {number} has labels {describe(labels)}; BIO tags need exactly one label per "
                "span (make the Labels control single-choice, or split the span)"
            )
        span = {"start": value.get("start"), "end": value.get("end"), "label": labels[0]}
        spans.append(span | ({"text": value["text"]} if "text" in value else {}))
    return spans


def doccano_examples(path: Path, raw: str, text_field: str) -> Iterator[SpanExample]:
    """(where, text, spans) of each record of a doccano sequence-labelling JSONL export."""
    for where, record in json_records(path, raw):
        text = span_text(where, record.get(text_field), text_field)
        key = next((k for k in ("entities", "label", "labels") if k in record), None)
        items = _doccano_list(where, record, key) if key is not None else []
        yield where, text, [_doccano_span(where, key, n, item) for n, item in enumerate(items, 1)]


def _doccano_list(where: str, record: dict[str, Any], key: str) -> list[Any]:
    """The record's span list; `null` or another value is one line (an empty list means no entity)."""
    spans = record[key]
    if not isinstance(spans, list):
        raise BertTasksError(
            f"{where}: doccano {key!r} is {describe(spans)}, not a list of spans; write [] for a text "
            "without entities"
        )
    return spans


def _doccano_span(where: str, key: str | None, number: int, item: Any) -> dict[str, Any]:
    """One span in any shape the JSONL annotation exports write it: doccano's `[start, end, "TYPE"]`
    (also spaCy's) or `{"start_offset", "end_offset", "label"}`, or `{"start", "end", "label"}` /
    `{"start", "end", "labels": ["TYPE"]}` (Label Studio's JSON-MIN export)."""
    if isinstance(item, list) and len(item) == 3:
        return {"start": item[0], "end": item[1], "label": item[2]}
    if isinstance(item, dict) and "start_offset" in item:
        return {"start": item["start_offset"], "end": item.get("end_offset"), "label": item.get("label")}
    if isinstance(item, dict) and "start" in item:
        labels = item.get("labels")
        label = labels[0] if isinstance(labels, list) and len(labels) == 1 else item.get("label", labels)
        span = {"start": item["start"], "end": item.get("end"), "label": label}
        return span | ({"text": item["text"]} if "text" in item else {})  # checked against the offsets
    raise BertTasksError(
        f'{where}: doccano {key!r} item {number} is {describe(item)}, not [start, end, "TYPE"] or an object '
        "with start_offset, end_offset and label (or start, end and label); fix the record"
    )


def label_studio_input(
    task: Task, check: Callable[[str, dict[str, Any]], dict[str, Any]]
) -> Callable[[str, dict[str, Any]], dict[str, Any]]:
    """`check`, also refusing at its `file:line` an input that has no text to mark: while the file is
    read, before the model loads and predicts everything else."""

    def with_text(where: str, record: dict[str, Any]) -> dict[str, Any]:
        checked = check(where, record)
        if task.shown_input(checked) is None:
            raise BertTasksError(f"{where}: {NO_TEXT_TO_MARK}")
        return checked

    return with_text


def label_studio_tasks(
    task: Task, texts: Sequence[str], predictions: Sequence[Any], model_version: str
) -> list[dict[str, Any]]:
    """Texts and their predictions as Label Studio tasks to import (pre-annotations); the task shapes
    each prediction's result items (`Task.label_studio_results`), this the task around them."""
    tasks = []
    for text, prediction in zip(texts, predictions, strict=True):
        results, score = task.label_studio_results(text, prediction)
        predicted: dict[str, Any] = {"model_version": model_version}
        if score is not None:
            predicted["score"] = score
        # A pair's second text is a data field of its own (`<Text name="aspect" value="$aspect">`).
        data = (
            {TEXT_OBJECT: text}
            if task.pair_field is None
            else {TEXT_OBJECT: text[0], task.pair_field: text[1]}
        )
        tasks.append({"data": data, "predictions": [predicted | {"result": results}]})
    return tasks
