"""ReAGent (Zhao & Shan, 2024): recursive attribution by replacing tokens with plausible alternatives.

Per step t and probe, scores start at logit-scale s ~ U(0, 1). Each probe step replaces a random
``replacing_ratio`` of the content tokens (set R) with sampled tokens, measures the drop of the target
probability delta = p(y_t | x) - p(y_t | x'), and adds logit((d_i + 1) / 2) to s_i with d_i = delta
for i in R and -delta otherwise. The ``objective`` parameter measures the drop of another objective of
:mod:`llmattr.objectives` instead (``contrast`` with a ``foil``: of ``logit(y_t) - logit(foil)``); a delta
outside [-1, 1] (logits, log-probabilities) saturates the update at logit(1 - 1e-6) = 13.8 (``torch.logit``'s
``eps``). A probe stops once keeping only its ``keep_top_n`` tokens of highest
softmax(s) (replacing every other content token) still puts y_t among the top
``stopping_condition_top_k`` predictions, or after ``max_probe_steps``. The result is softmax(s)
averaged over the probes that stopped (over all probes when none did). Defaults are paper 000's
settings (keep_top_n=3, stopping_condition_top_k=3, replacing_ratio=0.25, max_probe_steps=32,
num_probes=2). As everywhere in llmattr only content tokens are replaced (Inseq replaces the template
too).

Batched: one clean forward gives p(y_t | x), the causal sampler's distributions and the template prefix's
key/value cache; every (step, probe) pair is then a batch row of one forward from the content span on (step t
reads position t's logits), and the stopping check of probe step k shares a forward with the update of step
k + 1, so a run costs at most ``max_probe_steps + 2`` forwards.

Replacement tokens (``sampler``): ``"mlm"`` samples from a masked LM's prediction at each position
(the paper's RoBERTa; it must share the causal LM's vocabulary), ``"causal"`` from the causal LM's
own next-token distribution at the previous position, ``"uniform"`` uniformly from the vocabulary;
the original token is always excluded. ``"auto"`` (default) uses ``mlm_model`` when one is given and
otherwise ``"causal"``: offline, with no masked LM on disk, the default is the causal LM's own
distribution.
"""

from __future__ import annotations

from .. import objectives
from ..errors import LlmattrError
from ..lazy import no_grad, torch
from ..models.forward import SharedPrefix, logits_and_prefix
from ..models.loading import LoadedModel
from ..targets import Target
from .base import COUNT, AttributionMethod, choice, register

SAMPLERS = ("auto", "mlm", "causal", "uniform")
SAMPLER_COPIES = 4  # (n, V) float32 copies at the sampler's peak: 0.78 / 6.2 GB measured over the forward floor at
# 1k / 8k tokens on SmolLM2 (V = 49,152; one copy 0.20 / 1.60 GB), benchmarks/bench_memory.py


class TokenSampler:
    """Replacement tokens for the content span: ``sample(rows, generator) -> (rows, n)`` token ids.

    ``probs`` (n, V) is the replacement distribution of each content position with the original
    token's mass removed; ``None`` means uniform over the other vocabulary entries.
    """

    def __init__(self, span_ids: torch.Tensor, vocab_size: int, probs: torch.Tensor | None = None):
        self.span_ids, self.vocab_size = span_ids, vocab_size
        if probs is not None:
            probs = probs.float().scatter(-1, span_ids[:, None], 0.0)
            probs = probs / probs.sum(-1, keepdim=True).clamp_min(torch.finfo(probs.dtype).tiny)
        self.probs = probs

    def sample(self, rows: int, generator: torch.Generator) -> torch.Tensor:
        n = self.span_ids.shape[0]
        if self.probs is None:
            shift = torch.randint(1, self.vocab_size, (rows, n), generator=generator)
            return (self.span_ids[None, :] + shift) % self.vocab_size
        return torch.multinomial(self.probs, rows, replacement=True, generator=generator).T


def causal_sampler(input_ids: torch.Tensor, span: tuple[int, int], logits: torch.Tensor) -> TokenSampler:
    """The causal LM's own next-token distribution at each content position, from ``logits`` ``(n, V)`` at the
    positions before them (read off the clean pass)."""
    a, b = span
    return TokenSampler(input_ids[0, a:b].cpu(), logits.shape[-1], torch.softmax(logits.float(), -1).cpu())


