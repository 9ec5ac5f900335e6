"""The `bert-tasks` command: argument parsing and dispatch only.

It imports nothing heavy: parsing, `--help`, and every mistake that needs no model (config keys and
values, recipes, data files, model dirs) are answered before torch or transformers load. Each command
function forwards its options to the library, which imports what the command needs.

Every user mistake surfaces as a BertTasksError: printed as one line, exit status 1, with the traceback
only under --debug. Ctrl-C exits with status 130 and SIGTERM with 143 (finetune first writes a checkpoint
to resume from); a closed standard output (`| head`) ends quietly.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import gc
import json
import logging
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn

from bert_tasks import __version__
from bert_tasks.config import DEFAULT_MODEL, FIELDS, Config
from bert_tasks.errors import BertTasksError
from bert_tasks.inference.serve_settings import ServeSettings
from bert_tasks.model_dir import QUANTIZE_METHODS
from bert_tasks.runtime import configure_cli_process, launched_processes
from bert_tasks.tasks import task_names

if TYPE_CHECKING:
    from bert_tasks.inference.predictor import Predictor
    from bert_tasks.inference.stream import Check
    from bert_tasks.tasks.base import Task

#: Pickle-based weights (pytorch_model.bin) can run arbitrary code when loaded: only on request.
ALLOW_PICKLE_HELP = "also load pickle-based pytorch_model.bin weights (only from a source you trust)"
#: What `bert-tasks predict --format` writes.
PREDICTION_FORMATS = ("text", "json", "label-studio")
#: The server's defaults (the command line shows and overrides them).
SERVE = ServeSettings(model_dir="", task="")
#: The modules of the 'serve' extra and what they bring with them: missing, `serve` names the extra.
SERVE_EXTRA = ("fastapi", "uvicorn", "starlette", "pydantic", "h11", "anyio")
#: What `bert-tasks memory --dtype` takes (bert_tasks.insight.memory.DTYPES maps them to torch dtypes).
DTYPE_NAMES = ("fp32", "bf16", "fp16")
#: What `bert-tasks export --format` writes: a torch checkpoint quantized on load, or an ONNX graph.
EXPORT_FORMATS = ("torch", "onnx")
_NOTHING_TO_PREDICT = "nothing to predict: give texts as arguments or --file FILE"


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
    configure_cli_process()
    try:
        with _console_logging(quiet=args.quiet):
            args.run(args)
    except BertTasksError as error:
        if args.debug:
            raise
        _say_on_stderr(f"bert-tasks: error: {error}")
        return 1
    except KeyboardInterrupt as interrupt:  # finetune's says where its checkpoint is and how to resume
        _say_on_stderr(f"bert-tasks: {str(interrupt) or 'interrupted'}")
        return 128 + getattr(interrupt, "signal_number", signal.SIGINT)
    except (BrokenPipeError, OSError) as error:
        return _output_failed(error)
    return 0


def run() -> NoReturn:
    """The console script and `python -m bert_tasks`: `main`, then exit with its status.

    Standard output is flushed here, so a full disk or a closed pipe behind it is reported like any
    other, not by Python at exit. What the command loaded lives until the process ends, so the collector
    is spared a last walk over it at exit (about 0.8 s of every command on 2 cores, bench/startup.py).
    `main` itself leaves both alone, for programs that call it.
    """
    status = main()
    try:
        sys.stdout.flush()
    except OSError as error:
        status = _output_failed(error)
    gc.freeze()
    sys.exit(status)


def _output_failed(error: OSError) -> int:
    """A write that failed: a closed pipe ends quietly (`| head`), anything else is one line.

    Only write errors are ours to word (a full disk or quota behind stdout or an output file); other
    OSErrors are bugs and keep their traceback.
    """
    if not isinstance(error, BrokenPipeError) and error.errno not in _WRITE_ERRNOS:
        raise error
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so Python's exit flush cannot fail
    if isinstance(error, BrokenPipeError):
        return 128 + signal.SIGPIPE
    where = error.filename or "standard output"
    _say_on_stderr(
        f"bert-tasks: error: could not write to {where} ({error.strerror}); free space or write elsewhere"
    )
    return 1


def _say_on_stderr(line: str) -> None:
    """One line on stderr in one write: `print` writes the text and its newline apart, so the processes
    of a launch, which share one stderr, could splice their lines into one."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


