"""Entity-level NER scores (seqeval), loadable offline with `evaluate.load("<path to this folder>")`.

The Hub's `evaluate.load("seqeval")` downloads its script, which fails offline; this local module gives
the same numbers plus what seqeval alone does not: strict IOB2 scores next to the default (conlleval)
ones, and an error breakdown that says *how* the predictions go wrong.
"""

from __future__ import annotations

import datasets
import evaluate
from seqeval.metrics import accuracy_score, classification_report
from seqeval.metrics.sequence_labeling import get_entities
from seqeval.scheme import IOB2

_DESCRIPTION = """
Entity-level precision, recall and F1 (overall and per entity type) plus token accuracy, computed with
seqeval in its default mode (conlleval: an `I-X` that does not continue an `X` entity starts one) and in
strict IOB2 mode (such an `I-X` is not an entity; keys prefixed `strict_`). `errors` classifies every
entity mistake (default mode): a predicted entity with the gold boundaries but another type is
`wrong_type`; one overlapping a gold entity of its type with other boundaries is `wrong_boundary`; one
overlapping only gold entities of other types and boundaries is `wrong_type_and_boundary`; one
overlapping no gold entity is `spurious`; a gold entity overlapped by no prediction is `missed`.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions: list of tag sequences (one list of BIO tag strings per sentence).
    references: list of gold tag sequences, same lengths.
    tokens: optional list of token sequences; when given, error examples quote the entity text.
    max_examples: how many examples to keep per error category (default 5).
Returns:
    precision, recall, f1, accuracy, strict_precision, strict_recall, strict_f1 (floats);
    per_type / strict_per_type: {type: {precision, recall, f1, support}};
    errors: {wrong_type, wrong_boundary, wrong_type_and_boundary, missed, spurious (counts),
             examples: {category: [{sentence, gold, pred}]}}.
Examples:
    >>> metric = evaluate.load("bert_tasks/metrics/ner")
    >>> metric.compute(predictions=[["B-Disease", "O"]], references=[["B-Disease", "O"]])["f1"]
    1.0
"""

CATEGORIES = ("wrong_type", "wrong_boundary", "wrong_type_and_boundary", "missed", "spurious")


def _scores(references, predictions, **mode) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    report = classification_report(references, predictions, output_dict=True, zero_division=0, **mode)
    micro = report.pop("micro avg")
    for average in ("macro avg", "weighted avg"):
        report.pop(average)
    overall = {"precision": float(micro["precision"]), "recall": float(micro["recall"])}
    overall["f1"] = float(micro["f1-score"])
    per_type = {
        name: {
            "precision": float(row["precision"]),
            "recall": float(row["recall"]),
            "f1": float(row["f1-score"]),
            "support": int(row["support"]),
        }
        for name, row in sorted(report.items())
    }
    return overall, per_type


def _describe(entity: tuple[str, int, int] | None, tokens: list[str] | None) -> str | None:
    if entity is None:
        return None
    label, start, end = entity
    if tokens is None:
        return f"words {start}-{end} [{label}]"
    return f"{' '.join(tokens[start : end + 1])} [{label}]"


Entity = tuple[str, int, int]  # (type, first word, last word), as seqeval's get_entities reads BIO tags


def sentence_errors(
    reference: list[str], prediction: list[str]
) -> list[tuple[str, Entity | None, Entity | None]]:
    """Every entity error of one sentence as (category, gold entity, predicted entity): the predicted
    entities that are not gold, in word order, then the gold entities no prediction overlaps (`missed`).

    One rule for the counts here and for `evaluate --html`'s page, which marks each error in place.
    """
    gold = set(get_entities(list(reference)))
    guessed = set(get_entities(list(prediction)))
    errors: list[tuple[str, Entity | None, Entity | None]] = []
    for p in sorted(guessed - gold, key=lambda e: e[1]):
        overlapping = sorted((g for g in gold if g[1] <= p[2] and p[1] <= g[2]), key=lambda e: e[1])
        same_span = [g for g in overlapping if g[1:] == p[1:]]
        same_type = [g for g in overlapping if g[0] == p[0]]
        if not overlapping:
            errors.append(("spurious", None, p))
        elif same_span:
            errors.append(("wrong_type", same_span[0], p))
        elif same_type:
            errors.append(("wrong_boundary", same_type[0], p))
        else:
            errors.append(("wrong_type_and_boundary", overlapping[0], p))
    for g in sorted(gold, key=lambda e: e[1]):
        if not any(p[1] <= g[2] and g[1] <= p[2] for p in guessed):
            errors.append(("missed", g, None))
    return errors


def error_breakdown(
    references: list[list[str]],
    predictions: list[list[str]],
    tokens: list[list[str]] | None = None,
    max_examples: int = 5,
) -> dict:
    """Count and sample entity errors by kind (see the module description for the categories)."""
    counts = dict.fromkeys(CATEGORIES, 0)
    examples: dict[str, list[dict]] = {name: [] for name in CATEGORIES}
    for sentence, (ref, pred) in enumerate(zip(references, predictions, strict=True)):
        words = tokens[sentence] if tokens is not None else None
        for category, gold, guess in sentence_errors(ref, pred):
            counts[category] += 1
            if len(examples[category]) < max_examples:
                examples[category].append(
                    {"sentence": sentence, "gold": _describe(gold, words), "pred": _describe(guess, words)}
                )
    return {**counts, "examples": examples}


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Ner(evaluate.Metric):
    """seqeval entity scores in conlleval and strict IOB2 modes, with an error breakdown."""

    def _info(self) -> evaluate.MetricInfo:
        sequence = datasets.Sequence(datasets.Value("string", id="label"), id="sequence")
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="Nakayama, seqeval: a Python framework for sequence labeling evaluation (2018).",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": sequence, "references": sequence}),
            codebase_urls=["https://github.com/chakki-works/seqeval"],
        )

    def _compute(
        self,
        predictions: list[list[str]],
        references: list[list[str]],
        tokens: list[list[str]] | None = None,
        max_examples: int = 5,
    ) -> dict:
        for i, (pred, ref) in enumerate(zip(predictions, references, strict=True)):
            if len(pred) != len(ref):
                raise ValueError(f"sentence {i}: {len(pred)} predicted tags but {len(ref)} gold tags")
        overall, per_type = _scores(references, predictions)
        strict, strict_per_type = _scores(references, predictions, mode="strict", scheme=IOB2)
        return {
            **overall,
            "accuracy": float(accuracy_score(references, predictions)),
            **{f"strict_{key}": value for key, value in strict.items()},
            "per_type": per_type,
            "strict_per_type": strict_per_type,
            "errors": error_breakdown(references, predictions, tokens, max_examples),
        }
