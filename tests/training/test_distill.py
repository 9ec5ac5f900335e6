"""bert-tasks distill on tiny random BERTs: layer selection, the losses by hand, transfer rows, exact resume,
the saved student in vanilla transformers, and every one-line refusal."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification, pipeline

from bert_tasks.config import load_recipe
from bert_tasks.errors import BertTasksError
from bert_tasks.inference.predictor import Predictor
from bert_tasks.modeling.layers import keep_layers
from bert_tasks.modeling.load import load_model
from bert_tasks.training import train
from bert_tasks.training.distill import student_layer_indices
from bert_tasks.training.objectives import (
    DistillLoss,
    DistillSettings,
    attention_transfer_loss,
    gold_loss,
    hidden_transfer_loss,
    soft_target_loss,
)
from tests.helpers import (
    LABELS,
    build_tiny_model,
    distill_config,
    one_thread,
    read_log,
    tiny_config,
    write_jsonl,
)

pytestmark = pytest.mark.usefixtures("single_thread")

HEADS = {"sentiment": AutoModelForSequenceClassification, "ner": AutoModelForTokenClassification}


@pytest.fixture(scope="module")
def deep_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 4-layer tiny BERT: deep enough to cut to 2 layers."""
    return build_tiny_model(tmp_path_factory.mktemp("deep-bert"), num_hidden_layers=4)


