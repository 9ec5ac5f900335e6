"""`bert-tasks prune` on tiny trained runs: the dir it writes is a model dir like any other (predict,
evaluate, serve, int8, ONNX), it predicts what the unpruned model predicts with those heads masked, vanilla
transformers 5 loads it only through the documented lines, recovery trains through `train`, and mistakes
are one line that leaves nothing behind."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from fastapi.testclient import TestClient

from bert_tasks.cli import main
from bert_tasks.config import load_recipe
from bert_tasks.inference.onnx_export import export_onnx
from bert_tasks.inference.predictor import Predictor
from bert_tasks.inference.quantize import export_quantized
from bert_tasks.inference.serve_settings import ServeSettings
from bert_tasks.inference.server import create_app
from bert_tasks.model_card import vanilla_pruned_code
from bert_tasks.model_dir import load_finetuned
from bert_tasks.modeling.head_gates import gated_heads
from bert_tasks.pruning import prune
from tests.helpers import DATA, LONG_NER_TEXT, LONG_REVIEW, cli_error_line, read_conll, write_conll

#: Every test here prunes (and some recover or export) a tiny fine-tuned run: slow, on one thread.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("single_thread")]

TASKS = ("sentiment", "ner")


@pytest.fixture(scope="module")
def runs(sentiment_run: Path, ner_run: Path) -> dict[str, Path]:
    return {"sentiment": sentiment_run, "ner": ner_run}


@pytest.fixture(scope="module")
def pruned(runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """3 of the 8 heads removed in 2 steps; the sentiment one through the CLI."""
    root = tmp_path_factory.mktemp("pruned")
    out = {task: root / task for task in TASKS}
    argv = [
        "prune",
        "sentiment",
        "--model",
        str(runs["sentiment"]),
        "--heads",
        "3",
        "--out",
        str(out["sentiment"]),
    ]
    assert main([*argv, "steps=2"]) == 0
    prune("ner", runs["ner"], "3", out["ner"], ["steps=2"])
    return out


def texts(task: str) -> list[str]:
    """The validation texts and a long one (several windows at max_length=32)."""
    if task == "sentiment":
        rows = [json.loads(line) for line in DATA[task][1].read_text().splitlines() if line.strip()]
        return [row["text"] for row in rows] + [LONG_REVIEW]
    return [" ".join(word for word, _ in s) for s in read_conll(DATA[task][1])] + [LONG_NER_TEXT]


def record_of(out: Path) -> dict[str, Any]:
    return json.loads((out / "pruning.json").read_text())


def masks(model: torch.nn.Module, pruned_heads: dict[str, list[int]]) -> list[torch.Tensor]:
    """Gates of 0 at `pruned_heads` for the unpruned model."""
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    gates = [torch.ones(heads) for _ in range(layers)]
    for layer, gone in pruned_heads.items():
        gates[int(layer)][gone] = 0.0
    return gates


def assert_same_records(found: Any, want: Any) -> None:
    """Equal records, floats (scores) within 1e-4."""
    assert _close(found, want), (found, want)


def _close(found: Any, want: Any) -> bool:
    if isinstance(want, float):
        return found == pytest.approx(want, abs=1e-4)
    if isinstance(want, dict):
        return found.keys() == want.keys() and all(_close(found[k], want[k]) for k in want)
    if isinstance(want, list):
        return len(found) == len(want) and all(_close(f, w) for f, w in zip(found, want, strict=True))
    return found == want


def test_the_dir_records_what_went(pruned: dict[str, Path], runs: dict[str, Path]) -> None:
    for task in TASKS:
        out, record = pruned[task], record_of(pruned[task])
        config = json.loads((out / "config.json").read_text())
        source = json.loads((runs[task] / "config.json").read_text())
        assert config["pruned_heads"] == record["pruned_heads"]
        assert sum(map(len, config["pruned_heads"].values())) == 3
        assert all(len(heads) < 4 for heads in config["pruned_heads"].values()), "each layer keeps a head"
        assert config["bert_tasks"] == source["bert_tasks"]
        assert [step["heads_kept"] for step in record["steps"]] == [8, 7, 5]
        assert len(record["importance"]) == 2 and len(record["importance"][0]) == 2
        assert record["recovery"] is None
        assert (out / "pruning.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        metrics = json.loads((out / "metrics.json").read_text())
        assert metrics["validation"] == record["steps"][-1]["validation"]
        card = (out / "README.md").read_text()
        assert "3 of its 8 attention heads removed in 2 step(s)" in card
        assert "These lines rebuild them and load the weights" in card


@pytest.mark.parametrize("task", TASKS)
def test_it_predicts_what_the_unpruned_model_predicts_with_those_heads_masked(
    pruned: dict[str, Path], runs: dict[str, Path], task: str
) -> None:
    after, before = (
        Predictor(pruned[task], mixed_precision="no", progress=False),
        Predictor(runs[task], mixed_precision="no", progress=False),
    )
    raw = after.task.texts_to_raw(texts(task))
    with gated_heads(before.model, masks(before.model, record_of(pruned[task])["pruned_heads"])):
        want_logits = before.window_logits(raw)[1]
        want = before.records(texts(task))
    for found, expected in zip(after.window_logits(raw)[1], want_logits, strict=True):
        torch.testing.assert_close(torch.from_numpy(found), torch.from_numpy(expected), atol=1e-5, rtol=1e-4)
    assert_same_records(after.records(texts(task)), want)


@pytest.mark.parametrize("task", TASKS)
def test_vanilla_transformers_loads_it_through_the_documented_lines_only(
    pruned: dict[str, Path], task: str, padded_batch
) -> None:
    """transformers 5 keeps config.json's pruned_heads as a plain attribute and builds full-size attention:
    from_pretrained refuses the smaller weights; the card's lines rebuild the shapes (same logits)."""
    out = pruned[task]
    head = json.loads((out / "config.json").read_text())["architectures"][0]
    assert transformers.AutoConfig.from_pretrained(out).pruned_heads == record_of(out)["pruned_heads"]
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
        getattr(transformers, head).from_pretrained(out)
    namespace: dict[str, Any] = {}
    exec("\n".join(vanilla_pruned_code(head, str(out))), namespace)  # the card's own lines
    vanilla, ours = namespace["model"], load_finetuned(out).model
    assert (
        type(vanilla.base_model.encoder.layer[0].attention.self)
        is transformers.models.bert.modeling_bert.BertSelfAttention
    )
    with torch.no_grad():
        want, found = ours(**padded_batch).logits, vanilla(**padded_batch).logits
    real = padded_batch["attention_mask"].bool()
    if want.dim() == 3:
        want, found = want[real], found[real]
    torch.testing.assert_close(found, want, atol=1e-5, rtol=1e-4)
    card = (out / "README.md").read_text()
    assert "\n".join(vanilla_pruned_code(head, str(out))) in card


