"""The model card: `README.md` in every model dir, in the Hugging Face format, built from a run's facts.

YAML metadata (library, pipeline tag, base model, tags, a model-index with every score and its split)
through `huggingface_hub`'s `ModelCardData` and `EvalResult`, so the Hub reads it as it reads its own; then
a body for people: base model, task and labels, the data (file sizes and SHA-256, or the hub dataset),
every score with what its split was used for, the window policy, intended use and limits, how to load it
(bert-tasks and a vanilla `pipeline`), the recipe and the library versions. What differs between tasks
(pipeline tag and options, how long inputs are merged, the task's limits) comes from `Task.card`.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import platform
import shlex
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from huggingface_hub import EvalResult, ModelCard, ModelCardData

from bert_tasks.config import ATTENTION_DIRECTIONS, DEFAULT_MODEL_HUB_ID, Config
from bert_tasks.data.splits import SPLIT_FILES
from bert_tasks.model_dir import ModelPolicy, label_names
from bert_tasks.modeling.load import is_bundled_default

if TYPE_CHECKING:
    from datasets import Dataset

    from bert_tasks.tasks.base import Task, TaskCard

#: The card's file name: what the Hub and `ModelCard.load` read.
MODEL_CARD = "README.md"
#: The libraries whose versions a run records (recipe.yaml's header, the card), besides Python.
VERSIONED = ("bert-tasks", "torch", "transformers", "accelerate", "datasets", "huggingface_hub")
#: What each split's scores mean: the split that picks the checkpoint flatters it.
SPLIT_ROLES = {
    "validation": "used for model selection (it picked the best checkpoint), so its scores are optimistic",
    "test": "held out: scored once, with the selected weights, and never used to choose anything",
}
#: Rows of a per-class / per-type table shown in the card; metrics.json holds them all.
MAX_TABLE_ROWS = 50
_BUNDLED_BASE = (
    "a general-domain English sentence-transformers MiniLM (all-MiniLM-L6-v2: 6 layers, 384 wide, uncased), "
    "trained on web, question-answer and caption sentence pairs, not on any specialised domain"
)


@dataclass(frozen=True)
class DataSource:
    """Where one split's rows came from: a local file (size, SHA-256), a hub dataset split, or memory."""

    split: str
    rows: int
    file: str | None = None
    size_bytes: int | None = None
    sha256: str | None = None
    hub_dataset: str | None = None
    hub_config: str | None = None
    #: The row cap (`max_train_samples` / `max_eval_samples`) when it cut the split.
    limit: int | None = None
    #: Given to `train(cfg, data=...)` in memory: no file or hub split to name.
    in_memory: bool = False
    #: The `validation_split` share when this (validation) split was carved from train's source.
    carved: float | None = None


def describe_data(cfg: Config, raw: dict[str, Dataset], in_memory: Collection[str] = ()) -> list[DataSource]:
    """The sources of the splits a run read, by the split rule of `data/splits.py`: in memory, else file,
    else hub; a carved validation split names train's source and its share."""
    sources = []
    for split, data in raw.items():
        share = cfg.validation_split if isinstance(cfg.validation_split, float) else None  # auto: none carved
        carved = share if split == "validation" else None
        origin = "train" if carved is not None else split
        path = getattr(cfg, SPLIT_FILES[origin])
        limit = cfg.max_train_samples if origin == "train" else cfg.max_eval_samples
        read = len(data) + (len(raw["validation"]) if split == "train" and share else 0)
        found = {"limit": limit if limit is not None and read == limit else None, "carved": carved}
        if origin in in_memory:
            sources.append(DataSource(split, len(data), in_memory=True, **found))
        elif path is not None:
            size, digest = _file_digest(Path(path))
            sources.append(DataSource(split, len(data), path, size, digest, **found))
        else:
            hub_path, _, hub_config = str(cfg.dataset).partition("/")
            sources.append(
                DataSource(split, len(data), hub_dataset=hub_path, hub_config=hub_config or None, **found)
            )
    return sources


