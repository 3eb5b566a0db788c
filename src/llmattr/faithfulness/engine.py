"""Every perturbed forward pass of one (target, step), batched, with the pre-span prefix cached once.

The soft metrics (paper 000 sec. 3.1) and the ranking metrics perturb only the content span of the
prompt. Everything before the span (system prompt, chat markers) is the same in every perturbed input,
so its key/value cache is computed once, from the clean forward pass, and shared by every batch
(:class:`llmattr.models.forward.SharedPrefix`). The rest of the sequence (the content
span, the template after it and the generated prefix up to step ``step``) is fed as ``inputs_embeds``
with the span's embeddings multiplied by the keep masks, and logits are computed at the last position
only.

Routing protocols (paper 000 appendix K): ``"dynamic"`` is a plain forward pass on the perturbed
embeddings; ``"fixed"`` replaces every layer's attention probabilities by those of the clean forward
pass through the internals probe (:class:`llmattr.models.probe.Probe` with ``replay``): the clean pass
records every layer's queries of the perturbed rows and its keys, and each perturbed layer mixes its own
values with ``softmax(q_clean k_clean^T)``. Both run in the memory-efficient sdpa kernel; nothing grows
with the square of the length.
"""

from __future__ import annotations

from ..checks import ROUTINGS, one_of
from ..errors import LlmattrError
from ..lazy import no_grad, torch
from ..models.forward import content_key, logits_and_prefix
from ..models.loading import LoadedModel
from ..models.memory import forward_batch, is_oom
from ..models.probe import Probe
from ..targets import Target, visible


class PerturbationEngine:
    """Every perturbed forward pass of one (target, step), batched, with the pre-span prefix cached once.

    Args:
        lm: the model.
        target: prompt + explained tokens; its ``span`` is what gets perturbed.
        step: which generation step's next-token distribution is read.
        routing: ``"dynamic"`` or ``"fixed"`` (clean attention probabilities replayed in every layer).
        batch_size: sequences per forward pass (default: about 8192 suffix tokens per pass, fewer when memory is
            short: :func:`llmattr.models.memory.forward_batch`); halved on out-of-memory.

    Attributes:
        clean_probs: ``(V,)`` next-token distribution at step ``step`` on the clean input.
    """

    def __init__(self, lm: LoadedModel, target: Target, step: int = 0, routing: str = "dynamic",
                 batch_size: int | None = None):
        one_of(routing, ROUTINGS, "routing")
        if not 0 <= step < target.n_steps:
            raise LlmattrError(f"step {step} is outside the {target.n_steps} explained step(s)")
        self.lm, self.target, self.step, self.routing = lm, target, step, routing
        self.span = target.span
        self.n_span = visible(target, step)  # scope "all": the generated tokens this step sees
        ids = target.input_ids[0, : int(target.positions[step]) + 1].to(lm.device)
        self.prefix_len = self.span[0]
        self.suffix_embeds = lm.embed(ids[self.prefix_len:])[None]  # (1, T, d)
        self.batch_size = batch_size or forward_batch(lm, self.suffix_embeds.shape[1])
        self.last = torch.tensor([ids.numel() - 1])  # the step's predicting position
        self.key = ("perturbed-probs", routing, self.prefix_len, self.n_span, content_key(ids))  # :meth:`probs`
        self._clean_pass(ids)

    @no_grad
    def _clean_pass(self, ids: torch.Tensor) -> None:
        """One clean forward: clean distribution, prefix key/values, (fixed routing) every layer's q and k."""
        rows = torch.arange(self.prefix_len, ids.numel(), device=ids.device)  # the perturbed rows
        with Probe(record=("q", "k") if self.routing == "fixed" else False, rows=rows) as probe:
            logits, self.prefix = logits_and_prefix(self.lm, self.lm.embed(ids)[None], self.last, self.prefix_len)
        self.clean_probs = torch.softmax(logits[0, -1].float(), dim=-1)
        self.replay = probe.layers if self.routing == "fixed" else None

    def _masked_embeds(self, keep: torch.Tensor) -> torch.Tensor:
        """``(N, T, d)`` suffix embeddings with the span's rows multiplied by ``keep``."""
        embeds = self.suffix_embeds.expand(keep.shape[0], -1, -1)
        factor = keep.to(embeds.device, embeds.dtype)
        if factor.dim() == 2:
            factor = factor[..., None]
        span = embeds[:, : self.n_span] * factor
        return torch.cat([span, embeds[:, self.n_span:]], dim=1)

    @no_grad
    def _forward(self, keep: torch.Tensor) -> torch.Tensor:
        with Probe(replay=self.replay):
            logits = self.prefix.logits_at(self.lm, self._masked_embeds(keep), self.last)
        return torch.softmax(logits[:, -1].float(), dim=-1)

    def probs(self, keep: torch.Tensor, reuse: bool = False) -> torch.Tensor:
        """Next-token probabilities ``(N, V)`` at step ``step`` for the perturbed inputs ``keep``.

        ``keep``: ``(N, m)`` or ``(N, m, d)`` multipliers in [0, 1] on the m content-span token embeddings
        (0 = zeroed, 1 = kept; ``(N, m, d)`` = per-dimension masks). Tokens outside the span (template,
        generated prefix) stay intact. Identical masks run once. Runs in as few forward passes as memory
        allows (halving the batch size on out-of-memory), reusing the prefix key/value cache and computing
        logits at the last position only. ``reuse``: each mask's probabilities are also kept on the model
        (:meth:`~llmattr.models.kept.Kept.rows`), and a later engine of the same input, step and routing reads
        them back instead of running them again: for masks over a few units (sources), which every method's
        metric draws from the same ``2^n``.
        """
        if keep.dim() not in (2, 3) or keep.shape[1] != self.n_span:
            raise LlmattrError(
                f"keep masks must have shape (N, {self.n_span}) or (N, {self.n_span}, d), "
                f"got {tuple(keep.shape)}"
            )
        if reuse:
            return self.lm.kept.rows(self.lm.model, self.key, keep, self._distinct_probs)
        unique, inverse = torch.unique(keep, dim=0, return_inverse=True)  # repeated masks run once
        return self._distinct_probs(unique)[inverse.to(self.clean_probs.device)]

    def _distinct_probs(self, keep: torch.Tensor) -> torch.Tensor:
        """:meth:`probs` of distinct masks: batches of ``batch_size``, halved on out-of-memory."""
        chunks, start = [], 0
        while start < keep.shape[0]:
            try:
                chunks.append(self._forward(keep[start: start + self.batch_size]))
            except RuntimeError as err:
                if not is_oom(err) or self.batch_size == 1:
                    raise
                self.batch_size //= 2
                continue
            start += chunks[-1].shape[0]
        if not chunks:
            return self.clean_probs.new_zeros(0, self.clean_probs.shape[0])
        return torch.cat(chunks)
