"""train(cfg) on a tiny random BERT: what a run leaves behind, how the loop counts, and output-dir safety.

Every run here takes about a second (a 2-layer, 32-wide BERT on 40 sentences or 30 sentences of NER), so
the loop's bookkeeping is tested for real without the 90 MB default model.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file
from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification

from bert_tasks.config import load_recipe
from bert_tasks.errors import BertTasksError
from bert_tasks.inference.predictor import SentimentClassifier
from bert_tasks.training import train
from tests.helpers import (
    DATA,
    LABELS,
    LONG_REVIEW,
    long_ner_sentence,
    read_conll,
    read_log,
    tiny_config,
    train_steps,
    write_conll,
    write_jsonl,
)
from tests.reference_run import REFERENCE, reference_runs

AUTO_CLASSES = {"sentiment": AutoModelForSequenceClassification, "ner": AutoModelForTokenClassification}


pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(params=["sentiment", "ner"])
def run(request: pytest.FixtureRequest) -> Path:
    """Each task's finished run, for the checks that hold for both."""
    return request.getfixturevalue(f"{request.param}_run")


def task_of(run_dir: Path) -> str:
    return json.loads((run_dir / "config.json").read_text())["bert_tasks"]["task"]


def test_run_dir_holds_model_tokenizer_and_reports(run: Path) -> None:
    """A run is a complete HF model dir plus its recipe, metrics, log and curves; no `best/` left over."""
    names = {path.name for path in run.iterdir()}
    expected = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
    expected |= {"recipe.yaml", "metrics.json", "train_log.jsonl", "training_curves.png", "README.md"}
    assert expected <= names
    assert "best" not in names
    assert (run / "training_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_config_has_label_names_and_inference_policy(run: Path) -> None:
    """Real label names (not LABEL_0) and the windowing policy travel in config.json."""
    task = task_of(run)
    config = json.loads((run / "config.json").read_text())
    assert [config["id2label"][str(i)] for i in range(len(config["id2label"]))] == LABELS[task]
    assert config["label2id"] == {label: i for i, label in enumerate(LABELS[task])}
    assert config["bert_tasks"]["max_length"] == 32
    assert config["bert_tasks"]["stride"] == 8
    weights = load_file(run / "model.safetensors")
    assert weights["classifier.weight"].shape == (len(LABELS[task]), 32)


def test_recipe_reloads_to_the_run_config(run: Path, tiny_model: Path) -> None:
    """recipe.yaml is the resolved config: load_recipe gives back what the run used (NER: with the word
    splitter it inferred from its corpus of tokens, and no document context: its file marks no documents)."""
    task = task_of(run)
    reloaded = load_recipe(run / "recipe.yaml")
    inferred = {"word_splitter": "default", "document_context": 0} if task == "ner" else {}
    assert reloaded == tiny_config(task, tiny_model, run, **inferred)
    assert reloaded.train_file == str(DATA[task][0])


def test_train_log_has_step_and_eval_records(run: Path) -> None:
    """logging_steps=1: one loss/lr/grad_norm record per update, then the end-of-epoch evaluation."""
    log = read_log(run)
    updates = {"sentiment": 5, "ner": 4}[task_of(run)]  # ceil(40 / 8), ceil(30 / 8)
    train_records = [record for record in log if "loss" in record]
    assert [record["step"] for record in train_records] == list(range(1, updates + 1))
    for record in train_records:
        assert record["loss"] > 0 and record["grad_norm"] > 0 and record["lr"] >= 0
    assert train_records[0]["lr"] > train_records[-1]["lr"] == 0.0  # linear decay ends at 0
    eval_records = [record for record in log if any(key.startswith("eval_") for key in record)]
    assert [record["step"] for record in eval_records] == [updates]
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["best_step"] == updates
    name = metrics["metric_for_best"]
    assert eval_records[0][f"eval_{name}"] == pytest.approx(metrics["validation"][name])


def test_saved_dir_loads_in_vanilla_transformers(run: Path) -> None:
    """Stock AutoModelFor... loads every saved weight (no missing keys) with the real label names."""
    task = task_of(run)
    model, info = AUTO_CLASSES[task].from_pretrained(run, output_loading_info=True)
    assert not info["missing_keys"]
    assert not info["unexpected_keys"]
    assert list(model.config.id2label.values()) == LABELS[task]


def test_vanilla_text_classification_pipeline_agrees_with_predictor(sentiment_run: Path) -> None:
    """transformers.pipeline gives real label names and the same probability as our (fp32) predictor."""
    text = "The ending was top notch."
    classify = transformers.pipeline("text-classification", model=str(sentiment_run), device=-1)
    [stock] = classify(text)
    [ours] = SentimentClassifier(sentiment_run, mixed_precision="no")(text)
    assert stock["label"] == ours["label"] and stock["label"] in LABELS["sentiment"]
    assert stock["score"] == pytest.approx(ours["score"], abs=1e-5)


def test_vanilla_token_classification_pipeline_groups_entities(ner_run: Path) -> None:
    """The NER dir works in pipeline('token-classification', aggregation_strategy='simple')."""
    tag = transformers.pipeline(
        "token-classification", model=str(ner_run), aggregation_strategy="simple", device=-1
    )
    text = "Lithium carbonate induced nephrogenic diabetes insipidus ."
    entities = tag(text)
    assert entities, "the seeded tiny model tags something in this sentence"
    for entity in entities:
        assert entity["entity_group"] in {"Chemical", "Disease"}
        assert text[entity["start"] : entity["end"]].strip() != ""


@pytest.mark.slow
def test_grad_accum_halves_the_optimizer_updates(tiny_model: Path, tmp_path: Path) -> None:
    """16 rows in batches of 4 = 4 micro-batches: 4 updates, or 2 with grad_accum=2 (schedule ends at 0)."""
    small = {"batch_size": 4, "max_train_samples": 16, "validation_file": None}
    plain = train(tiny_config("sentiment", tiny_model, tmp_path / "plain", **small))
    accum = train(tiny_config("sentiment", tiny_model, tmp_path / "accum", grad_accum=2, **small))
    assert train_steps(plain) == [1, 2, 3, 4]
    assert train_steps(accum) == [1, 2]
    last = [record for record in read_log(accum) if "loss" in record][-1]
    assert last["lr"] == 0.0 and last["epoch"] == 1.0


@pytest.mark.slow
def test_max_steps_stops_exactly_there_across_epochs(tiny_model: Path, tmp_path: Path) -> None:
    """max_steps=7 with 5 updates per epoch runs into epoch 2 and stops at 7 (evaluating at 5 and 7)."""
    out = train(tiny_config("sentiment", tiny_model, tmp_path / "out", max_steps=7))
    assert train_steps(out) == list(range(1, 8))
    evals = [record["step"] for record in read_log(out) if "eval_accuracy" in record]
    assert evals == [5, 7]


@pytest.mark.slow
def test_early_stopping_stops_after_patience_evals(tiny_model: Path, tmp_path: Path) -> None:
    """With lr ~0 accuracy cannot improve: patience=2 stops at the 3rd of 15 updates, best stays step 1."""
    cfg = tiny_config(
        "sentiment", tiny_model, tmp_path / "out", epochs=3, lr=1e-12, eval_every=1, early_stopping_patience=2
    )
    out = train(cfg)
    assert train_steps(out) == [1, 2, 3]
    assert [record["step"] for record in read_log(out) if "eval_accuracy" in record] == [1, 2, 3]
    assert json.loads((out / "metrics.json").read_text())["best_step"] == 1
    assert not (out / "best").exists()


@pytest.mark.slow
def test_auto_patience_is_two_epochs_of_evaluations(
    tiny_model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """early_stopping_patience=auto (the default) with 5 updates an epoch evaluated every 2 updates: ten
    updates hold 5 evaluations, so the run stops at the 6th (step 12 of 20), best still step 2."""
    cfg = tiny_config("sentiment", tiny_model, tmp_path / "out", epochs=4, lr=1e-12, eval_every=2)
    assert cfg.early_stopping_patience == "auto"
    with caplog.at_level(logging.INFO, logger="bert_tasks"):
        out = train(cfg)
    assert [record["step"] for record in read_log(out) if "eval_accuracy" in record] == [2, 4, 6, 8, 10, 12]
    assert json.loads((out / "metrics.json").read_text())["best_step"] == 2
    assert (
        "early stopping: after 5 evaluation(s) without improvement (best checkpoint by accuracy)"
        in caplog.text
    )


def test_unknown_metric_for_best_is_a_user_error(tiny_model: Path, tmp_path: Path) -> None:
    """A metric name the task does not compute fails with the names it does compute, as the config loads."""
    with pytest.raises(BertTasksError, match=r"metric_for_best='f2'.*accuracy"):
        tiny_config("sentiment", tiny_model, tmp_path / "out", max_steps=1, metric_for_best="f2")
    assert not (tmp_path / "out").exists()


def test_non_empty_output_dir_is_refused_and_kept(tiny_model: Path, tmp_path: Path) -> None:
    """Without overwrite nothing is deleted, and the message names both ways forward."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(BertTasksError, match=r"--overwrite.*--resume"):
        train(tiny_config("sentiment", tiny_model, out, max_steps=1))
    assert [path.name for path in out.iterdir()] == ["notes.txt"]
    assert (out / "notes.txt").read_text() == "mine"


@pytest.mark.slow
def test_overwrite_replaces_a_previous_run(sentiment_run: Path, tiny_model: Path, tmp_path: Path) -> None:
    """overwrite=true replaces what the old run wrote (its manifest), and never a file the user added:
    with one there it refuses, names it and deletes nothing."""
    out = shutil.copytree(sentiment_run, tmp_path / "out")
    (out / "notes.txt").write_text("mine")
    cfg = tiny_config("sentiment", tiny_model, out, max_steps=2, overwrite=True, validation_file=None)
    before = sorted(path.name for path in out.iterdir())
    with pytest.raises(
        BertTasksError, match=r"holds notes\.txt, which no bert-tasks run wrote; nothing was deleted"
    ):
        train(cfg)
    assert sorted(path.name for path in out.iterdir()) == before
    (out / "notes.txt").unlink()
    (out / "best").mkdir()  # a run's own entry, as one killed before its end leaves it
    train(cfg)
    assert not (out / "best").exists()
    assert train_steps(out) == [1, 2]
    assert load_recipe(out / "recipe.yaml").max_steps == 2


def test_overwrite_refuses_a_dir_that_is_not_a_run(tiny_model: Path, tmp_path: Path) -> None:
    """`output_dir=~ overwrite=true` must not wipe a home dir: only a previous run may be replaced."""
    out = tmp_path / "documents"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    with pytest.raises(BertTasksError, match=r"not a (bert-tasks )?run"):
        train(tiny_config("sentiment", tiny_model, out, max_steps=1, overwrite=True))
    assert (out / "thesis.tex").exists()


def test_resume_without_checkpoint_says_how_to_get_one(sentiment_run: Path, tiny_model: Path) -> None:
    with pytest.raises(BertTasksError, match="save_every"):
        train(tiny_config("sentiment", tiny_model, sentiment_run, resume=True))


@pytest.mark.slow
@pytest.mark.parametrize("ema_decay", [0.0, 0.5])
def test_resumed_run_ends_where_an_uninterrupted_one_does(
    ema_decay: float, tiny_model: Path, tmp_path: Path
) -> None:
    """Stop after step 3 of 6 (checkpoints every 3), resume, and compare with an uninterrupted run.

    Two epochs of 5 updates with batch 8, so the resumed run restarts mid-epoch and crosses an epoch
    boundary: data order, optimizer, scheduler and RNG states all have to be restored for the weights to
    match; with `ema_decay`, the weights' average too (the saved model is then the last step's average).
    """
    settings = {"max_steps": 6, "save_every": 3, "validation_file": None, "ema_decay": ema_decay, "lr": 1e-2}
    full = train(tiny_config("sentiment", tiny_model, tmp_path / "full", **settings))
    interrupted = shutil.copytree(full, tmp_path / "interrupted")
    shutil.rmtree(interrupted / "checkpoints" / "step-00000006")
    for name in ("model.safetensors", "metrics.json"):
        (interrupted / name).unlink()
    resumed = train(tiny_config("sentiment", tiny_model, interrupted, resume=True, **settings))
    expected, actual = load_file(full / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert expected.keys() == actual.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.slow
def test_long_sentiment_texts_are_windowed_and_scored_once(
    tiny_model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Long texts become several training windows, yet each validation text counts once in the metrics."""
    rows = [{"text": f"{LONG_REVIEW} Visit {i}.", "label": LABELS["sentiment"][i % 2]} for i in range(6)]
    validation = write_jsonl(tmp_path / "long.jsonl", rows)
    train_file = write_jsonl(tmp_path / "train.jsonl", rows)
    cfg = tiny_config(
        "sentiment", tiny_model, tmp_path / "out", train_file=train_file, validation_file=validation
    )
    with caplog.at_level(logging.INFO, "bert_tasks"):
        out = train(cfg)
    windows = int(re.search(r"(\d+) training windows", caplog.text).group(1))
    assert windows >= 3 * len(rows)
    validation_metrics = json.loads((out / "metrics.json").read_text())["validation"]
    assert sum(map(sum, validation_metrics["confusion_matrix"])) == len(rows)


@pytest.mark.slow
def test_long_ner_sentence_is_windowed_in_training(
    tiny_model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A ~50-word sentence at max_length=32 yields several windows; no word is cut from the gold."""
    sentences = [*read_conll(DATA["ner"][0])[:8], long_ner_sentence()]
    train_file = write_conll(tmp_path / "train.conll", sentences)
    validation = write_conll(tmp_path / "validation.conll", [long_ner_sentence()])
    cfg = tiny_config("ner", tiny_model, tmp_path / "out", train_file=train_file, validation_file=validation)
    with caplog.at_level(logging.INFO, "bert_tasks"):
        out = train(cfg)
    windows = int(re.search(r"(\d+) training windows", caplog.text).group(1))
    assert windows >= len(sentences) + 2
    per_type = json.loads((out / "metrics.json").read_text())["validation"]["per_type"]
    assert {name: row["support"] for name, row in per_type.items()} == {"Chemical": 6, "Disease": 3}


@pytest.mark.slow
def test_runs_are_reproducible(tiny_model: Path, tmp_path: Path) -> None:
    """Same seed, same data -> the same losses and weights (so test expectations above are stable)."""
    first = train(tiny_config("sentiment", tiny_model, tmp_path / "a", max_steps=2, validation_file=None))
    second = train(tiny_config("sentiment", tiny_model, tmp_path / "b", max_steps=2, validation_file=None))
    losses = [[record["loss"] for record in read_log(out) if "loss" in record] for out in (first, second)]
    assert losses[0] == losses[1]
    a, b = load_file(first / "model.safetensors"), load_file(second / "model.safetensors")
    torch.testing.assert_close(a, b)


@pytest.mark.slow
def test_two_runs_with_different_precision_in_one_process(tiny_model: Path, tmp_path: Path) -> None:
    """A sweep or a notebook calls train() again with other settings; Accelerate's state must allow it."""
    for precision in ("no", "bf16"):
        out = train(
            tiny_config("sentiment", tiny_model, tmp_path / precision, max_steps=1, mixed_precision=precision)
        )
        assert load_recipe(out / "recipe.yaml").mixed_precision == precision


@pytest.mark.slow
def test_attention_dropout_override_is_trained_with_and_saved(tiny_model: Path, tmp_path: Path) -> None:
    """attention_dropout=0 reaches every layer and the saved config, so the model reloads the same."""
    small = {"batch_size": 4, "max_train_samples": 8, "validation_file": None}
    out = train(tiny_config("sentiment", tiny_model, tmp_path / "out", attention_dropout=0.0, **small))
    saved = json.loads((out / "config.json").read_text())
    assert saved["attention_probs_dropout_prob"] == 0.0
    assert saved["hidden_dropout_prob"] == 0.1  # the other dropouts stay the model's


@pytest.mark.slow
def test_the_tiny_recipe_gives_the_stored_weights_and_log(tmp_path: Path) -> None:
    """The tiny sentiment and NER recipes end with the log, scores and weights that the code before the
    renovation (run object, task registry, model-dir contract) gave, pinned in fixtures/reference_run.json.

    Compared to 1e-5 relative, not bit for bit: the reference was written on one CPU kind, and another
    kind's GEMM kernels round differently."""
    stored = json.loads(REFERENCE.read_text())
    got = reference_runs(tmp_path)
    assert got.keys() == stored.keys()
    for task in stored:
        assert_same_tree(got[task], stored[task], task)


def assert_same_tree(got: object, want: object, where: str) -> None:
    """Equal structure and strings; numbers equal to 1e-5 relative."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), where
        for key in want:
            assert_same_tree(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same_tree(g, w, f"{where}[{i}]")
    elif isinstance(want, float):
        assert got == pytest.approx(want, rel=1e-5, abs=1e-6), where
    else:
        assert got == want, where


@pytest.mark.slow
def test_eval_every_longer_than_the_run_falls_back_to_each_epoch(
    tiny_model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Else the best checkpoint is chosen from one evaluation, at the very end."""
    cfg = tiny_config("sentiment", tiny_model, tmp_path / "out", epochs=2, eval_every=10_000)
    with caplog.at_level(logging.WARNING, logger="bert_tasks"):
        run = train(cfg)
    assert "eval_every=10000 is longer than the run" in caplog.text
    evaluated = [record["step"] for record in read_log(run) if "eval_accuracy" in record]
    updates = [record["step"] for record in read_log(run) if "loss" in record][-1]
    assert evaluated == [updates // 2, updates]


@pytest.mark.slow
def test_threads_sets_torch_and_the_start_line_says_how_many(
    tiny_model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    before = torch.get_num_threads()
    try:
        with caplog.at_level(logging.INFO, logger="bert_tasks"):
            train(tiny_config("sentiment", tiny_model, tmp_path / "out", threads=1, max_steps=1))
        assert torch.get_num_threads() == 1
        assert "| 1 CPU thread(s), OpenMP waits " in caplog.text
    finally:
        torch.set_num_threads(before)
