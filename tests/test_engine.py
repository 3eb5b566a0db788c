"""The perturbation engine equals plain full-sequence forwards (dynamic and fixed routing)."""

from __future__ import annotations

import pytest
import torch

from llmattr.errors import LlmattrError
from llmattr.faithfulness.engine import PerturbationEngine
from llmattr.models.forward import SharedPrefix, logits_at, padded_last_probs
from llmattr.models.probe import Probe, eager_attention
from llmattr.prompting import build_prompt
from llmattr.targets import Target
from llmattr.tasks import get_task

TEXT = "An engrossing film that is never boring, with a terrific cast."


def make_target(lm, n_steps: int = 3) -> Target:
    prompt = build_prompt(lm.tokenizer, get_task("sentiment"), {"text": TEXT})
    ids = lm.tokenizer(" Positive film cast", add_special_tokens=False)["input_ids"][:n_steps]
    return Target(prompt=prompt, target_ids=torch.tensor(ids), forced=True)


@torch.no_grad()
def reference_probs(lm, target: Target, step: int, keep: torch.Tensor, routing: str) -> torch.Tensor:
    """Plain full-sequence forward with full eager attention, no cache, no batching tricks."""
    ids = target.input_ids[0, : int(target.positions[step]) + 1].to(lm.device)
    a, b = target.span
    replay = None
    with eager_attention():
        if routing == "fixed":
            with Probe(record=("q", "k")) as probe:
                lm.model(input_ids=ids[None])
            replay = probe.layers
        embeds = lm.embed(ids)[None].repeat(keep.shape[0], 1, 1)
        factor = (keep if keep.dim() == 3 else keep[..., None]).to(lm.device)
        embeds[:, a:b] = embeds[:, a:b] * factor
        with Probe(replay=replay):
            logits = lm.model(inputs_embeds=embeds, use_cache=False).logits[:, -1]
    return torch.softmax(logits.float(), -1)


@pytest.mark.parametrize("length", [0, 5])
def test_shared_prefix_logits_equal_full_forward(tiny_lm, length):
    """Rows that share a prefix but differ after it: cached-prefix logits = full forwards (every architecture,
    Gemma3's sliding window of 4 included), and the shared cache is not mutated by a forward."""
    target = make_target(tiny_lm)
    ids = target.input_ids
    gen = torch.Generator().manual_seed(0)
    rows = ids.repeat(3, 1)
    rows[1:, length:] = torch.randint(3, len(tiny_lm.tokenizer), (2, ids.shape[1] - length), generator=gen)
    positions = torch.tensor([length + 2, ids.shape[1] - 1])
    prefix = SharedPrefix.compute(tiny_lm, ids, length)
    with torch.no_grad():
        want = logits_at(tiny_lm, tiny_lm.embed(rows), positions)
        for _ in range(2):
            got = prefix.logits_at(tiny_lm, tiny_lm.embed(rows[:, length:]), positions)
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert all(k.shape[-2] == length for k, _ in prefix.layers)


@pytest.mark.parametrize("routing", ["dynamic", "fixed"])
def test_engine_matches_full_forward(tiny_lm, routing):
    target = make_target(tiny_lm)
    m = target.span[1] - target.span[0]
    assert target.span[0] > 0
    gen = torch.Generator().manual_seed(0)
    keep = torch.bernoulli(torch.full((7, m), 0.5), generator=gen)
    keep[0] = 1
    for step in (0, target.n_steps - 1):
        engine = PerturbationEngine(tiny_lm, target, step=step, routing=routing, batch_size=3)
        got = engine.probs(keep)
        want = reference_probs(tiny_lm, target, step, keep, routing)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
        torch.testing.assert_close(got[0], engine.clean_probs, atol=1e-5, rtol=0)


def test_engine_per_dimension_masks(tiny_llama):
    target = make_target(tiny_llama)
    m, d = target.span[1] - target.span[0], tiny_llama.config.hidden_size
    keep = torch.bernoulli(torch.full((4, m, d), 0.7), generator=torch.Generator().manual_seed(1))
    engine = PerturbationEngine(tiny_llama, target, step=1)
    torch.testing.assert_close(engine.probs(keep), reference_probs(tiny_llama, target, 1, keep, "dynamic"),
                               atol=1e-5, rtol=0)


def test_fixed_routing_replays_clean_attention(tiny_llama):
    """The clean pass keeps every layer's queries of the perturbed rows (span start to the step's position) and
    its keys; the replayed probabilities are those of the clean eager attention (tests/test_probe.py) and the
    perturbed output differs from dynamic routing."""
    target = make_target(tiny_llama)
    engine = PerturbationEngine(tiny_llama, target, step=2, routing="fixed")
    last = int(target.positions[2])
    assert sorted(engine.replay) == list(range(tiny_llama.config.num_hidden_layers))
    for record in engine.replay.values():
        assert record.rows.tolist() == list(range(target.span[0], last + 1))
        assert record.k.shape[2] == last + 1 and record.probs is None
    keep = torch.zeros(5, target.span[1] - target.span[0])
    dynamic = PerturbationEngine(tiny_llama, target, step=2).probs(keep)
    assert not torch.equal(dynamic, engine.probs(keep))  # replaying changed the output


def test_engine_halves_batch_on_oom(tiny_llama, monkeypatch):
    target = make_target(tiny_llama)
    engine = PerturbationEngine(tiny_llama, target, batch_size=8)
    plain = engine._forward

    def flaky(keep):
        if keep.shape[0] > 2:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory")
        return plain(keep)

    monkeypatch.setattr(engine, "_forward", flaky)
    keep = torch.eye(7, target.span[1] - target.span[0])  # 7 distinct masks
    out = engine.probs(keep)
    assert out.shape == (7, engine.clean_probs.shape[0]) and engine.batch_size == 2


def test_engine_bad_input(tiny_llama):
    target = make_target(tiny_llama)
    with pytest.raises(LlmattrError, match="routing"):
        PerturbationEngine(tiny_llama, target, routing="frozen")
    with pytest.raises(LlmattrError, match="step"):
        PerturbationEngine(tiny_llama, target, step=9)
    with pytest.raises(LlmattrError, match="keep masks"):
        PerturbationEngine(tiny_llama, target).probs(torch.ones(2, 1))


def test_padded_last_probs_equal_each_row_alone(tiny_lm):
    """Left-padded rows of different lengths: the next-token distribution after each row equals that row's own
    forward (logits gathered at the last column by an index, pad positions masked and not counted)."""
    gen = torch.Generator().manual_seed(1)
    lengths = [9, 4, 7]
    ids = torch.zeros(3, 9, dtype=torch.long)
    mask = torch.zeros(3, 9, dtype=torch.long)
    rows = [torch.randint(3, len(tiny_lm.tokenizer), (n,), generator=gen) for n in lengths]
    for i, row in enumerate(rows):
        ids[i, 9 - len(row):], mask[i, 9 - len(row):] = row, 1
    got = padded_last_probs(tiny_lm, ids, mask, batch_size=2)
    with torch.no_grad():
        want = torch.stack([torch.softmax(tiny_lm.model(input_ids=row[None].to(tiny_lm.device)).logits[0, -1].float(),
                                          -1) for row in rows])
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
