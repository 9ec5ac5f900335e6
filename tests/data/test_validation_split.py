"""`validation_split=F`: validation carved from train, stratified by label for sentiment, seeded, exact sizes;
`validation_split=auto` (the default): a tenth of train when no validation set is given.

The per-label sizes are counted by hand from the rule in bert_tasks/data/validation_split.py: a label with
`c` rows gives round(c * F) of them (halves up), never all `c`; a label whose share rounds to 0 stays in
train.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from datasets import Dataset

from bert_tasks.config import load_recipe
from bert_tasks.data import splits as split_rule
from bert_tasks.data.validation_split import carve_validation
from bert_tasks.errors import BertTasksError
from bert_tasks.insight.data_report import data_report
from bert_tasks.pruning.plan import plan_pruning
from bert_tasks.tasks import get_task
from bert_tasks.tasks.sentiment import SentimentTask
from bert_tasks.training import train
from tests.helpers import DATA, tiny_config, write_conll, write_jsonl

#: 33 rows: a 20, b 9, c 3, d 1, interleaved so no label sits in one block of the file.
COUNTS = {"a": 20, "b": 9, "c": 3, "d": 1}


def labelled(tmp_path: Path) -> Path:
    labels = [label for label, count in COUNTS.items() for _ in range(count)]
    labels = labels[::2] + labels[1::2]
    rows = [{"text": f"text number {i}", "label": label} for i, label in enumerate(labels)]
    return write_jsonl(tmp_path / "train.jsonl", rows)


def read(task: str, overrides: list[str]) -> dict[str, Dataset]:
    cfg = load_recipe(None, overrides, task=task)
    return split_rule.read_splits(get_task(cfg), cfg)


def test_per_label_sizes_are_the_rule_counted_by_hand(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    train = labelled(tmp_path)
    with caplog.at_level(logging.INFO, logger="bert_tasks"):
        data = read("sentiment", [f"train_file={train}", "validation_split=0.25"])
    assert list(data) == ["train", "validation"]
    # a: 20 * 0.25 = 5; b: 2.25 -> 2; c: 0.75 -> 1; d: 0.25 -> 0, so d stays in train.
    assert Counter(data["validation"]["label"][:]) == {"a": 5, "b": 2, "c": 1}
    assert Counter(data["train"]["label"][:]) == {"a": 15, "b": 7, "c": 2, "d": 1}
    assert sorted(data["train"]["text"][:] + data["validation"]["text"][:]) == sorted(
        f"text number {i}" for i in range(33)
    )
    assert "label value(s) too rare to split ('d': 1 row(s)) stay in train" in caplog.text


def test_halves_round_up_and_every_label_keeps_a_training_row() -> None:
    rows = Dataset.from_dict({"text": [str(i) for i in range(12)], "label": ["x"] * 2 + ["y"] * 10})
    # x: 2 * 0.9 = 1.8 -> 2, but one must stay in train -> 1; y: 10 * 0.9 = 9.
    train, validation = carve_validation(rows, 0.9, 0, "label", "rows")
    assert Counter(validation["label"]) == {"x": 1, "y": 9}
    assert Counter(train["label"]) == {"x": 1, "y": 1}
    # y: 10 * 0.25 = 2.5 -> 3 (half up, where Python's round gives 2); x: 0.5 -> 1.
    _, validation = carve_validation(rows, 0.25, 0, "label", "rows")
    assert Counter(validation["label"]) == {"x": 1, "y": 3}


def test_the_same_seed_gives_the_same_split_and_another_seed_another(tmp_path: Path) -> None:
    train = labelled(tmp_path)
    first, again, other = (
        read("sentiment", [f"train_file={train}", "validation_split=0.25", f"seed={seed}"])
        for seed in (7, 7, 8)
    )
    assert first["validation"]["text"][:] == again["validation"]["text"][:]
    assert first["train"]["text"][:] == again["train"]["text"][:]
    assert first["validation"]["text"][:] != other["validation"]["text"][:]
    assert Counter(other["validation"]["label"][:]) == Counter(first["validation"]["label"][:])


def many(tmp_path: Path, rows: int) -> Path:
    """`rows` sentiment rows, two labels alternating."""
    texts = [{"text": f"text number {i}", "label": "ab"[i % 2]} for i in range(rows)]
    return write_jsonl(tmp_path / f"train{rows}.jsonl", texts)


def test_auto_carves_a_tenth_when_no_validation_set_is_given(tmp_path: Path) -> None:
    train = many(tmp_path, 120)
    cfg = load_recipe(None, [f"train_file={train}"], task="sentiment")
    assert cfg.validation_split == "auto" and cfg.validation_file is None
    data, settled = split_rule.read_training_splits(get_task(cfg), cfg)
    assert (len(data["train"]), len(data["validation"])) == (108, 12)  # 60 of each label: 6 each carved
    assert settled.validation_split == 0.1  # what the saved recipe names
    explicit = read("sentiment", [f"train_file={train}", "validation_split=0.1"])
    assert explicit["validation"]["text"][:] == data["validation"]["text"][:]  # auto is that same carve


def test_auto_leaves_a_given_validation_set_alone(tmp_path: Path) -> None:
    train = many(tmp_path, 120)
    cfg = load_recipe(None, [f"train_file={train}", f"validation_file={train}"], task="sentiment")
    data, settled = split_rule.read_training_splits(get_task(cfg), cfg)
    assert (len(data["train"]), len(data["validation"])) == (120, 120)
    assert settled.validation_split == "auto"


def test_auto_carves_nothing_from_fewer_than_100_rows_and_none_never_carves(tmp_path: Path) -> None:
    for rows, overrides in ((99, []), (120, ["validation_split=none"])):
        train = many(tmp_path, rows)
        data = read("sentiment", [f"train_file={train}", *overrides])
        assert list(data) == ["train"] and len(data["train"]) == rows


def test_a_word_for_validation_split_other_than_auto_is_refused() -> None:
    with pytest.raises(BertTasksError, match=r"^bad config: validation_split='half', must be in \(0, 1\)"):
        load_recipe(None, ["validation_split=half"], task="sentiment")


def test_ner_is_a_plain_seeded_sample_after_max_train_samples() -> None:
    ner_train = DATA["ner"][0]
    data = read("ner", [f"train_file={ner_train}", "max_train_samples=30", "validation_split=0.2"])
    assert (len(data["train"]), len(data["validation"])) == (24, 6)  # 30 * 0.2 = 6
    again = read("ner", [f"train_file={ner_train}", "max_train_samples=30", "validation_split=0.2"])
    assert again["validation"]["tokens"][:] == data["validation"]["tokens"][:]
    whole = read("ner", [f"train_file={ner_train}", "max_train_samples=30"])["train"]["tokens"][:]
    assert sorted(map(tuple, data["train"]["tokens"][:] + data["validation"]["tokens"][:])) == sorted(
        map(tuple, whole)
    )


def test_max_eval_samples_caps_the_test_file_not_the_carved_split(tmp_path: Path) -> None:
    train = labelled(tmp_path)
    data = read(
        "sentiment",
        [f"train_file={train}", f"test_file={train}", "validation_split=0.25", "max_eval_samples=3"],
    )
    assert list(data) == ["train", "validation", "test"]
    assert (len(data["train"]), len(data["validation"]), len(data["test"])) == (25, 8, 3)


def test_a_validation_file_and_validation_split_together_are_one_line(tmp_path: Path) -> None:
    train = labelled(tmp_path)
    with pytest.raises(BertTasksError) as error:
        load_recipe(
            None, [f"train_file={train}", f"validation_file={train}", "validation_split=0.1"], "sentiment"
        )
    assert str(error.value) == (
        f"bad config: validation_split=0.1, but validation_file={train} gives a validation set too; pick one "
        "(validation_file=none to carve it from train, or validation_split=none) (on the command line)"
    )


def test_validation_split_replaces_the_demo_validation_file() -> None:
    cfg = load_recipe(None, ["validation_split=0.2"], task="sentiment")
    assert cfg.validation_file is None and cfg.train_file is not None


@pytest.mark.parametrize("share", ["0", "1", "1.5", "-0.1"])
def test_a_share_outside_0_1_is_refused(share: str) -> None:
    with pytest.raises(BertTasksError, match=r"^bad config: validation_split=.*must be in \(0, 1\)"):
        load_recipe(None, [f"validation_split={share}"], task="sentiment")


def test_a_hub_validation_split_and_validation_split_together_are_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hub = {"train": Dataset.from_dict({"text": ["good", "bad"] * 5, "label": ["p", "n"] * 5})}
    hub["validation"] = hub["train"]
    monkeypatch.setattr(split_rule, "hub_split_names", lambda dataset: list(hub))
    monkeypatch.setattr(SentimentTask, "read_hub", lambda self, dataset, split, cfg: hub[split])
    with pytest.raises(BertTasksError) as error:
        read("sentiment", ["dataset=sst", "validation_split=0.2"])
    assert str(error.value) == (
        "validation_split=0.2 carves a validation set from train, but dataset=sst (validation) gives one "
        "too; pick one (validation_split=none, or leave that validation split out)"
    )


def test_too_few_rows_to_carve_is_one_line(tmp_path: Path) -> None:
    train = write_jsonl(tmp_path / "t.jsonl", [{"text": "a b", "label": "x"}, {"text": "c d", "label": "y"}])
    with pytest.raises(BertTasksError) as error:
        read("sentiment", [f"train_file={train}", "validation_split=0.2"])
    assert str(error.value) == (
        f"{train}: validation_split=0.2 of 2 training row(s) of each label rounds to no validation example; "
        "raise validation_split, add rows, or give a validation_file"
    )


def test_debug_data_reports_the_carved_split(tmp_path: Path) -> None:
    train = labelled(tmp_path)
    report = data_report(
        load_recipe(None, [f"train_file={train}", "validation_split=0.25"], task="sentiment")
    )
    validation = report["splits"]["validation"]
    assert validation["source"] == f"{train} (validation_split=0.25)"
    assert validation["examples"] == 8 and validation["labels"] == {"a": 5, "b": 2, "c": 1}
    assert report["splits"]["train"]["examples"] == 25
    assert validation["in_train"] == 0  # carved rows leave train: no overlap


def test_ner_entity_types_are_checked_against_the_carved_train(tmp_path: Path) -> None:
    """A plain sample may take a rare type's only sentence: the usual error names the carved split."""
    sentences = [[("fever", "B-Disease")]] * 9 + [[("aspirin", "B-Chemical")]]
    train = write_conll(tmp_path / "train.conll", sentences)
    for seed in range(50):  # a seed whose sample takes the one Chemical sentence
        cfg = load_recipe(None, [f"train_file={train}", "validation_split=0.1", f"seed={seed}"], task="ner")
        splits, _ = split_rule.read_unchecked_splits(get_task(cfg), cfg)
        if splits["validation"]["tags"][:] == [["B-Chemical"]]:
            break
    else:
        pytest.fail("no seed in 0..49 carves the Chemical sentence")
    with pytest.raises(
        BertTasksError, match=rf"^{train} \(validation_split=0.1\): entity type 'Chemical' never"
    ):
        split_rule.read_splits(get_task(cfg), cfg)


