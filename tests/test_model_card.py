"""The model card (README.md) of run and export dirs, and the recipe that records what ran.

The card's metadata is read back with huggingface_hub's own `ModelCard.load`, its numbers are compared
with metrics.json and hashlib, and the code it shows is executed on the tiny model dir it describes.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import platform
import re
import shutil
from dataclasses import replace
from pathlib import Path

import accelerate
import pytest
import torch
import transformers
from huggingface_hub import ModelCard

import bert_tasks
from bert_tasks.config import DEFAULT_MODEL, DEFAULT_MODEL_HUB_ID, load_recipe
from bert_tasks.data.splits import read_splits
from bert_tasks.inference.quantize import export_quantized
from bert_tasks.model_card import MODEL_CARD, DataSource, RunFacts, describe_data, library_versions, run_card
from bert_tasks.runtime import resolve_mixed_precision
from bert_tasks.tasks import get_task
from bert_tasks.training import claim_output_dir, train
from bert_tasks.training.output_dir import MANIFEST
from bert_tasks.training.run import Run
from tests.helpers import DATA, tiny_config

pytestmark = pytest.mark.usefixtures("single_thread")

PIPELINE_TAGS = {"sentiment": "text-classification", "ner": "token-classification"}


@pytest.fixture(params=["sentiment", "ner"])
def run(request: pytest.FixtureRequest) -> Path:
    """Each task's finished tiny run (shared, read-only)."""
    return request.getfixturevalue(f"{request.param}_run")


