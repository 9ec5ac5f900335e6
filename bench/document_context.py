"""Benchmark: what `document_context` costs in tokens, before a run is spent on it (issue #17, item 3).

Each CoNLL sentence read between `k` words of its neighbours makes longer windows; the attention and
every Linear of a training step grow with the tokens per window, so this ratio predicts a run's time.
It encodes the training file of a corpus as a run does (the default model's tokenizer, the recipe's
`max_length` 256 and `stride` 32) once per count and prints windows and tokens per window. The F1
each count buys is measured by `bench/defaults_sweep.py --grid document_context=...`. Run from the
repo root:

    python bench/document_context.py --conll ../shared/data/conll2003/train.txt --counts 0 8 16 32 48 64
"""

from __future__ import annotations

import argparse
import statistics

from common import cpu_name, table_header, table_row
from transformers import AutoTokenizer

from bert_tasks.data.ner_files import read_conll
from bert_tasks.modeling.load import bundled_model_dir
from bert_tasks.tasks.ner import NerTask


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conll", required=True, help="a CoNLL file that marks documents (-DOCSTART-)")
    parser.add_argument("--counts", type=int, nargs="+", default=[0, 8, 16, 32, 48, 64])
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--stride", type=int, default=32)
    args = parser.parse_args()

    tokenizer = AutoTokenizer.from_pretrained(bundled_model_dir())
    sentences = read_conll(args.conll)
    batch = sentences[:]
    print(f"{cpu_name()} | {args.conll}: {len(sentences)} sentences | max_length {args.max_length}")
    table_header(["context words each side", "windows", "tokens per window", f"vs {args.counts[0]}"])
    first = None
    for count in args.counts:
        task = NerTask(document_context=count)
        windows = task.encode_batch(
            batch, range(len(sentences)), tokenizer, None, args.max_length, args.stride
        )["input_ids"]
        tokens = statistics.mean(map(len, windows))
        first = first or tokens
        table_row([count, len(windows), f"{tokens:.1f}", f"{tokens / first:.2f}x"])


if __name__ == "__main__":
    main()