def in_memory_note(sources: Sequence[DataSource]) -> list[str]:
    """recipe.yaml's comment on data that no key names: rerunning the recipe needs it passed again."""
    given = [f"{s.split} {s.rows} rows" for s in sources if s.in_memory and s.carved is None]
    if not given:
        return []
    return [f"Data given in memory, not named here ({', '.join(given)}): rerun with train(cfg, data=...)"]


def library_versions() -> dict[str, str]:
    """The versions a run ran with (installed distributions; bert-tasks from the package itself)."""
    from bert_tasks import __version__

    versions = {"python": platform.python_version(), "bert-tasks": __version__}
    for name in VERSIONED[1:]:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def versions_note(versions: dict[str, str]) -> str:
    """One comment line for recipe.yaml: what ran, which a config key cannot hold."""
    return "Ran with " + ", ".join(f"{name} {version}" for name, version in versions.items())


@dataclass(frozen=True)
class RunFacts:
    """What a finished run knows that its card reports."""

    directory: Path
    recipe: Config  # as recorded in recipe.yaml: resolved precision, no resume/overwrite
    labels: list[str]
    data: list[DataSource]
    metrics: dict[str, Any]  # metrics.json
    versions: dict[str, str]


def run_card(facts: RunFacts, task: Task) -> ModelCard:
    """The card of a fine-tuned model dir."""
    cfg = facts.recipe
    policy = ModelPolicy.for_run(cfg, task.option_values)
    about = task.card(facts.labels, policy)
    name = facts.directory.name
    data = ModelCardData(
        model_name=name,
        library_name="transformers",
        pipeline_tag=about.pipeline_tag,
        base_model=_base_model_id(cfg.model),
        datasets=sorted({s.hub_dataset for s in facts.data if s.hub_dataset}) or None,
        tags=["bert-tasks", task.name, "bert"],
        metrics=sorted({metric for _, metric, _ in _scalars(facts.metrics)}) or None,
        eval_results=[_eval_result(facts, about, task, *score) for score in _scalars(facts.metrics)] or None,
    )
    made = f"Fine-tuned from {_base_model_text(cfg.model)}"
    if cfg.teacher is not None:
        made = f"Distilled from the teacher `{cfg.teacher}` (`bert-tasks distill`)"
    body = [
        f"# {name}",
        "",
        f"{about.summary} {made} with bert-tasks {facts.versions['bert-tasks']}.",
        *_model_section(cfg, facts, about),
        *_distillation_section(cfg, facts.metrics),
        *_data_section(facts.data),
        *_scores_section(facts.metrics),
        *_windows_section(policy, about),
        *_limits_section(cfg, about),
        *_usage_section(task.name, facts.directory, policy, about, quantized=False),
        *_recipe_section(cfg, facts.directory),
        *_versions_section(facts.versions),
    ]
    return _card(data, body)


def export_card(
    source: str | Path, source_dir: Path, out_dir: Path, method: str, task: Task, policy: ModelPolicy
) -> ModelCard:
    """The card of `bert-tasks export`'s dir: which model (`source`, read from `source_dir`) it is a
    quantized copy of, then that model's card.

    Its metadata is the source's without the model-index: those scores were measured on the fp32 model,
    not on this copy.
    """
    about = task.card(label_names(source_dir), policy)
    head = pruned_head(source_dir)
    intro = [
        f"An {method.upper()} dynamic-quantized copy of the model `{source}`, written by "
        f"`bert-tasks export --quantize {method}`. The files hold the fp32 weights and "
        f'`"quantize": "{method}"` under `bert_tasks` in config.json: bert-tasks (predict, evaluate, '
        "`Predictor`) quantizes the encoder's Linear layers on load (int8 weights, one scale per output "
        "channel, on CPU); vanilla transformers loads the fp32 model"
        + (" with the lines below that rebuild its pruned heads." if head else "."),
        *_usage_section(task.name, out_dir, policy, about, quantized=True, head=head),
    ]
    return _copy_card(source_dir, out_dir, task, about, ["quantized", method], intro)


