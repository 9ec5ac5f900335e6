"""The update's gradient bookkeeping on one process: clipping, and the word embeddings' gradient.

Why not torch's: on CPU a step of short sentences spends ~10% of its time on work that grows with the
parameter count but is neither a GEMM nor the optimizer (`bench/profile_step.py`). The dense gradient of
the word embeddings (30,522 x 384 fp32 for MiniLM, 47 MB) is zero-filled by every backward although a
batch looks up a few hundred rows, then read by the clipping norm and scaled by its multiply in full; and
`clip_grad_norm_` multiplies every gradient by 1.0 when nothing needs clipping. Here the embedding keeps
one dense gradient buffer, written and cleared only at the rows the batches looked up; AdamW still steps
on that whole dense buffer (zeros included), so the update is exactly AdamW's, and the norm and scaling
are `clip_grad_norm_`'s. Not used under DDP, FSDP or DeepSpeed: they reduce gradients through autograd's
own accumulation, which this bypasses (the run keeps Accelerate's clipping there).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

#: torch's clip_grad_norm_ adds this to the norm before dividing, so clipping here scales the same.
CLIP_EPSILON = 1e-6


class TouchedRowsGradient:
    """One embedding table's dense gradient, written and zeroed only at the rows looked up since the last
    update; `weight.grad` is this buffer for the whole run."""

    def __init__(self, embedding: nn.Embedding) -> None:
        self.weight = embedding.weight
        self.padding_idx = embedding.padding_idx
        self.buffer = torch.zeros_like(self.weight)
        self.weight.grad = self.buffer
        self._looked_up: list[torch.Tensor] = []

    def accumulate(self, ids: torch.Tensor, grad_output: torch.Tensor) -> None:
        """Add the lookup's gradient into its rows; a padding row gets none (as nn.Embedding's backward)."""
        flat_ids = ids.reshape(-1)  # (N,)
        flat_grad = grad_output.reshape(-1, grad_output.shape[-1]).to(self.buffer.dtype)  # (N, dim)
        if self.padding_idx is not None:
            real = flat_ids != self.padding_idx
            flat_ids, flat_grad = flat_ids[real], flat_grad[real]
        self.buffer.index_add_(0, flat_ids, flat_grad)
        self.weight.grad = self.buffer  # zero_grad(set_to_none=True) may have dropped it
        self._looked_up.append(flat_ids)

    def rows(self) -> torch.Tensor:
        """The distinct rows written since the last `clear()`, (R,)."""
        if not self._looked_up:
            return torch.zeros(0, dtype=torch.long, device=self.buffer.device)
        return torch.unique(torch.cat(self._looked_up))

    def norm(self, rows: torch.Tensor) -> torch.Tensor:
        """The buffer's L2 norm, read from its non-zero rows only."""
        return torch.linalg.vector_norm(self.buffer.index_select(0, rows))

    def scale(self, rows: torch.Tensor, factor: torch.Tensor) -> None:
        self.buffer.index_copy_(0, rows, self.buffer.index_select(0, rows) * factor)

    def clear(self) -> None:
        """Zero the written rows (the rest is zero already) and hand the buffer back to the weight."""
        self.buffer.index_fill_(0, self.rows(), 0.0)
        self._looked_up.clear()
        self.weight.grad = self.buffer


class _LookupIntoTouchedRows(torch.autograd.Function):
    """nn.Embedding's lookup whose backward writes the weight's gradient into its TouchedRowsGradient
    instead of returning a dense one to autograd."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        ids: torch.Tensor,
        weight: torch.Tensor,
        gradient: TouchedRowsGradient,
    ) -> torch.Tensor:
        ctx.save_for_backward(ids)
        ctx.gradient = gradient
        return nn.functional.embedding(ids, weight, gradient.padding_idx)  # (*ids.shape, dim)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad_output: torch.Tensor) -> tuple[None, ...]:
        (ids,) = ctx.saved_tensors
        ctx.gradient.accumulate(ids, grad_output)
        return None, None, None


class TouchedRowsEmbedding(nn.Embedding):
    """nn.Embedding for training with a TouchedRowsGradient; set on a module by swapping its class, which
    keeps its weight, name and hooks (`GradientBook` swaps it back)."""

    touched_rows: TouchedRowsGradient

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled() or not self.weight.requires_grad:
            return super().forward(input)
        return _LookupIntoTouchedRows.apply(input, self.weight, self.touched_rows)


def touched_rows_possible(embedding: nn.Module, model: nn.Module) -> bool:
    """A plain, trained lookup table that no other module shares (a tied output layer would write a dense
    gradient into it through autograd)."""
    if type(embedding) is not nn.Embedding or not embedding.weight.requires_grad:
        return False
    if embedding.max_norm is not None or embedding.scale_grad_by_freq or embedding.sparse:
        return False
    holders = [m for m in model.modules() if any(p is embedding.weight for p in m.parameters(recurse=False))]
    return holders == [embedding]


class GradientBook:
    """Clipping and clearing for one process's update, with the input embeddings' rows kept sparse when
    `touched_rows` (see the module docstring); `release()` gives the model its plain embedding back."""

    def __init__(self, model: nn.Module, touched_rows: bool) -> None:
        self.parameters = [p for p in model.parameters() if p.requires_grad]
        embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
        self.embedding: nn.Embedding | None = None
        self.rows: TouchedRowsGradient | None = None
        if touched_rows and embedding is not None and touched_rows_possible(embedding, model):
            self.embedding, self.rows = embedding, TouchedRowsGradient(embedding)
            embedding.touched_rows = self.rows
            embedding.__class__ = TouchedRowsEmbedding

    @property
    def describe(self) -> str:
        return "touched rows" if self.rows is not None else "dense"

    def clip(self, max_norm: float) -> torch.Tensor:
        """The gradients' total L2 norm, after scaling them to `max_norm` when above it (0 = never): the
        norm and factor of torch's clip_grad_norm_, with no multiply when the factor would be 1."""
        skipped = self.rows.weight if self.rows is not None else None
        dense = [p.grad for p in self.parameters if p.grad is not None and p is not skipped]
        norms = [torch.linalg.vector_norm(grad) for grad in dense]
        rows = self.rows.rows() if self.rows is not None else None
        if rows is not None:
            norms.append(self.rows.norm(rows))
        if not norms:
            return torch.zeros(())
        total = torch.linalg.vector_norm(torch.stack(norms))
        if max_norm > 0:
            factor = torch.clamp(max_norm / (total + CLIP_EPSILON), max=1.0)
            # Reading the factor is free on CPU; on an accelerator it would wait for the device.
            if total.device.type != "cpu" or factor.item() < 1.0:
                _scale(dense, factor)
                if rows is not None:
                    self.rows.scale(rows, factor)
        return total

    def cleared(self) -> None:
        """After the optimizer's zero_grad: the embedding's written rows zeroed, its buffer in place."""
        if self.rows is not None:
            self.rows.clear()

    def release(self) -> None:
        if self.embedding is not None:
            self.embedding.__class__ = nn.Embedding
            del self.embedding.touched_rows
            self.embedding.weight.grad = None
            self.embedding = self.rows = None


def _scale(grads: Sequence[torch.Tensor], factor: torch.Tensor) -> None:
    for grad in grads:
        grad.mul_(factor.to(grad.device))
