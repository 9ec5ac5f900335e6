"""`python -m bert_tasks ...` (what `accelerate launch -m bert_tasks ...` runs): the same CLI."""

from bert_tasks.cli import run

run()
