"""The `bert-tasks` command: argument parsing and dispatch only.

Every user mistake surfaces as a BertTasksError: printed as one line, exit status 1, with the traceback
only under --debug. Ctrl-C exits with status 130 (finetune first writes a checkpoint to resume from).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bert_tasks.errors import BertTasksError
from bert_tasks.memory import DTYPES
from bert_tasks.modeling.load import DEFAULT_MODEL
from bert_tasks.quantize import QUANTIZE_METHODS
from bert_tasks.tasks import TASK_NAMES

#: Pickle-based weights (pytorch_model.bin) can run arbitrary code when loaded: only on request.
ALLOW_PICKLE_HELP = "also load pickle-based pytorch_model.bin weights (only from a source you trust)"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script (and of `python -m bert_tasks`)."""
    parser = _parser()
    # Options may come after positionals ("predict ner --model DIR 'text'"), which argparse's nargs="*"
    # positionals do not allow: collect the leftovers into the command's positional list.
    # After "--" everything is positional, so texts may start with "-".
    args, extra = parser.parse_known_args(argv)
    split = extra.index("--") if "--" in extra else len(extra)
    unknown = [item for item in extra[:split] if item.startswith("-")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    getattr(args, args.positionals).extend(extra[:split] + extra[split + 1 :])
    _quiet_libraries()
    try:
        args.run(args)
    except BertTasksError as error:
        if args.debug:
            raise
        print(f"bert-tasks: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as interrupt:  # finetune's says where its checkpoint is and how to resume
        print(f"bert-tasks: {str(interrupt) or 'interrupted'}", file=sys.stderr)
        return 130
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bert-tasks",
        description="Fine-tune BERT models on sentiment and NER, evaluate them, and predict.",
    )
    parser.add_argument("--debug", action="store_true", help="show full tracebacks")
    commands = parser.add_subparsers(dest="command", required=True)

    finetune = commands.add_parser("finetune", help="train a model (defaults: bundled model + demo data)")
    finetune.add_argument("task", choices=TASK_NAMES)
    finetune.add_argument("--recipe", help="a recipes/*.yaml file; key=value overrides win over it")
    finetune.add_argument("--resume", action="store_true", help="continue the run in output_dir")
    finetune.add_argument("--overwrite", action="store_true", help="replace what output_dir holds")
    finetune.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. lr=3e-5")
    finetune.set_defaults(run=_finetune, positionals="overrides")

    evaluate = commands.add_parser("evaluate", help="score a saved model on a labelled file")
    evaluate.add_argument("task", choices=TASK_NAMES)
    evaluate.add_argument("--model", help="saved model dir (default: runs/<task>)")
    evaluate.add_argument("--data", required=True, help="labelled file in any format finetune reads")
    evaluate.add_argument(
        "--out", help="where to write metrics JSON and plots (default: <model>/eval-<data>)"
    )
    evaluate.add_argument("--json", action="store_true", help="print the metrics as JSON")
    evaluate.add_argument("--allow-pickle", action="store_true", help=ALLOW_PICKLE_HELP)
    evaluate.add_argument(
        "--quantize", choices=QUANTIZE_METHODS, help="score the dynamically quantized model"
    )
    evaluate.add_argument(
        "overrides", nargs="*", metavar="key=value", help="reader settings, e.g. text_column=x"
    )
    evaluate.set_defaults(run=_evaluate, positionals="overrides")

    predict = commands.add_parser("predict", help="label texts with a saved model")
    predict.add_argument("task", choices=TASK_NAMES)
    predict.add_argument("texts", nargs="*", metavar="TEXT")
    predict.add_argument("--model", help="saved model dir (default: runs/<task>)")
    predict.add_argument(
        "--file", help="texts to label: one per line, or JSONL with a 'text' field; - reads standard input"
    )
    predict.add_argument("--json", action="store_true", help="one JSON object per text, for programs")
    predict.add_argument("--batch-size", type=int, default=64)
    predict.add_argument("--quantize", choices=QUANTIZE_METHODS, help="dynamic INT8 Linear layers (CPU)")
    predict.add_argument("--allow-pickle", action="store_true", help=ALLOW_PICKLE_HELP)
    predict.set_defaults(run=_predict, positionals="texts")

    attention = commands.add_parser("attention", help="draw a text's attention weights as PNG heatmaps")
    attention.add_argument("text", nargs="*", metavar="TEXT", help="the text (its words are joined)")
    attention.add_argument(
        "--model", default=DEFAULT_MODEL, help=f"a BERT model dir (default: {DEFAULT_MODEL})"
    )
    attention.add_argument("--layer", help="layer number from 0, or 'all' (default: the last layer)")
    attention.add_argument("--head", type=int, help="head number from 0 (default: every head of the layer)")
    attention.add_argument("--out", help="PNG to write (default: attention_<layer>[_head<H>].png)")
    attention.set_defaults(run=_attention, positionals="text")

    memory = commands.add_parser("memory", help="attention memory: formula vs measured, eager vs fused SDPA")
    memory.add_argument("--model", default=DEFAULT_MODEL, help=f"a BERT model dir (default: {DEFAULT_MODEL})")
    memory.add_argument("--batch", type=int, default=8)
    memory.add_argument("--seq-len", type=int, default=512)
    memory.add_argument("--dtype", choices=DTYPES, default="fp32")
    memory.set_defaults(run=_memory, positionals="unexpected", unexpected=[])

    export = commands.add_parser("export", help="write a reusable quantized copy of a saved model")
    export.add_argument("out", nargs="*", metavar="OUT", help="the new model dir")
    export.add_argument("--model", required=True, help="saved model dir")
    export.add_argument("--quantize", choices=QUANTIZE_METHODS, required=True)
    export.set_defaults(run=_export, positionals="out")
    return parser


def _finetune(args: argparse.Namespace) -> None:
    from bert_tasks.config import load_recipe
    from bert_tasks.training import train

    flags = [f"{flag}=true" for flag in ("resume", "overwrite") if getattr(args, flag)]
    cfg = load_recipe(args.recipe, [*args.overrides, *flags], task=args.task)
    train(cfg)


def _evaluate(args: argparse.Namespace) -> None:
    from bert_tasks.evaluation import evaluate_file

    model_dir = Path(args.model or f"runs/{args.task}")
    out_dir = Path(args.out) if args.out else model_dir / f"eval-{Path(args.data).stem}"
    metrics = evaluate_file(
        args.task,
        model_dir,
        args.data,
        args.overrides,
        out_dir,
        quiet=args.json,
        quantize=args.quantize,
        allow_pickle=args.allow_pickle,
    )
    if args.json:
        print(json.dumps(metrics, indent=2))


def _predict(args: argparse.Namespace) -> None:
    from bert_tasks.predict import PREDICTORS

    texts = list(args.texts) + (_read_texts(args.file) if args.file else [])
    if not texts:
        raise BertTasksError("nothing to predict: give texts as arguments or --file FILE")
    if args.batch_size < 1:
        raise BertTasksError(f"--batch-size must be at least 1, got {args.batch_size}")
    predictor = PREDICTORS[args.task](
        args.model or f"runs/{args.task}",
        batch_size=args.batch_size,
        quantize=args.quantize,
        allow_pickle=args.allow_pickle,
    )
    predictions = predictor.predict(texts)
    if args.json:
        for text, prediction in zip(texts, predictions, strict=True):
            print(json.dumps(_as_record(args.task, text, prediction), ensure_ascii=False))
    else:
        print(predictor.task.render_predictions(texts, predictions))


def _attention(args: argparse.Namespace) -> None:
    from bert_tasks.attention_maps import draw_attention

    text = " ".join(args.text)
    if not text.strip():
        raise BertTasksError('nothing to draw: give a text, e.g. bert-tasks attention "The patient is ill"')
    path, _ = draw_attention(text, args.model, args.layer, args.head, args.out)
    print(f"attention heatmap written to {path}")


def _memory(args: argparse.Namespace) -> None:
    from bert_tasks.memory import attention_memory, render_memory

    if args.unexpected:
        raise BertTasksError(f"memory takes no positional arguments, got: {' '.join(args.unexpected)}")
    print(render_memory(attention_memory(args.model, args.batch, args.seq_len, args.dtype)))


def _export(args: argparse.Namespace) -> None:
    from bert_tasks.quantize import export_quantized

    if len(args.out) != 1:
        raise BertTasksError(f"export needs one OUT directory, got {len(args.out)}")
    sizes = export_quantized(args.model, args.out[0], args.quantize)
    print(f"{args.quantize} model written to {args.out[0]}; weights in memory: {sizes}")


def _as_record(task: str, text: str, prediction: Any) -> dict[str, Any]:
    return {"text": text, **prediction} if task == "sentiment" else {"text": text, "entities": prediction}


def _read_texts(path: str) -> list[str]:
    """Texts from a file, or standard input for `-`: JSONL objects with a 'text' field, or one plain text
    per non-blank line."""
    from bert_tasks.data.files import decode_utf8, read_utf8

    if path == "-":
        path = "<stdin>"
        lines = decode_utf8(sys.stdin.buffer.read(), path).splitlines()
    else:
        lines = read_utf8(path).splitlines()  # one-line errors for missing, empty, non-UTF-8 files
    texts = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise BertTasksError(f"{path}:{number}: invalid JSON ({error.msg})") from error
            if not isinstance(record.get("text"), str):
                raise BertTasksError(f"{path}:{number}: JSON line has no 'text' string field")
            texts.append(record["text"])
        else:
            texts.append(line)
    return texts


def _quiet_libraries() -> None:
    """Our own progress bars and messages say what happens; silence the libraries' per-load chatter."""
    import datasets
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()


if __name__ == "__main__":
    sys.exit(main())