@pytest.fixture(scope="module")
def teachers(deep_base: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A finished 4-layer teacher per task (read only)."""
    root = tmp_path_factory.mktemp("teachers")
    with one_thread():
        return {task: train(tiny_config(task, deep_base, root / task)) for task in ("sentiment", "ner")}


# --- Layer selection --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("total", "wanted", "from_teacher", "kept"),
    [
        (6, 3, True, [0, 2, 4]),  # DistilBERT's every other layer
        (6, None, True, [0, 2, 4]),  # the default: half the teacher's
        (12, 4, True, [0, 3, 6, 9]),
        (5, None, True, [0, 1, 3]),  # half rounded up, evenly spaced
        (6, [0, 2, 5], True, [0, 2, 5]),
        (6, 6, True, None),  # all of them: nothing to cut
        (4, None, False, None),  # a student= start is kept whole by default
        (4, 2, False, [0, 2]),
    ],
)
def test_the_layers_a_student_keeps(total: int, wanted: object, from_teacher: bool, kept: object) -> None:
    assert student_layer_indices(total, wanted, from_teacher) == kept


@pytest.mark.parametrize(
    ("wanted", "message"),
    [
        (7, r"^student_layers=7: the teacher has 6 layers; keep 1 to 6 of them$"),
        ([0, 6], r"^student_layers=\[0, 6\]: the teacher has 6 layers, numbered 0 to 5; list layers in that"),
    ],
)
def test_layers_beyond_the_teacher_are_one_line(wanted: object, message: str) -> None:
    with pytest.raises(BertTasksError, match=message):
        student_layer_indices(6, wanted, True)


def test_a_cut_model_holds_the_chosen_layers_renumbered(deep_base: Path, tmp_path: Path) -> None:
    """Layers [0, 2] of 4: the student's layer 1 is the teacher's layer 2, weight for weight, and the saved
    dir is a plain 2-layer BERT that vanilla transformers loads to the same logits."""
    torch.manual_seed(0)  # the same fresh head on both
    teacher = load_model(deep_base, "sentiment", LABELS["sentiment"]).eval()
    torch.manual_seed(0)
    student = keep_layers(load_model(deep_base, "sentiment", LABELS["sentiment"]), [0, 2]).eval()
    teacher_weights, student_weights = teacher.state_dict(), student.state_dict()
    for key, value in student_weights.items():
        source = key.replace("layer.1.", "layer.2.")
        torch.testing.assert_close(value, teacher_weights[source], msg=key)
    assert not any("layer.2." in key or "layer.3." in key for key in student_weights)
    student.save_pretrained(tmp_path)
    vanilla = AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    assert vanilla.config.num_hidden_layers == 2
    ids = torch.tensor([[101, 2023, 2003, 1037, 3231, 102]])
    with torch.no_grad():
        torch.testing.assert_close(vanilla(input_ids=ids).logits, student(input_ids=ids).logits)


# --- The losses, by hand ----------------------------------------------------------------------------


def _kl(teacher: list[float], student: list[float], temperature: float) -> float:
    """KL(softmax(teacher / T) || softmax(student / T)), written out."""

    def softmax(row: list[float]) -> list[float]:
        exps = [math.exp(v / temperature) for v in row]
        return [e / sum(exps) for e in exps]

    p, q = softmax(teacher), softmax(student)
    return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q, strict=True))


def test_the_soft_target_loss_of_sentences_by_hand_an_ignored_row_left_out() -> None:
    student = torch.tensor([[0.0, math.log(3)], [2.0, -1.0], [9.0, -9.0]])  # [B=3, C=2]
    teacher = torch.tensor([[1.0, 0.5], [0.0, 0.0], [-9.0, 9.0]])
    scored = torch.tensor([True, True, False])  # the third row is ignored, however far apart
    expected = (_kl([1.0, 0.5], [0.0, math.log(3)], 2.0) + _kl([0.0, 0.0], [2.0, -1.0], 2.0)) / 2 * 2.0**2
    assert soft_target_loss(student, teacher, scored, 2.0).item() == pytest.approx(expected, rel=1e-6)


def test_the_soft_target_loss_of_tokens_by_hand_padding_left_out() -> None:
    row_s, row_t = [0.0, math.log(2), math.log(5)], [1.0, 1.0, -1.0]
    wild = [float("nan"), 50.0, -50.0]  # a padded position may hold anything, NaN too
    student = torch.tensor([[row_s, row_s, wild], [row_t, wild, wild]])  # [B=2, T=3, C=3]
    teacher = torch.tensor([[row_t, row_s, wild], [row_s, wild, wild]])
    labels = torch.tensor([[0, 2, -100], [1, -100, -100]])
    expected = (_kl(row_t, row_s, 3.0) + _kl(row_s, row_s, 3.0) + _kl(row_s, row_t, 3.0)) / 3 * 9.0
    loss = soft_target_loss(student, teacher, labels != -100, 3.0)
    assert loss.item() == pytest.approx(expected, rel=1e-6)


def test_the_gold_loss_is_the_mean_over_gold_targets_and_zero_without_any() -> None:
    logits = torch.tensor([[[0.0, math.log(3)], [5.0, 5.0]]])  # [B=1, T=2, C=2]
    assert gold_loss(logits, torch.tensor([[1, -100]])).item() == pytest.approx(math.log(4 / 3), rel=1e-6)
    weighted = gold_loss(logits, torch.tensor([[0, 1]]), torch.tensor([3.0, 1.0]))
    assert weighted.item() == pytest.approx((3 * math.log(4) + math.log(2)) / 4, rel=1e-6)
    assert gold_loss(logits, torch.full((1, 2), -100)).item() == 0.0


def test_hidden_and_attention_transfer_by_hand() -> None:
    """Student layer 0 learns teacher layer 1 (hidden_states index 2); padded tokens never count."""
    mask = torch.tensor([[1, 1, 0]])
    zeros = torch.zeros(1, 3, 2)
    teacher_hidden = (zeros, zeros, torch.tensor([[[1.0, 3.0], [2.0, 2.0], [9.0, 9.0]]]))
    student_hidden = (zeros, torch.tensor([[[0.0, 1.0], [2.0, 0.0], [0.0, 0.0]]]))
    expected = ((1 + 4) / 2 + (0 + 4) / 2) / 2  # per-token mean over C, then over the 2 real tokens
    assert hidden_transfer_loss(student_hidden, teacher_hidden, [1], mask).item() == pytest.approx(expected)
    p, q = [0.5, 0.5, 0.0], [0.25, 0.75, 0.0]  # distributions over keys; the padded key holds 0 in both
    teacher_attention = (torch.zeros(1, 1, 3, 3), torch.tensor([[[p, p, [1 / 3] * 3]]]))
    student_attention = (torch.tensor([[[q, p, [1.0, 0.0, 0.0]]]]),)
    kl = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    loss = attention_transfer_loss(student_attention, teacher_attention, [1], mask)
    assert loss.item() == pytest.approx((kl + 0.0) / 2)  # query 2 is padding


@pytest.mark.parametrize("task", ["sentiment", "ner"])
def test_the_distill_loss_of_real_models_mixes_soft_and_gold_and_masks_transfer_rows(
    task: str, tiny_model: Path, deep_base: Path, padded_batch: dict[str, torch.Tensor]
) -> None:
    """alpha * soft + (1 - alpha) * gold on two tiny BERTs; a transfer row (gold False) adds soft targets
    only, so with alpha = 0 its labels change nothing."""
    torch.manual_seed(0)
    labels = LABELS[task]
    teacher = load_model(deep_base, task, labels).eval()
    student = load_model(tiny_model, task, labels).eval()
    batch = dict(padded_batch, row=torch.tensor([0, 1, 2]))
    mask = batch["attention_mask"]
    if task == "sentiment":
        batch["labels"] = torch.tensor([1, 0, 1])
    else:
        batch["labels"] = torch.randint(0, len(labels), mask.shape).masked_fill(mask == 0, -100)
        batch["labels"][0, 1] = -100  # a continuation piece
    gold_rows = torch.tensor([True, True, False])
    objective = DistillLoss(teacher, DistillSettings(alpha=0.3, temperature=2.0), gold_rows)
    with torch.no_grad():
        s, t = (m(input_ids=batch["input_ids"], attention_mask=mask).logits for m in (student, teacher))
        gold_labels = batch["labels"].clone()
        gold_labels[2] = -100
        expected = 0.3 * soft_target_loss(s, t, batch["labels"] != -100, 2.0) + 0.7 * gold_loss(
            s, gold_labels
        )
        torch.testing.assert_close(objective(student, batch), expected)
        gold_only = DistillLoss(teacher, DistillSettings(alpha=0.0, temperature=2.0), gold_rows)
        flipped = dict(batch, labels=batch["labels"].clone())
        row = flipped["labels"][2]
        flipped["labels"][2] = torch.where(row >= 0, (row + 1) % len(labels), -100)  # other "gold"
        torch.testing.assert_close(gold_only(student, flipped), gold_only(student, batch))


# --- Runs ------------------------------------------------------------------------------------------


@pytest.mark.slow  # trains tiny teachers and students
@pytest.mark.parametrize("task", ["sentiment", "ner"])
def test_a_distilled_student_loads_in_vanilla_transformers_and_predicts(
    task: str, teachers: dict[str, Path], tmp_path: Path
) -> None:
    student = train(distill_config(task, teachers[task], tmp_path / "student"))
    config = json.loads((student / "config.json").read_text())
    assert config["num_hidden_layers"] == 2
    vanilla = HEADS[task].from_pretrained(student).eval()
    assert vanilla.config.id2label == dict(enumerate(LABELS[task]))
    text = "The patient developed hepatotoxicity after taking valproate."
    kind = "text-classification" if task == "sentiment" else "token-classification"
    assert pipeline(kind, model=str(student))(text) is not None
    ours = Predictor(student).predict([text])
    assert len(ours) == 1
    metrics = json.loads((student / "metrics.json").read_text())
    teacher_metrics = json.loads((teachers[task] / "metrics.json").read_text())
    assert metrics["teacher"]["model"] == str(teachers[task])
    assert metrics["teacher"]["student_layers"] == [0, 2]
    assert metrics["teacher"]["validation"] == teacher_metrics["validation"]
    card = (student / "README.md").read_text()
    assert f"Distilled from the teacher `{teachers[task]}`" in card
    assert "- Student: layers [0, 2] of the teacher (2 layers)" in card
    recipe = (student / "recipe.yaml").read_text()
    assert f"teacher: {teachers[task]}" in recipe and "alpha: 0.5" in recipe


@pytest.mark.slow  # trains tiny teachers and students
@pytest.mark.parametrize("task", ["sentiment", "ner"])
def test_transfer_file_rows_train_on_soft_targets_alone(
    task: str, teachers: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Plain text and JSONL: each text becomes training windows after the labelled ones; with alpha = 0
    (gold only) they change nothing, so the student equals one trained without them."""
    texts = ["The patient developed hepatotoxicity after taking valproate.", "A lovely, warm film."]
    plain = tmp_path / "notes.txt"
    plain.write_text("\n".join(texts) + "\n", encoding="utf-8")
    jsonl = write_jsonl(tmp_path / "notes.jsonl", [{"id": i, "text": t} for i, t in enumerate(texts)])
    settings = {"max_steps": 4, "attention_dropout": 0, "validation_file": None}
    with caplog.at_level("INFO", logger="bert_tasks"):
        from_text = train(
            distill_config(task, teachers[task], tmp_path / "a", transfer_file=plain, **settings)
        )
    assert " labelled + 2 unlabelled training windows" in caplog.text
    from_jsonl = train(distill_config(task, teachers[task], tmp_path / "b", transfer_file=jsonl, **settings))
    ours, theirs = load_file(from_text / "model.safetensors"), load_file(from_jsonl / "model.safetensors")
    for key in ours:  # the same texts, read from either format, train the same student
        torch.testing.assert_close(ours[key], theirs[key], msg=key)
    assert all(math.isfinite(record["loss"]) for record in read_log(from_text) if "loss" in record)
    assert json.loads((from_text / "metrics.json").read_text())["teacher"]["transfer_texts"] == 2


@pytest.mark.slow  # trains tiny teachers and students
@pytest.mark.parametrize("transfer", ["none", "hidden,attention"])
def test_a_resumed_distill_run_ends_where_an_uninterrupted_one_does(
    transfer: str, teachers: dict[str, Path], tmp_path: Path
) -> None:
    """Stop after step 3 of 6, resume: the teacher is in no checkpoint, its logits are recomputed, and the
    student's weights match an uninterrupted run's (dropout on: RNG states restored too)."""
    settings = {"max_steps": 6, "save_every": 3, "validation_file": None, "transfer": transfer}
    full = train(distill_config("ner", teachers["ner"], tmp_path / "full", **settings))
    saved = sorted(p.name for p in (full / "checkpoints" / "step-00000003").iterdir())
    assert not any("teacher" in name for name in saved)
    interrupted = shutil.copytree(full, tmp_path / "interrupted")
    shutil.rmtree(interrupted / "checkpoints" / "step-00000006")
    for name in ("model.safetensors", "metrics.json"):
        (interrupted / name).unlink()
    resumed = train(distill_config("ner", teachers["ner"], interrupted, resume=True, **settings))
    expected, actual = load_file(full / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert expected.keys() == actual.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], atol=1e-6, rtol=1e-5, msg=name)

    def losses(run: Path) -> list[tuple[int, float]]:
        return [(record["step"], record["loss"]) for record in read_log(run) if "loss" in record]

    assert losses(resumed) == pytest.approx(losses(full), rel=1e-5)