def onnx_export_card(
    source: str | Path,
    source_dir: Path,
    out_dir: Path,
    task: Task,
    policy: ModelPolicy,
    parity: str,
) -> ModelCard:
    """The card of `bert-tasks export --format onnx`'s dir: the graph it holds, how it was checked
    against the source model (`parity`, a sentence), how to run it, then the source's card."""
    about = task.card(label_names(source_dir), policy)
    weights = (
        "int8 weights (dynamic quantization: one scale per output channel, activations quantized per "
        "batch) in the encoder's matmuls, float embeddings, LayerNorms and head"
        if policy.quantize
        else "fp32 weights"
    )
    where, example = shlex.quote(str(out_dir)), _command_input(about.example)
    intro = [
        f"An ONNX export of the model `{source}`, written by `bert-tasks export --format onnx"
        + (f" --quantize {policy.quantize}`" if policy.quantize else "`")
        + f": `model.onnx` holds the whole network with {weights}, stored on disk; the tokenizer and "
        f'config.json (labels, and `"backend": "onnx"` under `bert_tasks`) sit beside it. {parity}',
        "",
        "## How to use",
        "",
        f"With bert-tasks and its onnx extra (`pip install 'bert-tasks[onnx]'`): onnxruntime runs the graph "
        f"with windows of {policy.max_length} sub-tokens and the task's decoding, as trained; torch is "
        "not imported.",
        "",
        "```bash",
        f"bert-tasks predict {task.name} --model {where} {example}",
        f"bert-tasks evaluate {task.name} --model {where} --data FILE",
        "```",
        "",
        "Vanilla transformers cannot load this dir (it has no model.safetensors); onnxruntime alone runs "
        "`model.onnx` on `input_ids`, `attention_mask` and, where the model takes them, `token_type_ids` "
        "(int64, [batch, tokens]; `session.get_inputs()` names them) and "
        "returns `logits`, one window at a time without the task's merging of long inputs.",
    ]
    tags = ["onnx", *(["quantized", policy.quantize] if policy.quantize else [])]
    return _copy_card(source_dir, out_dir, task, about, tags, intro)


def _copy_card(
    source_dir: Path,
    out_dir: Path,
    task: Task,
    about: TaskCard,
    tags: list[str],
    intro: list[str],
    source_is: str = "the fp32 model",
) -> ModelCard:
    """An export's (or a pruned copy's) card: the source's metadata without its scores (measured on the
    source, `source_is`, not on this copy) plus `tags`, then `intro`, then the source's own card."""
    original = _source_card(source_dir / MODEL_CARD)
    kept = {k: v for k, v in original.data.to_dict().items() if k != "model-index"} if original else {}
    data = ModelCardData(**kept)
    data.tags = [*(data.tags or ["bert-tasks", task.name, "bert"]), *tags]
    data.pipeline_tag = data.pipeline_tag or about.pipeline_tag
    body = [
        f"# {out_dir.name}",
        "",
        intro[0],
        "",
        f"Scores in the source's card below were measured on {source_is}, not on this copy; measure it "
        f"with `bert-tasks evaluate {task.name} --model {shlex.quote(str(out_dir))} --data FILE`.",
        *intro[1:],
    ]
    if original is not None:
        lines = original.text.strip().splitlines()
        title = 1 if lines and lines[0].startswith("# ") else 0  # its name: the heading below says it
        body += ["", "## The source model's card", "", *_demoted(lines[title:])]
    else:
        body += ["", f"The source dir has no model card in its {MODEL_CARD}. {about.summary}"]
    return _card(data, body)


def _source_card(path: Path) -> ModelCard | None:
    """The source dir's card; None without one, or for a README.md whose metadata is no YAML mapping
    (a dir fine-tuned elsewhere may hold any README): the export's card then stands alone."""
    if not path.is_file():
        return None
    try:
        return ModelCard.load(path)
    except (ValueError, yaml.YAMLError):
        return None


