"""What only a CUDA GPU can show (marker ``gpu``: skipped without one; ``benchmarks/gpu_session.sh`` runs them).

bfloat16 by default on CUDA with float32 logits, a model split between the GPU and the CPU (``device_map``), 4-bit
weights (bitsandbytes), the memory guard's reading of free GPU memory, out-of-memory halving of the path chunk on a
real allocator, and the embedded model's attributions and AUCs on CUDA against the CPU's.
"""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

import llmattr
from conftest import build_tiny
from llmattr import methods
from llmattr.api import prepare
from llmattr.evaluation import load_dataset
from llmattr.faithfulness import evaluate
from llmattr.methods import integrated
from llmattr.models import memory
from llmattr.models.loading import load_model
from llmattr.request import Request
from test_dtype import BF16_AUC_TOLERANCE, BF16_MIN_SPEARMAN

pytestmark = pytest.mark.gpu
TEXT = "An engrossing film that is never boring, with a terrific cast."


@pytest.fixture
def tiny_folder(tmp_path, tiny_tokenizer):
    """A tiny Llama saved as a Hugging Face folder (load_model's own path: from_pretrained, dtype, device_map)."""
    lm = build_tiny("llama", tiny_tokenizer, hidden_size=64, intermediate_size=128, num_hidden_layers=4)
    lm.model.cpu().save_pretrained(tmp_path)
    tiny_tokenizer.save_pretrained(tmp_path)
    return tmp_path


def test_cuda_defaults_to_bf16_with_float32_logits(tiny_folder):
    lm = load_model(str(tiny_folder), device="cuda")
    assert lm.device.type == "cuda" and lm.model.dtype == torch.bfloat16
    ids = torch.arange(3, 20, device=lm.device)[None]
    with torch.no_grad():
        assert lm.model(input_ids=ids).logits.dtype == torch.float32
    expl = llmattr.explain(TEXT, model=lm, method="saliency", task="sentiment", answer="Positive")
    assert torch.isfinite(expl.score_matrix(raw=True)).all()


def test_device_map_splits_the_model_between_gpu_and_cpu(tiny_folder):
    """``max_memory`` below the model's size on GPU 0: accelerate puts the rest on the CPU (run on the GPU through
    its hooks), and the attributions equal those of the model held whole on the GPU (float32, same kernels up to
    the order of a few sums)."""
    whole = load_model(str(tiny_folder), device="cuda", dtype="fp32")
    size = sum(p.numel() * 4 for p in whole.model.parameters())
    split = load_model(str(tiny_folder), device="cuda", dtype="fp32", device_map="auto",
                       max_memory=f"0={int(0.5 * size)}B,cpu=1GB")
    assert {0, "cpu"} <= set(split.model.hf_device_map.values()), split.model.hf_device_map
    target = prepare(whole, TEXT, Request("sentiment", answer="Positive"))
    for name in ("saliency", "attention", "integrated-gradients"):
        want = methods.get(name).attribute(whole, target)
        got = methods.get(name).attribute(split, target)
        torch.testing.assert_close(got.cpu(), want.cpu(), atol=1e-5 * float(want.abs().amax()), rtol=0, msg=name)


@pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None, reason="bitsandbytes is not installed")
def test_load_in_4bit_explains_and_evaluates(tiny_folder):
    lm = load_model(str(tiny_folder), device="cuda", load_in_4bit=True)
    assert any(type(m).__name__ == "Linear4bit" for m in lm.model.modules())
    expl = llmattr.explain(TEXT, model=lm, method="grad-ellm", task="sentiment", answer="Positive")
    assert torch.isfinite(expl.score_matrix(raw=True)).all()
    result = evaluate(expl, lm, samples=2)
    assert math.isfinite(result.auc_nc) and 0 <= result.auc_ns <= 1  # NC may pass 1 (a distance over D0)