#: What a failed write says: a full disk, a quota, an I/O error, a read-only file system.
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bert-tasks",
        description="Fine-tune BERT models on sentiment and NER, evaluate them, and predict.",
    )
    parser.add_argument("--debug", action="store_true", help="show full tracebacks")
    parser.add_argument("--quiet", action="store_true", help="print results and warnings only, no progress")
    parser.add_argument("--version", action="version", version=f"bert-tasks {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    tasks = task_names()

    finetune = commands.add_parser(
        "finetune",
        help="train a model (defaults: bundled model + demo data)",
        epilog=_config_keys_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    finetune.add_argument("task", choices=tasks)
    finetune.add_argument("--recipe", help="a recipes/*.yaml file; key=value overrides win over it")
    finetune.add_argument("--resume", action="store_true", help="continue the run in output_dir")
    finetune.add_argument("--overwrite", action="store_true", help="replace the previous run in output_dir")
    finetune.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. lr=3e-5")
    finetune.set_defaults(run=_finetune, positionals="overrides")

    distill = commands.add_parser(
        "distill",
        help="train a smaller student on a fine-tuned teacher's predictions (a finetune with a teacher)",
        description="The student (default: the teacher cut to half its layers, student_layers=N or [..]) "
        "learns the teacher's soft targets (alpha, temperature) and the gold labels; transfer_file= adds "
        "unlabelled texts the teacher labels. Everything finetune does, and the same keys.",
        epilog=_config_keys_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    distill.add_argument("task", choices=tasks)
    distill.add_argument(
        "--teacher", help="the fine-tuned model dir to distil (default: the recipe's teacher)"
    )
    distill.add_argument("--recipe", help="a recipes/*.yaml file; key=value overrides win over it")
    distill.add_argument("--resume", action="store_true", help="continue the run in output_dir")
    distill.add_argument("--overwrite", action="store_true", help="replace the previous run in output_dir")
    distill.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. alpha=0.7")
    distill.set_defaults(run=_distill, positionals="overrides")

    evaluate = commands.add_parser("evaluate", help="score a saved model on a labelled file")
    evaluate.add_argument("task", choices=tasks)
    evaluate.add_argument("--model", help="saved model dir (default: runs/<task>)")
    evaluate.add_argument("--data", required=True, help="labelled file in any format finetune reads")
    evaluate.add_argument(
        "--out", help="where to write metrics JSON and plots (default: <model>/eval-<data>)"
    )
    evaluate.add_argument("--json", action="store_true", help="print the metrics as JSON")
    evaluate.add_argument(
        "--html", metavar="PAGE", help="also write the evaluation as an explorable page (.html; ner)"
    )
    evaluate.add_argument("--allow-pickle", action="store_true", help=ALLOW_PICKLE_HELP)
    evaluate.add_argument(
        "--quantize", choices=QUANTIZE_METHODS, help="score the dynamically quantized model"
    )
    evaluate.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="how the file is read (e.g. text_column=x) or how the model reads it, instead of the saved "
        "values (max_length, stride, NER's viterbi, word_splitter, document_context)",
    )
    evaluate.set_defaults(run=_evaluate, positionals="overrides")

    predict = commands.add_parser("predict", help="label texts with a saved model")
    predict.add_argument("task", choices=tasks)
    predict.add_argument("texts", nargs="*", metavar="TEXT")
    predict.add_argument("--model", help="saved model dir (default: runs/<task>)")
    predict.add_argument(
        "--file",
        help="texts to label: one per line, or JSONL with a 'text' field (ner: or 'tokens', a list of "
        "words to tag one by one, with or without the 'text'); - reads standard input",
    )
    predict.add_argument("--json", action="store_true", help="one JSON object per text, for programs")
    predict.add_argument(
        "--format",
        choices=PREDICTION_FORMATS,
        help="text (for people, the default), json (= --json), or label-studio: one JSON array of Label "
        "Studio tasks pre-annotated with the predictions, to import into a project",
    )
    predict.add_argument(
        "--html", metavar="PAGE", help="also write the predictions as an explorable page (.html; ner)"
    )
    predict.add_argument(
        "--out",
        metavar="OUT.jsonl",
        help="write JSON Lines to this new file instead of printing: each input record (id and every other "
        "field kept) with its prediction, in input order, read, predicted and written in bounded chunks",
    )
    predict.add_argument(
        "--pair",
        metavar="TEXT",
        help="a pair model's second text (e.g. the aspect) for the TEXTs given and the plain lines of --file "
        "(JSON records give theirs in the field the model was trained with)",
    )
    predict.add_argument("--batch-size", type=int, default=64)
    predict.add_argument("--quantize", choices=QUANTIZE_METHODS, help="dynamic INT8 Linear layers (CPU)")
    predict.add_argument("--allow-pickle", action="store_true", help=ALLOW_PICKLE_HELP)
    predict.set_defaults(run=_predict, positionals="texts")

    serve = commands.add_parser(
        "serve",
        help="serve a saved model over HTTP with micro-batching (needs the 'serve' extra)",
        description="POST /predict, GET /health, GET /info, OpenAPI at /openapi.json. Listens on "
        "loopback unless --host says otherwise: put a TLS reverse proxy with auth and rate limits in "
        "front before opening it to a network (README).",
    )
    serve.add_argument("task", choices=tasks)
    serve.add_argument("--model", help="saved model dir (default: runs/<task>)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port to listen on (default: 8000)")
    serve.add_argument(
        "--max-batch",
        type=int,
        default=SERVE.max_batch,
        help=f"texts per model call at most (default: {SERVE.max_batch})",
    )
    serve.add_argument(
        "--max-wait-ms",
        type=float,
        default=SERVE.max_wait_ms,
        help="how long the first request of a batch waits for others to join "
        f"(default: {SERVE.max_wait_ms:g})",
    )
    serve.add_argument(
        "--max-texts",
        type=int,
        default=SERVE.max_texts,
        help=f"texts per request at most (default: {SERVE.max_texts})",
    )
    serve.add_argument(
        "--max-chars",
        type=int,
        default=SERVE.max_chars,
        help=f"characters per request at most (default: {SERVE.max_chars})",
    )
    serve.add_argument(
        "--workers", type=int, default=1, help="processes, each with its own model (default: 1)"
    )
    serve.add_argument(
        "--threads",
        type=int,
        help="torch CPU threads per process (default: OMP_NUM_THREADS, else the cores divided among the "
        "workers)",
    )
    serve.add_argument("--quantize", choices=QUANTIZE_METHODS, help="dynamic INT8 Linear layers (CPU)")
    serve.add_argument("--allow-pickle", action="store_true", help=ALLOW_PICKLE_HELP)
    serve.set_defaults(run=_serve, positionals="unexpected", unexpected=[])

    attention = commands.add_parser("attention", help="draw a text's attention weights as PNG heatmaps")
    attention.add_argument("text", nargs="*", metavar="TEXT", help="the text (its words are joined)")
    attention.add_argument(
        "--model", default=DEFAULT_MODEL, help=f"a BERT model dir (default: {DEFAULT_MODEL})"
    )
    attention.add_argument("--layer", help="layer number from 0, or 'all' (default: the last layer)")
    attention.add_argument("--head", type=int, help="head number from 0 (default: every head of the layer)")
    attention.add_argument("--out", help="PNG to write (default: attention_<layer>[_head<H>].png)")
    attention.add_argument(
        "--html",
        metavar="PAGE",
        help="write an explorable page (.html) instead of a PNG, open at --layer/--head",
    )
    attention.add_argument(
        "--compare", metavar="MODEL", help="with --html: a second model (e.g. fine-tuned) and its difference"
    )
    attention.set_defaults(run=_attention, positionals="text")

    memory = commands.add_parser("memory", help="attention memory: formula vs measured, eager vs fused SDPA")
    memory.add_argument("--model", default=DEFAULT_MODEL, help=f"a BERT model dir (default: {DEFAULT_MODEL})")
    memory.add_argument("--batch", type=int, default=8)
    memory.add_argument("--seq-len", type=int, default=512)
    memory.add_argument("--dtype", choices=DTYPE_NAMES, default="fp32")
    memory.set_defaults(run=_memory, positionals="unexpected", unexpected=[])

    export = commands.add_parser(
        "export", help="write a deployable copy of a saved model: ONNX (fp32/int8) or torch int8"
    )
    export.add_argument("out", nargs="*", metavar="OUT", help="the new model dir")
    export.add_argument("--model", required=True, help="saved model dir")
    export.add_argument(
        "--format",
        choices=EXPORT_FORMATS,
        default=EXPORT_FORMATS[0],
        help="torch: the fp32 checkpoint, quantized on load (needs --quantize); onnx: one ONNX graph that "
        "onnxruntime runs without torch, int8 weights on disk with --quantize (the onnx extra)",
    )
    export.add_argument("--quantize", choices=QUANTIZE_METHODS)
    export.add_argument(
        "--check",
        metavar="FILE",
        help="onnx: texts to check the export against the model on (default: the task's demo data)",
    )
    export.set_defaults(run=_export, positionals="out")

    prune = commands.add_parser(
        "prune",
        help="remove the least important attention heads, step by step (Michel et al. 2019)",
        description="Score every head on the validation split, remove the lowest-scored ones in steps "
        "(scoring again after each), optionally fine-tune to recover, and write a new model dir with "
        "pruning.json and pruning.png.",
    )
    prune.add_argument("task", choices=tasks)
    prune.add_argument("--model", help="saved model dir (default: runs/<task>)")
    prune.add_argument(
        "--heads",
        required=True,
        help="heads to remove: a fraction of the model's heads (0.5) or a count (36)",
    )
    prune.add_argument("--out", help="the new model dir (default: <model>-pruned-<N>, N heads removed)")
    prune.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="steps=K (default: one per 10%% of the heads), recover_steps=S (default 0), and config keys "
        "over the model's recipe.yaml: its data (validation_file=, ...) and, with recovery, training "
        "(lr=, default the recipe's / 5; eval_every=, default recover_steps / 4; ...)",
    )
    prune.set_defaults(run=_prune, positionals="overrides")

    compress = commands.add_parser(
        "compress",
        help="distil, prune and export int8 in one go, each step scored on the validation split",
        description="Runs distill (the teacher cut to --layers), prune (--heads, optional) and export "
        "--format onnx --quantize int8 into OUT/distilled, OUT/pruned, OUT/onnx-int8, scores every step "
        "and the teacher on the teacher's validation split, and names the dir to deploy: with --max-loss, "
        "the smallest step within that many points of the teacher. Writes OUT/compress.json.",
    )
    compress.add_argument("task", choices=tasks)
    compress.add_argument("--model", help="the fine-tuned model dir (default: runs/<task>)")
    compress.add_argument("--out", required=True, help="a new dir for the steps' model dirs")
    compress.add_argument(
        "--layers", default="half", help="layers the student keeps: a count, half (default), or none"
    )
    compress.add_argument("--heads", help="heads to prune from the student: a fraction (0.25) or a count")
    compress.add_argument("--recover-steps", type=int, default=0, help="recovery updates after pruning")
    compress.add_argument("--no-int8", action="store_true", help="skip the ONNX int8 export")
    compress.add_argument("--max-loss", type=float, help="validation points the deployed step may lose")
    compress.add_argument(
        "overrides", nargs="*", metavar="key=value", help="distill keys over the teacher's recipe (epochs=3)"
    )
    compress.set_defaults(run=_compress, positionals="overrides")

    debug = commands.add_parser("debug", help="look at the data before training (debug data)")
    debug_commands = debug.add_subparsers(dest="debug_command", required=True)
    data = debug_commands.add_parser(
        "data",
        help="per-split counts, labels, lengths, windows, duplicates and overlap; no model loads",
        description="Report on the data a finetune run would read (same recipe, same readers); exit "
        "status 1 when it holds errors training would hit or that make its scores meaningless.",
    )
    data.add_argument("task", choices=tasks)
    data.add_argument("--recipe", help="a recipes/*.yaml file; key=value overrides win over it")
    data.add_argument("--json", action="store_true", help="print the report as one JSON object")
    data.add_argument(
        "--rare",
        type=int,
        metavar="N",
        help="labels with fewer than N examples (entities) are rare (default 10)",
    )
    data.add_argument(
        "overrides", nargs="*", metavar="key=value", help="config overrides, e.g. max_length=64"
    )
    data.set_defaults(run=_debug_data, positionals="overrides")
    return parser


@contextmanager
def _console_logging(quiet: bool) -> Iterator[None]:
    """The library logs; the CLI shows its records on stderr, so stdout holds results only (`--json`).

    Installed for the command's duration only, so calling `main` from Python leaves logging as it was.
    """
    library = logging.getLogger("bert_tasks")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    level = library.level
    library.setLevel(logging.WARNING if quiet else logging.INFO)
    library.addHandler(handler)
    try:
        yield
    finally:
        library.removeHandler(handler)
        library.setLevel(level)


def _config_keys_help() -> str:
    """Every config key with its default and meaning, from the Config definition itself."""
    rows = [(f.name, _default_text(f), f.metadata.get("help", "")) for f in dataclasses.fields(Config)]
    rows = [row for row in rows if row[0] != "task"]
    width = max(len(f"{name}={default}") for name, default, _ in rows)
    lines = [f"  {f'{name}={default}':<{width}}  {meaning}" for name, default, meaning in rows]
    return (
        "config keys (key=value; defaults before task defaults, see README 'Recipes and config'):\n"
        + "\n".join(lines)
    )


def _default_text(field: dataclasses.Field) -> str:
    default = field.default
    if default is dataclasses.MISSING or default is None:
        return "none"
    return str(default).lower() if isinstance(default, bool) else str(default)


def _finetune(args: argparse.Namespace) -> None:
    from bert_tasks.config import load_recipe
    from bert_tasks.training import train

    flags = [f"{flag}=true" for flag in ("resume", "overwrite") if getattr(args, flag)]
    cfg = load_recipe(args.recipe, [*args.overrides, *flags], task=args.task)
    if cfg.teacher is not None:
        raise BertTasksError(
            f"finetune: teacher={cfg.teacher} distils; run `bert-tasks distill {args.task}` with it instead"
        )
    train(cfg)


def _distill(args: argparse.Namespace) -> None:
    from bert_tasks.config import load_recipe
    from bert_tasks.training import train

    flags = [f"{flag}=true" for flag in ("resume", "overwrite") if getattr(args, flag)]
    teacher = [f"teacher={args.teacher}"] if args.teacher is not None else []
    cfg = load_recipe(args.recipe, [*args.overrides, *teacher, *flags], task=args.task)
    if cfg.teacher is None:
        raise BertTasksError(
            f"distill: no teacher; give --teacher DIR (a model dir bert-tasks finetune {args.task} wrote)"
        )
    train(cfg)


def _debug_data(args: argparse.Namespace) -> None:
    from bert_tasks.config import load_recipe
    from bert_tasks.insight.data_report import data_report, render_data_report

    cfg = load_recipe(args.recipe, args.overrides, task=args.task)
    report = data_report(cfg) if args.rare is None else data_report(cfg, args.rare)
    print(json.dumps(report, indent=2, ensure_ascii=False) if args.json else render_data_report(report))
    if report["errors"]:
        raise BertTasksError(
            f"the data has {len(report['errors'])} error(s), listed in the report; fix them before training"
        )


def _evaluate(args: argparse.Namespace) -> None:
    from pathlib import Path

    from bert_tasks.inference.evaluate import evaluate_file
    from bert_tasks.model_dir import read_policy

    model_dir = Path(_model_dir(args))
    out_dir = Path(args.out) if args.out else model_dir / f"eval-{Path(args.data).stem}"
    metrics = evaluate_file(
        args.task,
        model_dir,
        args.data,
        args.overrides,
        out_dir,
        quantize=args.quantize,
        allow_pickle=args.allow_pickle,
        html=args.html,
    )
    if args.json:
        print(json.dumps(metrics, indent=2))
    else:
        print(read_policy(model_dir, args.task).make_task().render_metrics(metrics))


def _predict(args: argparse.Namespace) -> None:
    if args.out is not None:
        if args.html is not None:
            raise BertTasksError(
                "--out streams predictions to a file, --html needs all for one page; give one"
            )
        _predict_to_file(args)
        return
    processes = launched_processes()
    if processes > 1:
        raise BertTasksError(
            f"predict across {processes} processes writes one file: give --out OUT.jsonl (and --file), "
            "or run predict as a single process"
        )
    _check_texts_given(args)
    _check_batch_size(args)
    if args.json and args.format not in (None, "json"):
        raise BertTasksError(f"--json and --format {args.format} ask for two outputs; give one of them")
    output = args.format or ("json" if args.json else "text")
    model_dir = _checked_model_dir(args)
    from bert_tasks.inference.stream import prediction_inputs

    check = _input_check(args, model_dir)
    if output == "label-studio":
        from bert_tasks.data.annotation_tools import label_studio_input
        from bert_tasks.model_dir import read_policy

        check = label_studio_input(read_policy(model_dir, args.task).make_task(), check)
    given, _ = prediction_inputs(args.texts, args.file, check)
    records = list(given)
    if not records:  # an empty pipe or file
        source = "standard input" if args.file == "-" else args.file
        raise BertTasksError(
            f"nothing to predict: {source} holds no text (empty, or blank lines only); give it texts, "
            "or texts as arguments"
        )
    if args.html is None:
        _predict_and_print(args, model_dir, records, output)
        return
    from pathlib import Path

    from bert_tasks.output_paths import page_output, write_atomically
    from bert_tasks.tasks import task_class

    task_class(args.task).check_page("predict")
    with page_output(args.html, "predict") as page:  # checked (and made) before the model loads
        task, predictions = _predict_and_print(args, model_dir, records, output)
        texts = [task.shown_input(fields) for _, fields in records]
        with page.writing():
            write_atomically(Path(args.html), task.predictions_page(texts, predictions))
    logging.getLogger("bert_tasks.cli").info("predictions page written to %s", args.html)


def _predict_and_print(
    args: argparse.Namespace, model_dir: str, records: list[tuple[str, dict[str, Any]]], output: str
) -> tuple[Task, list[Any]]:
    """Predict the input `records` (`file:line`, fields) and print them as `output` asks; return the task
    and the predictions."""
    predictor = _predictor(args, model_dir)
    predictions = predictor.predict_inputs(records)
    texts = [predictor.task.shown_input(fields) for _, fields in records]
    if output == "label-studio":
        from bert_tasks.data.annotation_tools import label_studio_tasks

        tasks = label_studio_tasks(predictor.task, texts, predictions, predictor.model_version)
        print(json.dumps(tasks, ensure_ascii=False, indent=2))
    elif output == "json":
        for text, prediction in zip(texts, predictions, strict=True):
            print(json.dumps(predictor.task.record(text, prediction), ensure_ascii=False))
    else:
        print(predictor.task.render_predictions(texts, predictions))
    return predictor.task, predictions


def _predict_to_file(args: argparse.Namespace) -> None:
    """`predict --out`: streamed, so a file of any size runs in bounded memory (inference/stream.py)."""
    from bert_tasks.inference.stream import (
        JsonlOutput,
        check_output,
        predict_to_jsonl,
        prediction_inputs,
    )

    if args.format not in (None, "json"):
        raise BertTasksError(f"--out writes JSON Lines, --format {args.format} prints; give one of them")
    _check_texts_given(args)
    _check_batch_size(args)
    processes = launched_processes()
    if processes > 1 and args.file == "-":
        raise BertTasksError(
            f"--file -: standard input cannot be shared by the {processes} processes of a launch; "
            "save it to a file and give its path, or run predict as a single process"
        )
    model_dir = _checked_model_dir(args)
    check = _input_check(args, model_dir)
    records, total = prediction_inputs(args.texts, args.file, check)  # a regular file: read through here
    if processes > 1:
        from bert_tasks.inference.across_processes import predict_across_processes

        check_output(args.out, args.file)  # on every process: each must refuse what the main one would
        shared = predict_across_processes(
            lambda: _predictor(args, model_dir), records, args.out, args.file, total
        )
        if shared is None:  # not the main process: it wrote nothing and says nothing
            return
        count = shared
    else:
        with JsonlOutput(args.out, args.file) as out:
            count = predict_to_jsonl(_predictor(args, model_dir), records, out, total)
    print(f"{count} predictions written to {args.out}")


def _check_texts_given(args: argparse.Namespace) -> None:
    """Something to predict, and no TEXT that is exactly a setting (`viterbi=false`): predict takes none
    (the model's saved ones apply), so such a word was meant as one and would be predicted as a text."""
    if not args.texts and not args.file:
        raise BertTasksError(_NOTHING_TO_PREDICT)
    for text in args.texts:
        key, equals, _ = text.partition("=")
        if equals and key in FIELDS:
            raise BertTasksError(
                f"predict: the text {text!r} is a {key}= setting, and predict takes none: it runs the model "
                f"with the settings saved in it; to predict {text!r} as a text, give it in a --file"
            )


def _check_batch_size(args: argparse.Namespace) -> None:
    if args.batch_size < 1:
        raise BertTasksError(f"--batch-size must be at least 1, got {args.batch_size}")


def _checked_model_dir(args: argparse.Namespace) -> str:
    """The command's model dir; a wrong or damaged one is answered here, before torch loads."""
    from bert_tasks.model_dir import check_saved_positions, read_policy

    model_dir = _model_dir(args)
    check_saved_positions(read_policy(model_dir, args.task), model_dir)
    return model_dir


def _input_check(args: argparse.Namespace, model_dir: str) -> Check:
    """The model's task's check of each input record (before torch loads), with `--pair` filling a pair
    model's second text where a record has none; `--pair` for a one-text model is refused."""
    from bert_tasks.model_dir import read_policy

    task = read_policy(model_dir, args.task).make_task()
    field = task.pair_field
    if args.pair is None:
        return task.check_input
    if field is None:
        raise BertTasksError(
            f"--pair: the model in {model_dir} reads one text per input, not text pairs; drop --pair"
        )

    def with_pair(where: str, record: dict[str, Any]) -> dict[str, Any]:
        return task.check_input(where, record if field in record else {**record, field: args.pair})

    return with_pair


def _predictor(args: argparse.Namespace, model_dir: str) -> Predictor:
    from bert_tasks.inference.predictor import Predictor

    return Predictor(
        model_dir, batch_size=args.batch_size, quantize=args.quantize, allow_pickle=args.allow_pickle
    )


def _model_dir(args: argparse.Namespace) -> str:
    """`--model`, or where `finetune` saves by default (`runs/<task>`), which a newcomer may lack yet."""
    if args.model is not None:
        return args.model
    default = f"runs/{args.task}"
    if not os.path.isdir(default):
        raise BertTasksError(
            f"no model at {default} (the default --model); train one with `bert-tasks finetune {args.task}` "
            "or pass --model DIR"
        )
    return default


def _prune(args: argparse.Namespace) -> None:
    from bert_tasks.pruning import prune

    out = prune(args.task, _model_dir(args), args.heads, args.out, args.overrides)
    print(f"pruned model written to {out}")


def _compress(args: argparse.Namespace) -> None:
    from bert_tasks.compress import compress, plan_compress, render_report

    plan = plan_compress(
        args.task,
        _model_dir(args),
        args.out,
        args.layers,
        args.heads,
        args.recover_steps,
        not args.no_int8,
        args.max_loss,
        args.overrides,
    )
    print(render_report(compress(plan)))


def _serve(args: argparse.Namespace) -> None:
    if args.unexpected:
        raise BertTasksError(f"serve takes one task, got also: {' '.join(args.unexpected)}")
    settings = dataclasses.replace(
        SERVE,
        model_dir=_checked_model_dir(args),
        task=args.task,
        max_batch=args.max_batch,
        max_wait_ms=args.max_wait_ms,
        max_texts=args.max_texts,
        max_chars=args.max_chars,
        allow_pickle=args.allow_pickle,
        quantize=args.quantize,
        threads=args.threads,
    )
    settings.check()
    try:
        from bert_tasks.inference.server import serve
    except ModuleNotFoundError as missing:
        if missing.name not in SERVE_EXTRA:
            raise
        raise BertTasksError(
            f"bert-tasks serve needs the 'serve' extra ({missing.name} is not installed); "
            "install it with: pip install 'bert-tasks[serve]'"
        ) from None
    serve(settings, args.host, args.port, args.workers)


def _attention(args: argparse.Namespace) -> None:
    text = " ".join(args.text)
    if not text.strip():
        raise BertTasksError('nothing to draw: give a text, e.g. bert-tasks attention "The patient is ill"')
    if args.html is not None:
        if args.out is not None:
            raise BertTasksError("--out writes a PNG and --html a page: give one of them")
        from bert_tasks.insight.attention_page import write_attention_page

        page = write_attention_page(text, args.html, args.model, args.compare, args.layer, args.head)
        print(f"attention page written to {page}")
        return
    if args.compare is not None:
        raise BertTasksError("--compare shows two models on the HTML page only; add --html PAGE")
    from bert_tasks.insight.attention_maps import draw_attention

    path, _ = draw_attention(text, args.model, args.layer, args.head, args.out)
    print(f"attention heatmap written to {path}")


def _memory(args: argparse.Namespace) -> None:
    if args.unexpected:
        raise BertTasksError(f"memory takes no positional arguments, got: {' '.join(args.unexpected)}")
    from bert_tasks.insight.memory import attention_memory, render_memory

    print(render_memory(attention_memory(args.model, args.batch, args.seq_len, args.dtype)))


def _export(args: argparse.Namespace) -> None:
    if len(args.out) != 1:
        raise BertTasksError(f"export needs one OUT directory, got {len(args.out)}")
    from bert_tasks.model_dir import read_policy

    read_policy(args.model)  # a wrong or damaged model dir is answered before torch loads
    if args.format == "onnx":
        from bert_tasks.inference.onnx_export import export_onnx

        parity = export_onnx(args.model, args.out[0], args.quantize, args.check)
        print(f"ONNX {args.quantize or 'fp32'} model written to {args.out[0]}; {parity}")
        return
    if args.check is not None:
        raise BertTasksError("export: --check is for --format onnx (the torch export is not re-run)")
    if args.quantize is None:
        raise BertTasksError(f"export --format torch: choose --quantize ({', '.join(QUANTIZE_METHODS)})")
    from bert_tasks.inference.quantize import export_quantized

    sizes = export_quantized(args.model, args.out[0], args.quantize)
    print(f"{args.quantize} model written to {args.out[0]}; weights in memory: {sizes}")


if __name__ == "__main__":
    run()
