"""The target: which output tokens are explained (the predicted label word, the generated tokens (greedy) or a
forced answer) and the scope: which input tokens are attributed and perturbed (span, prompt, all). The scalar
scored at each explained token is the objective (:mod:`llmattr.objectives`).

For a task with label words the default target is the predicted label (paper 000 sec. 4.3: "the
token-level faithfulness of the target label word"): the argmax of the next-token logits restricted to
the task's label words at the first answer position. ``target="generated"`` explains the free greedy
answer instead, ``target="gold"`` the gold label word; every mode records the free answer and the
label-word probabilities (:func:`label_target`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from .checks import SCOPES, TARGET_MODES, member
from .errors import LlmattrError
from .lazy import no_grad, torch
from .models.loading import LoadedModel
from .objectives import probability
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
    classification: dict | None = None  # record of :func:`label_target` (None without label words)
    scope: str = "span"  # what ``span`` covers: see :func:`with_scope`
    step_logits: torch.Tensor | None = None  # (T, V) raw logits of each step, read off the generation that chose them

    @property
    def step_probs(self) -> torch.Tensor | None:
        """``(T,)`` p(target_ids[t]) from :attr:`step_logits` (``None`` for a forced answer: no generation)."""
        return None if self.step_logits is None else probability(self.step_logits, self.target_ids)

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


@no_grad
def generate_with_logits(lm: LoadedModel, prompt: Prompt, max_new_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy continuation, without the closing end-of-turn token (kept if it is the only one), and the
    raw next-token logits ``(max(T, 1), V)`` at each kept answer position (from the same generation: the first
    row is the prompt's own forward)."""
    ids = prompt.input_ids.to(lm.device)
    stops = _stop_ids(lm)
    result = lm.model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
        num_beams=1, pad_token_id=next(iter(stops), 0), eos_token_id=sorted(stops) or None,
        top_p=None, top_k=None, temperature=None, output_logits=True, return_dict_in_generate=True,
    )
    out = result.sequences[0, ids.shape[1]:].cpu()
    ends = [i for i, token in enumerate(out.tolist()) if token in stops]
    if ends:
        out = out[: max(ends[0], 1)]
    return out, torch.stack(result.logits[: max(len(out), 1)])[:, 0].float().cpu()


def generate(lm: LoadedModel, prompt: Prompt, max_new_tokens: int) -> torch.Tensor:
    """Greedy continuation, without the closing end-of-turn token (kept if it is the only one)."""
    return generate_with_logits(lm, prompt, max_new_tokens)[0]


@no_grad
def step_probabilities(lm: LoadedModel, target: Target) -> torch.Tensor:
    """The model's probability of each explained token at its step: read off the generation that chose the
    tokens (``target.step_probs``: the label word's and the free answer's, no second pass), else (a forced
    answer) one forward pass, logits kept only at the explained positions (the last ``n_steps`` inputs)."""
    if target.step_probs is not None:
        return target.step_probs
    logits = lm.model(input_ids=target.input_ids.to(lm.device), logits_to_keep=target.n_steps).logits[0]
    return probability(logits, target.target_ids).cpu()


def check_context(lm: LoadedModel, prompt: Prompt, max_new_tokens: int) -> None:
    check_length(prompt.length, max_new_tokens, lm.max_length)


def check_length(prompt_length: int, max_new_tokens: int, max_length: int) -> None:
    """Refuse in one line a prompt of ``prompt_length`` tokens that leaves no room for ``max_new_tokens`` (at
    least one) in the model's context of ``max_length`` tokens."""
    if prompt_length + max(max_new_tokens, 1) > max_length:
        raise LlmattrError(
            f"text too long: {prompt_length} prompt tokens + {max_new_tokens} new tokens exceed the "
            f"model's context of {max_length} tokens"
        )


def make_target(lm: LoadedModel, prompt: Prompt, max_new_tokens: int, answer: str | None = None) -> Target:
    """Greedy generation, or the tokens of ``answer`` when an answer is forced."""
    check_context(lm, prompt, max_new_tokens)
    if answer is not None:
        ids = lm.tokenizer(answer, add_special_tokens=False)["input_ids"]
        return Target(prompt=prompt, target_ids=torch.tensor(forced_answer(ids)), forced=True)
    ids, logits = generate_with_logits(lm, prompt, new_tokens(max_new_tokens))
    return Target(prompt=prompt, target_ids=ids, step_logits=logits)


def word_target(lm: LoadedModel, prompt: Prompt, task, word: str) -> Target:
    """A next-word task's gold ``word`` forced as the one explained token (its first token when the tokenizer
    splits it): BLiMP's target word, whose logit paper 003 sec. 5.1 explains (``target="gold"``)."""
    check_gold_word(task.name, word)
    check_context(lm, prompt, 1)
    return Target(prompt=prompt, target_ids=task.word_ids(lm.tokenizer, [word], first_token=True), forced=True)


def foil_id(tokenizer, foil: str | int) -> int:
    """The token a contrastive objective compares the target with (:mod:`llmattr.objectives`).

    ``foil``: a token id, or a text tokenized as written (as a forced ``answer`` is: in a chat template the
    answer starts without a space, so SmolLM2's sentiment foil is ``"Negative"``), which must be one token,
    as the label words must (:meth:`llmattr.tasks.Task.word_ids`).
    """
    if isinstance(foil, int) and not isinstance(foil, bool):
        if not 0 <= foil < len(tokenizer):
            raise LlmattrError(f"foil token id {foil} is outside the vocabulary (0..{len(tokenizer) - 1})")
        return foil
    pieces = tokenizer(str(foil), add_special_tokens=False)["input_ids"]
    if len(pieces) != 1:
        raise LlmattrError(f"foil {foil!r} is {len(pieces)} tokens for this tokenizer; give a single-token word")
    return pieces[0]




