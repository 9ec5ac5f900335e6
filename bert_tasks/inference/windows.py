"""Run a model over length-sorted batches and hand back per-window logits in dataset order.

Shared by evaluation inside training (several processes: results gathered without duplicates) and by
prediction (one process), so both score windows exactly the same way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
from tqdm.auto import tqdm

from bert_tasks.data.padded_batches import model_inputs
from bert_tasks.runtime import progress_bars_wanted

if TYPE_CHECKING:  # prediction never imports Accelerate (about 1 s of start-up)
    from collections.abc import Iterable

    from accelerate import Accelerator


def collect_window_logits(
    model: torch.nn.Module,
    loader: Iterable[dict[str, torch.Tensor]],
    num_rows: int,
    accelerator: Accelerator | None = None,
    description: str = "predict",
    device: torch.device | None = None,
    progress: bool = True,
) -> list[np.ndarray]:
    """Logits for every encoded row: [num_labels] per sentence, [window_tokens, num_labels] per token task.

    `loader` yields batches with a `row` tensor (a DataLoader, or `PaddedBatches`). With an
    `accelerator` (evaluation in training) batches are sharded and gathered across processes; without
    one (prediction) they are moved to `device`. `progress=False` hides the bar where the caller
    counts progress itself (a streamed file) or nobody watches (a server).
    """
    model.eval()
    found: list[np.ndarray | None] = [None] * num_rows
    show = progress and (accelerator is None or accelerator.is_local_main_process) and progress_bars_wanted()
    with torch.inference_mode():
        for batch in tqdm(loader, desc=description, disable=not show, leave=False, delay=2):
            if device is not None:  # without an accelerator, which already places batches
                batch = {key: value.to(device) for key, value in batch.items()}
            rows = batch["row"]  # [B]
            lengths = batch["attention_mask"].sum(dim=1)  # [B]
            logits = model(**model_inputs(batch, with_labels=False)).logits.float()  # [B, L] or [B, T, L]
            if accelerator is not None:
                if logits.dim() == 3:
                    logits = accelerator.pad_across_processes(logits, dim=1, pad_index=-100)
                rows, lengths, logits = accelerator.gather_for_metrics((rows, lengths, logits))
            for row, length, row_logits in zip(
                rows.tolist(), lengths.tolist(), logits.cpu().numpy(), strict=True
            ):
                found[row] = row_logits[:length] if row_logits.ndim == 2 else row_logits
    missing = [row for row, logits in enumerate(found) if logits is None]
    if missing:
        raise RuntimeError(f"{len(missing)} rows got no prediction (first: {missing[0]}): a sharding bug")
    return found  # type: ignore[return-value]