def test_memory_guard_reads_free_gpu_memory(monkeypatch):
    """The limit is the driver's free memory plus what the caching allocator holds unused: a 1 GiB tensor lowers
    it by 1 GiB, and freeing the tensor (which stays reserved, invisible to the driver) gives it back."""
    monkeypatch.delenv(memory.LIMIT_ENV, raising=False)
    device = torch.device("cuda", torch.cuda.current_device())
    gib = 2**30
    (before, source), driver_before = memory.memory_limit(device), torch.cuda.mem_get_info(device)[0]
    assert source == "free GPU memory" and before > gib
    block = torch.empty(gib, dtype=torch.uint8, device=device)
    during = memory.memory_limit(device)[0]
    assert abs((before - during) - gib) < 64 * 2**20
    del block
    after = memory.memory_limit(device)[0]
    assert driver_before - torch.cuda.mem_get_info(device)[0] > gib // 2  # the driver still counts the block used
    assert abs(after - before) < 64 * 2**20  # the guard does not: PyTorch reuses it


def test_out_of_memory_halves_the_path_chunk_on_a_real_allocator(tiny_tokenizer, monkeypatch):
    """Integrated Gradients asked for 64 path points in one chunk on a long input, with the GPU filled up to about
    12 rows' worth of the guard's backward estimate: the allocator raises out-of-memory, the chunk halves until it
    fits, and the scores equal those of a run that asked for that chunk size."""
    lm = build_tiny("llama", tiny_tokenizer, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                    num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=4096)
    lm.model.to("cuda")  # whatever LLMATTR_TEST_DEVICE says: the GPU's allocator is the point
    target = prepare(lm, "A terrific film. " * 150, Request("sentiment", answer="Positive"))
    per_row = memory.activation_bytes(memory.Shapes.of(lm), "backward", int(target.input_ids.shape[1]))
    chunks, inner = [], integrated.embedding_gradients
    monkeypatch.setattr(integrated, "embedding_gradients", lambda f, x: chunks.append(x.shape[0]) or inner(f, x))
    torch.cuda.empty_cache()
    filler = torch.empty(torch.cuda.mem_get_info()[0] - 12 * per_row, dtype=torch.uint8, device=lm.device)
    try:
        got = methods.get("integrated-gradients", n_steps=64, internal_batch_size=64).attribute(lm, target)
    finally:
        del filler
    fitted = chunks[-1]
    assert chunks[0] == 64 and fitted < 64 and chunks[: chunks.index(fitted)] == [64 >> k for k in range(
        chunks.index(fitted))], chunks  # 64, 32, ... halved until one fitted
    want = methods.get("integrated-gradients", n_steps=64, internal_batch_size=fitted).attribute(lm, target)
    torch.testing.assert_close(got, want, atol=1e-5 * float(want.abs().amax()), rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_embedded_model_on_cuda_equals_the_cpu(dtype):
    """SmolLM2 on CUDA against float32 on the CPU, two SST-2 examples, Grad-ELLM and Integrated Gradients: float32
    scores within float32 tolerance of the CPU's (relative to their sum of magnitudes) and the same AUCs to 1e-3;
    bfloat16 within the documented bf16 tolerance (test_dtype: AUCs, Spearman of the scores)."""
    from scipy.stats import spearmanr

    cpu = load_model("default", device="cpu", dtype="fp32")
    gpu = load_model("default", device="cuda", dtype=dtype)
    data = load_dataset("sst2", 2, 0)
    for example in data.examples:
        for method in ("grad-ellm", "integrated-gradients"):
            runs = [llmattr.explain(example["text"], model=lm, task=data.task, method=method, target="gold",
                                    gold=example["label"]) for lm in (cpu, gpu)]
            (want, got) = (run.score_matrix(raw=True) for run in runs)
            aucs = [evaluate(run, lm, samples=5, seed=0) for run, lm in zip(runs, (cpu, gpu), strict=True)]
            if dtype == "fp32":
                torch.testing.assert_close(got, want, atol=1e-4 * float(want.abs().sum()), rtol=0, msg=method)
                assert abs(aucs[1].auc_nc - aucs[0].auc_nc) < 1e-3 and abs(aucs[1].auc_ns - aucs[0].auc_ns) < 1e-3
            else:
                assert abs(aucs[1].auc_nc - aucs[0].auc_nc) <= BF16_AUC_TOLERANCE
                assert abs(aucs[1].auc_ns - aucs[0].auc_ns) <= BF16_AUC_TOLERANCE
                assert spearmanr(runs[0].steps[0].scores, runs[1].steps[0].scores).statistic >= BF16_MIN_SPEARMAN