def label_record(task, tokenizer, label_ids: torch.Tensor, logits: torch.Tensor, free: torch.Tensor,
                 gold, mode: str) -> dict:
    """What a classification explanation records beside its scores.

    ``free_answer``: the free greedy answer; ``began_with_label``: whether its first token is a label
    word's token; ``label_probs``: full-vocabulary probability of every label word at the first answer
    position; ``predicted``: the label word with the largest logit among the label words; ``gold`` and
    ``correct`` (``predicted == gold``) when the gold label is known; ``target``: which token is explained.
    """
    probs = torch.softmax(logits.double(), -1)[label_ids]
    predicted = task.label_words[int(logits[label_ids].argmax())]
    gold = gold if gold in task.label_words else None
    return {
        "target": mode, "free_answer": tokenizer.decode(free.tolist()),
        "began_with_label": bool(free.numel()) and int(free[0]) in label_ids.tolist(),
        "label_probs": {w: float(p) for w, p in zip(task.label_words, probs, strict=True)},
        "predicted": predicted, "gold": gold, "correct": None if gold is None else predicted == gold,
    }


def label_target(lm: LoadedModel, prompt: Prompt, task, max_new_tokens: int, mode: str = "label",
                 gold=None) -> Target:
    """The target of a task with label words (module docs): one greedy generation gives both the free
    answer and the first answer position's logits.

    ``mode``: ``"label"`` explains the predicted label word (argmax over the label words' logits),
    ``"generated"`` the free greedy answer, ``"gold"`` the gold label word (``gold`` must be one).
    """
    member(mode, TARGET_MODES, "target")
    if mode == "gold":
        gold_label_word(task.label_words, gold)
    label_ids = task.label_ids(lm.tokenizer, first_token=False)
    check_context(lm, prompt, max_new_tokens)
    free, logits = generate_with_logits(lm, prompt, new_tokens(max_new_tokens))
    record = label_record(task, lm.tokenizer, label_ids, logits[0], free, gold, mode)
    word = {"label": record["predicted"], "gold": record["gold"]}.get(mode)
    ids = free if word is None else label_ids[task.label_words.index(word)][None]
    return Target(prompt=prompt, target_ids=ids, classification=record,
                  step_logits=logits[: len(ids)])




def with_scope(target: Target, scope: str) -> Target:
    """The target whose ``span`` (what is attributed, perturbed and zeroed) is ``scope``.

    ``"span"``: the content span (the user's text, template excluded); ``"prompt"``: every prompt token,
    template and special tokens included (paper 000's pipeline: Inseq attributes every token, the zero
    baseline is "all zero inputs"); ``"all"``: the prompt and the generated prefix (what the ReAGent
    evaluator code perturbs). Step ``t`` sees only the tokens before its position (causal), so under
    ``"all"`` its scores on later generated tokens are what the method gives them (zero for gradients and
    attention) and the metrics perturb only the tokens it sees (:func:`visible`).
    """
    member(scope, SCOPES, "scope")
    if scope == "span":
        return target
    end = target.prompt_len if scope == "prompt" else target.input_ids.shape[1]
    return replace(target, prompt=replace(target.prompt, span=(0, end)), scope=scope)


def visible(target: Target, step: int) -> int:
    """How many span tokens step ``step`` sees: those at positions up to the one predicting its token."""
    a, b = target.span
    return max(0, min(b, int(target.positions[step]) + 1) - a)


def check_gold_word(task: str, word: str | None) -> None:
    """One line when ``target="gold"`` on a next-word task has no gold word to explain."""
    if not word:
        raise LlmattrError(f"target='gold' needs the example's gold next word (task {task}'s label: "
                           "gold=WORD, or --field label=WORD)")


def new_tokens(max_new_tokens: int) -> int:
    """``max_new_tokens`` of a generated target, refused below 1."""
    if max_new_tokens < 1:
        raise LlmattrError("max_new_tokens must be at least 1")
    return max_new_tokens


def forced_answer(answer: str | Sequence[int]) -> str | Sequence[int]:
    """A forced answer (its text, or its token ids), refused when empty."""
    if not answer:
        raise LlmattrError("the forced answer is empty")
    return answer


def gold_label_word(label_words: Sequence[str], gold: object) -> None:
    """Refuse ``target="gold"`` on a task explained at its label word when the gold label ``gold`` is none of its
    ``label_words``."""
    if gold not in label_words:
        raise LlmattrError(f"target='gold' needs the gold label, one of {list(label_words)}; got {gold!r}")


def check_target(task: Mapping, target: str, max_new_tokens: int | None, answer: str | None,
                 gold: object = None) -> None:
    """``explain``'s ``--answer``, ``--target gold`` and ``--max-new-tokens`` for ``task`` (:func:`task_facts`) as
    the target's construction (:mod:`llmattr.targets`) refuses them: an empty forced answer; without one, a gold label
    (``gold``: the text's ``label`` field) that is none of the label words where the label word is explained, and
    fewer than one new token where the target generates (every target but a next-word task's gold word)."""
    if answer is not None:
        forced_answer(answer)
        return
    if target == "gold" and task["explains_label_word"]:
        gold_label_word(task["label_words"], gold)
    if max_new_tokens is not None and not (task["next_word"] and target == "gold"):
        new_tokens(max_new_tokens)