def _card(data: ModelCardData, body: list[str]) -> ModelCard:
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(body).strip() + "\n")


def _file_digest(path: Path) -> tuple[int, str]:
    """Size and SHA-256 of a file, read in 1 MiB blocks (a data file may be gigabytes)."""
    digest, size = hashlib.sha256(), 0
    with path.open("rb") as file:
        while block := file.read(2**20):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()


def _base_model_id(model: str) -> str | None:
    """The base model's hub id for the metadata; None for a local dir (the Hub knows no path)."""
    if is_bundled_default(model):
        return DEFAULT_MODEL_HUB_ID
    return None if Path(model).expanduser().exists() else model


def _base_model_text(model: str) -> str:
    if is_bundled_default(model):
        link = f"[{DEFAULT_MODEL_HUB_ID}](https://huggingface.co/{DEFAULT_MODEL_HUB_ID})"
        return f"{link} (bundled with bert-tasks)"
    if Path(model).expanduser().exists():
        return f"the local model dir `{model}`"
    return f"[{model}](https://huggingface.co/{model})"


def _scalars(metrics: dict[str, Any]) -> list[tuple[str, str, float]]:
    """(split, metric, value) of every scalar score in metrics.json, validation before test."""
    return [
        (split, metric, value)
        for split in SPLIT_ROLES
        for metric, value in metrics.get(split, {}).items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    ]


def _eval_result(
    facts: RunFacts, about: TaskCard, task: Task, split: str, metric: str, value: float
) -> EvalResult:
    source = next(s for s in facts.data if s.split == split)
    dataset = "in memory" if source.in_memory else source.hub_dataset or Path(str(source.file)).name
    return EvalResult(
        task_type=about.pipeline_tag or task.name,
        dataset_type=dataset,
        dataset_name=dataset,
        dataset_config=source.hub_config,
        dataset_split=split,
        metric_type=metric,
        metric_name=metric.replace("_", " "),
        metric_value=value,
    )


def _model_section(cfg: Config, facts: RunFacts, about: TaskCard) -> list[str]:
    best = facts.metrics.get("best_step")
    chosen = (
        f"the weights of step {best}, best by validation {facts.metrics.get('metric_for_best')}"
        if best is not None
        else "the weights of the last step (no validation split to choose by)"
    )
    return [
        "",
        "## Model",
        "",
        f"- Base model: {_base_model_text(cfg.model)}",
        f"- Task: `{cfg.task}`" + (f" (pipeline `{about.pipeline_tag}`)" if about.pipeline_tag else ""),
        f"- Labels, in id order: {', '.join(f'`{label}`' for label in facts.labels)}",
        f"- Saved weights: {chosen}",
    ]


def _data_section(sources: Sequence[DataSource]) -> list[str]:
    lines = [
        "",
        "## Data",
        "",
        "The model learned from the train split alone; validation and test were only scored. What it "
        "knows of its task comes from this data alone.",
        "",
        "| split | source | rows used | bytes | SHA-256 |",
        "| --- | --- | --- | --- | --- |",
    ]
    for s in sources:
        origin = "train" if s.carved else s.split  # a carved validation split came from train's source
        capped = f"max_{'train' if origin == 'train' else 'eval'}_samples"
        cut = f" (from the first {s.limit}: {capped})" if s.limit else ""
        carved = (
            f", {s.carved:g} of its rows carved by `validation_split`, the rest trained on"
            if s.carved
            else ""
        )
        if s.in_memory:
            lines.append(
                f"| {s.split} | in memory (`train(cfg, data=...)`){carved} | {s.rows}{cut} | – | – |"
            )
        elif s.file is not None:
            row = f"`{s.file}`{carved} | {s.rows}{cut} | {s.size_bytes} | `{s.sha256}`"
            lines.append(f"| {s.split} | {row} |")
        else:
            config = f", config `{s.hub_config}`" if s.hub_config else ""
            source = f"hub dataset `{s.hub_dataset}`{config}, split `{origin}`{carved}"
            lines.append(f"| {s.split} | {source} | {s.rows}{cut} | – | – |")
    return lines


