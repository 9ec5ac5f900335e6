"""Text pairs, multi-label and regression through every door, on tiny runs of the bundled shape demos:
the CLI and the library, evaluate, Label Studio, the server, and vanilla transformers loading what we save.

The models are random and barely trained: the tests check what holds for any weights (formats, thresholds
tuned and saved, values in the label's units, the same logits in vanilla transformers).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline

from bert_tasks.cli import main
from bert_tasks.errors import BertTasksError
from bert_tasks.inference.evaluate import read_labelled_file
from bert_tasks.inference.predictor import Predictor, SentimentClassifier
from bert_tasks.model_dir import load_finetuned, read_policy
from bert_tasks.pruning import prune
from bert_tasks.tasks.sentiment_shapes import tune_thresholds
from bert_tasks.training import train
from tests.helpers import cli_error_line, one_thread, tiny_config, write_jsonl

DEMO = Path(__file__).resolve().parents[1] / "bert_tasks" / "resources" / "demo"
REVIEW = "The battery lasts all day but the screen is dim."
SHAPES = {
    "pairs": ["text_pair_column=aspect"],
    "multilabel": [],  # multi_label left unset: the demo's labels are JSON lists
    "regression": ["regression=true", "ordinal=true"],
}

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def runs(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One tiny run per shape on 96 rows of its demo (a couple of seconds each)."""
    found = {}
    with one_thread():
        for shape, overrides in SHAPES.items():
            settings = dict(item.split("=") for item in overrides)
            cfg = tiny_config(
                "sentiment",
                tiny_model,
                tmp_path_factory.mktemp(shape) / "run",
                train_file=DEMO / shape / "train.jsonl",
                validation_file=DEMO / shape / "validation.jsonl",
                max_train_samples=96,
                **settings,
            )
            found[shape] = train(cfg)
    return found