def test_evaluate_scores_what_pruning_recorded(pruned: dict[str, Path], tmp_path: Path, capsys) -> None:
    for task in TASKS:
        argv = ["evaluate", task, "--model", str(pruned[task]), "--data", str(DATA[task][1])]
        assert main([*argv, "--json", "--out", str(tmp_path / task)]) == 0
        metrics = json.loads(capsys.readouterr().out)
        recorded = record_of(pruned[task])
        final = recorded["steps"][-1]["validation"]
        assert metrics[recorded["metric"]] == pytest.approx(final[recorded["metric"]])


def test_it_serves(pruned: dict[str, Path]) -> None:
    out = pruned["sentiment"]
    with TestClient(create_app(ServeSettings(str(out), "sentiment"))) as client:
        answer = client.post("/predict", json={"texts": ["Loved it.", "Dull."]})
    assert answer.status_code == 200
    assert_same_records(
        answer.json()["records"], Predictor(out, progress=False).records(["Loved it.", "Dull."])
    )


@pytest.mark.parametrize("task", TASKS)
def test_it_exports_to_onnx_and_int8(pruned: dict[str, Path], task: str, tmp_path: Path) -> None:
    parity = export_onnx(pruned[task], tmp_path / "onnx", None, str(DATA[task][1]))
    assert parity.passed, parity
    torch_records = Predictor(pruned[task], mixed_precision="no", progress=False).records(texts(task))
    assert_same_records(
        Predictor(tmp_path / "onnx", mixed_precision="no", progress=False).records(texts(task)), torch_records
    )
    export_quantized(pruned[task], tmp_path / "int8")
    quantized = Predictor(tmp_path / "int8", mixed_precision="no", progress=False)
    assert quantized.quantized is not None
    assert len(quantized.records(texts(task))) == len(torch_records)
    card = (tmp_path / "int8" / "README.md").read_text()
    assert "with the lines below that rebuild its pruned heads" in card