@no_grad
def clean_pass(lm: LoadedModel, input_ids: torch.Tensor, span: tuple[int, int], positions: torch.Tensor,
               causal: bool):
    """One forward of the clean sequence: the template prefix's key/values (shared by every probe row), the
    logits at the explained positions and (``causal``) at the positions before the content tokens, which
    the causal sampler reads: ``(prefix, clean (T, V), sampler (n, V) or None)``."""
    a, b = span
    if causal and a == 0:
        raise LlmattrError("the causal sampler needs at least one token before the content span; with "
                           "scope 'prompt' or 'all' use sampler='uniform'")
    before = torch.arange(a - 1, b - 1) if causal else torch.zeros(0, dtype=torch.long)
    logits, prefix = logits_and_prefix(lm, lm.embed(input_ids), torch.cat([positions.cpu(), before]), a)
    t = positions.numel()
    return prefix, logits[0, :t], logits[0, t:] if causal else None


def mlm_sampler(lm: LoadedModel, input_ids: torch.Tensor, span: tuple[int, int], mlm) -> TokenSampler:
    """A masked LM's prediction at each content position (ReAGent's inferential sampler, RoBERTa).

    ``mlm`` is a model folder / hub id (loaded from local files only) or a loaded masked-LM model;
    its vocabulary must be the causal LM's (e.g. RoBERTa with GPT-2).
    """
    if isinstance(mlm, str):
        from transformers import AutoModelForMaskedLM, AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(mlm, local_files_only=True)
            mlm = AutoModelForMaskedLM.from_pretrained(mlm, local_files_only=True).eval()
        except OSError as err:
            raise LlmattrError(f"masked LM {mlm!r} is not available locally; use sampler=causal") from err
        if tokenizer.get_vocab() != lm.tokenizer.get_vocab():
            raise LlmattrError("the masked LM's vocabulary differs from the model's; use sampler=causal")
    a, b = span
    with torch.no_grad():
        logits = mlm(input_ids=input_ids.to(mlm.device)).logits[0, a:b]
    if logits.shape[-1] != lm.model.get_input_embeddings().num_embeddings:
        raise LlmattrError("the masked LM's vocabulary size differs from the model's; use sampler=causal")
    return TokenSampler(input_ids[0, a:b].cpu(), logits.shape[-1], torch.softmax(logits.float(), -1).cpu())