# --- One-line refusals, before torch loads ---------------------------------------------------------


def _other_vocabulary(source: Path, target: Path) -> Path:
    """A copy of `source` whose tokenizer gives two tokens each other's ids."""
    shutil.copytree(source, target)
    tokenizer = json.loads((target / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    vocab["the"], vocab["of"] = vocab["of"], vocab["the"]
    (target / "tokenizer.json").write_text(json.dumps(tokenizer))
    (target / "vocab.txt").unlink(missing_ok=True)
    return target


def _refusals(teachers: dict[str, Path], tmp: Path) -> list[tuple[list[str], str, bool]]:
    """(argv, the one line, whether the data was read first) for each mistake."""
    sentiment, ner = str(teachers["sentiment"]), str(teachers["ner"])
    damaged = shutil.copytree(sentiment, tmp / "damaged")
    weights = damaged / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    other_labels = write_jsonl(
        tmp / "other.jsonl", [{"text": "fine", "label": "good"}, {"text": "x", "label": "bad"}]
    )
    narrow = build_tiny_model(tmp / "narrow", hidden_size=16)
    empty = tmp / "empty.txt"
    empty.write_text("\n")
    distill = ["distill", "sentiment", "--teacher", sentiment]
    return [
        (
            ["distill", "sentiment", "--teacher", "nowhere/at/all"],
            "teacher: model dir nowhere/at/all: no such dir",
            0,
        ),
        (
            ["distill", "sentiment", "--teacher", ner],
            f"teacher {ner} holds a ner model, not a sentiment model",
            0,
        ),
        (["distill", "sentiment"], "distill: no teacher; give --teacher DIR", 0),
        ([*distill, "student_layers=[2,0]"], "student_layers=[2, 0], must list layer indices", 0),
        ([*distill, "model=x"], "distill: model= on the command line is not read", 0),
        ([*distill, "transfer_layers=[1,3]"], "transfer_layers=[1, 3], maps layers for transfer=", 0),
        ([*distill, "alpha=1.5"], "bad config: alpha=1.5, must be in [0, 1]", 0),
        (
            ["finetune", "sentiment", "alpha=0.7"],
            "alpha=0.7, is a key of bert-tasks distill; give a teacher",
            0,
        ),
        (["finetune", "sentiment", f"teacher={sentiment}"], "finetune: teacher=", 0),
        ([*distill[:3], str(damaged)], "teacher: model dir", 1),
        (
            [*distill, f"train_file={other_labels}", "validation_file=none"],
            "knows the labels ['negative',",
            1,
        ),
        (
            [*distill, f"student={_other_vocabulary(sentiment, tmp / 'vocab')}"],
            "its tokenizer is not the teach",
            1,
        ),
        (
            [*distill, "student_layers=9"],
            "student_layers=9: the teacher has 4 layers; keep 1 to 4 of them",
            1,
        ),
        (
            [*distill, f"student={narrow}", "transfer=hidden"],
            "transfer=hidden: the student is 16 wide, the",
            1,
        ),
        ([*distill, "transfer=attention", "transfer_layers=[1]"], "transfer_layers=[1]: give one teacher", 1),
        ([*distill, f"transfer_file={empty}"], "empty.txt: the file is empty; give a file", 1),
        (
            [*distill, "transfer=attention", "prune_heads=[0:1]"],
            "transfer=attention: the student (prune_heads=0:1) lost heads to pruning; attention",
            1,
        ),
    ]


@pytest.mark.slow  # trains tiny teachers and students
def test_every_distill_mistake_is_one_line_before_torch_and_leaves_no_output(
    teachers: dict[str, Path], tmp_path: Path
) -> None:
    from tests.test_cli_startup import probe

    for argv, message, read_data in _refusals(teachers, tmp_path):
        out = tmp_path / "out"
        answer = probe([*argv, f"output_dir={out}"], tmp_path)
        assert answer["status"] == 1, (argv, answer)
        lines = str(answer["stderr"]).strip().splitlines()
        assert len(lines) == 1 and message in lines[0], (argv, lines)
        heavy = {"torch", "transformers", "accelerate"} | (set() if read_data else {"datasets"})
        assert heavy.isdisjoint(answer["loaded"]), (argv, answer["loaded"])
        assert not out.exists(), argv


# --- End to end on the real default model (slow) --------------------------------------------------


E2E = {
    "sentiment": (
        "recipes/sentiment_sst2.yaml",
        ["max_train_samples=1000", "batch_size=16", "lr=1e-4", "eval_every=0"],
        ("accuracy", 0.65),  # the majority class is 0.51 of dev
    ),
    "ner": (
        "recipes/ner_bc5cdr.yaml",
        ["max_train_samples=1000", "max_eval_samples=200", "epochs=2"],
        ("f1", 0.4),  # a student of a teacher of 600 sentences x 1 epoch scored 0.30
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("task", ["sentiment", "ner"])
def test_a_real_teacher_distilled_into_3_layers_loads_in_vanilla_transformers(
    task: str, shared_data: Path, tmp_path: Path
) -> None:
    """all-MiniLM-L6-v2 fine-tuned briefly on a slice of SST-2 / BC5CDR, distilled into layers [0, 2, 4]
    with the same recipe: a 3-layer plain HF dir that vanilla transformers loads and predicts with, and
    whose held-out score is well above chance."""
    recipe, overrides, (metric, floor) = E2E[task]
    corpus = shared_data / ("sst2" if task == "sentiment" else "bc5cdr")
    files = [f"train_file={corpus / 'train.tsv'}", f"test_file={corpus / 'dev.tsv'}"]
    if task == "ner":
        files = [*files[:1], f"validation_file={corpus / 'dev.tsv'}", f"test_file={corpus / 'test.tsv'}"]
    shared = [*files, "epochs=1", *overrides, "report_to=none"]
    teacher = train(load_recipe(recipe, [*shared, f"output_dir={tmp_path / 'teacher'}"], task=task))
    distilled = [*shared, f"teacher={teacher}", "student_layers=3", f"output_dir={tmp_path / 'student'}"]
    student = train(load_recipe(recipe, distilled, task=task))
    metrics = json.loads((student / "metrics.json").read_text())
    assert metrics["teacher"]["student_layers"] == [0, 2, 4]
    assert metrics["test"][metric] >= floor, metrics["test"][metric]
    vanilla = HEADS[task].from_pretrained(student)
    assert vanilla.config.num_hidden_layers == 3
    kind = "text-classification" if task == "sentiment" else "token-classification"
    found = pipeline(kind, model=str(student))("The patient developed hepatotoxicity after taking valproate.")
    key = "entity" if task == "ner" else "label"  # NER: the non-O tokens; sentiment: one label
    assert all(item[key] in LABELS[task] for item in found) and (task == "ner" or len(found) == 1)