def _scores_section(metrics: dict[str, Any]) -> list[str]:
    splits = [split for split in SPLIT_ROLES if split in metrics]
    if not splits:
        return ["", "## Scores", "", "No validation or test split was given: the run measured no scores."]
    lines = ["", "## Scores", ""]
    lines += [f"- **{split}**: {SPLIT_ROLES[split]}." for split in splits]
    lines += ["", "| metric | " + " | ".join(splits) + " |", "| --- |" + " --- |" * len(splits)]
    names = dict.fromkeys(metric for _, metric, _ in _scalars(metrics))
    for metric in names:
        values = [metrics[split].get(metric) for split in splits]
        lines.append(f"| {metric} | " + " | ".join("–" if v is None else f"{v:.4f}" for v in values) + " |")
    for split in splits:
        for key, table in metrics[split].items():
            if _is_breakdown(table):
                lines += ["", f"{key.replace('_', ' ')} ({split}):", "", *_breakdown(table)]
    return lines


def _distillation_section(cfg: Config, metrics: dict[str, Any]) -> list[str]:
    """The teacher, how the student was made from it, the objective, and both models' scores."""
    teacher = metrics.get("teacher")
    if cfg.teacher is None or teacher is None:
        return []
    start = "the teacher" if teacher["student_start"] == "teacher" else f"`{teacher['student_start']}`"
    kept = teacher["student_layers"]
    layers = f"all layers of {start}" if kept is None else f"layers {kept} of {start} ({len(kept)} layers)"
    transfer = "none"
    if cfg.transfer != "none":
        transfer = (
            f"{cfg.transfer.replace(',', ' and ')} (TinyBERT / MiniLM-style), student layer m from teacher "
            f"layer {teacher['transfer_layers']}[m], weight {cfg.transfer_weight:g}"
        )
    lines = [
        "",
        "## Distillation",
        "",
        f"- Teacher: `{teacher['model']}` ({teacher['layers']} layers), frozen; its logits are computed on "
        "the fly for every batch",
        f"- Student: {layers}",
        f"- Objective: {cfg.alpha:g} x KL(teacher || student) of the softmax at temperature "
        f"{cfg.temperature:g} (x T^2) + {1 - cfg.alpha:g} x cross-entropy on the gold labels, at the "
        "positions the task scores",
        f"- Intermediate transfer: {transfer}",
    ]
    if cfg.transfer_file is not None:
        lines.append(
            f"- Unlabelled text: `{cfg.transfer_file}` ({teacher['transfer_texts']} texts), trained on the "
            "teacher's soft targets only"
        )
    splits = [split for split in SPLIT_ROLES if split in teacher and split in metrics]
    if splits:
        lines += [
            "",
            "The teacher's scores as its own run measured them (on its own validation and test data; "
            "`bert-tasks evaluate` scores both on one file):",
            "",
            "| split | metric | teacher | student |",
            "| --- | --- | --- | --- |",
        ]
        for split in splits:
            for metric, value in metrics[split].items():
                other = teacher[split].get(metric)
                if isinstance(value, int | float) and isinstance(other, int | float):
                    lines.append(f"| {split} | {metric} | {other:.4f} | {value:.4f} |")
    return lines


def _is_breakdown(value: Any) -> bool:
    """A per-class / per-type table: {name: {precision, recall, f1, support}}."""
    return (
        isinstance(value, dict)
        and bool(value)
        and all(
            isinstance(row, dict) and {"precision", "recall", "f1", "support"} <= set(row)
            for row in value.values()
        )
    )


