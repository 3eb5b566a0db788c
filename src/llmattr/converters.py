"""Bring your own scores: attributions made by Inseq or Captum as llmattr Explanations, so that every
llmattr metric can evaluate them (docs/byo.md).

Neither library is a dependency of llmattr: the converters read their result objects by attribute
(Inseq 0.7's ``FeatureAttributionOutput``, Captum's ``LLMAttributionResult``) and need no import.
Attribute the prompt text llmattr builds (``Explanation.text``, or :func:`llmattr.prompting.build_prompt`)
so the content span is found among the attributed tokens; the explained tokens are forced to the ones
the other tool explained.
"""

from __future__ import annotations

from .api import from_scores, resolve_model
from .errors import LlmattrError
from .explanation import Explanation
from .lazy import torch


def _matrix(values, what: str) -> torch.Tensor:
    if values is None:
        raise LlmattrError(f"the {what} has no per-token attributions to convert")
    matrix = torch.as_tensor(values, dtype=torch.float64)
    if matrix.dim() != 2:
        raise LlmattrError(f"the {what}'s attributions have shape {tuple(matrix.shape)}; aggregate them to one "
                           "score per token and step first (Inseq: output.aggregate())")
    return matrix


def from_inseq(output, text: str | dict, model="default", task="sentiment", **kwargs) -> Explanation:
    """An Explanation from an Inseq ``FeatureAttributionOutput`` (its first sequence) of a decoder-only model.

    Inseq stores ``target_attributions`` as (prompt + generated tokens) x generated steps, with NaN for
    tokens after each step; the prompt columns are taken, the generated tokens become the explained
    answer. Aggregate over the hidden size first (``output.aggregate()``). ``kwargs`` go to
    :func:`llmattr.api.from_scores` (``method``, ``signed``, ``device``).
    """
    seq = output.sequence_attributions[0] if hasattr(output, "sequence_attributions") else output
    if seq.source_attributions is not None:
        raise LlmattrError("this Inseq output is of an encoder-decoder model; llmattr explains decoder-only models")
    matrix = _matrix(seq.target_attributions, "Inseq output").T.nan_to_num(0.0)  # (steps, prompt + generated)
    start = seq.attr_pos_start
    answer_ids = [int(t.id) for t in seq.target[start: seq.attr_pos_end]]
    lm = resolve_model(model, kwargs.get("device", "auto"))
    return from_scores(text, matrix[:, :start], lm, task, answer=lm.tokenizer.decode(answer_ids),
                       columns=[int(t.id) for t in seq.target[:start]], **{"method": "inseq", **kwargs})


def from_captum(result, text: str | dict, answer: str, model="default", task="sentiment", **kwargs) -> Explanation:
    """An Explanation from a Captum ``LLMAttributionResult`` with per-token attributions (``token_attr``:
    output tokens x input tokens), e.g. from ``LLMAttribution`` or ``LLMGradientAttribution`` on a
    ``TextTokenInput`` of the prompt text. ``answer`` is the ``target`` text given to Captum (its result
    keeps only display strings of the output tokens). ``kwargs`` go to :func:`llmattr.api.from_scores`."""
    matrix = _matrix(result.token_attr, "Captum result")
    return from_scores(text, matrix, model, task, answer=answer, columns=list(result.input_tokens),
                       **{"method": "captum", **kwargs})