def test_recovery_fine_tunes_through_train(
    runs: dict[str, Path], pruned: dict[str, Path], tmp_path: Path
) -> None:
    out = prune("sentiment", runs["sentiment"], "3", tmp_path / "recovered", ["steps=2", "recover_steps=2"])
    record, unrecovered = record_of(out), record_of(pruned["sentiment"])
    assert record["pruned_heads"] == unrecovered["pruned_heads"], (
        "the same heads: importance is deterministic"
    )
    assert record["steps"] == [
        {**s, "seconds": step["seconds"]}
        for s, step in zip(unrecovered["steps"], record["steps"], strict=True)
    ]
    recovery = record["recovery"]
    assert (recovery["steps"], recovery["warmup_ratio"]) == (2, 0.1)
    assert recovery["lr"] == pytest.approx(load_recipe(runs["sentiment"] / "recipe.yaml").lr / 5)
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [row["step"] for row in log if "loss" in row] == [1, 2]
    assert [row["step"] for row in log if "eval_accuracy" in row] == [0, 1, 2], "before, then 4 (here 2)"
    assert [e["step"] for e in recovery["evaluations"]] == [0, 1, 2]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["best_step"] == recovery["best_step"]
    assert recovery["validation"] == {k: v for k, v in metrics["validation"].items() if isinstance(v, float)}
    assert json.loads((out / "config.json").read_text())["pruned_heads"] == record["pruned_heads"]
    card = (out / "README.md").read_text()
    assert f"| recovery (2 updates, best at step {recovery['best_step']}) | 5 |" in card
    assert "Then 2 updates of recovery fine-tuning at lr" in card


def test_pruning_a_pruned_dir_goes_on_from_its_heads(pruned: dict[str, Path], tmp_path: Path) -> None:
    first = record_of(pruned["ner"])
    out = prune("ner", pruned["ner"], "2", tmp_path / "again")
    record = record_of(out)
    assert record["heads"] == {"before": 5, "removed": 2}
    before = {(int(layer), head) for layer, heads in first["pruned_heads"].items() for head in heads}
    after = {(int(layer), head) for layer, heads in record["pruned_heads"].items() for head in heads}
    assert before < after and len(after) == 5
    assert {
        (layer, head)
        for layer, row in enumerate(record["importance"][0])
        for head, score in enumerate(row)
        if score is None
    } == before


def test_mistakes_are_one_line_and_leave_nothing(runs: dict[str, Path], tmp_path: Path, capsys) -> None:
    model = ["--model", str(runs["ner"])]
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "mine.txt").write_text("keep me")
    line = cli_error_line(["prune", "ner", *model, "--heads", "2", "--out", str(taken)], capsys)
    assert "already exists and is not empty" in line
    assert (taken / "mine.txt").read_text() == "keep me"
    other = write_conll(tmp_path / "other.conll", [[("aspirin", "B-Drug"), ("helps", "O")]])
    out = tmp_path / "out"
    line = cli_error_line(
        ["prune", "ner", *model, "--heads", "2", "--out", str(out), f"validation_file={other}"], capsys
    )
    assert "other.conll: entity type 'Drug' never" in line and not out.exists()
    no_recipe = tmp_path / "no-recipe"
    shutil.copytree(runs["ner"], no_recipe)
    (no_recipe / "recipe.yaml").unlink()  # no training split to check the labels against: prune does
    argv = [
        "prune",
        "ner",
        "--model",
        str(no_recipe),
        "--heads",
        "2",
        "--out",
        str(out),
        f"validation_file={other}",
    ]
    line = cli_error_line(argv, capsys)
    assert "other.conll: label 'B-Drug' (first in example" in line and not out.exists()
    extra = [*read_conll(DATA["ner"][0]), [("aspirin", "B-Drug"), ("helps", "O")]]
    more_types = write_conll(tmp_path / "more-types.conll", extra)
    argv = [
        "prune",
        "ner",
        *model,
        "--heads",
        "2",
        "--out",
        str(out),
        f"train_file={more_types}",
        "recover_steps=2",
    ]
    line = cli_error_line(argv, capsys)
    assert "recover_steps=2: the training data's labels" in line and "the head would start fresh" in line
    assert not out.exists()
    not_ours = tmp_path / "plain-bert"
    shutil.copytree(runs["ner"], not_ours)
    config = json.loads((not_ours / "config.json").read_text())
    config.pop("bert_tasks")
    config["architectures"] = ["BertModel"]
    (not_ours / "config.json").write_text(json.dumps(config))
    line = cli_error_line(["prune", "ner", "--model", str(not_ours), "--heads", "0.5"], capsys)
    assert "not a fine-tuned model of a bert-tasks task" in line


def test_the_readme_shows_the_lines_every_card_holds() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    lines = vanilla_pruned_code("BertForSequenceClassification", "runs/sentiment-pruned-36")
    assert "\n".join(f"  {line}" if line else "" for line in lines) in readme
