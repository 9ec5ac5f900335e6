"""`bert-tasks export --format onnx`: parity at export, prediction and evaluation through onnxruntime.

On the tiny random BERT runs of both tasks (conftest), each exported once in fp32 and once in int8.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from bert_tasks.cli import main
from bert_tasks.errors import BertTasksError
from bert_tasks.inference import onnx_export
from bert_tasks.inference.onnx_backend import ONNX_FILE
from bert_tasks.inference.onnx_export import MIN_AGREEMENT, Parity, export_onnx
from bert_tasks.inference.predictor import Predictor
from bert_tasks.model_dir import ModelPolicy, load_finetuned, read_policy
from tests.helpers import DATA, LONG_NER_TEXT, LONG_REVIEW, read_conll

#: Every test here exports a model to ONNX and runs its parity check (seconds each).
pytestmark = pytest.mark.slow

TASKS = ("sentiment", "ner")
METHODS = (None, "int8")


@pytest.fixture(scope="module")
def runs(sentiment_run: Path, ner_run: Path) -> dict[str, Path]:
    return {"sentiment": sentiment_run, "ner": ner_run}


@pytest.fixture(scope="module")
def exports(runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[tuple, tuple]:
    """(task, method) -> (export dir, parity); the fp32 sentiment one through the CLI."""
    root = tmp_path_factory.mktemp("onnx")
    found = {}
    for task in TASKS:
        for method in METHODS:
            out = root / f"{task}-{method or 'fp32'}"
            if (task, method) == ("sentiment", None):
                check = ["--check", str(DATA[task][1])]  # the fixture's own texts, not the demo's
                assert main(["export", "--format", "onnx", *check, "--model", str(runs[task]), str(out)]) == 0
                parity = Parity.measure(*_logits(runs[task], out, DATA[task][1]), None)
            else:
                parity = export_onnx(runs[task], out, method)
            found[task, method] = (out, parity)
    return found


def _logits(model_dir: Path, export_dir: Path, data: Path) -> tuple[list, list]:
    """Window logits of the torch dir and of its export on a labelled file (the same encoding)."""
    torch_predictor, onnx_predictor = Predictor(model_dir, mixed_precision="no"), Predictor(export_dir)
    raw = torch_predictor.task.read_file(str(data), _reader_config(torch_predictor.task.name))
    return torch_predictor.window_logits(raw)[1], onnx_predictor.window_logits(raw)[1]


def _reader_config(task: str) -> object:
    from bert_tasks.config import load_recipe

    return load_recipe(None, [], task)


def _texts(task: str) -> list[str]:
    """Fixture texts with a long one (several windows at max_length=32)."""
    if task == "sentiment":
        rows = [json.loads(line) for line in DATA[task][1].read_text().splitlines() if line.strip()]
        return [row["text"] for row in rows] + [LONG_REVIEW]
    return [" ".join(word for word, _ in sentence) for sentence in read_conll(DATA[task][1])] + [
        LONG_NER_TEXT
    ]


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("method", METHODS)
def test_the_export_passes_its_parity_check_and_says_what_it_holds(
    exports: dict[tuple, tuple], task: str, method: str | None
) -> None:
    out, parity = exports[task, method]
    assert parity.passed and parity.close and parity.agreement >= MIN_AGREEMENT
    if method is None:
        assert parity.max_difference <= 1e-4
    policy = read_policy(out, task)
    assert (policy.backend, policy.quantize) == ("onnx", method)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["README.md", "config.json", ONNX_FILE, "recipe.yaml", "tokenizer.json", "tokenizer_config.json"]
    )
    card = (out / "README.md").read_text()
    assert "onnx" in card and "checked against the torch model" in card
    graph = onnx.load(str(out / ONNX_FILE))
    integer = [node for node in graph.graph.node if node.op_type == "MatMulInteger"]
    # int8: each of the 2 layers' qkv, attention output, intermediate and output matmuls; attention's
    # own matmuls and the head stay float.
    assert len(integer) == (8 if method else 0)
    int8_bytes = sum(
        t.raw_data.__len__() for t in graph.graph.initializer if t.data_type == onnx.TensorProto.INT8
    )
    assert (int8_bytes > 0) == (method is not None)


@pytest.mark.parametrize("task", TASKS)
def test_fp32_export_predicts_what_the_torch_dir_predicts(
    runs: dict[str, Path], exports: dict[tuple, tuple], task: str
) -> None:
    texts = _texts(task)
    expected = Predictor(runs[task], mixed_precision="no").predict(texts)
    found = Predictor(exports[task, None][0]).predict(texts)
    assert len(found) == len(texts)
    for want, got in zip(expected, found, strict=True):
        if task == "sentiment":
            assert got["label"] == want["label"]
            assert got["score"] == pytest.approx(want["score"], abs=1e-5)
        else:
            assert [(e["text"], e["label"], e["start"], e["end"]) for e in got] == [
                (e["text"], e["label"], e["start"], e["end"]) for e in want
            ]
            assert [e["score"] for e in got] == pytest.approx([e["score"] for e in want], abs=1e-5)


@pytest.mark.parametrize("task", TASKS)
def test_int8_export_keeps_the_labels_of_the_torch_dir(
    runs: dict[str, Path], exports: dict[tuple, tuple], task: str
) -> None:
    expected, found = _logits(runs[task], exports[task, "int8"][0], DATA[task][1])
    reference = np.concatenate([np.atleast_2d(x) for x in expected]).argmax(-1)
    int8 = np.concatenate([np.atleast_2d(x) for x in found]).argmax(-1)
    assert (reference == int8).mean() >= MIN_AGREEMENT


@pytest.mark.parametrize("task", TASKS)
def test_evaluate_through_the_export_scores_as_the_torch_dir(
    runs: dict[str, Path],
    exports: dict[tuple, tuple],
    task: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
) -> None:
    scores = {}
    for name, model in [("torch", runs[task]), ("onnx", exports[task, None][0])]:
        args = ["evaluate", task, "--model", str(model), "--data", str(DATA[task][1]), "--json"]
        assert main([*args, "--out", str(tmp_path / name)]) == 0
        scores[name] = json.loads(capsys.readouterr().out)
    metric = "accuracy" if task == "sentiment" else "f1"
    assert scores["onnx"][metric] == pytest.approx(scores["torch"][metric])


def test_a_failed_parity_check_is_one_line_and_leaves_no_dir(
    runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(onnx_export.TOLERANCES, None, (-1.0, 0.0))  # no export can be this close
    out = tmp_path / "new" / "export"
    with pytest.raises(BertTasksError, match="does not match the torch model") as error:
        export_onnx(runs["sentiment"], out)
    assert "\n" not in str(error.value)
    assert not (tmp_path / "new").exists()


def test_a_check_file_that_is_not_there_is_one_line_before_the_model_loads(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "export"
    argv = ["export", "--format", "onnx", "--check", str(tmp_path / "gone.jsonl"), "--model"]
    assert main([*argv, str(runs["sentiment"]), str(out)]) == 1
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and "gone.jsonl" in line and "not found" in line
    assert not out.exists()


def test_a_damaged_graph_is_one_line(
    exports: dict[tuple, tuple], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    damaged = tmp_path / "damaged"
    shutil.copytree(exports["sentiment", None][0], damaged)
    graph = damaged / ONNX_FILE
    graph.write_bytes(graph.read_bytes()[: graph.stat().st_size // 3])  # an interrupted copy
    assert main(["predict", "sentiment", "--model", str(damaged), "Loved it."]) == 1
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and f"{graph}: not a loadable ONNX model" in line
    graph.unlink()
    with pytest.raises(BertTasksError, match=r"model\.onnx: no such file"):
        Predictor(damaged)


def test_the_missing_extra_is_named(
    runs: dict[str, Path], exports: dict[tuple, tuple], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # what an interpreter without it imports
    with pytest.raises(BertTasksError, match=r"package onnxruntime.*pip install 'bert-tasks\[onnx\]'"):
        Predictor(exports["sentiment", None][0])
    with pytest.raises(BertTasksError, match=r"export --format onnx needs .* onnxruntime"):
        export_onnx(runs["sentiment"], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_an_export_runs_as_exported_and_is_no_source_to_load(exports: dict[tuple, tuple]) -> None:
    out = exports["sentiment", "int8"][0]
    with pytest.raises(BertTasksError, match="runs as exported, not with quantize=int8"):
        Predictor(out, quantize="int8")
    with pytest.raises(BertTasksError, match="holds a onnx export, which only predict and evaluate run"):
        load_finetuned(out)


def test_the_policy_backend_is_checked() -> None:
    data = {"task": "sentiment", "max_length": 32, "stride": 8}
    assert ModelPolicy.from_json(data, "c.json").backend == "torch"
    assert "backend" not in ModelPolicy.from_json(data, "c.json").to_json()  # older versions read it
    assert ModelPolicy.from_json({**data, "backend": "onnx"}, "c.json").to_json()["backend"] == "onnx"
    with pytest.raises(
        BertTasksError, match=r"c.json: 'bert_tasks.backend' is 'tflite', not one of torch, onnx"
    ):
        ModelPolicy.from_json({**data, "backend": "tflite"}, "c.json")


#: Predicts one text through the CLI in a fresh interpreter and lists the heavy modules it imported.
PROBE = """
import contextlib, io, json, sys
from bert_tasks.cli import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    status = main(["predict", sys.argv[1], "--model", sys.argv[2], "--json", "Aspirin eased the headache."])
heavy = ("torch", "transformers.modeling_utils", "transformers.models.bert.modeling_bert", "accelerate")
print(json.dumps({"status": status, "out": out.getvalue(), "loaded": [m for m in heavy if m in sys.modules]}))
"""


@pytest.mark.parametrize("task", TASKS)
def test_predicting_with_an_export_imports_no_torch(exports: dict[tuple, tuple], task: str) -> None:
    out = exports[task, "int8"][0]
    result = subprocess.run(
        [sys.executable, "-c", PROBE, task, str(out)], capture_output=True, text=True, timeout=120, check=True
    )
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["status"] == 0 and report["loaded"] == []
    assert json.loads(report["out"])["text"] == "Aspirin eased the headache."
