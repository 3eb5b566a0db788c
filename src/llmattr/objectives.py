"""The objective: the scalar ``F_t`` of the model's output each attribution method scores at step ``t`` (Inseq's
step functions). Which tokens ``y_t`` are explained is the target (:mod:`llmattr.targets`); which input tokens
are attributed and perturbed is the scope; where a path starts is the baseline (the gradient family).

An objective maps the logits at the explained positions ``(..., V)``, the target token ids and (contrastive
objectives) the foil token ids, both broadcast over the logits' leading dims, to one value per row ``(...)``;
batched, no loop over tokens. Every method that scores a model output reads it from here: the gradient
family differentiates it, LIME regresses it, ReAGent measures its drop, Grad-ELLM back-propagates it.

* ``probability``: ``p(y_t) = softmax(z_t)[y_t]`` (float32 softmax; Inseq's ``probability_fn``);
* ``log-prob``: ``log p(y_t) = log_softmax(z_t)[y_t]`` (Inseq's ``probability_fn(logprob=True)``);
* ``logit``: ``z_t[y_t]`` (Inseq's ``logit_fn``; Grad-ELLM's quantity);
* ``contrast``: ``z_t[y_t] - z_t[f]``, the target's logit minus the foil's: "why ``y_t`` rather than ``f``"
  (Inseq's ``contrast_logits_diff_fn``, the target function of Yin & Neubig 2022);
* ``contrast-prob``: ``p(y_t) - p(f)`` (Inseq's ``contrast_prob_diff_fn``).

Both contrastive objectives compare two tokens at the same position, so the foil ``f`` is one token, compared
with the target at every explained step. Add an objective with :func:`objective` beside the others.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .checks import one_of, register_once
from .errors import LlmattrError
from .lazy import torch

if TYPE_CHECKING:
    from torch import Tensor

ObjectiveFn = Callable[["Tensor", "Tensor", "Tensor | None"], "Tensor"]


@dataclass(frozen=True)
class Objective:
    """A registered objective: ``fn(logits (..., V), target_ids, foil_ids) -> (...)``."""

    name: str
    fn: ObjectiveFn
    summary: str
    contrastive: bool = False

    def __call__(self, logits: torch.Tensor, target_ids: torch.Tensor,
                 foil_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.fn(logits, target_ids, foil_ids)


OBJECTIVES: dict[str, Objective] = {}


def objective(name: str, summary: str, contrastive: bool = False) -> Callable[[ObjectiveFn], ObjectiveFn]:
    """Decorator: register ``fn(logits, target_ids, foil_ids)`` as the objective ``name``."""
    def register(fn: ObjectiveFn) -> ObjectiveFn:
        register_once(OBJECTIVES, name, Objective(name, fn, summary, contrastive), "objective")
        return fn
    return register


def token_values(values: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``values[..., ids]``: the entry of each row's token ``(...)`` from ``values (..., V)``; ``ids`` is
    broadcast over the leading dims (``(T,)`` against ``(B, T, V)``, or one id per row)."""
    index = ids.to(values.device).expand(values.shape[:-1])[..., None]
    return values.gather(-1, index)[..., 0]


@objective("probability", "p(target): softmax of the logits at the target token (Inseq's default)")
def probability(logits: torch.Tensor, target_ids: torch.Tensor, foil_ids: torch.Tensor | None = None) -> torch.Tensor:
    return token_values(torch.softmax(logits.float(), dim=-1), target_ids)


@objective("log-prob", "log p(target): log-softmax of the logits at the target token")
def log_prob(logits: torch.Tensor, target_ids: torch.Tensor, foil_ids: torch.Tensor | None = None) -> torch.Tensor:
    return token_values(torch.log_softmax(logits.float(), dim=-1), target_ids)


@objective("logit", "the target token's logit (Grad-ELLM's quantity)")
def logit(logits: torch.Tensor, target_ids: torch.Tensor, foil_ids: torch.Tensor | None = None) -> torch.Tensor:
    return token_values(logits, target_ids)


@objective("contrast", "logit(target) - logit(foil): why the target rather than the foil (Yin & Neubig 2022)",
           contrastive=True)
def contrast(logits: torch.Tensor, target_ids: torch.Tensor, foil_ids: torch.Tensor) -> torch.Tensor:
    logits = logits.float()
    return token_values(logits, target_ids) - token_values(logits, foil_ids)


@objective("contrast-prob", "p(target) - p(foil) (Inseq's contrast_prob_diff)", contrastive=True)
def contrast_prob(logits: torch.Tensor, target_ids: torch.Tensor, foil_ids: torch.Tensor) -> torch.Tensor:
    probs = torch.softmax(logits.float(), dim=-1)
    return token_values(probs, target_ids) - token_values(probs, foil_ids)


def get(name: str, foil: object = None, option: str = "objective") -> Objective:
    """The objective ``name``; one line if it is unknown, if a contrastive one lacks its ``foil``, or if a
    foil is given to one that is not contrastive (it would be silently ignored)."""
    return OBJECTIVES[check_objective(name, foil, OBJECTIVES, contrastive(), option)]


def contrastive() -> list[str]:
    """The names of the objectives that compare the target with a foil."""
    return [name for name, found in OBJECTIVES.items() if found.contrastive]


def check_objective(name: object, foil: object, objectives: Iterable[str], contrastive: Iterable[str],
                    option: str = "objective") -> str:
    """``name`` if it is one of ``objectives`` and ``foil`` fits it: a ``contrastive`` objective needs a foil, any
    other takes none (it would be silently ignored)."""
    contrastive = tuple(contrastive)
    one_of(name, objectives, option)
    if name in contrastive and foil is None:
        raise LlmattrError(f"objective {name} compares the target with a foil token: give --foil WORD (foil=...)")
    if foil is not None and name not in contrastive:
        raise LlmattrError(f"--foil needs a contrastive objective ({', '.join(contrastive)}); the objective is {name}")
    return name
