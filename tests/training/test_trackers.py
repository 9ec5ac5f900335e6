"""Scores as the run trains, its closing summary, and `report_to` trackers through Accelerate.

TensorBoard is the tracker tested for real (it writes files, needs no network, and is in the dev extra):
its event files are read back with TensorBoard's own EventAccumulator and held against train_log.jsonl.
wandb and MLflow go through the same Accelerate calls; here only their absence is tested (one line,
before torch), since neither can run without an account or a server in a test.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from bert_tasks.cli import main
from bert_tasks.config import load_recipe
from bert_tasks.errors import BertTasksError
from bert_tasks.training import train
from bert_tasks.training.output_dir import MANIFEST
from bert_tasks.training.trackers import installed, resolve_trackers, tracker_scalars
from tests.helpers import fast_overrides, read_log, tiny_config

pytestmark = pytest.mark.usefixtures("single_thread")

#: A checkpoint every 2 of the 5 updates, all kept: a finished run that can be cut back and resumed
#: (evaluated at the end only, so its checkpoints need no best/, which a finished run has removed).
CHECKPOINTED = {"report_to": "tensorboard", "save_every": 2, "keep_checkpoints": 5}


def events(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag of the run's TensorBoard logs as (step, value) pairs, as TensorBoard shows them."""
    accumulator = EventAccumulator(str(run_dir / "logs" / "bert-tasks"))
    accumulator.Reload()
    return {
        tag: [(event.step, event.value) for event in accumulator.Scalars(tag)]
        for tag in accumulator.Tags()["scalars"]
    }


