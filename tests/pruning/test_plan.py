"""The pruning plan: every request checked in one line before torch (or data) loads, the step sizes, and the
rule that picks the heads (lowest first, never a layer's last head)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from bert_tasks.errors import BertTasksError
from bert_tasks.pruning.plan import choose_heads, plan_pruning, recovery_config, step_sizes
from tests.helpers import DATA
from tests.test_cli_startup import probe

#: The tiny runs have 2 layers x 4 heads: at most 6 can go.
BAD_REQUESTS = [
    ("1.5", [], r"--heads 1\.5: give the share of heads to remove, a fraction between 0 and 1"),
    ("1.0", [], "a fraction between 0 and 1"),
    ("0", [], "remove at least one head"),
    ("-2", [], "remove at least one head"),
    ("nan", [], "a fraction between 0 and 1"),
    ("half", [], "a fraction between 0 and 1"),
    ("0.01", [], r"--heads 0\.01 of 8 heads is less than one head"),
    ("7", [], r"the model has 8 heads in 2 layers and each layer keeps one, so at most 6 can go \(7 asked\)"),
    ("0.9", [], r"at most 6 can go \(7 asked\)"),
    ("4", ["steps=5"], r"steps=5: each step removes at least one head, and 4 go"),
    ("4", ["steps=0"], r"steps='0' on the command line: expected a whole number >= 1"),
    ("4", ["recover_steps=-1"], r"recover_steps='-1' on the command line: expected a whole number >= 0"),
    ("4", ["steps=²"], r"steps='²' on the command line: expected a whole number >= 1"),
    ("4", ["recover_steps=²"], r"recover_steps='²' on the command line: expected a whole number >= 0"),
    ("4", ["steps=1.5"], r"steps='1.5' on the command line: expected a whole number >= 1"),
    ("4", ["model=x"], "model= on the command line is prune's to set: give the model to prune as --model"),
    ("4", ["output_dir=x"], "give where the pruned model goes as --out DIR"),
    ("4", ["epochs=2"], "the recovery fine-tuning runs recover_steps=S updates"),
    ("4", ["max_length=64"], "prune keeps the model's windows and decoding"),
    (
        "4",
        ["prune_heads=[0:1]"],
        r"prune_heads= on the command line is prune's to set: prune chooses the heads",
    ),
    ("4", ["recover_steps=2", "eval_at_start=false"], "recovery always scores the pruned model first"),
    (
        "4",
        ["lr=1e-4"],
        r"lr= on the command line sets the recovery fine-tuning, which runs only with recover_steps",
    ),
    ("4", ["lerning_rate=1"], "unknown config key 'lerning_rate'"),
]


@pytest.mark.parametrize(("heads", "overrides", "message"), BAD_REQUESTS)
def test_a_bad_request_is_one_line(
    sentiment_run: Path, heads: str, overrides: list[str], message: str
) -> None:
    with pytest.raises(BertTasksError, match=message):
        plan_pruning("sentiment", sentiment_run, heads, None, overrides)


def test_a_good_request_is_planned(sentiment_run: Path) -> None:
    plan = plan_pruning("sentiment", sentiment_run, "0.5", None, [])
    assert (plan.removed, plan.steps, plan.recover_steps) == (4, [1, 1, 1, 1], 0)  # 10% of 8 heads a step
    assert plan.out_dir == sentiment_run.parent / f"{sentiment_run.name}-pruned-4"
    assert plan.cfg.validation_file is not None  # the run's own, from its recipe.yaml
    plan = plan_pruning(
        "sentiment", sentiment_run, "5", "elsewhere", ["steps=2", "recover_steps=3", "lr=1e-3"]
    )
    assert (plan.steps, plan.recover_steps, plan.cfg.lr, plan.out_dir) == ([2, 3], 3, 1e-3, Path("elsewhere"))


def test_recovery_runs_at_a_fifth_of_the_recipes_lr_and_evaluates_before_and_four_times(
    sentiment_run: Path,
) -> None:
    plan = plan_pruning("sentiment", sentiment_run, "3", "out", ["recover_steps=10"])
    cfg = recovery_config(plan, {1: [3], 0: [2, 0]})
    assert cfg.lr == pytest.approx(plan.cfg.lr / 5)
    assert (cfg.warmup_ratio, cfg.eval_every, cfg.eval_at_start, cfg.max_steps) == (0.1, 3, True, 10)
    assert (cfg.model, cfg.prune_heads) == (os.path.abspath(sentiment_run), ["0:0", "0:2", "1:3"])
    assert (cfg.output_dir, cfg.resume, cfg.overwrite, cfg.seeds) == ("out", False, False, None)
    given = ["recover_steps=10", "lr=1e-3", "warmup_ratio=0", "eval_every=5"]
    cfg = recovery_config(plan_pruning("sentiment", sentiment_run, "3", "out", given), {0: [1]})
    assert (cfg.lr, cfg.warmup_ratio, cfg.eval_every) == (1e-3, 0.0, 5), "what the command line gives wins"


def test_a_distilled_source_recovers_from_itself_on_its_teacher(sentiment_run: Path) -> None:
    """A recipe naming a teacher is a distill run, whose `model` is its `student` or else the teacher: the
    recovery names the source as its student, whole, or the teacher would be cut again in its place."""
    given = ["recover_steps=4", f"teacher={sentiment_run}", "student_layers=1"]
    cfg = recovery_config(plan_pruning("sentiment", sentiment_run, "3", "out", given), {0: [1]})
    source = os.path.abspath(sentiment_run)
    assert (cfg.teacher, cfg.student, cfg.student_layers) == (str(sentiment_run), source, None)
    assert (cfg.model, cfg.prune_heads) == (source, ["0:1"])
    assert recovery_config(plan_pruning("sentiment", sentiment_run, "3", "out", []), {0: [1]}).student is None
    with pytest.raises(
        BertTasksError,
        match=r"^transfer=attention: the recovery's student \(pruned here\) lost heads to pruning; attention "
        "transfers between whole, equal sets of heads only: give transfer=hidden or transfer=none$",
    ):
        plan_pruning("sentiment", sentiment_run, "3", "out", [*given, "transfer=hidden,attention"])


def test_dirs_prune_does_not_take(
    sentiment_run: Path, ner_run: Path, tiny_model: Path, tmp_path: Path
) -> None:
    with pytest.raises(BertTasksError, match="not a fine-tuned model of a bert-tasks task"):
        plan_pruning("sentiment", tiny_model, "1")
    with pytest.raises(BertTasksError, match="holds a ner model, not a sentiment model"):
        plan_pruning("sentiment", ner_run, "1")
    with pytest.raises(BertTasksError, match="no such directory"):
        plan_pruning("sentiment", tmp_path / "missing", "1")
    copy = tmp_path / "int8"
    shutil.copytree(sentiment_run, copy)
    config = json.loads((copy / "config.json").read_text())
    config["bert_tasks"]["quantize"] = "int8"
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(BertTasksError, match="holds a int8 export; prune the fp32 model dir it was exported"):
        plan_pruning("sentiment", copy, "1")
    config["bert_tasks"].pop("quantize")
    config["pruned_heads"] = {"5": [0]}
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(BertTasksError, match=r"pruned_heads \{'5': \[0\]\} names no layer below 2"):
        plan_pruning("sentiment", copy, "1")
    config["pruned_heads"] = {"0": [0, 1]}
    (copy / "config.json").write_text(json.dumps(config))
    plan = plan_pruning("sentiment", copy, "0.5")  # of the 6 heads it has: 3, and 4 at most
    assert (plan.shape.present, plan.removed) == (6, 3)
    with pytest.raises(BertTasksError, match=r"6 heads in 2 layers .* at most 4 can go \(5 asked\)"):
        plan_pruning("sentiment", copy, "5")


def test_a_dir_without_a_recipe_needs_its_data_named(sentiment_run: Path, tmp_path: Path) -> None:
    """No recipe.yaml: the demo data is never taken for the model's; validation_file= names the data."""
    copy = tmp_path / "no-recipe"
    shutil.copytree(sentiment_run, copy)
    (copy / "recipe.yaml").unlink()
    with pytest.raises(
        BertTasksError, match=r"\(it has no recipe.yaml\): no validation data to score the heads"
    ):
        plan_pruning("sentiment", copy, "1")
    validation = DATA["sentiment"][1]
    plan = plan_pruning("sentiment", copy, "1", None, [f"validation_file={validation}"])
    assert plan.cfg.train_file is None
    with pytest.raises(BertTasksError, match="no training data for recover_steps=2; give train_file=FILE"):
        plan_pruning("sentiment", copy, "1", None, [f"validation_file={validation}", "recover_steps=2"])