def _breakdown(table: dict[str, dict[str, Any]]) -> list[str]:
    rows = sorted(table.items(), key=lambda item: -item[1]["support"])
    lines = ["| | precision | recall | f1 | support |", "| --- | --- | --- | --- | --- |"]
    for name, row in rows[:MAX_TABLE_ROWS]:
        lines.append(
            f"| {name} | {row['precision']:.4f} | {row['recall']:.4f} | {row['f1']:.4f} | {row['support']} |"
        )
    if len(rows) > MAX_TABLE_ROWS:
        lines.append(f"| ({len(rows) - MAX_TABLE_ROWS} more, in metrics.json) | | | | |")
    return lines


def _windows_section(policy: ModelPolicy, about: TaskCard) -> list[str]:
    options = ", ".join(f"`{key}={value}`" for key, value in policy.task_options.items())
    return [
        "",
        "## Long inputs",
        "",
        f"The model reads windows of at most {policy.max_length} sub-tokens (special tokens included) that "
        f"overlap by {policy.stride}; an input is never truncated: {about.long_inputs}. The policy is saved "
        "under `bert_tasks` in config.json, so bert-tasks predicts with the windows it trained with."
        + (f" Task options: {options}." if options else ""),
    ]


def _limits_section(cfg: Config, about: TaskCard) -> list[str]:
    base = (
        f"The base model is {_BUNDLED_BASE}; domain knowledge (clinical, legal, other languages) comes only "
        "from the fine-tuning data."
        if is_bundled_default(cfg.model)
        else f"The base model `{cfg.model}` brings its own domain and languages; read its card."
    )
    return [
        "",
        "## Intended use and limits",
        "",
        "- Intended for research and for text like the training data (see Data); measure it on your own "
        "data before relying on it.",
        f"- {base}",
        "- Expect lower scores on text unlike the training data (another domain, time, language or "
        "annotation guideline); the scores above hold for the splits they name only.",
        *(f"- {limit}" for limit in about.limits),
        *([_direction_limit(cfg.attention)] if cfg.attention != ATTENTION_DIRECTIONS[0] else []),
    ]


def _direction_limit(direction: str) -> str:
    """A causal or right_to_left model runs so only where something reads its policy."""
    return (
        f"- Trained with `attention={direction}`: bert-tasks runs it so (the policy in config.json records "
        "it); vanilla transformers knows no attention direction and runs it bidirectionally, on inputs "
        "it never saw so: its predictions there are not the ones scored above."
    )


def _usage_section(
    task: str,
    directory: Path,
    policy: ModelPolicy,
    about: TaskCard,
    *,
    quantized: bool,
    head: str | None = None,
) -> list[str]:
    """How to run the dir with bert-tasks and with vanilla transformers; `head`: the dir's head class when
    its heads are pruned (vanilla transformers 5 then needs the lines that rebuild the pruned shapes)."""
    where = str(directory)
    lines = [
        "",
        "## How to use",
        "",
        f"With bert-tasks (windows of {policy.max_length} sub-tokens, as trained"
        + (", quantized to int8 on load" if quantized else "")
        + "):",
        "",
        "```bash",
        f"bert-tasks predict {task} --model {shlex.quote(where)} {_command_input(about.example)}",
        f"bert-tasks evaluate {task} --model {shlex.quote(where)} --data FILE",
        "```",
        "",
        "```python",
        "from bert_tasks import Predictor, load_finetuned",
        "",
        f"predictor = Predictor.from_pretrained({where!r})",
        f"print(predictor.records([{about.example!r}]))",
        f"loaded = load_finetuned({where!r})  # model, tokenizer, task and window policy",
        "```",
    ]
    if about.pipeline_tag is None:
        return [*lines, "", "No transformers pipeline runs this task."]
    options = "".join(f", {key}={value!r}" for key, value in about.pipeline_options.items())
    if head is not None:
        return [*lines, *_vanilla_pruned_section(head, where, policy, about, options, quantized)]
    return [
        *lines,
        "",
        "With vanilla transformers (no bert-tasks installed"
        + (", fp32: the int8 quantization is bert-tasks'" if quantized else "")
        + "):",
        "",
        "```python",
        "from transformers import AutoTokenizer, pipeline",
        "",
        f"tokenizer = AutoTokenizer.from_pretrained({where!r}, model_max_length={policy.max_length})",
        f"model = pipeline({about.pipeline_tag!r}, model={where!r}, tokenizer=tokenizer{options})",
        f"print(model({_pipeline_input(about.example)!r}))",
        "```",
    ]


