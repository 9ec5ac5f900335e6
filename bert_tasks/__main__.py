"""`python -m bert_tasks ...` (what `accelerate launch -m bert_tasks ...` runs): the same CLI."""

import sys

from bert_tasks.cli import main

sys.exit(main())
