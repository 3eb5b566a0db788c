"""AttnLRP and CP-LRP: rules by hand, conservation with every bias term counted on five architectures and SmolLM2,
agreement with the authors' `lxt` 2.1 (run in its own virtual environment), and the method's plumbing."""

from __future__ import annotations

import json
import math
import os
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils.checkpoint import CheckpointError

from conftest import ARCHS, build_tiny, peak_tensor_bytes
from llmattr import methods
from llmattr.api import prepare
from llmattr.errors import LlmattrError
from llmattr.methods.gradient import embedding_gradients, score_fn
from llmattr.methods.lrp import calls, relevance, relevance_rules
from llmattr.models.forward import logits_at
from llmattr.models.memory import LIMIT_ENV, Shapes, activation_bytes, checkpointed, plan
from llmattr.models.probe import eager_attention
from llmattr.request import Request

EPS32 = torch.finfo(torch.float32).eps
TEXT = "A terrific film."
ROOT = Path(__file__).resolve().parents[1]
LXT_PYTHON = Path(os.environ.get("LLMATTR_LXT_PYTHON", ROOT / ".venv-lxt" / "bin" / "python"))


def forced(lm):
    return prepare(lm, TEXT, Request("sentiment", answer=" movie was"))


class Toy(torch.nn.Module):
    """``F = silu(w1 . x) * (w2 . x)`` after an RMSNorm: one gate, one activation, one normaliser."""

    def __init__(self):
        super().__init__()
        self.act = torch.nn.SiLU()
        self.w1, self.w2 = torch.tensor([1.0, -2.0, 0.5]), torch.tensor([0.5, 1.0, 2.0])

    def forward(self, x):
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.act(x @ self.w1) * (x @ self.w2)


def test_rules_by_hand():
    """With ``n = x / rms(x)``, ``u = w1 . n``, ``b = w2 . n``, ``F = silu(u) b``: the uniform rule gives ``F/2``
    to each factor, the identity rule passes ``F/2`` from ``silu(u)`` to ``u``, the linear maps split by
    ``n_i w_i / u`` and ``n_i w_i / b``, and the RMSNorm (normaliser held constant) passes ``R_n`` to ``x``:
    ``R_i = F/2 (n_i w1_i / u + n_i w2_i / b)``, summing to ``F``."""
    toy, x = Toy(), torch.tensor([[1.0, 2.0, -1.5]])
    with relevance_rules(toy):
        xg = x.clone().requires_grad_(True)
        value = toy(xg)[0]
        (grad,) = torch.autograd.grad(value, xg)
    n = x[0] / math.sqrt(float(x.pow(2).mean()) + 1e-6)
    u, b = float(n @ toy.w1), float(n @ toy.w2)
    f = u / (1 + math.exp(-u)) * b
    expected = f / 2 * (n * toy.w1 / u + n * toy.w2 / b)
    torch.testing.assert_close((x * grad)[0], expected, rtol=1e-6, atol=0)
    assert math.isclose(float((x * grad).sum()), f, rel_tol=1e-6)
    assert "forward" not in vars(toy) and "forward" not in vars(toy.act)  # the patches are undone


class SoftmaxBias(TorchFunctionMode):
    """The softmax's Taylor bias ``b = s - J z`` (AttnLRP's rule gives it no relevance) as a leaf added to the
    output (value 0 added, gradient ``g_s``), so ``b . g_s`` is the relevance it absorbs."""

    def __init__(self):
        super().__init__()
        self.leaves: list[torch.Tensor] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in calls().softmax and args[0].requires_grad:
            s = out.detach()
            z = torch.where(s > 0, args[0].detach().to(s.dtype), 0)  # masked scores: s = 0, no term
            leaf = (s - s * (z - (s * z).sum(-1, keepdim=True))).requires_grad_(True)
            self.leaves.append(leaf)
            out = out + (leaf - leaf.detach())
        return out


