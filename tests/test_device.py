"""The GPU paths that a CPU can check: the memory guard's reading of free GPU memory (torch.cuda's counters set by
hand) and the evaluator's out-of-memory halving (a GPU allocator's error raised by hand). tests/test_gpu.py runs
them for real on a GPU."""

from __future__ import annotations

import pytest
import torch

from llmattr import methods
from llmattr.errors import LlmattrError
from llmattr.faithfulness.engine import PerturbationEngine
from llmattr.models import memory
from llmattr.models.loading import LoadedModel
from test_engine import make_target

GIB = 2**30


@pytest.fixture
def fake_gpu(monkeypatch):
    """torch.cuda's counters of a GPU with 3 GiB free for the driver, of which PyTorch's caching allocator holds 5
    GiB reserved and 2 GiB of it allocated (3 GiB reserved but unused: freed tensors the next allocation reuses)."""
    monkeypatch.delenv(memory.LIMIT_ENV, raising=False)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (3 * GIB, 80 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 5 * GIB)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 2 * GIB)


def test_free_gpu_memory_counts_the_allocators_unused_reserve(fake_gpu):
    """3 GiB free for the driver + 3 GiB reserved but unused = 6 GiB the run may use (the driver's count alone
    would refuse runs that fit in memory PyTorch already holds)."""
    assert memory.memory_limit(torch.device("cuda", 0)) == (6 * GIB, "free GPU memory")


def test_path_chunk_and_guard_read_the_gpu(fake_gpu, tiny_llama, monkeypatch):
    """A model on a GPU: the path methods' automatic chunk is min(PATH_BUDGET, free / 2) over one row's backward
    bytes, and the guard refuses in one line naming the free GPU memory."""
    monkeypatch.setattr(LoadedModel, "device", property(lambda self: torch.device("cuda", 0)))
    per_row = memory.activation_bytes(memory.Shapes.of(tiny_llama), "backward", 1000)
    assert memory.path_batch(tiny_llama, 1000, 10**9) == min(memory.PATH_BUDGET, 3 * GIB) // per_row
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 2 * GIB)  # nothing unused: 3 GiB free
    assert memory.path_batch(tiny_llama, 1000, 10**9) == min(memory.PATH_BUDGET, 3 * GIB // 2) // per_row
    with pytest.raises(LlmattrError, match=r"the limit is 3\.00 GB \(free GPU memory\)"):
        memory.plan(tiny_llama, methods.get("saliency"), 10**7, "off")


def test_out_of_memory_halves_the_evaluators_batch(tiny_llama, monkeypatch):
    """A batch of more than 2 perturbed rows 'runs out of memory' (as a GPU would): the engine halves 8 -> 4 -> 2,
    keeps the halved size for its next calls, and returns the rows a batch of 2 gives."""
    target = make_target(tiny_llama)
    keep = torch.bernoulli(torch.full((7, target.span[1] - target.span[0]), 0.5),
                           generator=torch.Generator().manual_seed(0))
    want = PerturbationEngine(tiny_llama, target, batch_size=2).probs(keep)
    engine = PerturbationEngine(tiny_llama, target, batch_size=8)
    inner, sizes = engine._forward, []

    def limited(rows):
        sizes.append(rows.shape[0])
        if rows.shape[0] > 2:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return inner(rows)

    monkeypatch.setattr(engine, "_forward", limited)
    torch.testing.assert_close(engine.probs(keep), want, atol=0, rtol=0)
    unique = torch.unique(keep, dim=0).shape[0]  # repeated masks run once
    assert unique > 4 and sizes[:3] == [unique, 4, 2] and engine.batch_size == 2