def logged(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """train_log.jsonl as the same (step, value) pairs per tracker tag."""
    series: dict[str, list[tuple[int, float]]] = {}
    for record in read_log(run_dir):
        for tag, value in tracker_scalars(record).items():
            series.setdefault(tag, []).append((record["step"], value))
    return series


def assert_same_scalars(run_dir: Path) -> None:
    tensorboard, log = events(run_dir), logged(run_dir)
    assert tensorboard.keys() == log.keys()
    for tag, pairs in log.items():
        assert [step for step, _ in tensorboard[tag]] == [step for step, _ in pairs], tag
        assert [value for _, value in tensorboard[tag]] == pytest.approx([value for _, value in pairs]), tag


@pytest.fixture(scope="module")
def tensorboard_run(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("trackers") / "sentiment"
    return train(tiny_config("sentiment", tiny_model, out, **CHECKPOINTED))


def cut_back(run_dir: Path, to: Path) -> Path:
    """A copy of a finished run as if it had been killed after its step-2 checkpoint."""
    out = shutil.copytree(run_dir, to)
    shutil.rmtree(out / "checkpoints" / "step-00000004")
    for name in ("metrics.json", "model.safetensors"):
        (out / name).unlink()
    return out


@pytest.mark.slow
def test_tensorboard_holds_the_train_log_scalars_at_the_same_steps(tensorboard_run: Path) -> None:
    """loss, lr, grad_norm, examples/s, epoch and every eval score: the same values at the same steps."""
    tags = events(tensorboard_run).keys()
    assert {"train/loss", "train/lr", "train/grad_norm", "train/examples_per_s"} <= tags
    assert {"eval/accuracy", "eval/macro_f1"} <= tags
    assert [step for step, _ in events(tensorboard_run)["train/loss"]] == [1, 2, 3, 4, 5]
    assert [step for step, _ in events(tensorboard_run)["eval/accuracy"]] == [5]
    assert_same_scalars(tensorboard_run)


@pytest.mark.slow
def test_the_config_goes_to_the_trackers_as_scalar_hyperparameters(tensorboard_run: Path) -> None:
    """As the run used it (report_to resolved), scalars only: unset keys are left out."""
    (params_file,) = (tensorboard_run / "logs" / "bert-tasks").glob("*/hparams.yml")
    params = yaml.safe_load(params_file.read_text())
    recipe = load_recipe(tensorboard_run / "recipe.yaml")
    assert params["task"] == "sentiment" and params["report_to"] == "tensorboard"
    assert params["lr"] == recipe.lr
    assert params["save_every"] == 2 and params["resume"] is False
    assert "label_names" not in params  # none: not a value a tracker could take
    assert all(isinstance(value, str | int | float | bool) for value in params.values())


@pytest.mark.slow
def test_logs_are_recorded_in_the_manifest_so_overwrite_replaces_them(
    tensorboard_run: Path, tiny_model: Path, tmp_path: Path
) -> None:
    manifest = json.loads((tensorboard_run / MANIFEST).read_text())
    assert "logs" in manifest["entries"]
    out = shutil.copytree(tensorboard_run, tmp_path / "again")
    before = sorted((out / "logs").rglob("events.out.tfevents.*"))
    train(tiny_config("sentiment", tiny_model, out, overwrite="true", report_to="tensorboard"))
    after = sorted((out / "logs").rglob("events.out.tfevents.*"))
    assert len(after) == 2 and not set(before) & set(after)  # the new run's scalars and hparams, only
    assert_same_scalars(out)


@pytest.mark.slow
def test_a_resumed_run_appends_without_repeating_the_steps_it_logs_again(
    tensorboard_run: Path, tiny_model: Path, tmp_path: Path
) -> None:
    """The resumed run writes a new event file; TensorBoard shows each step once (purge_step), with the
    resumed values, and the hyper-parameters once."""
    out = cut_back(tensorboard_run, tmp_path / "resumed")
    time.sleep(1)  # TensorBoard orders event files by name, which holds the second they were opened
    train(tiny_config("sentiment", tiny_model, out, resume="true", **CHECKPOINTED))
    logs = out / "logs" / "bert-tasks"
    assert len(list(logs.glob("events.out.tfevents.*"))) == 2
    assert len(list(logs.glob("*/events.out.tfevents.*"))) == 1  # hparams: the original run's
    assert [step for step, _ in events(out)["train/loss"]] == [1, 2, 3, 4, 5]
    assert_same_scalars(out)


@pytest.mark.slow
def test_a_resumed_dir_holding_a_logs_dir_of_the_users_is_never_written_into(
    tensorboard_run: Path, tiny_model: Path, tmp_path: Path
) -> None:
    out = cut_back(tensorboard_run, tmp_path / "users-logs")
    shutil.rmtree(out / "logs")
    manifest = json.loads((out / MANIFEST).read_text())
    manifest["entries"].remove("logs")  # as a run made with report_to=none left it
    (out / MANIFEST).write_text(json.dumps(manifest))
    (out / "logs").mkdir()
    (out / "logs" / "notes.txt").write_text("mine")
    with pytest.raises(BertTasksError) as error:
        train(tiny_config("sentiment", tiny_model, out, resume="true", **CHECKPOINTED))
    assert str(error.value) == (
        f"output_dir {out} holds logs, which no bert-tasks run wrote, and tensorboard would write there; "
        "move it elsewhere, or pass report_to=none (or a tracker that writes elsewhere)"
    )
    assert [path.name for path in (out / "logs").iterdir()] == ["notes.txt"]


def test_report_to_none_writes_no_logs(sentiment_run: Path) -> None:
    assert not (sentiment_run / "logs").exists()
    assert yaml.safe_load((sentiment_run / "recipe.yaml").read_text())["report_to"] == "none"


def test_auto_is_tensorboard_when_installed_and_none_without_it(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_trackers("auto") == ("tensorboard",)
    for module in ("tensorboard", "tensorboardX"):
        monkeypatch.setitem(sys.modules, module, None)  # find_spec answers None: as if not installed
    assert resolve_trackers("auto") == ()
    assert resolve_trackers("all") == tuple(name for name in ("wandb", "mlflow") if installed(name))


#: Runs `main(argv)` with the named modules hidden (as if not installed); prints status, stderr, and
#: the heavy modules imported by then.
HIDING_PROBE = """
import contextlib, io, json, sys
for name in json.loads(sys.argv[2]):
    sys.modules[name] = None
from bert_tasks.cli import main
with contextlib.redirect_stderr(io.StringIO()) as err:
    status = main(json.loads(sys.argv[1]))
loaded = [name for name in ("torch", "transformers", "accelerate", "datasets") if name in sys.modules]
print(json.dumps({"status": status, "stderr": err.getvalue(), "loaded": loaded}))
"""


@pytest.mark.parametrize(
    ("report_to", "hidden", "message"),
    [
        (
            "tensorbord",
            [],
            "bert-tasks: error: bad config: report_to='tensorbord', must be one of auto, all, none, or a "
            "comma list of tensorboard, wandb, mlflow (on the command line)",
        ),
        (
            "tensorboard,wandb",
            ["wandb"],
            "bert-tasks: error: report_to=tensorboard,wandb: wandb is not installed; pip install wandb, or "
            "drop it from report_to (report_to=none reports to no tracker)",
        ),
        (
            "mlflow",
            ["mlflow"],
            "bert-tasks: error: report_to=mlflow: mlflow is not installed; pip install mlflow, or drop it "
            "from report_to (report_to=none reports to no tracker)",
        ),
    ],
)
@pytest.mark.slow
def test_an_unknown_or_missing_tracker_is_one_line_before_torch(
    tmp_path: Path, report_to: str, hidden: list[str], message: str
) -> None:
    argv = ["finetune", "sentiment", f"report_to={report_to}", f"output_dir={tmp_path / 'out'}"]
    result = subprocess.run(
        [sys.executable, "-c", HIDING_PROBE, json.dumps(argv), json.dumps(hidden)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        check=True,
    )
    answer = json.loads(result.stdout)
    assert (answer["status"], answer["stderr"].strip(), answer["loaded"]) == (1, message, [])
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_each_evaluation_is_one_line_and_the_summary_names_commands_that_run(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On stderr, once each (stdout holds results only); the printed predict and evaluate commands work."""
    out = tmp_path / "run dir"  # a space: the commands must quote it
    assert main(["finetune", "sentiment", *fast_overrides("sentiment", tiny_model, out, eval_every=2)]) == 0
    printed = capsys.readouterr()
    assert printed.out == ""
    lines = printed.err.splitlines()
    evaluations = [line for line in lines if line.startswith("step ")]
    pattern = (
        r"step (\d)/5 \(epoch (\d\.\d\d)\) \| validation accuracy \d\.\d{4}, macro_f1 \d\.\d{4} \| "
        r"best accuracy \d\.\d{4} \(step (\d)\)"
    )
    matches = [re.fullmatch(pattern, line) for line in evaluations]
    assert all(matches), evaluations
    assert [(m[1], m[2]) for m in matches] == [("2", "0.40"), ("4", "0.80"), ("5", "1.00")]
    metrics = json.loads((out / "metrics.json").read_text())
    assert matches[-1][3] == str(metrics["best_step"])

    summary = lines[lines.index(evaluations[-1]) + 1 :]
    best = metrics["validation"]["accuracy"]
    assert f"best accuracy {best:.4f} at step {metrics['best_step']}" in summary
    assert f"model saved to {out}" in summary
    predict = next(line for line in summary if line.startswith("next: ")).removeprefix("next: ")
    evaluate = summary[summary.index(f"next: {predict}") + 1].strip()
    assert shlex.split(predict) == [
        *["bert-tasks", "predict", "sentiment", "--model", str(out), "your text here"]
    ]
    validation_file = load_recipe(out / "recipe.yaml").validation_file
    assert shlex.split(evaluate) == [
        *["bert-tasks", "evaluate", "sentiment", "--model", str(out), "--data", validation_file]
    ]
    assert main(shlex.split(predict)[1:]) == 0
    assert "your text here" in capsys.readouterr().out
    assert main(shlex.split(evaluate)[1:]) == 0
    assert "accuracy" in capsys.readouterr().out