def conservation(lm, target, constant_attention: bool, rules: bool = True):
    """Per step: ``F``, the sum of the input relevances ``sum_i x_i g_i`` and of what the bias terms absorb
    (``sum b g_b``: softmax biases, linear and LayerNorm biases, learned position embeddings), and the sum of the
    absolute values of every term (the scale of the float error). Eager attention (the softmax in the graph)."""
    x = lm.embed(target.input_ids).detach().requires_grad_(True)
    biases = [p for name, p in lm.model.named_parameters() if name.endswith("bias") or "wpe" in name]
    f = score_fn(lm, target, "logit")
    rows = []
    try:
        for p in biases:
            p.requires_grad_(True)
        with eager_attention(), SoftmaxBias() as softmax, \
                (relevance_rules(lm.model, constant_attention) if rules else torch.enable_grad()):
            scores = f(x)[0]
            for t in range(target.n_steps):
                leaves = [x, *softmax.leaves, *biases]
                grads = torch.autograd.grad(scores[t], leaves, retain_graph=True, allow_unused=True)
                terms = [(v.detach() * g).double() for v, g in zip(leaves, grads, strict=True) if g is not None]
                rows.append((float(scores[t].detach()), float(terms[0].sum()), sum(float(r.sum()) for r in terms[1:]),
                             sum(float(r.abs().sum()) for r in terms)))
    finally:
        for p in biases:
            p.requires_grad_(False)
    return rows


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("constant_attention", [False, True], ids=["attnlrp", "cp-lrp"])
def test_relevance_is_conserved(tiny_tokenizer, arch, constant_attention):
    """``F = sum_i R_i + sum_b b . g_b`` over all input positions (template included) to float precision of the
    terms' scale; CP-LRP on a bias-free model (Llama, Mistral, Gemma3) conserves with nothing absorbed. The
    plain gradient (no rules) breaks the identity by far more than the tolerance."""
    lm = build_tiny(arch, tiny_tokenizer)
    target = forced(lm)
    for value, inputs, absorbed, scale in conservation(lm, target, constant_attention):
        assert abs(inputs + absorbed - value) <= 64 * EPS32 * scale, (arch, value, inputs, absorbed)
        if constant_attention and arch in ("llama", "mistral", "gemma3"):
            assert absorbed == 0.0 and abs(inputs - value) <= 64 * EPS32 * scale
    plain = conservation(lm, target, constant_attention, rules=False)
    assert max(abs(i + a - v) / s for v, i, a, s in plain) > 1e-3


@pytest.mark.slow
def test_relevance_is_conserved_on_smollm(smollm):
    target = prepare(smollm, "An engrossing film that is never boring.", Request("sentiment", answer=" Positive"))
    for constant_attention in (False, True):
        for value, inputs, absorbed, scale in conservation(smollm, target, constant_attention):
            assert abs(inputs + absorbed - value) <= 64 * EPS32 * scale, (value, inputs, absorbed)


@pytest.mark.parametrize("name", ["attnlrp", "cp-lrp"])
def test_sdpa_equals_the_eager_rules(tiny_lm, name):
    """In sdpa the rules act on q, k, v (shares 1/4, 1/4, 1/2, or 0, 0, 1); on the eager path on the two products
    and the softmax: the same relevances on every architecture."""
    target = forced(tiny_lm)
    method = methods.get(name, reduction="sum")
    got = method.attribute(tiny_lm, target)
    with eager_attention():
        want = method.attribute(tiny_lm, target)
    torch.testing.assert_close(got, want, atol=64 * EPS32 * float(want.abs().sum()), rtol=0)


def test_steps_prefix_cache_and_checkpointing_leave_the_relevance_unchanged(tiny_llama):
    """All steps in one forward and backward (prefix cached) equal the full pass's span relevances and a
    checkpointed run's (whose recomputed blocks run under the rules again)."""
    target = forced(tiny_llama)
    method = methods.get("attnlrp")
    got = method.attribute(tiny_llama, target)
    _, full = relevance(tiny_llama, score_fn(tiny_llama, target, "logit"), tiny_llama.embed(target.input_ids))
    a, b = target.span
    tol = 64 * EPS32 * float(got.abs().sum())
    torch.testing.assert_close(got, full[:, a:b].sum(-1), atol=tol, rtol=0)
    with method.checkpointing(tiny_llama, True):
        torch.testing.assert_close(method.attribute(tiny_llama, target), got, atol=tol, rtol=0)
    with checkpointed(tiny_llama), pytest.raises(CheckpointError):  # recomputed without the rules: other graphs
        method.attribute(tiny_llama, target)


