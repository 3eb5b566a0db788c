"""Scores computed elsewhere, as a method: what ``llmattr.from_scores`` explains with, so any attribution can be
evaluated. Not registered (it has no name of its own until given one); one instance per set of scores."""

from __future__ import annotations

from ..errors import LlmattrError
from ..lazy import torch
from ..models.loading import LoadedModel
from ..targets import Target
from .base import AttributionMethod


class GivenScores(AttributionMethod):
    """Scores computed elsewhere, returned as given: the bridge that lets any attribution be evaluated."""

    family = "external"
    summary = "scores computed outside llmattr (bring your own)"
    needs_gradients = False
    cost = "none (given)"

    def __init__(self, scores: torch.Tensor, name: str = "external", signed: bool = False, params: dict | None = None,
                 columns: list | None = None):
        self.scores, self.name, self.signed, self.params = scores, name, signed, dict(params or {})
        self.columns = columns

    def _span_columns(self, lm: LoadedModel, target: Target) -> torch.Tensor:
        """The columns of the content span, found in ``columns`` (token ids, or token strings as the
        tokenizer's ``convert_ids_to_tokens`` writes them) when the scores cover a longer token sequence."""
        a, b = target.span
        ids = target.prompt.input_ids[0, a:b].tolist()
        span = ids if isinstance(self.columns[0], int) else lm.tokenizer.convert_ids_to_tokens(ids)
        starts = [k for k in range(len(self.columns) - len(span) + 1) if list(self.columns[k: k + len(span)]) == span]
        if not starts:
            raise LlmattrError(f"the content span's tokens {span} are not among the scores' tokens; attribute the "
                               "same prompt text (Explanation.text) with the same tokenizer")
        return self.scores[:, starts[-1]: starts[-1] + len(span)]

    def attribute(self, lm: LoadedModel, target: Target) -> torch.Tensor:
        a, b = target.span
        if self.columns is not None:
            self.scores, self.columns = self._span_columns(lm, target), None
        if self.scores.shape != (target.n_steps, b - a):
            tokens = [lm.tokenizer.decode([i]) for i in target.prompt.input_ids[0, a:b].tolist()]
            raise LlmattrError(
                f"scores have shape {tuple(self.scores.shape)} but this text gives {target.n_steps} explained "
                f"step(s) x {b - a} content tokens {tokens}; give one row per step (pass answer= to fix the "
                "steps) and one column per content token")
        return self.scores
