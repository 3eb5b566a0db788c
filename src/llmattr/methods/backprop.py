"""The backward pass the gradient methods share: gradients of every explained step's scalar in one pass
(saliency and input x gradient in :mod:`.gradient`, DeepLIFT's multipliers in :mod:`.deeplift`, Grad-ELLM's
per-head gradients in :mod:`.grad_ellm`)."""

from __future__ import annotations

from ..lazy import torch


def step_gradients(outputs: torch.Tensor, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Gradients of each of the T scalars in ``outputs`` w.r.t. ``inputs``: a ``(T, *input.shape)`` each.

    One backward pass: T > 1 uses batched vector-Jacobian products (``is_grads_batched``), so one
    forward is shared by all generation steps.
    """
    flat = outputs.reshape(-1)
    if flat.numel() == 1:
        return [g[None] for g in torch.autograd.grad(flat[0], inputs)]
    eye = torch.eye(flat.numel(), dtype=flat.dtype, device=flat.device)
    return list(torch.autograd.grad(flat, inputs, grad_outputs=eye, is_grads_batched=True))