def _command_input(example: str | tuple[str, str]) -> str:
    """An example input as `bert-tasks predict` takes it: the text, and a pair's second text as --pair."""
    if isinstance(example, str):
        return shlex.quote(example)
    return f"{shlex.quote(example[0])} --pair {shlex.quote(example[1])}"


def _pipeline_input(example: str | tuple[str, str]) -> str | dict[str, str]:
    """An example input as transformers' text-classification pipeline takes it (a pair as a dict)."""
    return example if isinstance(example, str) else {"text": example[0], "text_pair": example[1]}


def _recipe_section(cfg: Config, directory: Path) -> list[str]:
    return [
        "",
        "## Recipe",
        "",
        f"The resolved config (`recipe.yaml`); train again with `bert-tasks finetune {cfg.task} --recipe "
        f"{shlex.quote(str(directory / 'recipe.yaml'))} output_dir=NEW_DIR`.",
        "",
        "```yaml",
        yaml.safe_dump(cfg.to_dict(), sort_keys=False).strip(),
        "```",
    ]


def _versions_section(versions: dict[str, str]) -> list[str]:
    rows = [f"| {name} | {version} |" for name, version in versions.items()]
    return ["", "## Versions", "", "| library | version |", "| --- | --- |", *rows]


def _demoted(lines: list[str]) -> list[str]:
    """Markdown headings one level down (outside code blocks), so a quoted card nests under a heading."""
    out, fenced = [], False
    for line in lines:
        if line.startswith("```"):
            fenced = not fenced
        out.append("#" + line if not fenced and line.startswith("#") else line)
    return out


def pruned_head(directory: Path) -> str | None:
    """The head class of a model dir whose config.json prunes heads; None for a dir with every head."""
    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    if not config.get("pruned_heads"):
        return None
    return (config.get("architectures") or ["BertModel"])[0]


def vanilla_pruned_code(head: str, where: str) -> list[str]:
    """Python lines that load a head-pruned dir in vanilla transformers 5, as `model`.

    transformers 5 builds every attention at full size whatever config.json's `pruned_heads` says (the
    key is kept as a plain attribute; no model code reads it), so `from_pretrained` refuses the smaller
    weights. Its BERT attention takes the head count from the projection size, so shrinking the four
    Linear layers per config.pruned_heads, as transformers 4 did on load, then loading the weights, works.
    """
    return [
        "import torch",
        "from safetensors.torch import load_file",
        f"from transformers import AutoConfig, {head}",
        "from transformers.pytorch_utils import prune_linear_layer",
        "",
        f"path = {json.dumps(where)}",
        "config = AutoConfig.from_pretrained(path)",
        f"model = {head}(config)",
        "for layer, heads in config.pruned_heads.items():  # the shapes transformers 4 rebuilt on load",
        "    attention = model.base_model.encoder.layer[int(layer)].attention",
        "    size = attention.self.attention_head_size",
        "    kept = [h for h in range(config.num_attention_heads) if h not in heads]",
        "    index = torch.tensor([h * size + i for h in kept for i in range(size)])",
        '    for name in ("query", "key", "value"):',
        "        setattr(attention.self, name, prune_linear_layer(getattr(attention.self, name), index))",
        "    attention.output.dense = prune_linear_layer(attention.output.dense, index, dim=1)",
        'model.load_state_dict(load_file(f"{path}/model.safetensors"))',
        "model.eval()",
    ]