def rows_forward(lm: LoadedModel, prefix: SharedPrefix, ids: torch.Tensor, positions: torch.Tensor,
                 steps: torch.Tensor, targets: torch.Tensor, top_k: int,
                 explained: objectives.Objective = objectives.OBJECTIVES["probability"],
                 foil: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """For each row (a full sequence for step ``steps[r]``): ``explained`` (p(y_t)) and whether y_t is in the
    top k.

    The rows share ``prefix`` (the template before the content span), which is not recomputed.
    """
    with torch.no_grad():
        logits = prefix.logits_at(lm, lm.embed(ids[:, prefix.length:]), positions)  # (R, T, V)
    rows = torch.arange(ids.shape[0], device=logits.device)
    logits = logits[rows, steps.to(logits.device)].float()  # (R, V)
    y = targets.to(logits.device)[steps.to(logits.device)]
    hit = (logits.topk(top_k, dim=-1).indices == y[:, None]).any(-1)
    return explained(logits, y, foil).cpu(), hit.cpu()


def keep_top_mask(importance: torch.Tensor, keep_top_n: int) -> torch.Tensor:
    """Replacement mask that keeps the ``keep_top_n`` most important tokens of each row."""
    top = importance.topk(min(keep_top_n, importance.shape[-1]), dim=-1).indices
    return torch.ones_like(importance, dtype=torch.bool).scatter(-1, top, False)


@register
class ReAGent(AttributionMethod):
    """Recursive replacement probing with a stopping condition (Zhao & Shan, 2024)."""

    name = "reagent"
    family = "perturbation"
    summary = "ReAGent: replace random tokens with sampled ones, accumulate probability drops (batched)"
    needs_gradients = False
    signed = False
    cost = "up to max_probe_steps + 2 forwards of 2 x steps x num_probes rows"
    defaults = {"keep_top_n": 3, "stopping_condition_top_k": 3, "replacing_ratio": 0.25,
                "max_probe_steps": 32, "num_probes": 2, "sampler": "auto", "mlm_model": None, "seed": 0}
    rules = {"keep_top_n": COUNT, "stopping_condition_top_k": COUNT, "max_probe_steps": COUNT, "num_probes": COUNT,
             "replacing_ratio": ("between", (0, 1), "reagent replacing_ratio must be in (0, 1)"),
             "sampler": choice(SAMPLERS, f"reagent sampler must be one of {', '.join(SAMPLERS)}"),
             "mlm_model": ("needed-when", ("sampler", "mlm"),
                           "reagent sampler=mlm needs mlm_model (a local masked-LM folder)")}
    objective = "probability"

    def memory_extra(self, lm: LoadedModel, tokens: int) -> int:
        """The replacement distributions: ``SAMPLER_COPIES`` float32 ``(n, V)`` tensors (logits, softmax, the
        original token's mass removed, renormalised) for ``n`` <= ``tokens`` content positions; none for the
        uniform sampler."""
        if self.sampler_kind() == "uniform":
            return 0
        return SAMPLER_COPIES * tokens * lm.model.get_input_embeddings().num_embeddings * 4

    def sampler_kind(self) -> str:
        """``mlm``, ``uniform`` or ``causal`` (``auto``: the masked LM when one is given, else causal)."""
        kind = self.params["sampler"]
        if kind == "auto":
            return "mlm" if self.params["mlm_model"] is not None else "causal"
        return kind

    def sampler(self, lm: LoadedModel, input_ids: torch.Tensor, span: tuple[int, int],
                causal_logits: torch.Tensor | None) -> TokenSampler:
        kind = self.sampler_kind()
        if kind == "mlm":
            return mlm_sampler(lm, input_ids, span, self.params["mlm_model"])
        if kind == "uniform":
            n_vocab = lm.model.get_input_embeddings().num_embeddings
            return TokenSampler(input_ids[0, span[0]:span[1]].cpu(), n_vocab)
        return causal_sampler(input_ids, span, causal_logits)

    def attribute(self, lm: LoadedModel, target: Target) -> torch.Tensor:
        p = self.params
        a, b = target.span
        ids = target.input_ids.cpu()
        positions = target.positions
        prefix, clean_logits, sampler_logits = clean_pass(lm, ids, (a, b), positions, self.sampler_kind() == "causal")
        sampler = self.sampler(lm, ids, (a, b), sampler_logits)
        generator = torch.Generator().manual_seed(int(p["seed"]))
        n_rows = target.n_steps * p["num_probes"]
        steps = torch.arange(target.n_steps).repeat_interleave(p["num_probes"])
        original = ids.expand(n_rows, -1)
        explained, foil = self.explained(lm)
        p_clean = explained(clean_logits.float(), target.target_ids, foil).cpu()
        score = torch.rand(n_rows, b - a, generator=generator)  # logit-scale importance s
        stopped = torch.zeros(n_rows, dtype=torch.bool)
        for probe_step in range(p["max_probe_steps"] + 1):
            check = (~stopped).nonzero()[:, 0] if probe_step > 0 else torch.zeros(0, dtype=torch.long)
            update = (~stopped).nonzero()[:, 0] if probe_step < p["max_probe_steps"] else check[:0]
            replace = torch.cat([torch.rand(len(update), b - a, generator=generator) < p["replacing_ratio"],
                                 keep_top_mask(torch.softmax(score[check], -1), p["keep_top_n"])])
            rows = torch.cat([update, check])
            batch = original[rows].clone()
            batch[:, a:b] = torch.where(replace, sampler.sample(len(rows), generator), batch[:, a:b])
            prob, hit = rows_forward(lm, prefix, batch, positions, steps[rows], target.target_ids,
                                     p["stopping_condition_top_k"], explained, foil)
            newly = torch.zeros(n_rows, dtype=torch.bool)
            newly[check] = hit[len(update):]
            delta = p_clean[steps[update]] - prob[: len(update)]
            d = torch.where(replace[: len(update)], delta[:, None], -delta[:, None])
            gain = torch.logit(d * 0.5 + 0.5, eps=1e-6) * ~newly[update, None]
            score[update] += gain
            stopped |= newly
            if bool(stopped.all()) or (probe_step == p["max_probe_steps"]):
                break
        importance = torch.softmax(score, -1).view(target.n_steps, p["num_probes"], b - a)
        weight = stopped.view(target.n_steps, p["num_probes"]).float()
        weight = torch.where(weight.sum(-1, keepdim=True) > 0, weight, torch.ones_like(weight))
        return (importance * weight[..., None]).sum(1) / weight.sum(-1, keepdim=True)