@pytest.mark.usefixtures("single_thread")
@pytest.mark.slow
def test_a_run_on_a_carved_split_says_so_in_its_card(tiny_model: Path, tmp_path: Path) -> None:
    train_file = DATA["sentiment"][0]
    cfg = tiny_config(
        "sentiment", tiny_model, tmp_path / "run", validation_file="none", validation_split="0.25"
    )
    run = train(cfg)
    card = (run / "README.md").read_text(encoding="utf-8")
    carved = (
        f"| validation | `{train_file}`, 0.25 of its rows carved by `validation_split`, the rest trained on"
    )
    carved += " | 10 |"
    assert carved in card
    assert f"| train | `{train_file}` | 30 |" in card
    assert load_recipe(run / "recipe.yaml", task="sentiment").validation_split == 0.25


@pytest.mark.usefixtures("single_thread")
@pytest.mark.slow
def test_a_run_given_only_train_picks_its_best_on_a_carved_tenth(tiny_model: Path, tmp_path: Path) -> None:
    train_file = many(tmp_path, 100)
    cfg = tiny_config("sentiment", tiny_model, tmp_path / "run", train_file=str(train_file))
    cfg = replace(cfg, validation_file=None, validation_split="auto")
    run = train(cfg)
    metrics = json.loads((run / "metrics.json").read_text())
    assert "validation" in metrics and metrics["best_step"] > 0
    assert load_recipe(run / "recipe.yaml", task="sentiment").validation_split == 0.1
    assert f"`{train_file}`, 0.1 of its rows carved by `validation_split`" in (run / "README.md").read_text()


@pytest.mark.usefixtures("single_thread")
@pytest.mark.slow
def test_an_auto_that_carved_nothing_is_recorded_as_none(tiny_model: Path, tmp_path: Path) -> None:
    # Recorded as auto, a later prune on the model dir would pass its plan check and find no validation set.
    train_file = many(tmp_path, 40)
    cfg = tiny_config("sentiment", tiny_model, tmp_path / "run", train_file=str(train_file))
    run = train(replace(cfg, validation_file=None, validation_split="auto"))
    assert load_recipe(run / "recipe.yaml", task="sentiment").validation_split is None
    with pytest.raises(BertTasksError, match=r"recipe.yaml: no validation data to score the heads on"):
        plan_pruning("sentiment", run, "1")