def _vanilla_pruned_section(
    head: str, where: str, policy: ModelPolicy, about: TaskCard, options: str, quantized: bool
) -> list[str]:
    return [
        "",
        "With vanilla transformers 5 (no bert-tasks installed"
        + (", fp32: the int8 quantization is bert-tasks'" if quantized else "")
        + "): `from_pretrained` refuses this dir, since transformers 5 no longer builds the pruned shapes "
        "config.json's `pruned_heads` describes (it raises a size mismatch; with "
        "`ignore_mismatched_sizes=True` it would run the pruned layers on random weights). These lines "
        "rebuild them and load the weights:",
        "",
        "```python",
        *vanilla_pruned_code(head, where),
        "",
        "from transformers import AutoTokenizer, pipeline",
        "",
        f"tokenizer = AutoTokenizer.from_pretrained(path, model_max_length={policy.max_length})",
        f"predict = pipeline({about.pipeline_tag!r}, model=model, tokenizer=tokenizer{options})",
        f"print(predict({about.example!r}))",
        "```",
    ]


def _recovery_sentence(recovery: dict[str, Any], metric: str) -> str:
    """What the recovery fine-tuning did, and whether the card's model is the pruned one or a later step."""
    done = (
        f"{recovery['steps']} updates of recovery fine-tuning at lr {recovery['lr']:g}, scored on validation "
        "before the first and during them (`train_log.jsonl`, `training_curves.png`): "
    )
    if recovery["best_step"] == 0:
        return done + "none beat the pruned model, so these are its weights, as pruning left them."
    gain = f"{recovery['gain']:+.4f} {metric}"
    return done + f"step {recovery['best_step']} was the best ({gain}), and is this model."


def pruned_card(
    source_dir: Path, out_dir: Path, task: Task, policy: ModelPolicy, record: dict[str, Any]
) -> ModelCard:
    """The card of `bert-tasks prune`'s dir: which heads went and how they were chosen, the score after each
    step (and after recovery), how to load it (bert-tasks, and vanilla transformers 5), then the source's
    card."""
    about = task.card(label_names(out_dir), policy)
    heads, steps, metric = record["heads"], record["steps"], record["metric"]
    recovery = record.get("recovery")
    test = "test" in steps[-1]
    rows = [
        f"| {number} | {step['heads_kept']} | {step['validation'][metric]:.4f} | "
        + (f"{step['test'][metric]:.4f} |" if "test" in step else "– |")
        for number, step in enumerate(steps)
    ]
    if recovery is not None:
        rows.append(
            f"| recovery ({recovery['steps']} updates, best at step {recovery['best_step']}) | "
            f"{steps[-1]['heads_kept']} | "
            f"{recovery['validation'][metric]:.4f} | "
            + (f"{recovery['test'][metric]:.4f} |" if "test" in recovery else "– |")
        )
    intro = [
        f"A head-pruned copy of the model `{source_dir}`, written by `bert-tasks prune`: "
        f"{heads['removed']} of its {heads['before']} attention heads removed in {len(steps) - 1} "
        "step(s), the least important first: the expected |dL/dgate| of a gate on each head's output "
        "over the validation split, normalised per layer (Michel et al. 2019), measured again after each "
        "step; no layer loses its last head"
        + (f". Then {_recovery_sentence(recovery, metric)}" if recovery is not None else ".")
        + " config.json's `pruned_heads` names the removed heads per layer (original numbering); the "
        "weights hold the smaller shapes. Each step is in `pruning.json` and `pruning.png`.",
        "",
        "## Scores after each step",
        "",
        f"| step | heads kept | validation {metric} | test {metric} |",
        "| --- | --- | --- | --- |",
        *rows,
        "",
        "Validation chose the heads and scores every step, so its numbers are optimistic"
        + ("; test is held out." if test else "."),
        *_usage_section(task.name, out_dir, policy, about, quantized=False, head=pruned_head(out_dir)),
    ]
    return _copy_card(source_dir, out_dir, task, about, ["pruned"], intro, "the unpruned model")