def test_rules_leave_the_forward_and_the_objective_alone(tiny_lm):
    """The explained scores are the model's logits; the rules act inside the model only, so a contrastive
    objective's relevance is the difference of the two logits' (linear), and the probability objective keeps its
    softmax's gradient even under CP-LRP (whose held-constant softmax is the attention's)."""
    target = forced(tiny_lm)
    x = tiny_lm.embed(target.input_ids).detach()
    positions, steps = target.positions, torch.arange(target.n_steps)
    plain, _ = embedding_gradients(score_fn(tiny_lm, target, "logit"), x)
    scores, logit_rel = relevance(tiny_lm, score_fn(tiny_lm, target, "logit"), x)
    torch.testing.assert_close(scores, plain, rtol=1e-6, atol=1e-7)
    foil = torch.tensor(7)
    _, foil_rel = relevance(tiny_lm, lambda e: logits_at(tiny_lm, e, positions)[:, steps, foil], x)
    _, contrast_rel = relevance(tiny_lm, score_fn(tiny_lm, target, "contrast", foil_ids=foil), x)
    tol = 64 * EPS32 * float(logit_rel.abs().sum() + foil_rel.abs().sum())
    torch.testing.assert_close(contrast_rel, logit_rel - foil_rel, atol=tol, rtol=0)
    _, prob_rel = relevance(tiny_lm, score_fn(tiny_lm, target, "probability"), x, constant_attention=True)
    assert torch.isfinite(prob_rel).all() and (prob_rel.sum((1, 2)).abs() > 0).all()


def lxt_available() -> bool:
    if not LXT_PYTHON.exists():
        return False
    return subprocess.run([str(LXT_PYTHON), "-c", "import importlib.util as u; assert u.find_spec('lxt')"],
                          capture_output=True).returncode == 0


needs_lxt = pytest.mark.skipif(not lxt_available(), reason=f"lxt 2.1 not installed at {LXT_PYTHON} (make setup "
                               "builds .venv-lxt; it skips only where lxt cannot be installed)")


def lxt_relevance(cp: bool, runs: list[tuple[str, str, object]]) -> list[dict]:
    """lxt's logits and relevances (AttnLRP, or CP-LRP with ``cp``) for each ``(folder, arch, target)``: one
    subprocess of the lxt environment for all of them."""
    request = {"cp": cp, "runs": [{"model": folder, "arch": arch, "input_ids": target.input_ids[0].tolist(),
                                   "positions": target.positions.tolist(), "target_ids": target.target_ids.tolist()}
                                  for folder, arch, target in runs]}
    done = subprocess.run([str(LXT_PYTHON), str(ROOT / "tests" / "lxt_reference.py")], input=json.dumps(request),
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])["runs"]


def assert_equals_lxt(lm, target, ref: dict, cp: bool) -> None:
    """Every input position's relevance for every step equal to lxt's to float precision of the relevances'
    scale (after checking that both sides explain the same logits)."""
    scores, attr = relevance(lm, score_fn(lm, target, "logit"), lm.embed(target.input_ids), constant_attention=cp)
    torch.testing.assert_close(scores[0], torch.tensor(ref["logits"]), atol=64 * EPS32 * float(scores.abs().max()),
                               rtol=0)
    got, want = attr.sum(-1).cpu(), torch.tensor(ref["relevance"])
    tol = 64 * EPS32 * want.abs().sum(-1, keepdim=True)
    assert ((got - want).abs() <= tol).all(), (cp, float((got - want).abs().max()), tol.squeeze(-1).tolist())


LXT_ARCHS = ("llama", "qwen2", "gemma3", "gpt2")


