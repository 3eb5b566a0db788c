"""Long inputs in bounded memory: every method through the sdpa probe equals the full eager computation."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest
import torch

import llmattr
from conftest import ARCHS, build_tiny, token_methods
from llmattr import methods
from llmattr.api import prepare
from llmattr.errors import LlmattrError
from llmattr.methods import deeplift, integrated
from llmattr.methods.gradient import baseline_embeds, embedding_gradients, score_fn
from llmattr.methods.value_zeroing import value_zeroing_distances
from llmattr.models import memory
from llmattr.models.anatomy import decoder_blocks
from llmattr.models.forward import logits_at
from llmattr.models.memory import (
    LIMIT_ENV,
    TOKEN_BUDGET,
    Shapes,
    activation_bytes,
    checkpointed,
    forward_batch,
    parse_bytes,
    path_batch,
    plan,
    prefix_cache_pays,
)
from llmattr.models.probe import eager_attention
from llmattr.request import Request
from test_deeplift import sharpened

TEXT = "An engrossing film that is never boring, with a terrific cast."
CHEAP = {"integrated-gradients": {"n_steps": 4}, "igcg": {"n_steps": 4}, "aieg": {"n_steps": 4},
         "gradient-shap": {"n_samples": 2}, "lime": {"n_samples": 16},
         "reagent": {"max_probe_steps": 3, "num_probes": 2}}


def test_every_method_equals_the_eager_computation(tiny_lm):
    """sdpa attention and rows-only probe records give every method's scores of the full eager attention (the
    computation before the sdpa probe), on all five architectures (Gemma3's window of 4 included), to float
    tolerance relative to the scores' own scale."""
    target = prepare(tiny_lm, "An engrossing film that is never boring, with a terrific cast.",
                     Request("sentiment", answer=" movie was"))
    with torch.no_grad():
        logits = logits_at(tiny_lm, tiny_lm.embed(target.input_ids), target.positions)[0]
    # LIME's ridge (alpha = 1) shrinks its coefficients far below the probability it regresses, whose float
    # error is what carries over: compare on that probability's scale
    probability = torch.softmax(logits.float(), -1).cpu().gather(-1, target.target_ids[:, None]).amax()
    for name in sorted(set(token_methods()) - {"value-zeroing"}):  # its distances are compared below
        method = methods.get(name, **CHEAP.get(name, {}))
        got = method.attribute(tiny_lm, target)
        with eager_attention():
            want = method.attribute(tiny_lm, target)
        scale = probability if name == "lime" else want.abs().amax().clamp_min(torch.finfo(torch.float32).tiny)
        torch.testing.assert_close(got / scale, want / scale, atol=1e-4, rtol=0, msg=name)


@pytest.mark.parametrize("gain", [1.0, 20.0])
def test_deeplift_row_blocks_equal_the_eager_rules(tiny_tokenizer, monkeypatch, gain):
    """DeepLIFT's sdpa path (attention multipliers in the backward pass, here one query row per block) gives the
    attributions and deltas of the eager path (every ``(S, S)`` call through the rules), on the five
    architectures (Gemma3's window of 4 included), with plain and sharpened attention (query weights x 20:
    rows where one pass's normaliser is tiny, so both anchors of the scale product are taken)."""
    monkeypatch.setattr(deeplift, "ATTENTION_BLOCK", 1)  # one row per block (tiny models: B H S <= 4 * 30)
    calls = []
    inner = deeplift.attention_multipliers_vjp
    monkeypatch.setattr(deeplift, "attention_multipliers_vjp", lambda *a: calls.append(1) or inner(*a))
    for arch in ARCHS:
        lm = sharpened(arch, tiny_tokenizer, gain=gain)
        target = prepare(lm, TEXT, Request("sentiment", answer=" movie was"))
        f, x = score_fn(lm, target, "logit"), lm.embed(target.input_ids).detach()
        x0 = baseline_embeds(lm, x, target, "unk")
        got, got_delta = deeplift.deeplift_attributions(f, x, x0)
        assert len(calls) == lm.config.num_hidden_layers, arch  # the eager path was not taken
        calls.clear()
        with eager_attention():
            want, want_delta = deeplift.deeplift_attributions(f, x, x0)
        assert not calls
        scale = want.abs().sum((1, 2), keepdim=True)
        torch.testing.assert_close(got / scale, want / scale, atol=1e-5, rtol=0, msg=arch)
        torch.testing.assert_close(got_delta, want_delta, atol=1e-5 * float(want_delta.abs().max()), rtol=0)


def test_value_zeroing_distances_equal_the_eager_computation(tiny_lm):
    """Value zeroing's 1 - cos distances (~1e-5 on tiny random models, so normalising them would magnify float
    noise) agree to a few float32 steps of cos near 1."""
    target = prepare(tiny_lm, "An engrossing film that is never boring, with a terrific cast.",
                     Request("sentiment", answer=" movie was"))
    layers = list(range(tiny_lm.config.num_hidden_layers))
    got = value_zeroing_distances(tiny_lm, target.input_ids, target.positions, target.span, layers, 8)
    with eager_attention():
        want = value_zeroing_distances(tiny_lm, target.input_ids, target.positions, target.span, layers, 8)
    torch.testing.assert_close(got, want, atol=16 * torch.finfo(torch.float32).eps, rtol=0)


def test_activation_formula_by_hand(tiny_llama):
    """The guard's formula for the tiny Llama (2 layers, d=32, f=64, 2 kv heads of 8, float32), 10 tokens."""
    shapes = Shapes.of(tiny_llama)
    assert shapes == Shapes(layers=2, hidden=32, mlp=64, heads=4, kv_heads=2, head_dim=8, element=4)
    forward, cache = 4 * (4 * 32 + 4 * 64), 4 * 2 * 2 * 2 * 8
    assert activation_bytes(shapes, "forward", 10, rows=3) == 3 * 10 * forward + 10 * cache
    backward = 4 * 2 * (8 * 32 + 4 * 64) + forward
    assert activation_bytes(shapes, "backward", 10, rows=3) == 3 * 10 * backward
    assert activation_bytes(shapes, "backward", 10, checkpointing=True) == 10 * 4 * (2 * 32 + 5 * 32 + 6 * 64)
    assert activation_bytes(shapes, "deeplift", 10) == 5 * 10 * backward // 2  # linear: no (S, S) term


def test_a_memory_profile_is_declared_beside_its_method(tiny_llama):
    """``models/memory.py`` holds the formulas and the forward and backward profiles and names no method (issue 22):
    DeepLIFT's profile is declared and registered in ``methods/deeplift.py``; a profile registered by name is a
    ``memory_kind`` at once, and a second, different profile under a taken name is refused."""
    source = Path(memory.__file__).read_text(encoding="utf-8").lower()
    words = ("attention", "random")  # method names that are also ordinary words of the formulas' prose
    assert [n for n in methods.available() if n not in words and re.search(rf"\b{re.escape(n)}\b", source)] == []
    assert "deeplift" not in source and memory.PROFILES["deeplift"] is deeplift.MEMORY
    assert methods.REGISTRY["deeplift"].memory_kind == "deeplift" and deeplift.MEMORY.copies == Fraction(5, 2)
    shapes = Shapes.of(tiny_llama)
    double = memory.register_profile(memory.MemoryProfile("test-double", copies=Fraction(2)))
    try:
        assert activation_bytes(shapes, "test-double", 10) == 2 * activation_bytes(shapes, "backward", 10)
        with pytest.raises(LlmattrError, match="already registered"):
            memory.register_profile(memory.MemoryProfile("test-double", copies=Fraction(3)))
    finally:
        memory.PROFILES.pop(double.name)
    with pytest.raises(LlmattrError, match="unknown memory kind 'test-double'"):
        activation_bytes(shapes, "test-double", 10)


def test_prefix_cache_pays_by_hand(tiny_llama):
    """The cache saves P rows of backward activations (5,632 bytes a token for the tiny Llama) and costs a float32
    (S - P, S) mask per layer (2 layers): with P = 30 it pays up to S = 161, not at S = 162."""
    per_token = 4 * 2 * (8 * 32 + 4 * 64) + 4 * (4 * 32 + 4 * 64)
    assert activation_bytes(Shapes.of(tiny_llama), "backward", 1) == per_token == 5632
    assert 2 * (161 - 30) * 161 * 4 < 30 * per_token < 2 * (162 - 30) * 162 * 4
    assert prefix_cache_pays(tiny_llama, 30, 161) and not prefix_cache_pays(tiny_llama, 30, 162)
    assert prefix_cache_pays(tiny_llama, 30, 162, rows=2) and not prefix_cache_pays(tiny_llama, 0, 10)


def test_long_input_runs_the_prefix_through_the_graph(tiny_llama):
    """Past the break-even length score_fn(prefix=...) takes the full causal pass (no mask per layer): the prefix
    tokens get their gradients, F and the span gradients are the full pass's."""
    tiny_llama.model.config.max_position_embeddings = 1024  # rotary positions: any length runs
    tgt = prepare(tiny_llama, "A terrific film. " * 60, Request("sentiment", answer=" movie"))
    a, n = tgt.span[0], int(tgt.input_ids.shape[1])
    assert not prefix_cache_pays(tiny_llama, a, n)
    x = tiny_llama.embed(tgt.input_ids).detach()
    full_f, full_g = embedding_gradients(score_fn(tiny_llama, tgt, "probability"), x)
    long_f, long_g = embedding_gradients(score_fn(tiny_llama, tgt, "probability", prefix=a), x)
    assert torch.equal(long_f, full_f) and torch.equal(long_g, full_g) and bool(long_g[:, :, :a].abs().sum() > 0)


@pytest.mark.parametrize("limit, expected", [("1GB", 16), ("120KB", 2), ("1KB", 1)])
def test_path_batch_follows_the_budget(tiny_llama, monkeypatch, limit, expected):
    """Half the limit (at most 2 GiB) over one row's backward bytes, between 1 and the number of points."""
    monkeypatch.setenv(LIMIT_ENV, limit)
    per_row = activation_bytes(Shapes.of(tiny_llama), "backward", 5)
    assert per_row == 5 * 4 * (2 * (8 * 32 + 4 * 64) + 4 * 32 + 4 * 64)  # 28,160 bytes: 120 KB / 2 holds two
    assert path_batch(tiny_llama, 5, 16) == expected
    assert methods.get("integrated-gradients", internal_batch_size=3).memory_rows(tiny_llama, 5) == 3


def test_oversize_input_is_refused_before_the_model_runs(tiny_llama, monkeypatch):
    monkeypatch.setenv(LIMIT_ENV, "20KB")
    calls = []
    tiny_llama.model.register_forward_pre_hook(lambda *args: calls.append(1))
    with pytest.raises(LlmattrError) as err:
        llmattr.explain(TEXT, model=tiny_llama, method="saliency", task="sentiment", answer="Positive")
    message = str(err.value)
    assert "\n" not in message and "saliency on" in message and "needs about" in message
    assert "the limit is 0.00 GB (LLMATTR_MEMORY_LIMIT)" in message and "what fits: at most about" in message
    assert not calls  # neither generation nor the method ran
    monkeypatch.setenv(LIMIT_ENV, "1GB")
    llmattr.explain(TEXT, model=tiny_llama, method="saliency", task="sentiment", answer="Positive")
    assert calls


def test_methods_side_by_side_are_guarded_before_the_generation(tiny_llama, monkeypatch):
    """Several methods: none fits -> one line naming each, and neither the generation nor a method ran; one fits
    -> the generation runs, the one is explained and the other is named as refused."""
    monkeypatch.setenv(LIMIT_ENV, "20KB")
    calls = []
    tiny_llama.model.register_forward_pre_hook(lambda *args: calls.append(1))
    with pytest.warns(UserWarning) as caught:
        out = llmattr.explain(TEXT, model=tiny_llama, method=["saliency", "integrated-gradients"], task="sentiment")
    assert not calls and len(out) == 0
    why = out.failed[0]
    assert "\n" not in why and why.startswith("no method fits in memory: saliency on")
    assert "; integrated-gradients on" in why and why.count("needs about") == 2
    assert "item 0: no method fits in memory" in str(caught[0].message)
    tokens = prepare(tiny_llama, TEXT, Request("sentiment")).input_ids.shape[1]
    calls.clear()
    limit = 20_000
    while not fits(tiny_llama, methods.get("random"), tokens):  # the least that random's forward pass needs
        limit = limit * 21 // 20
        monkeypatch.setenv(LIMIT_ENV, str(limit))
    assert not fits(tiny_llama, methods.get("saliency"), tokens)
    with pytest.warns(UserWarning, match="item 0: saliency on [0-9,]+ tokens"):
        out = llmattr.explain(TEXT, model=tiny_llama, method=["saliency", "random"], task="sentiment")
    assert calls and [e.method for e in out] == ["random"]


def fits(lm, method, tokens: int) -> bool:
    try:
        plan(lm, method, tokens)
    except LlmattrError:
        return False
    return True


def test_auto_checkpointing_when_only_the_checkpointed_backward_fits(tiny_llama, monkeypatch):
    """20 tokens: plain backward 112,640 bytes, checkpointed 48,640; a 60 KB limit takes the checkpointed one,
    ``off`` refuses and suggests it, and checkpointing changes no score."""
    method = methods.get("saliency")
    assert activation_bytes(Shapes.of(tiny_llama), "backward", 20) == 112640
    assert activation_bytes(Shapes.of(tiny_llama), "backward", 20, checkpointing=True) == 48640
    monkeypatch.setenv(LIMIT_ENV, "60KB")
    assert plan(tiny_llama, method, 20, "auto") is True
    with pytest.raises(LlmattrError, match="--checkpointing on"):
        plan(tiny_llama, method, 20, "off")
    monkeypatch.setenv(LIMIT_ENV, "1GB")
    assert plan(tiny_llama, method, 20, "auto") is False and plan(tiny_llama, method, 20, "on") is True
    with pytest.raises(LlmattrError, match="checkpointing must be one of"):
        plan(tiny_llama, method, 20, "sometimes")


@pytest.mark.parametrize("name", ["saliency", "integrated-gradients", "grad-ellm"])
def test_checkpointed_backward_gives_the_same_scores(tiny_llama, name):
    target = prepare(tiny_llama, TEXT, Request("sentiment", answer=" movie was"))
    method = methods.get(name, **CHEAP.get(name, {}))
    plain = method.attribute(tiny_llama, target)
    with checkpointed(tiny_llama):
        again = method.attribute(tiny_llama, target)
    torch.testing.assert_close(again, plain, atol=1e-6 * plain.abs().amax().item(), rtol=0)
    assert "forward" not in vars(decoder_blocks(tiny_llama.model)[0])  # restored


def test_checkpointed_deeplift_equals_the_plain_passes(tiny_lm, monkeypatch):
    """Blockwise DeepLIFT (each block's reference and linearised input pass rebuilt in the backward pass) gives
    the plain two-pass multipliers on every architecture, for one and for three explained steps; each block's
    rule runs twice (the forward, then the backward's recomputation)."""
    runs = []
    rule = deeplift._linearised_block
    monkeypatch.setattr(deeplift, "_linearised_block", lambda *a, **k: runs.append(1) or rule(*a, **k))
    method = methods.get("deeplift")
    for tgt in (prepare(tiny_lm, TEXT, Request("sentiment", answer=" movie was")),
                prepare(tiny_lm, TEXT, Request("sentiment", answer="Positive"))):
        plain, plain_info = method.attribute_with_info(tiny_lm, tgt)
        runs.clear()
        with method.checkpointing(tiny_lm, True):
            again, info = method.attribute_with_info(tiny_lm, tgt)
        assert len(runs) == 2 * len(decoder_blocks(tiny_lm.model)) and not method.blockwise
        scale = float(plain.abs().sum()) + 1e-30
        torch.testing.assert_close(again, plain, atol=64 * torch.finfo(torch.float32).eps * scale, rtol=0)
        delta = torch.tensor(plain_info["target_delta"]).abs().sum().item()
        got, want = (torch.tensor(i["convergence_delta"]) for i in (info, plain_info))
        torch.testing.assert_close(got, want, atol=64 * torch.finfo(torch.float32).eps * delta, rtol=0)


def test_deeplift_checkpoints_when_only_the_blockwise_passes_fit(tiny_tokenizer, monkeypatch):
    """A 16-layer tiny Llama: plain DeepLIFT 85,760 bytes a token (2.5 backward graphs), blockwise 26,624 a token
    (7 L d + 48 d + 24 f floats) plus 104 bytes per element of one block of attention multipliers (4 heads x S^2).
    For the 97-token prompt a 7 MB limit runs the blockwise passes, with the same scores; ``off`` refuses."""
    deep = build_tiny("llama", tiny_tokenizer, num_hidden_layers=16)
    method = methods.get("deeplift")
    shapes = Shapes.of(deep)
    assert activation_bytes(shapes, "deeplift", 1) == 5 * 4 * (16 * (8 * 32 + 4 * 64) + 4 * 32 + 4 * 64) // 2 == 85760
    plain = llmattr.explain(TEXT, model=deep, method="deeplift", task="sentiment", answer="Positive")
    tokens = len(plain.token_ids)
    blockwise = tokens * 4 * (7 * 16 * 32 + 48 * 32 + 24 * 64) + 104 * 4 * tokens**2
    assert activation_bytes(shapes, "deeplift", tokens, checkpointing=True) == blockwise
    assert blockwise < parse_bytes("7MB") < tokens * 85760
    monkeypatch.setenv(LIMIT_ENV, "7MB")
    assert plan(deep, method, tokens, "auto") is True
    with pytest.raises(LlmattrError, match="--checkpointing on"):
        plan(deep, method, tokens, "off")
    runs = []
    rule = deeplift._linearised_block
    monkeypatch.setattr(deeplift, "_linearised_block", lambda *a, **k: runs.append(1) or rule(*a, **k))
    again = llmattr.explain(TEXT, model=deep, method="deeplift", task="sentiment", answer="Positive")
    assert len(runs) == 32  # 16 blocks, each run and recomputed
    raw = plain.score_matrix(raw=True)
    torch.testing.assert_close(again.score_matrix(raw=True), raw, atol=64 * 1.2e-7 * float(raw.abs().sum()), rtol=0)


def test_out_of_memory_halves_the_path_chunk(tiny_llama, monkeypatch):
    """A chunk of more than 2 points 'runs out of memory' (as a GPU would): IG halves 8 -> 4 -> 2 and the
    result equals the chunk-of-2 run."""
    target = prepare(tiny_llama, TEXT, Request("sentiment", answer="Positive"))
    ig = methods.get("integrated-gradients", n_steps=8, internal_batch_size=2)
    want = ig.attribute(tiny_llama, target)
    inner = integrated.embedding_gradients

    def limited(f, x, *scale):
        if x.shape[0] > 2:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return inner(f, x, *scale)

    monkeypatch.setattr(integrated, "embedding_gradients", limited)
    got = methods.get("integrated-gradients", n_steps=8, internal_batch_size=8).attribute(tiny_llama, target)
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_cli_refuses_an_oversize_text_with_one_line():
    """The real CLI on the embedded model with a 1 MB budget: exit 2, one line, before any forward pass."""
    env = {**os.environ, LIMIT_ENV: "1MB"}
    result = subprocess.run([sys.executable, "-m", "llmattr", "explain", TEXT, "--method", "attention"],
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "needs about" in lines[0] and LIMIT_ENV in lines[0], result.stderr


def test_evaluator_chunk_from_token_budget_and_memory(tiny_llama, monkeypatch):
    """8192 suffix tokens per pass, or fewer rows when half the limit holds fewer (forward estimate per row)."""
    monkeypatch.setenv(LIMIT_ENV, "1GB")
    assert forward_batch(tiny_llama, 50) == TOKEN_BUDGET // 50
    per_row = activation_bytes(Shapes.of(tiny_llama), "forward", 50)
    monkeypatch.setenv(LIMIT_ENV, str(2 * 3 * per_row))
    assert forward_batch(tiny_llama, 50) == 3
    monkeypatch.setenv(LIMIT_ENV, "1KB")
    assert forward_batch(tiny_llama, 50) == 1


def test_reagent_estimate_counts_its_replacement_distributions(tiny_llama, monkeypatch):
    """ReAGent's causal sampler holds (n, V) distributions, far more than its forward activations: a limit that
    fits the forward but not 4 float32 (S, V) copies is refused; the uniform sampler holds none and passes."""
    tokens, vocab = 20, tiny_llama.model.get_input_embeddings().num_embeddings
    causal, uniform = methods.get("reagent"), methods.get("reagent", sampler="uniform")
    forward = activation_bytes(Shapes.of(tiny_llama), "forward", tokens)
    assert causal.memory_extra(tiny_llama, tokens) == 4 * tokens * vocab * 4 > forward
    assert uniform.memory_extra(tiny_llama, tokens) == 0
    monkeypatch.setenv(LIMIT_ENV, str(forward + 1))
    assert plan(tiny_llama, uniform, tokens) is False
    with pytest.raises(LlmattrError, match=r"reagent on 20 tokens needs about .* what fits: at most about"):
        plan(tiny_llama, causal, tokens)


def test_decoder_blocks_come_from_the_decoder_not_from_a_count(tiny_lm):
    """The blocks are the decoder's own stack, on every architecture, even when another ModuleList of the
    same length sits before it in the module tree (the old search took the first list of that length)."""
    model = tiny_lm.model
    decoder = model.get_decoder()
    blocks = decoder_blocks(model)
    assert blocks is getattr(decoder, "h" if tiny_lm.model_id == "tiny-gpt2" else "layers")
    decoy = torch.nn.ModuleList(torch.nn.Linear(2, 2) for _ in blocks)
    decoder._modules = {"decoy": decoy, **decoder._modules}
    assert next(m for m in model.modules() if isinstance(m, torch.nn.ModuleList)) is decoy
    assert decoder_blocks(model) is blocks