@pytest.fixture(scope="module")
def reproduced(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A run with `mixed_precision=auto` and a test split, and a second run from its saved recipe."""
    root = tmp_path_factory.mktemp("recipe")
    validation = DATA["sentiment"][1]
    cfg = tiny_config("sentiment", tiny_model, root / "first", mixed_precision="auto", test_file=validation)
    first = train(cfg)
    second = train(load_recipe(first / "recipe.yaml", [f"output_dir={root / 'second'}"], task="sentiment"))
    return first, second


def scalar_scores(metrics: dict) -> dict[tuple[str, str], float]:
    return {
        (split, key): value
        for split in ("validation", "test")
        for key, value in metrics.get(split, {}).items()
        if isinstance(value, int | float)
    }


def card_scores(card: ModelCard) -> dict[tuple[str, str], float]:
    return {(r.dataset_split, r.metric_type): r.metric_value for r in card.data.eval_results or []}


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


def test_the_card_metadata_parses_and_holds_every_score_of_metrics_json(run: Path) -> None:
    card = ModelCard.load(run / MODEL_CARD)
    metrics = json.loads((run / "metrics.json").read_text())
    task = json.loads((run / "config.json").read_text())["bert_tasks"]["task"]
    assert card.data.library_name == "transformers"
    assert card.data.pipeline_tag == PIPELINE_TAGS[task]
    assert {"bert-tasks", task} <= set(card.data.tags)
    assert card.data.base_model is None  # the tiny base is a local dir, which the Hub cannot name
    assert card_scores(card) == scalar_scores(metrics) and card_scores(card)
    assert card.data.model_name == run.name
    for (split, metric), value in scalar_scores(metrics).items():
        row = next(line for line in card.text.splitlines() if line.startswith(f"| {metric} |"))
        assert f"{value:.4f}" in row, (split, metric)


def test_the_card_names_each_data_file_with_its_size_and_sha256(run: Path) -> None:
    text = (run / MODEL_CARD).read_text(encoding="utf-8")
    recipe = load_recipe(run / "recipe.yaml")
    for split, key in (("train", "train_file"), ("validation", "validation_file")):
        path = Path(getattr(recipe, key))
        data = path.read_bytes()
        assert f"| {split} | `{path}` |" in text
        assert f"| {len(data)} | `{hashlib.sha256(data).hexdigest()}` |" in text


def test_card_and_recipe_record_the_library_versions(run: Path) -> None:
    text = (run / MODEL_CARD).read_text(encoding="utf-8")
    header = "".join(line for line in (run / "recipe.yaml").read_text().splitlines() if line.startswith("#"))
    for name, version in [
        ("python", platform.python_version()),
        ("bert-tasks", bert_tasks.__version__),
        ("torch", torch.__version__),
        ("transformers", transformers.__version__),
        ("accelerate", accelerate.__version__),
    ]:
        assert f"| {name} | {version} |" in text
        assert f"{name} {version}" in header


@pytest.mark.slow
def test_every_python_snippet_in_the_card_runs_on_the_model_dir(run: Path) -> None:
    """The bert-tasks snippet and the vanilla transformers `pipeline` one, executed as written."""
    blocks = python_blocks((run / MODEL_CARD).read_text(encoding="utf-8"))
    assert len(blocks) == 2 and "pipeline(" in blocks[1]
    id2label = json.loads((run / "config.json").read_text())["id2label"]
    names = {label.removeprefix("B-").removeprefix("I-") for label in id2label.values()} - {"O"}
    for block in blocks:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(block, str(run / MODEL_CARD), "exec"), {})
        assert any(repr(name) in printed.getvalue() for name in names) or printed.getvalue().strip() == "[]"


def test_the_ner_pipeline_snippet_reads_words_as_bert_tasks_does(ner_run: Path) -> None:
    """`first` aggregation (first sub-token per word, as bert-tasks trains) and the saved windows."""
    [_, vanilla] = python_blocks((ner_run / MODEL_CARD).read_text(encoding="utf-8"))
    assert "aggregation_strategy='first'" in vanilla and "stride=8" in vanilla
    assert "model_max_length=32" in vanilla


def test_the_card_is_in_the_manifest(run: Path) -> None:
    assert MODEL_CARD in json.loads((run / MANIFEST).read_text())["entries"]


@pytest.mark.slow
def test_the_recipe_records_the_precision_used_and_reruns_to_an_equal_config(
    reproduced: tuple[Path, Path],
) -> None:
    first, second = reproduced
    used = resolve_mixed_precision("auto")
    recorded = load_recipe(first / "recipe.yaml")
    assert recorded.mixed_precision == used != "auto"
    assert "mixed_precision: auto" not in (first / "recipe.yaml").read_text()
    # Saved, reloaded and run again: the same config but for where it was written.
    rerun = load_recipe(second / "recipe.yaml")
    assert rerun == replace(recorded, output_dir=str(second))
    assert load_recipe(second / "recipe.yaml") == rerun  # and it reloads to an equal Config
    metrics = json.loads((second / "metrics.json").read_text())
    assert card_scores(ModelCard.load(second / MODEL_CARD)) == scalar_scores(metrics)


@pytest.mark.slow
def test_the_card_says_which_split_selected_the_model_and_which_is_held_out(
    reproduced: tuple[Path, Path],
) -> None:
    first, _ = reproduced
    card = ModelCard.load(first / MODEL_CARD)
    assert {split for split, _ in card_scores(card)} == {"validation", "test"}
    assert "**validation**: used for model selection" in card.text
    assert "**test**: held out" in card.text
    assert "| test |" in card.text  # the test file is listed with its hash too


@pytest.mark.slow
def test_a_users_readme_added_to_the_run_dir_is_kept(
    tiny_model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A README.md the run did not write (e.g. notes added while it trains) is never replaced."""
    cfg = tiny_config("sentiment", tiny_model, tmp_path / "run", max_steps=1)
    task = get_task(cfg)
    output = claim_output_dir(cfg)
    run = Run.setup(cfg, task, read_splits(task, cfg), output)
    notes = output.path / MODEL_CARD
    notes.write_text("my notes on this run\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING, "bert_tasks"):
        run.loop()
        run.finish()
    output.release()
    assert notes.read_text(encoding="utf-8") == "my notes on this run\n"
    assert f"holds {MODEL_CARD}, which no bert-tasks run wrote: kept it" in caplog.text
    assert MODEL_CARD not in json.loads((output.path / MANIFEST).read_text())["entries"]
    assert (output.path / "metrics.json").is_file() and not (output.path / ".model.tmp").exists()


def test_the_export_card_names_its_source_and_claims_no_scores(sentiment_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "int8"
    export_quantized(sentiment_run, out)
    card = ModelCard.load(out / MODEL_CARD)
    assert {"quantized", "int8"} <= set(card.data.tags)
    assert card.data.pipeline_tag == "text-classification"
    assert not card.data.eval_results  # measured on the fp32 source, not on this copy
    assert f"An INT8 dynamic-quantized copy of the model `{sentiment_run}`" in card.text
    assert "## The source model's card" in card.text
    source = ModelCard.load(sentiment_run / MODEL_CARD)
    assert source.text.split("## Data", 1)[1].split("## Scores")[0] in card.text  # its data, hashes and all
    vanilla = next(block for block in python_blocks(card.text) if "pipeline(" in block)
    assert repr(str(out)) in vanilla
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        exec(compile(vanilla, str(out / MODEL_CARD), "exec"), {})
    assert "positive" in printed.getvalue() or "negative" in printed.getvalue()


def test_an_export_of_a_dir_whose_readme_is_no_card_gets_a_card_of_its_own(
    sentiment_run: Path, tmp_path: Path
) -> None:
    """A dir fine-tuned elsewhere may hold any README.md: it stays; the export's card stands alone."""
    source = shutil.copytree(sentiment_run, tmp_path / "source")
    (source / MODEL_CARD).write_text("---\n- not a mapping\n---\nnotes\n", encoding="utf-8")
    export_quantized(source, tmp_path / "int8")
    card = ModelCard.load(tmp_path / "int8" / MODEL_CARD)
    assert card.data.pipeline_tag == "text-classification" and "quantized" in card.data.tags
    assert "The source dir has no model card in its README.md" in card.text
    assert (source / MODEL_CARD).read_text(encoding="utf-8") == "---\n- not a mapping\n---\nnotes\n"


def test_a_card_for_the_bundled_base_and_a_hub_dataset(tmp_path: Path) -> None:
    """Built from facts alone: the bundled base's hub id and its general-domain limit, a hub data set."""
    cfg = load_recipe(None, ["dataset=ncbi_disease", f"output_dir={tmp_path}"], task="ner")
    assert cfg.model == DEFAULT_MODEL
    labels = ["O", "B-Disease", "I-Disease"]
    data = [
        DataSource(split, rows, hub_dataset="ncbi_disease")
        for split, rows in [("train", 5433), ("test", 940)]
    ]
    metrics = {"best_step": None, "metric_for_best": "f1", "test": {"f1": 0.8, "per_type": {}}}
    facts = RunFacts(tmp_path, cfg, labels, data, metrics, library_versions())
    card = ModelCard(str(run_card(facts, get_task(cfg))))
    assert card.data.base_model == DEFAULT_MODEL_HUB_ID
    assert card.data.datasets == ["ncbi_disease"]
    assert card_scores(card) == {("test", "f1"): 0.8}
    assert "general-domain English sentence-transformers MiniLM" in card.text
    assert "hub dataset `ncbi_disease`, split `train` | 5433" in card.text
    assert "research tool" in card.text and "Disease" in card.text
    assert "the weights of the last step" in card.text


def test_describe_data_notes_a_row_cap(tmp_path: Path, tiny_model: Path) -> None:
    cfg = tiny_config("sentiment", tiny_model, tmp_path / "unused", max_train_samples=5)
    train_source, validation_source = describe_data(cfg, read_splits(get_task(cfg), cfg))
    assert (train_source.rows, train_source.limit) == (5, 5)
    assert validation_source.limit is None
    assert train_source.sha256 == hashlib.sha256(DATA["sentiment"][0].read_bytes()).hexdigest()