@pytest.fixture(scope="module")
def lxt_tiny(tiny_tokenizer):
    """lxt's results on the tiny models of ``LXT_ARCHS`` (saved with save_pretrained), both rule sets."""
    with tempfile.TemporaryDirectory() as root:
        runs = []
        for arch in LXT_ARCHS:
            lm = build_tiny(arch, tiny_tokenizer)
            lm.model.save_pretrained(f"{root}/{arch}")
            runs.append((f"{root}/{arch}", arch, forced(lm)))
        return {cp: dict(zip(LXT_ARCHS, lxt_relevance(cp, runs), strict=True)) for cp in (False, True)}


@needs_lxt
@pytest.mark.parametrize("arch", LXT_ARCHS)
@pytest.mark.parametrize("cp", [False, True], ids=["attnlrp", "cp-lrp"])
def test_equals_lxt(tiny_tokenizer, lxt_tiny, arch, cp):
    lm = build_tiny(arch, tiny_tokenizer)
    assert_equals_lxt(lm, forced(lm), lxt_tiny[cp][arch], cp)


@needs_lxt
@pytest.mark.slow
def test_equals_lxt_on_smollm(smollm):
    target = prepare(smollm, "An engrossing film that is never boring.", Request("generate", answer=" It is a"))
    for cp in (False, True):
        (ref,) = lxt_relevance(cp, [(smollm.model.name_or_path, "llama", target)])
        assert_equals_lxt(smollm, target, ref, cp)


def test_registered_with_the_logit_objective():
    for name in ("attnlrp", "cp-lrp"):
        cls = methods.REGISTRY[name]
        assert cls.objective == "logit" and cls.needs_gradients and cls.signed and cls.memory_kind == "backward"
    assert methods.get("cp-lrp", objective="contrast", foil=" no").params["objective"] == "contrast"


def test_memory_guard_plans_the_backward_and_checkpoints_under_the_rules(tiny_llama, monkeypatch):
    """AttnLRP holds one forward+backward graph (the guard's ``backward``): with a limit between the checkpointed
    and the plain estimate the guard checkpoints (and the run gives the plain scores, see above); below both it
    refuses with one line."""
    method, tokens = methods.get("attnlrp"), 100
    shapes = Shapes.of(tiny_llama)
    plain = activation_bytes(shapes, "backward", tokens)
    blocks = activation_bytes(shapes, "backward", tokens, checkpointing=True)
    monkeypatch.setenv(LIMIT_ENV, str((plain + blocks) // 2))
    assert plan(tiny_llama, method, tokens, "auto") is True
    monkeypatch.setenv(LIMIT_ENV, str(blocks // 2))
    with pytest.raises(LlmattrError, match="attnlrp on 100 tokens needs about"):
        plan(tiny_llama, method, tokens, "auto")


@pytest.mark.parametrize("name", ["attnlrp", "cp-lrp"])
def test_memory_guard_covers_the_tensors_alive(tiny_llama, name):
    """At two lengths (one explained token) the tensors alive at the peak stay within the guard's ``backward``
    estimate. The measurement sees an ``(S, S)`` term where there is one: under eager attention, which keeps every
    layer's ``(H, S, S)`` probabilities for the backward, the longer run exceeds the estimate."""
    method, shapes = methods.get(name), Shapes.of(tiny_llama)
    targets = [prepare(tiny_llama, TEXT * n, Request("sentiment", answer=" m")) for n in (6, 23)]  # " m": one token
    lengths = [int(t.input_ids.shape[1]) for t in targets]
    assert [t.n_steps for t in targets] == [1, 1] and 100 < lengths[0] < lengths[1] <= 256, lengths
    estimate = [activation_bytes(shapes, "backward", n) for n in lengths]
    peaks = [peak_tensor_bytes(lambda t=t: method.attribute(tiny_llama, t)) for t in targets]
    assert peaks[0] <= estimate[0] and peaks[1] <= estimate[1], (peaks, estimate)
    if name == "attnlrp":  # CP-LRP sends no gradient through the probabilities: eager keeps none of them either
        with eager_attention():
            eager = peak_tensor_bytes(lambda: method.attribute(tiny_llama, targets[1]))
        assert eager > estimate[1], (eager, estimate)