def test_steps_share_the_heads_evenly() -> None:
    assert step_sizes(36, 5) == [7, 7, 7, 7, 8]
    assert step_sizes(18, 3) == [6, 6, 6]
    assert step_sizes(3, 3) == [1, 1, 1]
    assert all(
        sum(step_sizes(n, k)) == n and min(step_sizes(n, k)) >= 1 for n in range(1, 40) for k in range(1, n)
    )


def test_the_lowest_heads_go_but_never_a_layers_last() -> None:
    scores = np.array([[0.1, 0.2, np.nan], [0.9, 0.05, 0.8], [0.3, np.nan, np.nan]])
    assert choose_heads(scores, 2) == {0: [0], 1: [1]}
    # Layer 0 keeps its better head, layer 2 its only one; the next lowest elsewhere go instead.
    assert choose_heads(scores, 3) == {0: [0], 1: [1, 2]}
    assert choose_heads(np.zeros((2, 2)), 2) == {0: [0], 1: [0]}  # ties: earlier layer and head first
    with pytest.raises(ValueError, match="1 more heads asked than can go"):
        choose_heads(scores, 4)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--heads", "1.5"], "a fraction between 0 and 1"),
        (["--heads", "7"], "at most 6 can go"),
        (["--heads", "2", "lr=1e-4"], "sets the recovery fine-tuning"),
    ],
)
@pytest.mark.slow
def test_the_cli_answers_before_torch_and_datasets(
    sentiment_run: Path, tmp_path: Path, argv, message
) -> None:
    answer = probe(["prune", "sentiment", "--model", str(sentiment_run), *argv], tmp_path)
    assert answer["status"] == 1
    assert message in answer["stderr"] and answer["stderr"].count("\n") == 1, answer["stderr"]
    assert answer["loaded"] == [], answer
