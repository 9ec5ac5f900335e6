"""Distillation's plan: everything `bert-tasks distill` decides and checks from files, before torch loads.

A distill run is a finetune with a teacher (`training/distill_run.py` adds the teacher to the one Run).
Here, from JSON and the data already read: the teacher is a fine-tuned model dir of this task, its labels
are the training data's, the student's start reads the teacher's token ids, `student_layers` fits its
depth, intermediate transfer fits both shapes, and `transfer_file` holds texts. A mistake in any of them is
one line, and the output dir is left as it was.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bert_tasks.errors import BertTasksError
from bert_tasks.model_dir import (
    BACKENDS,
    ModelPolicy,
    check_weights_match_labels,
    label_names,
    local_model_dir,
    read_id2label,
    read_policy,
)
from bert_tasks.tasks.base import Task

if TYPE_CHECKING:
    from datasets import Dataset

    from bert_tasks.config import Config

#: Where a distill run writes unless `output_dir` says otherwise (never over the teacher's `runs/<task>`).
DEFAULT_OUTPUT = "runs/{task}-distilled"


@dataclass(frozen=True)
class Shape:
    """What distillation needs of a BERT's config.json: depth, width and heads."""

    layers: int
    width: int
    heads: int

    @classmethod
    def read(cls, model_dir: Path) -> Shape | None:
        """From config.json; None when it says no such thing (the model loader then names what is wrong)."""
        try:
            config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
            shape = cls(config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"])
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
            return None
        return (
            shape
            if all(isinstance(v, int) and v > 0 for v in (shape.layers, shape.width, shape.heads))
            else None
        )


@dataclass(frozen=True)
class StudentLayers:
    """Which of its start's layers the student keeps, and which teacher layer each kept one learns from."""

    #: Indices of the start's layers kept, in order; None: all of them.
    kept: list[int] | None
    #: Under `transfer`, the teacher layer whose output (and attention) each student layer learns; else [].
    transfer_layers: list[int]


@dataclass(frozen=True)
class DistillPlan:
    """What the run distils: the teacher, the labels in its id order, its shape, the student's layers
    (None until a hub student is fetched), the transfer kinds and the unlabelled texts."""

    teacher: Path
    labels: list[str]
    teacher_shape: Shape
    student: StudentLayers | None
    transfer: tuple[str, ...] = ()
    #: `transfer_file`'s input records, checked as `predict --file` checks them.
    transfer_records: list[dict[str, Any]] = field(default_factory=list)
    #: The teacher's metrics.json, for the student's card and metrics.
    teacher_metrics: dict[str, Any] = field(default_factory=dict)


def teacher_layer(
    task: str, user: dict[str, Any], model_given: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The config layer a teacher adds under the recipe: its window policy, attention and task options (so
    the student reads inputs as the teacher was trained to) and `runs/<task>-distilled`; and the values it
    fixes: the teacher's path (absolute when local) and `model`, where the student starts (`student`, else
    the teacher).

    `model=` on the command line is refused: in a distill run the student's start is `student=`.
    """
    if model_given:
        raise BertTasksError(
            "distill: model= on the command line is not read; the student starts from student=DIR "
            "(default: the teacher, cut to student_layers)"
        )
    name = str(user["teacher"])
    local = Path(name).expanduser()
    teacher = os.path.abspath(local) if local.exists() else name
    policy = teacher_policy(teacher, task)
    defaults = {
        "max_length": policy.max_length,
        "stride": policy.stride,
        "attention": policy.attention,
        **policy.task_options,
        "output_dir": DEFAULT_OUTPUT.format(task=task),
    }
    return defaults, {"teacher": teacher, "model": user.get("student") or teacher}


def teacher_policy(teacher: str | Path, task: str) -> ModelPolicy:
    """The teacher's saved policy: a fine-tuned torch model dir of `task`, or one line saying what it is."""
    try:
        policy = read_policy(teacher)
    except BertTasksError as error:
        raise BertTasksError(f"teacher: {error}") from None
    if policy.task != task:
        raise BertTasksError(
            f"teacher {teacher} holds a {policy.task} model, not a {task} model; distil it with "
            f"`bert-tasks distill {policy.task} --teacher {teacher}`"
        )
    if policy.backend != BACKENDS[0]:
        raise BertTasksError(
            f"teacher {teacher} is a {policy.backend} export; give the model dir it was exported from"
        )
    shape = next((key for key in ("multi_label", "regression") if policy.task_options.get(key)), None)
    if shape is not None:  # soft targets are a softmax over classes; neither shape's outputs are one
        raise BertTasksError(
            f"teacher {teacher} is a {shape.replace('_', '-')} model; distill teaches single-label "
            "classification and NER (fine-tune the small model directly)"
        )
    return policy


def plan_distillation(cfg: Config, task: Task, raw: dict[str, Dataset]) -> DistillPlan:
    """Check the teacher against the data, the student's start and the transfer settings; no torch."""
    teacher = local_model_dir(str(cfg.teacher))
    teacher_policy(teacher, task.name)
    try:
        read_id2label(teacher)  # placeholder label names (LABEL_0) teach nothing
        labels = label_names(teacher)
        check_weights_match_labels(teacher, len(labels))
    except BertTasksError as error:
        raise BertTasksError(f"teacher: {error}") from None
    data_labels = task.label_names(raw["train"], cfg)
    if set(data_labels) != set(labels):
        raise BertTasksError(
            f"teacher {teacher} knows the labels {labels} but the training data has {data_labels}; distil on "
            f"data labelled as the teacher's was (its recipe: --recipe {teacher / 'recipe.yaml'})"
        )
    shape = Shape.read(teacher)
    if shape is None:
        raise BertTasksError(
            f"teacher {teacher}: config.json gives no BERT shape (num_hidden_layers, hidden_size, "
            "num_attention_heads); save the teacher again with bert-tasks finetune"
        )
    start = _local_start(cfg.student)
    if start is not None:
        check_same_vocabulary(teacher, start, f"student {cfg.student}")
    start_shape = shape if cfg.student is None else Shape.read(start) if start is not None else None
    student = None if start_shape is None else student_layers(cfg, shape, start_shape)
    pruned = [f"the student (prune_heads={','.join(cfg.prune_heads)})"] if cfg.prune_heads else []
    for what, directory in (("teacher", teacher), (f"student {cfg.student}", start)):
        if directory is not None and _has_pruned_heads(directory):
            pruned.append(f"{what} (its config.json's pruned_heads)")
    check_whole_heads(transfer_kinds(cfg.transfer), pruned)
    records = _transfer_records(cfg, task)
    return DistillPlan(
        teacher, labels, shape, student, transfer_kinds(cfg.transfer), records, _metrics(teacher)
    )


def _metrics(model_dir: Path) -> dict[str, Any]:
    """A model dir's metrics.json, or {} without a readable one (a teacher trained elsewhere)."""
    try:
        metrics = json.loads((model_dir / "metrics.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return metrics if isinstance(metrics, dict) else {}


def student_layers(cfg: Config, teacher: Shape, start: Shape) -> StudentLayers:
    """The layers the student keeps of its start, and under `transfer` each one's teacher layer."""
    kept = student_layer_indices(start.layers, cfg.student_layers, cfg.student is None, cfg.student)
    transfer = transfer_kinds(cfg.transfer)
    if not transfer:
        return StudentLayers(kept, [])
    student = replace(start, layers=start.layers if kept is None else len(kept))
    return StudentLayers(kept, transfer_layer_map(cfg, transfer, teacher, student))


def _local_start(student: str | None) -> Path | None:
    """The student's start as a local dir; None for the teacher itself or a hub id (checked once fetched)."""
    if student is None:
        return None
    path = Path(student).expanduser()
    return path if path.is_dir() else None


def student_layer_indices(
    total: int, wanted: int | list[int] | None, from_teacher: bool, name: str | None = None
) -> list[int] | None:
    """The layers of a `total`-layer start the student keeps, or None for all of them.

    `wanted` a count k: k layers evenly spaced from the first (3 of 6 -> [0, 2, 4], DistilBERT's every
    other layer; 4 of 12 -> [0, 3, 6, 9]); a list: those layers; None: half the teacher's (rounded up),
    or all of a `student=` start.
    """
    source = "the teacher" if from_teacher else f"student {name}"
    if wanted is None:
        wanted = (total + 1) // 2 if from_teacher else total
    if isinstance(wanted, int):
        if wanted > total:
            raise BertTasksError(
                f"student_layers={wanted}: {source} has {total} layers; keep 1 to {total} of them"
            )
        layers = [i * total // wanted for i in range(wanted)]
    else:
        if wanted[-1] >= total:
            raise BertTasksError(
                f"student_layers={wanted}: {source} has {total} layers, numbered 0 to {total - 1}; "
                "list layers in that range"
            )
        layers = list(wanted)
    return None if layers == list(range(total)) else layers


def transfer_kinds(transfer: str) -> tuple[str, ...]:
    """`hidden,attention` -> ("hidden", "attention"); `none` -> ()."""
    return () if transfer == "none" else tuple(name.strip() for name in transfer.split(","))


def check_whole_heads(transfer: tuple[str, ...], pruned: list[str]) -> None:
    """Refuse attention transfer with a model whose heads are pruned (each of `pruned` names one).

    The transfer pairs each student head with the teacher's head of the same number, layer by layer; a
    layer with heads removed has fewer of them, and no pairing that means anything.
    """
    if "attention" in transfer and pruned:
        raise BertTasksError(
            f"transfer=attention: {' and '.join(pruned)} lost heads to pruning; attention transfers "
            "between whole, equal sets of heads only: give transfer=hidden or transfer=none"
        )


def _has_pruned_heads(model_dir: Path) -> bool:
    """Whether a model dir's config.json names heads `bert-tasks prune` removed (unreadable: no)."""
    try:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(config, dict) and bool(config.get("pruned_heads"))


def transfer_layer_map(cfg: Config, transfer: tuple[str, ...], teacher: Shape, student: Shape) -> list[int]:
    """The teacher layer each student layer learns from: `transfer_layers`, or uniform (TinyBERT's
    mapping: student layer m of k after teacher layer (m + 1) * L / k - 1, so 3 of 6 -> [1, 3, 5])."""
    if "hidden" in transfer and student.width != teacher.width:
        raise BertTasksError(
            f"transfer=hidden: the student is {student.width} wide, the teacher {teacher.width}; hidden "
            "states transfer between equal widths only (drop hidden from transfer, or pick another student)"
        )
    if "attention" in transfer and student.heads != teacher.heads:
        raise BertTasksError(
            f"transfer=attention: the student has {student.heads} heads a layer, the teacher "
            f"{teacher.heads}; "
            "attention transfers between equal head counts only"
        )
    if cfg.transfer_layers is None:
        return [(m + 1) * teacher.layers // student.layers - 1 for m in range(student.layers)]
    layers = list(cfg.transfer_layers)
    if len(layers) != student.layers or max(layers) >= teacher.layers:
        raise BertTasksError(
            f"transfer_layers={layers}: give one teacher layer (0 to {teacher.layers - 1}) for each of the "
            f"student's {student.layers} layers"
        )
    return layers


def check_same_vocabulary(teacher: Path, student: Path, what: str) -> None:
    """Refuse a student whose tokenizer maps text to other ids than the teacher's: the teacher's logits
    would be for other inputs. Compared from the tokenizer files (vocabulary and normalizer)."""
    mine, theirs = _tokenizer_identity(student), _tokenizer_identity(teacher)
    if mine is None or theirs is None or mine == theirs:
        return  # a dir without tokenizer files: load_tokenizer names what is missing
    vocab, teacher_vocab = mine[0], theirs[0]
    differs = "its normalizer (lower-casing, accents)"
    if vocab != teacher_vocab:
        first = next((t for t in sorted(vocab, key=vocab.get) if teacher_vocab.get(t) != vocab[t]), None)
        differs = f"{len(vocab)} vs {len(teacher_vocab)} tokens, first difference {first!r}"
    raise BertTasksError(
        f"{what}: its tokenizer is not the teacher's ({differs}); the student must read the teacher's "
        "token ids: pick a student with the teacher's vocabulary (or student=none, the teacher cut down)"
    )


def _tokenizer_identity(model_dir: Path) -> tuple[dict[str, int], str] | None:
    """(token -> id, normalizer) from tokenizer.json, else vocab.txt's lines; None without either."""
    tokenizer_file, vocab_file = model_dir / "tokenizer.json", model_dir / "vocab.txt"
    try:
        if tokenizer_file.is_file():
            data = json.loads(tokenizer_file.read_text(encoding="utf-8"))
            return dict(data["model"]["vocab"]), json.dumps(data.get("normalizer"), sort_keys=True)
        if vocab_file.is_file():
            lines = vocab_file.read_text(encoding="utf-8").splitlines()
            return {token: i for i, token in enumerate(lines)}, ""
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        return None  # a damaged file: load_tokenizer names it
    return None


def _transfer_records(cfg: Config, task: Task) -> list[dict[str, Any]]:
    """`transfer_file`'s input records, read and checked as `predict --file` reads them: one text a line,
    or JSONL records (a pair model's with their pair field, NER's with their own tokens)."""
    if cfg.transfer_file is None:
        return []
    if type(task).transfer_rows is Task.transfer_rows:
        raise BertTasksError(
            f"transfer_file: the {task.name} task takes no unlabelled text; drop transfer_file"
        )
    from bert_tasks.data.files import text_records  # its errors name file:line

    records = [record for _, record in text_records(cfg.transfer_file, task.check_input)]
    if not records:  # an empty standard input (an empty file is the reader's own error)
        raise BertTasksError(f"transfer_file={cfg.transfer_file}: no texts were read; give a file of texts")
    return records