def predict_json(capsys: pytest.CaptureFixture[str], *argv: str) -> list[dict[str, object]]:
    capsys.readouterr()
    assert main(["predict", "sentiment", *argv, "--json"]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_each_run_saves_its_shape_in_config_json(runs: dict[str, Path]) -> None:
    configs = {shape: json.loads((run / "config.json").read_text()) for shape, run in runs.items()}
    assert configs["pairs"]["bert_tasks"]["text_pair_column"] == "aspect"
    multi = configs["multilabel"]
    assert (
        multi["problem_type"] == "multi_label_classification" and multi["bert_tasks"]["multi_label"] is True
    )
    assert sorted(multi["id2label"].values()) == ["anger", "fear", "joy", "sadness", "surprise"]
    assert len(multi["bert_tasks"]["thresholds"]) == 5 and all(
        0 < t < 1 for t in multi["bert_tasks"]["thresholds"]
    )
    regression = configs["regression"]
    assert regression["problem_type"] == "regression" and regression["id2label"] == {"0": "value"}
    assert regression["bert_tasks"]["round_to"] == [1.0, 2.0, 3.0, 4.0, 5.0]
    recipe = (runs["multilabel"] / "recipe.yaml").read_text()
    assert "multi_label: null" in recipe  # the recipe as given: a rerun settles it from the data again


def test_a_pair_model_predicts_pairs_through_the_cli_and_the_library(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = runs["pairs"]
    [screen] = predict_json(capsys, "--model", str(run), REVIEW, "--pair", "screen")
    assert list(screen) == ["text", "aspect", "label", "score", "scores"]
    assert (screen["text"], screen["aspect"]) == (REVIEW, "screen")
    classify = SentimentClassifier(run)  # the CLI's settings, so the numbers are the same
    [battery, again] = classify([(REVIEW, "battery"), (REVIEW, "screen")])
    assert again["scores"] == pytest.approx(screen["scores"], abs=1e-5)
    assert battery["scores"] != pytest.approx(again["scores"], abs=1e-7)  # the aspect is read
    assert classify((REVIEW, "screen"))[0]["label"] == again["label"]  # one tuple alone is one pair
    inputs = tmp_path / "in.jsonl"
    inputs.write_text(json.dumps({"text": REVIEW, "aspect": "battery"}) + "\n")
    [record] = predict_json(capsys, "--model", str(run), "--file", str(inputs))
    assert record["aspect"] == "battery" and record["scores"] == pytest.approx(battery["scores"], abs=1e-5)
    plain = tmp_path / "in.txt"
    plain.write_text(f"{REVIEW}\n")
    [line] = predict_json(capsys, "--model", str(run), "--file", str(plain), "--pair", "battery")
    assert line["scores"] == pytest.approx(battery["scores"], abs=1e-5)


def test_pairs_are_records_on_the_list_path_and_stream_through_predict_out(
    runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """(text, aspect) pairs become records with the pair field; they give the Dataset path's records
    without building a Dataset, and `--out` streams a file of them (`--pair` for lines without one)."""
    from datasets import Dataset

    run = runs["pairs"]
    predictor = Predictor(run)  # the CLI's settings, so the numbers are the same
    pairs = [(REVIEW, "battery"), ("Dim screen.", "screen"), (REVIEW * 12, "screen")]  # the last: windows
    raw = Dataset.from_dict({"text": [t for t, _ in pairs], "text_pair": [a for _, a in pairs]})
    predictions = predictor.task.decode(raw, *predictor.window_logits(raw), predictor.id2label)
    through_dataset = [predictor.task.record(p, q) for p, q in zip(pairs, predictions, strict=True)]

    def no_dataset(*args: object, **kwargs: object) -> None:
        raise AssertionError("prediction built a Dataset")

    with monkeypatch.context() as patched:
        patched.setattr(Dataset, "__init__", no_dataset)
        assert predictor.records(pairs) == through_dataset
        assert predictor.records([list(p) for p in pairs]) == through_dataset
        records = [{"text": t, "aspect": a} for t, a in pairs]
        assert predictor.records(records) == through_dataset
    inputs = tmp_path / "in.jsonl"
    lines = [{"id": n, "text": t, "aspect": a} for n, (t, a) in enumerate(pairs)] + [
        {"id": 9, "text": REVIEW}
    ]
    inputs.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out.jsonl"
    argv = ["predict", "sentiment", "--model", str(run), "--file", str(inputs), "--out", str(out)]
    assert main([*argv, "--pair", "battery"]) == 0
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [list(record) for record in written] == [["id", "text", "aspect", "label", "score", "scores"]] * 4
    for record, expected in zip(written, [*through_dataset, through_dataset[0]], strict=True):
        assert record["scores"] == pytest.approx(expected["scores"], abs=1e-5)
    assert written[3]["aspect"] == "battery"  # --pair, where the record has none
    assert cli_error_line([*argv[:-1], str(tmp_path / "again.jsonl")], capsys).endswith(
        f"{inputs}:4: no 'aspect' for the text; the model reads (text, aspect) pairs, so give every record a "
        "'aspect' string field ((text, aspect) pairs in the library, predict --pair for texts without one)"
    )
    clash = [("in:1", {"text": REVIEW, "aspect": "screen", "label": "gold"})]
    with pytest.raises(BertTasksError, match=r"^in:1: the record has a field 'label', which the prediction"):
        predictor.annotate(clash)


@pytest.mark.slow
def test_two_processes_stream_pairs_as_one_process_does(runs: dict[str, Path], tmp_path: Path) -> None:
    """`predict --out` under `accelerate launch` on a pair model: every process fills `--pair` and
    checks the pairs as the one process does, and the output is that process's byte for byte."""
    import os
    import subprocess
    import sys

    from bert_tasks.inference.stream import CHUNK_TEXTS
    from tests.test_distributed import launch_result

    source = tmp_path / "in.jsonl"
    lines = [{"id": n, "text": f"review {n}: {REVIEW}"} for n in range(CHUNK_TEXTS + 50)]  # two chunks
    for line in lines[::2]:
        line["aspect"] = "battery"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    argv = ["-m", "bert_tasks", "predict", "sentiment", "--model", str(runs["pairs"]), "--file", str(source)]
    argv += ["--pair", "screen", "--out"]
    single = subprocess.run(
        [sys.executable, *argv, str(one)], env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True
    )
    assert single.returncode == 0, single.stderr.decode()[-3000:]
    launched = launch_result(*argv, two)
    assert launched.returncode == 0, launched.stderr[-5000:]
    assert two.read_bytes() == one.read_bytes()
    written = [json.loads(line) for line in two.read_text().splitlines()]
    assert [record["aspect"] for record in written[:4]] == ["battery", "screen", "battery", "screen"]
    assert [record["id"] for record in written] == list(range(len(lines)))


def test_pair_mistakes_are_one_line(
    runs: dict[str, Path], sentiment_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = str(runs["pairs"])
    inputs = tmp_path / "in.jsonl"
    inputs.write_text(json.dumps({"text": REVIEW}) + "\n")
    assert cli_error_line(["predict", "sentiment", "--model", run, "--file", str(inputs)], capsys) == (
        f"bert-tasks: error: {inputs}:1: no 'aspect' for the text; the model reads (text, aspect) pairs, so "
        "give every record a 'aspect' string field ((text, aspect) pairs in the library, predict --pair for "
        "texts without one)"
    )
    assert cli_error_line(["predict", "sentiment", "--model", run, REVIEW, "--pair", " "], capsys).endswith(
        "text 1: the 'aspect' is empty; give it as a string of some words"
    )
    line = cli_error_line(
        ["predict", "sentiment", "--model", str(sentiment_run), REVIEW, "--pair", "x"], capsys
    )
    assert line.endswith("reads one text per input, not text pairs; drop --pair")
    with pytest.raises(BertTasksError, match=r"^text 1: no 'aspect' for the text; the model reads"):
        SentimentClassifier(run)([REVIEW])
    with pytest.raises(BertTasksError, match=r"^text 1 has 3 parts; the model reads"):
        SentimentClassifier(run)([(REVIEW, "screen", "battery")])
    with pytest.raises(BertTasksError, match=r"^text 2 is empty; give at least one word"):
        SentimentClassifier(run)([(REVIEW, "screen"), ["", "screen"]])
    with pytest.raises(BertTasksError, match=r"^text 1 is a pair, but the model reads one text per input"):
        SentimentClassifier(sentiment_run)([(REVIEW, "screen")])


def test_multi_label_predictions_are_every_label_over_its_threshold(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    run = runs["multilabel"]
    policy = read_policy(run)
    labels = [name for _, name in sorted(json.loads((run / "config.json").read_text())["id2label"].items())]
    thresholds = dict(zip(labels, policy.task_options["thresholds"], strict=True))
    texts = ["I was furious and scared.", "What a lovely surprise.", "I took the bus."]
    records = predict_json(capsys, "--model", str(run), *texts)
    for record in records:
        assert list(record) == ["text", "labels", "scores"]
        assert set(record["scores"]) == set(labels)
        passing = {label for label, p in record["scores"].items() if p >= thresholds[label]}
        assert {item["label"] for item in record["labels"]} == passing
        shown = [item["score"] for item in record["labels"]]
        assert shown == sorted(shown, reverse=True)
    assert SentimentClassifier(run)(texts)[0]["scores"] == pytest.approx(records[0]["scores"], abs=1e-5)
    assert main(["predict", "sentiment", "--model", str(run), *texts]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["labels", "scores", "text"] and table[1].endswith(texts[0])


def test_thresholds_are_the_validation_splits_best_and_the_validation_scores_use_them(
    runs: dict[str, Path],
) -> None:
    run = runs["multilabel"]
    raw, policy = read_labelled_file(run, str(DEMO / "multilabel" / "validation.jsonl"))
    predictor = Predictor(run, mixed_precision="no")
    encoded, logits = predictor.window_logits(raw)
    from bert_tasks.tasks.sentiment import _example_logits

    example = _example_logits(encoded, logits, len(raw))
    labels = [predictor.id2label[i] for i in sorted(predictor.id2label)]
    gold = np.array([[label in names for label in labels] for names in raw["label"]])
    assert policy.task_options["thresholds"] == pytest.approx(
        tune_thresholds(1 / (1 + np.exp(-example)), gold), abs=1e-4
    )
    saved = json.loads((run / "metrics.json").read_text())["validation"]
    scores = predictor.evaluate(raw)
    assert scores["macro_f1"] == pytest.approx(saved["macro_f1"], abs=1e-3)
    assert saved["thresholds"] == pytest.approx(
        dict(zip(labels, policy.task_options["thresholds"], strict=True))
    )


def test_regression_predicts_values_in_the_labels_units_and_their_rounding(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    run = runs["regression"]
    records = predict_json(capsys, "--model", str(run), "Awful kettle.", "Superb kettle!")
    for record in records:
        assert list(record) == ["text", "value", "rounded"]
        assert record["rounded"] in (1, 2, 3, 4, 5)
        assert abs(record["value"] - record["rounded"]) <= 0.5 or record["rounded"] in (1, 5)
    # tiny random weights barely move from the mean, which is the training labels' (3.0 on the demo's)
    assert records[0]["value"] == pytest.approx(3.0, abs=0.5)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_saved_dirs_give_the_same_logits_in_vanilla_transformers(runs: dict[str, Path], shape: str) -> None:
    run = runs[shape]
    loaded = load_finetuned(run)
    vanilla = AutoModelForSequenceClassification.from_pretrained(run).eval()
    tokenizer = AutoTokenizer.from_pretrained(run)
    texts = ["I was furious and scared.", REVIEW]
    batch = tokenizer(
        texts, ["screen", "battery"] if shape == "pairs" else None, padding=True, return_tensors="pt"
    )
    with torch.no_grad():
        torch.testing.assert_close(
            vanilla(**batch).logits, loaded.model(**batch).logits, atol=1e-5, rtol=1e-4
        )
    assert vanilla.config.problem_type == loaded.task.problem_type or shape == "pairs"


def test_vanilla_pipelines_read_the_heads_as_bert_tasks_does(runs: dict[str, Path]) -> None:
    """Multi-label: top_k=None gives each label's sigmoid probability (no thresholds: transformers has
    none); regression: the pipeline's score is the value in the label's units (the scaling is in the head);
    pairs: a {"text", "text_pair"} input is the same pair."""
    text = "I was furious and scared."
    [multi] = pipeline("text-classification", model=str(runs["multilabel"]), top_k=None)([text])
    ours = SentimentClassifier(runs["multilabel"], mixed_precision="no")(text)[0]["scores"]
    assert {item["label"]: item["score"] for item in multi} == pytest.approx(ours, abs=1e-5)
    [rating] = pipeline("text-classification", model=str(runs["regression"]))("Awful kettle.")
    value = SentimentClassifier(runs["regression"], mixed_precision="no")("Awful kettle.")[0]["value"]
    assert rating["label"] == "value" and rating["score"] == pytest.approx(value, abs=1e-5)
    pair = pipeline("text-classification", model=str(runs["pairs"]), top_k=None)(
        {"text": REVIEW, "text_pair": "screen"}
    )
    ours = SentimentClassifier(runs["pairs"], mixed_precision="no")((REVIEW, "screen"))[0]["scores"]
    assert {item["label"]: item["score"] for item in pair} == pytest.approx(ours, abs=1e-5)


def test_evaluate_reports_each_shapes_scores(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for shape, first_line in (
        ("multilabel", "micro-F1 "),
        ("regression", "MAE "),
        ("pairs", "accuracy "),
    ):
        out = tmp_path / shape
        argv = [
            "evaluate",
            "sentiment",
            "--model",
            str(runs[shape]),
            "--data",
            str(DEMO / shape / "validation.jsonl"),
        ]
        capsys.readouterr()
        assert main([*argv, "--out", str(out)]) == 0
        assert capsys.readouterr().out.startswith(first_line)
        pngs = sorted(path.name for path in out.glob("*.png"))
        assert (
            pngs
            == {"multilabel": ["label_scores.png"], "regression": [], "pairs": ["confusion_matrix.png"]}[
                shape
            ]
        )
    metrics = json.loads((tmp_path / "regression" / "metrics.json").read_text())
    assert set(metrics) == {"mae", "rmse", "pearson", "spearman", "count", "rounded_accuracy", "round_to"}
    argv = [
        "evaluate",
        "sentiment",
        "--model",
        str(runs["multilabel"]),
        "--data",
        str(DEMO / "multilabel" / "validation.jsonl"),
    ]
    assert main([*argv, "--out", str(tmp_path / "half"), "thresholds=[0.5]", "--json"]) == 0
    assert set(json.loads(capsys.readouterr().out)["thresholds"].values()) == {0.5}
    line = cli_error_line([*argv, "--out", str(tmp_path / "x"), "multi_label=false"], capsys)
    assert "multi_label= on the command line: the model was trained with its saved multi_label" in line
    line = cli_error_line([*argv, "--out", str(tmp_path / "y"), "round_to=[1,2]"], capsys)
    assert "round_to= on the command line is not an evaluate setting" in line  # a multi-label model has none


@pytest.mark.parametrize(
    ("shape", "setting", "message"),
    [
        ("multilabel", "thresholds=[0.1,0.2]", "thresholds has 2 value(s) but the model has 5 labels"),
        ("regression", "round_to=[nan,1]", "round_to=[nan, 1.0], must be two or more distinct finite values"),
        ("regression", "round_to=[1,inf]", "must be two or more distinct finite values"),
        ("pairs", "max_length=512", "max_length=512: model {model} has only 128 position embeddings"),
    ],
)
def test_an_evaluate_setting_the_model_cannot_take_is_one_line_before_it_loads(
    runs: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    shape: str,
    setting: str,
    message: str,
) -> None:
    """Each used to be a traceback at the first batch, or (nan) a report with NaN in its JSON."""
    out = tmp_path / "out"
    data = str(DEMO / shape / "validation.jsonl")
    argv = ["evaluate", "sentiment", "--model", str(runs[shape]), "--data", data, "--out", str(out), setting]
    assert message.format(model=runs[shape]) in cli_error_line(argv, capsys)
    assert not out.exists()


def test_evaluate_into_its_own_dir_again_drops_the_plots_the_new_report_has_not(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    """A pair model's confusion matrix, then a regression model's report (no plot) into the same dir."""
    out = tmp_path / "report"
    for shape, plots in (
        ("pairs", ["confusion_matrix.png"]),
        ("regression", []),
        ("multilabel", ["label_scores.png"]),
    ):
        data = str(DEMO / shape / "validation.jsonl")
        assert (
            main(["evaluate", "sentiment", "--model", str(runs[shape]), "--data", data, "--out", str(out)])
            == 0
        )
        assert sorted(path.name for path in out.glob("*.png")) == plots, shape
    (out / "mine.png").write_bytes(b"\x89PNG the user's own")
    data = str(DEMO / "regression" / "validation.jsonl")
    assert (
        main(["evaluate", "sentiment", "--model", str(runs["regression"]), "--data", data, "--out", str(out)])
        == 0
    )
    assert sorted(path.name for path in out.iterdir()) == [".bert-tasks-evaluate", "metrics.json", "mine.png"]


def test_a_label_the_model_does_not_know_names_its_first_example(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [{"text": f"text {n}", "aspect": "screen", "label": "positive"} for n in range(40)]
    rows[26]["label"] = "mixed"
    data = write_jsonl(tmp_path / "unseen.jsonl", rows)
    line = cli_error_line(
        ["evaluate", "sentiment", "--model", str(runs["pairs"]), "--data", str(data)], capsys
    )
    assert f"{data}: label 'mixed' (first in example 27) is not one the model knows" in line


def test_label_studio_tasks_of_each_shape(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    def tasks(shape: str, *argv: str) -> list[dict[str, object]]:
        capsys.readouterr()
        assert (
            main(["predict", "sentiment", "--model", str(runs[shape]), *argv, "--format", "label-studio"])
            == 0
        )
        return json.loads(capsys.readouterr().out)

    [pair] = tasks("pairs", REVIEW, "--pair", "screen")
    assert pair["data"] == {"text": REVIEW, "aspect": "screen"}
    [rating] = tasks("regression", "Awful kettle.")
    [result] = rating["predictions"][0]["result"]
    assert (
        result["type"] == "number"
        and result["from_name"] == "value"
        and "score" not in rating["predictions"][0]
    )
    for task in tasks("multilabel", "I was furious and scared.", "I took the bus."):
        for result in task["predictions"][0]["result"]:
            assert result["type"] == "choices" and result["value"]["choices"]


def test_shape_settings_that_cannot_work_are_one_line_before_the_model_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["finetune", "sentiment", f"output_dir={tmp_path / 'out'}", "report_to=none"]
    multi = [
        f"train_file={DEMO / 'multilabel' / 'train.jsonl'}",
        "label_column=labels",
        "validation_file=none",
    ]
    assert cli_error_line([*base, *multi, "class_weights=auto"], capsys) == (
        f"bert-tasks: error: class_weights: {DEMO / 'multilabel' / 'train.jsonl'} holds label sets "
        "(multi-label), which have no class to weigh against the others; drop class_weights (each label's "
        "threshold is tuned on validation instead)"
    )
    assert cli_error_line([*base, *multi, "metric_for_best=spearman"], capsys).endswith(
        "metric_for_best=spearman is not a score of a multi-label model; choose one of macro_f1, micro_f1, "
        "subset_accuracy"
    )
    assert cli_error_line([*base, *multi, "thresholds=[0.5,0.4]"], capsys).endswith(
        "thresholds has 2 value(s) but the model has 5 labels (anger, fear, joy, sadness, surprise); give "
        "one per label in this order, one for all, or none to tune them"
    )
    assert cli_error_line([*base, "regression=true", "class_weights=auto"], capsys).startswith(
        "bert-tasks: error: bad config: class_weights='auto', a multi-label or regression model has no class"
    )
    assert "rounds regression values; set regression=true" in cli_error_line(
        [*base, "round_to=[1,2]"], capsys
    )
    single = DEMO / "sentiment" / "train.jsonl"
    assert cli_error_line([*base, f"train_file={single}", "thresholds=[0.5]"], capsys) == (
        f"bert-tasks: error: thresholds: {single} holds one label per text, not label sets, and thresholds "
        "are multi-label's; drop thresholds, or write each label as a set (a JSON list or a|b)"
    )
    assert not (tmp_path / "out").exists()


def test_validation_split_carves_a_plain_sample_for_multi_label(tiny_model: Path, tmp_path: Path) -> None:
    from bert_tasks.config import load_recipe
    from bert_tasks.data.splits import read_splits
    from bert_tasks.tasks import get_task

    cfg = load_recipe(
        None,
        [f"train_file={DEMO / 'multilabel' / 'train.jsonl'}", "validation_split=0.1"],
        task="sentiment",
    )
    splits = read_splits(get_task(cfg), cfg)
    assert (len(splits["train"]), len(splits["validation"])) == (360, 40)


def test_a_pair_server_takes_pairs_and_records_with_the_pair_field(runs: dict[str, Path]) -> None:
    from fastapi.testclient import TestClient

    from bert_tasks.inference.serve_settings import ServeSettings
    from bert_tasks.inference.server import create_app

    with TestClient(create_app(ServeSettings(str(runs["pairs"]), "sentiment", max_batch=8))) as client:
        assert client.get("/info").json()["pair_field"] == "aspect"
        [pair] = client.post("/predict", json={"texts": [[REVIEW, "screen"]]}).json()["records"]
        [record] = client.post(
            "/predict", json={"records": [{"id": 1, "text": REVIEW, "aspect": "screen"}]}
        ).json()["records"]
        assert record["id"] == 1 and record["scores"] == pytest.approx(pair["scores"])
        lone = client.post("/predict", json={"texts": [REVIEW]})
        assert lone.status_code == 422 and "texts.0: Input should be a valid tuple" in lone.json()["detail"]
        missing = client.post("/predict", json={"records": [{"text": REVIEW}]})
        assert missing.status_code == 422 and missing.json()["detail"].startswith("record 1: no 'aspect'")


@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_python_snippet_of_each_shapes_card_runs(runs: dict[str, Path], shape: str) -> None:
    """The card's bert-tasks and vanilla snippets, as written: a pair's input as a tuple and as
    {"text", "text_pair"}, multi-label's pipeline with top_k=None."""
    import contextlib
    import io
    import re

    text = (runs[shape] / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    assert len(blocks) == 2 and "pipeline(" in blocks[1]
    assert ("top_k=None" in blocks[1]) == (shape == "multilabel")
    assert ("--pair screen" in text) == (shape == "pairs")
    for block in blocks:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(block, "README.md", "exec"), {})
        assert (
            "'score'" in printed.getvalue()
            or "'value'" in printed.getvalue()
            or "'labels'" in printed.getvalue()
        )


@pytest.mark.parametrize("shape", ["multilabel", "regression"])
def test_prune_scores_the_heads_on_the_shapes_own_loss(
    runs: dict[str, Path], shape: str, tmp_path: Path
) -> None:
    """Head importance differentiates BCE (multi-label) and MSE (regression), not cross-entropy on class
    ids those labels are not; the pruned dir predicts."""
    out = prune("sentiment", runs[shape], "2", tmp_path / "pruned")
    record = json.loads((out / "pruning.json").read_text(encoding="utf-8"))
    assert record["heads"]["removed"] == 2
    assert sum(len(heads) for heads in record["pruned_heads"].values()) == 2
    assert all(score is None or score >= 0 for row in record["importance"][0] for score in row)
    assert len(Predictor(out).predict([REVIEW])) == 1


def test_pairs_in_memory_and_in_debug_data_are_judged_on_both_texts() -> None:
    from bert_tasks.config import load_recipe
    from bert_tasks.data.in_memory import records
    from bert_tasks.tasks.sentiment import SentimentTask

    task = SentimentTask(text_pair_column="aspect")
    cfg = load_recipe(None, ["text_pair_column=aspect"], task="sentiment")
    rows = [
        {"text": REVIEW, "aspect": aspect, "label": label}
        for aspect, label in [("screen", "neg"), ("battery", "pos")]
    ]
    raw = task.read_memory(records(rows, "train data (in memory)"), "train data (in memory)", cfg)
    assert raw["text_pair"] == ["screen", "battery"]
    profile = task.profile_split(raw)
    assert profile.keys == [f"{REVIEW} [SEP] screen", f"{REVIEW} [SEP] battery"]  # not one text twice


def test_regression_values_keep_their_precision_under_bf16(tiny_model: Path, tmp_path: Path) -> None:
    """Labels near 2,000: a bf16 output layer rounds them to a multiple of 8 (2,005.2 as 2,008); the
    head's last layer computes in float32, in training and in prediction, so bf16 moves a value by the
    encoder's rounding only."""
    texts = ["good", "bad", "fine", "awful", "great", "poor", "nice", "dull"]
    rows = [{"text": f"{texts[i % 8]} {texts[(i * 3) % 8]}", "label": 2000 + i % 11} for i in range(48)]
    cfg = tiny_config(
        "sentiment",
        tiny_model,
        tmp_path / "run",
        train_file=write_jsonl(tmp_path / "train.jsonl", rows[:40]),
        validation_file=write_jsonl(tmp_path / "validation.jsonl", rows[40:]),
        regression=True,
        mixed_precision="bf16",
    )
    with one_thread():
        run = train(cfg)
        fp32, bf16 = (
            [record["value"] for record in SentimentClassifier(run, mixed_precision=mp)(texts)]
            for mp in ("no", "bf16")
        )
    assert fp32 == pytest.approx(bf16, abs=0.1)
    assert not all(value % 8 == 0 for value in bf16)
