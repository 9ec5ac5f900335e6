"""The saved-model contract: the typed policy round-trips, old dirs still load, bad policies are one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bert_tasks.config import load_recipe
from bert_tasks.errors import BertTasksError
from bert_tasks.inference.predictor import EntityTagger, Predictor, SentimentClassifier
from bert_tasks.model_dir import ModelPolicy, load_finetuned, read_policy

#: What `bert-tasks finetune` wrote under `bert_tasks` before the typed contract, for both tasks alike.
OLD_POLICY = {"max_length": 32, "stride": 8, "label_all_subtokens": False, "viterbi": True}


def rewrite_policy(model_dir: Path, policy: object | None) -> Path:
    """Replace (or, with None, remove) the `bert_tasks` object of a copied model dir's config.json."""
    config_file = model_dir / "config.json"
    config = json.loads(config_file.read_text())
    config.pop("bert_tasks")
    if policy is not None:
        config["bert_tasks"] = policy
    config_file.write_text(json.dumps(config))
    return model_dir


def test_policy_of_a_run_round_trips(ner_run: Path) -> None:
    cfg = load_recipe(ner_run / "recipe.yaml")
    policy = read_policy(ner_run, "ner")
    assert policy == ModelPolicy.for_run(cfg)
    # the tiny run trains on CoNLL tokens split as `default` splits their text, in no marked documents:
    # both inferred and saved
    inferred = {"document_context": 0, "word_splitter": "default"}
    assert policy.task_options == {"label_all_subtokens": False, "viterbi": True, **inferred}
    assert ModelPolicy.from_json(policy.to_json(), "x") == policy


@pytest.mark.parametrize("task", ["sentiment", "ner"])
@pytest.mark.slow
def test_a_dir_saved_by_the_previous_version_predicts_the_same(
    task: str, sentiment_run: Path, ner_run: Path, tmp_path: Path
) -> None:
    """Before the contract every dir got the same untyped keys (NER's options on sentiment too)."""
    run = {"sentiment": sentiment_run, "ner": ner_run}[task]
    predictor = {"sentiment": SentimentClassifier, "ner": EntityTagger}[task]
    old = rewrite_policy(shutil.copytree(run, tmp_path / "old"), {"task": task, **OLD_POLICY})
    text = "The patient had a mild fever after aspirin and the hotel was lovely."
    assert predictor(old).predict([text]) == predictor(run).predict([text])
    assert read_policy(old).max_length == 32


def test_a_dir_fine_tuned_elsewhere_gets_its_task_from_the_head(ner_run: Path, tmp_path: Path) -> None:
    """No policy at all (a plain transformers save): the architecture names the task, windows are as long
    as the tokenizer (512) and the position embeddings (128) allow."""
    plain = rewrite_policy(shutil.copytree(ner_run, tmp_path / "plain"), None)
    policy = read_policy(plain)
    assert (policy.task, policy.max_length, policy.stride) == ("ner", 128, 32)
    assert isinstance(Predictor(plain).predict(["aspirin"])[0], list)


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ("ner", "'bert_tasks' is str, not an object"),
        (
            {**OLD_POLICY, "task": "ner", "max_length": "32"},
            "'bert_tasks.max_length' is '32', not an integer",
        ),
        ({**OLD_POLICY, "task": "ner", "max_length": -4}, "'bert_tasks.max_length' is -4, not an integer in"),
        ({**OLD_POLICY, "task": "ner", "stride": 2**70}, "'bert_tasks.stride' is 1180591620717411303424"),
        ({**OLD_POLICY, "task": "ner", "viterbi": "yes"}, "'bert_tasks.viterbi' is 'yes', not true/false"),
        ({**OLD_POLICY, "task": "pos"}, "'bert_tasks.task' is 'pos', not one of sentiment, ner"),
        (
            {**OLD_POLICY, "task": "ner", "quantize": "int4"},
            "'bert_tasks.quantize' is 'int4', not one of int8",
        ),
        ({**OLD_POLICY, "task": "ner", "pooling": "mean"}, "unknown key 'bert_tasks.pooling'"),
        (
            {**OLD_POLICY, "task": "ner", "attention": "left"},
            "'bert_tasks.attention' is 'left', not one of bidirectional, causal, right_to_left",
        ),
    ],
)
def test_a_bad_policy_is_one_line_before_any_model_loads(
    ner_run: Path, tmp_path: Path, policy: object, message: str
) -> None:
    bad = rewrite_policy(shutil.copytree(ner_run, tmp_path / "bad"), policy)
    with pytest.raises(BertTasksError, match=f"^{bad / 'config.json'}: ") as error:
        read_policy(bad)
    assert message in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(BertTasksError, match=r"fix config\.json"):
        load_finetuned(bad)


def test_a_missing_dir_is_named_as_missing_not_sent_to_the_hub(tmp_path: Path) -> None:
    with pytest.raises(BertTasksError, match=f"model dir {tmp_path / 'nope'}: no such directory"):
        read_policy(tmp_path / "nope")
    with pytest.raises(BertTasksError, match="model dir runs/nope/x: no such directory"):
        read_policy("runs/nope/x")
    data = tmp_path / "validation.jsonl"  # --model given the data file by mistake
    data.write_text('{"text": "a", "label": "positive"}\n', encoding="utf-8")
    with pytest.raises(BertTasksError, match=f"^model dir {data}: is a file, not a directory; pass the dir"):
        read_policy(data)


def test_the_wrong_task_is_named(sentiment_run: Path) -> None:
    with pytest.raises(BertTasksError, match="holds a sentiment model, not a ner model"):
        EntityTagger(sentiment_run)
