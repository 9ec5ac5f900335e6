"""attention=causal end to end: trained and saved so, predicted, exported and drawn so; old dirs unchanged."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from bert_tasks.cli import main
from bert_tasks.inference.onnx_export import export_onnx
from bert_tasks.inference.predictor import Predictor
from bert_tasks.insight.attention_maps import attention_maps
from bert_tasks.model_dir import ModelPolicy, load_finetuned, read_policy
from bert_tasks.modeling.load import load_model
from bert_tasks.modeling.patch import attention_direction
from tests.helpers import fast_overrides

#: Every test here trains a tiny causal run through the CLI or exports it.
pytestmark = pytest.mark.slow

TEXTS = ["I loved every minute of it.", "Dull, slow and far too long; I left early."]


@pytest.fixture(scope="module")
def causal_run(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory, single_thread: None) -> Path:
    out = tmp_path_factory.mktemp("causal") / "sentiment"
    assert (
        main(["finetune", "sentiment", *fast_overrides("sentiment", tiny_model, out, attention="causal")])
        == 0
    )
    return out


def test_a_causal_run_records_its_direction_and_predicts_with_it(
    causal_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = json.loads((causal_run / "config.json").read_text())["bert_tasks"]
    assert policy["attention"] == "causal"
    assert read_policy(causal_run).attention == "causal"
    assert yaml.safe_load((causal_run / "recipe.yaml").read_text())["attention"] == "causal"
    assert "vanilla transformers knows no attention direction" in (causal_run / "README.md").read_text()
    assert attention_direction(load_finetuned(causal_run).model) == "causal"
    capsys.readouterr()
    assert main(["predict", "sentiment", "--json", "--model", str(causal_run), *TEXTS]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert printed == Predictor(causal_run).records(TEXTS)


def test_vanilla_transformers_runs_a_causal_dir_bidirectionally(causal_run: Path, padded_batch) -> None:
    """What the README says: the dir loads in plain transformers, which knows no direction."""
    from transformers import AutoModelForSequenceClassification

    vanilla = AutoModelForSequenceClassification.from_pretrained(causal_run).eval()
    bidirectional = load_model(causal_run, "sentiment", attention="bidirectional").eval()
    causal = load_model(causal_run, "sentiment").eval()  # the direction saved with it
    with torch.no_grad():
        plain = vanilla(**padded_batch).logits
        torch.testing.assert_close(bidirectional(**padded_batch).logits, plain, atol=1e-5, rtol=1e-5)
        assert not torch.allclose(causal(**padded_batch).logits, plain, atol=1e-4)


def test_the_heatmap_of_a_causal_model_is_lower_triangular(causal_run: Path, tmp_path: Path) -> None:
    maps = attention_maps("The patient was given aspirin for the headache.", causal_run)
    upper = torch.ones(maps.probs.shape[-2:], dtype=torch.bool).triu(1)
    assert maps.probs[..., upper].abs().max() == 0
    assert bool((maps.probs.diagonal(dim1=-2, dim2=-1) > 0).all())
    torch.testing.assert_close(maps.probs.sum(-1), torch.ones(maps.probs.shape[:-1]))
    out = tmp_path / "causal.png"
    assert main(["attention", "--model", str(causal_run), "--out", str(out), "A short text."]) == 0
    assert out.stat().st_size > 0


def test_a_dir_without_the_key_is_bidirectional(sentiment_run: Path, tmp_path: Path) -> None:
    """Older dirs (and bidirectional ones: the key is written only when it is not the default)."""
    policy = json.loads((sentiment_run / "config.json").read_text())["bert_tasks"]
    assert "attention" not in policy
    assert read_policy(sentiment_run).attention == "bidirectional"
    assert attention_direction(load_finetuned(sentiment_run).model) == "bidirectional"
    marked = shutil.copytree(sentiment_run, tmp_path / "marked")
    config = json.loads((marked / "config.json").read_text())
    config["bert_tasks"]["attention"] = "right_to_left"
    (marked / "config.json").write_text(json.dumps(config))
    assert attention_direction(load_finetuned(marked).model) == "right_to_left"
    policy = read_policy(marked)
    assert policy.attention == "right_to_left"
    assert ModelPolicy.from_json(policy.to_json(), "x") == policy


def test_the_onnx_export_of_a_causal_dir_keeps_its_mask(causal_run: Path, tmp_path: Path) -> None:
    """The direction traces into the graph; the export's own parity check compares it with torch."""
    out = tmp_path / "onnx"
    parity = export_onnx(causal_run, out)
    assert parity.passed, parity
    assert read_policy(out).attention == "causal"
    exported = Predictor(out).predict(TEXTS)
    expected = Predictor(causal_run, mixed_precision="no").predict(TEXTS)
    assert [p["label"] for p in exported] == [p["label"] for p in expected]
    for got, want in zip(exported, expected, strict=True):
        assert got["score"] == pytest.approx(want["score"], abs=1e-4)
