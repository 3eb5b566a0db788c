"""What is explained: the generated tokens (greedy) or a forced answer, after a prompt."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import LlmattrError
from .models.loading import LoadedModel
from .prompting import Prompt


@dataclass
class Target:
    """A prompt plus the tokens to explain.

    ``input_ids`` holds prompt + explained tokens except the last one: one causal forward over it gives
    the logits of every step; step ``t`` reads position ``positions[t]`` and explains ``target_ids[t]``.
    """

    prompt: Prompt
    target_ids: torch.Tensor  # (T,)
    forced: bool = False

    @property
    def prompt_len(self) -> int:
        return self.prompt.length

    @property
    def span(self) -> tuple[int, int]:
        return self.prompt.span

    @property
    def n_steps(self) -> int:
        return int(self.target_ids.shape[0])

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.prompt.input_ids[0], self.target_ids[:-1]])[None]

    @property
    def positions(self) -> torch.Tensor:
        return torch.arange(self.n_steps) + self.prompt_len - 1


def _stop_ids(lm: LoadedModel) -> set[int]:
    ids = set()
    for source in (lm.model.generation_config, lm.tokenizer):
        eos = getattr(source, "eos_token_id", None)
        ids.update(eos if isinstance(eos, list | tuple) else [eos] if eos is not None else [])
    return ids


@torch.no_grad()
def generate(lm: LoadedModel, prompt: Prompt, max_new_tokens: int) -> torch.Tensor:
    """Greedy continuation, without the closing end-of-turn token (kept if it is the only one)."""
    ids = prompt.input_ids.to(lm.device)
    stops = _stop_ids(lm)
    out = lm.model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
        num_beams=1, pad_token_id=next(iter(stops), 0), eos_token_id=sorted(stops) or None,
        top_p=None, top_k=None, temperature=None,
    )[0, ids.shape[1]:].cpu()
    ends = [i for i, token in enumerate(out.tolist()) if token in stops]
    if ends:
        out = out[: max(ends[0], 1)]
    return out


def make_target(lm: LoadedModel, prompt: Prompt, max_new_tokens: int, answer: str | None = None) -> Target:
    """Greedy generation, or the tokens of ``answer`` when an answer is forced."""
    if prompt.length + max(max_new_tokens, 1) > lm.max_length:
        raise LlmattrError(
            f"text too long: {prompt.length} prompt tokens + {max_new_tokens} new tokens exceed the "
            f"model's context of {lm.max_length} tokens"
        )
    if answer is not None:
        ids = lm.tokenizer(answer, add_special_tokens=False)["input_ids"]
        if not ids:
            raise LlmattrError("the forced answer is empty")
        return Target(prompt=prompt, target_ids=torch.tensor(ids), forced=True)
    if max_new_tokens < 1:
        raise LlmattrError("max_new_tokens must be at least 1")
    return Target(prompt=prompt, target_ids=generate(lm, prompt, max_new_tokens))
