"""Memory guard: estimate a run's peak memory from the model's shapes before it starts, refuse what cannot fit.

The estimate counts the activations a method keeps on top of the resident model (bytes, ``e`` = bytes per
element of the model's dtype, ``S`` tokens, ``R`` rows per pass, ``L`` layers, ``d`` hidden size, ``f`` MLP
width, ``H``/``H_kv`` query/key-value heads of width ``D``), by the method's :class:`MemoryProfile` (its
``memory_kind``: a name in :data:`PROFILES`)::

    forward   (no gradients; one layer's transients alive):   R S e (4 d + 4 f)
    cache     (a key/value cache of the sequence):             S e 2 L H_kv D
    backward  (every layer's saved activations):               copies R S e (L (8 d + 4 f) + 4 d + 4 f)
    checkpointed backward (block inputs kept, blocks redone):  R S e (a L d + b d + c f)
                                                               + score_bytes min(score_block, R H S^2)
    extra     (what a method holds beside its passes: its ``memory_extra``)
    head      (weights not in float32: the LM head's float32 cast, :func:`~.loading.float32_head`;
               one block in a forward pass, every block kept for a backward):  min(V d 4, 256 MiB) / V d 4

(the per-layer ``8 d + 4 f`` is what SmolLM2's forward+backward floor measured: 1.24 MB per token between 1k
and 2k tokens over its 30 layers in float32, by ``benchmarks/bench_memory.py``; ``8 d + 4 f`` gives 1.29 MB).
A profile without a backward graph (:data:`FORWARD`) costs ``forward + cache``; one with a graph ``backward``
(:data:`BACKWARD`: one graph, ``copies = 1``), or its checkpointed line when checkpointing is on
(:data:`BACKWARD`: ``(a, b, c) = (1, 5, 6)``, each block's input kept and one block redone, no score term). A
method whose passes hold more declares its own profile beside its class and registers it
(:func:`register_profile`): how many graphs' worth its plain passes keep, the coefficients of its checkpointed
passes and the attention score blocks they hold. The estimate is
compared with the memory the device has free: CPU available RAM (``psutil``), GPU free memory
(``torch.cuda.mem_get_info`` plus what PyTorch's caching allocator holds reserved but unused), or the
``LLMATTR_MEMORY_LIMIT`` environment variable (e.g. ``2GB``), which lowers the budget for tests and shared
machines.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from fractions import Fraction
from functools import partial

import psutil

from ..checks import check_checkpointing, register_once
from ..errors import LlmattrError
from ..lazy import checkpointing, torch
from ..sizes import parse_size
from .anatomy import output_head
from .intercept import patched_blocks
from .loading import LoadedModel, head_block_rows

LIMIT_ENV = "LLMATTR_MEMORY_LIMIT"
TOKEN_BUDGET = 8192  # tokens per forward pass of perturbed rows when no batch size is given
PATH_BUDGET = 2 * 2**30  # bytes of activations one path-method chunk may hold (at most half the limit)


@dataclass(frozen=True)
class Shapes:
    """What the estimate reads from a model's config."""

    layers: int
    hidden: int
    mlp: int
    heads: int
    kv_heads: int
    head_dim: int
    element: int  # bytes per element

    @classmethod
    def of(cls, lm: LoadedModel) -> Shapes:
        cfg = lm.config.get_text_config()
        hidden = cfg.hidden_size
        heads = cfg.num_attention_heads
        return cls(
            layers=cfg.num_hidden_layers,
            hidden=hidden,
            mlp=getattr(cfg, "intermediate_size", None) or getattr(cfg, "n_inner", None) or 4 * hidden,
            heads=heads,
            kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
            head_dim=getattr(cfg, "head_dim", None) or hidden // heads,
            element=lm.model.get_input_embeddings().weight.element_size(),
        )


@dataclass(frozen=True)
class MemoryProfile:
    """How a method's passes hold activations: the coefficients of the module docstring's formulas.

    ``graph``: a backward pass keeps every layer's activations (checkpointing applies; the LM head's float32
    cast keeps every block); without one, ``forward + cache``. ``copies``: backward graphs' worth of activations
    the plain passes keep at once. ``checkpointed``: ``(a, b, c)`` of the checkpointed passes' bytes per token
    and row, ``e (a L d + b d + c f)``, plus ``score_bytes`` per element of one block of at most ``score_block``
    attention scores (``R H S^2`` elements in all)."""

    name: str
    graph: bool = True
    copies: Fraction = Fraction(1)
    checkpointed: tuple[int, int, int] = (1, 5, 6)
    score_bytes: int = 0
    score_block: int = 0


PROFILES: dict[str, MemoryProfile] = {}  # memory_kind -> its profile


def register_profile(profile: MemoryProfile) -> MemoryProfile:
    """Make ``profile`` a ``memory_kind`` by its name (a different one under a taken name is refused)."""
    return register_once(PROFILES, profile.name, profile, "memory profile")


FORWARD = register_profile(MemoryProfile("forward", graph=False))
BACKWARD = register_profile(MemoryProfile("backward"))


def profile_of(kind: str) -> MemoryProfile:
    """The registered profile named ``kind`` (a method's ``memory_kind``)."""
    if kind not in PROFILES:
        raise LlmattrError(f"unknown memory kind {kind!r}; valid: {', '.join(PROFILES)}")
    return PROFILES[kind]


def parse_bytes(text: str) -> int:
    """``LLMATTR_MEMORY_LIMIT``'s ``"2GB"``, ``"512 MB"``, ``"1.5G"`` or bytes (binary units, :mod:`llmattr.sizes`)."""
    size = parse_size(text)
    if size is None:
        raise LlmattrError(f"{LIMIT_ENV}={text!r} is not a size; use e.g. 2GB or 512MB")
    return size


def memory_limit(device: torch.device) -> tuple[int, str]:
    """Bytes the run may use and where that number comes from."""
    if os.environ.get(LIMIT_ENV):
        return parse_bytes(os.environ[LIMIT_ENV]), LIMIT_ENV
    if device.type == "cuda":
        return free_gpu_memory(device), "free GPU memory"
    return psutil.virtual_memory().available, "available RAM"


def free_gpu_memory(device: torch.device) -> int:
    """Bytes this process can still allocate on a GPU: the driver's free memory plus what PyTorch's caching
    allocator holds reserved but unused (freed tensors stay reserved, invisible to the driver's count, and are
    the first memory the next allocation takes)."""
    free = torch.cuda.mem_get_info(device)[0]
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def activation_bytes(shapes: Shapes, kind: str, tokens: int, rows: int = 1, checkpointing: bool = False) -> int:
    """The module docstring's formula for the memory profile named ``kind`` (:data:`PROFILES`)."""
    s, profile = shapes, profile_of(kind)
    forward = s.element * (4 * s.hidden + 4 * s.mlp)
    cache = s.element * 2 * s.layers * s.kv_heads * s.head_dim
    if not profile.graph:
        return rows * tokens * forward + tokens * cache
    if checkpointing:
        a, b, c = profile.checkpointed
        scores = profile.score_bytes * min(profile.score_block, rows * s.heads * tokens * tokens)
        return rows * tokens * s.element * (a * s.layers * s.hidden + b * s.hidden + c * s.mlp) + scores
    per_token = s.element * s.layers * (8 * s.hidden + 4 * s.mlp) + forward
    return int(profile.copies * rows * tokens * per_token)


def head_cast_bytes(lm: LoadedModel, graph: bool) -> int:
    """The float32 copy of a non-float32 LM head's weight (:func:`~.loading.float32_head`): one vocabulary block
    at a time in a forward pass, every block at once where a backward pass keeps them (``graph``); 0 in float32."""
    head = output_head(lm.model)
    if head is None or head.weight.dtype == torch.float32:
        return 0
    vocabulary, width = head.weight.shape
    return 4 * width * (vocabulary if graph else min(vocabulary, head_block_rows(head)))


def prefix_cache_pays(lm: LoadedModel, prefix: int, tokens: int, rows: int = 1) -> bool:
    """Whether a backward pass should run the first ``prefix`` of ``tokens`` tokens into a no-gradient key/value
    cache (:func:`~.forward.prefix_cache`) rather than through the graph.

    The cache saves the prefix's activations, ``R P`` times the backward's bytes per token (module docstring).
    But with a cache the other ``S - P`` queries no longer start at key 0, so attention cannot take the causal
    kernel's shortcut: it gets an explicit ``(S - P, S)`` mask, which PyTorch's ``scaled_dot_product_attention``
    converts to the model's dtype and keeps for the backward in every layer: ``L (S - P) S e`` bytes, quadratic
    in the length (measured on SmolLM2 at 8k tokens: 7.8 GB, 1.7 times the whole forward+backward floor). The
    cache is used when it saves more than that.
    """
    s = Shapes.of(lm)
    masks = s.layers * (tokens - prefix) * tokens * s.element
    return prefix > 0 and masks < rows * prefix * activation_bytes(s, "backward", 1)


def forward_batch(lm: LoadedModel, tokens: int) -> int:
    """Perturbed rows of ``tokens`` tokens per forward pass: ``TOKEN_BUDGET`` tokens, fewer if the forward estimate
    of the rows (:func:`activation_bytes`) would pass half the memory limit; at least 1."""
    per_row = activation_bytes(Shapes.of(lm), "forward", tokens)
    return max(1, min(TOKEN_BUDGET // tokens, memory_limit(lm.device)[0] // 2 // per_row))


def path_batch(lm: LoadedModel, tokens: int, points: int, checkpointing: bool = False) -> int:
    """Path points per forward+backward chunk: as many as fit ``min(PATH_BUDGET, limit / 2)``, at least 1."""
    budget = min(PATH_BUDGET, memory_limit(lm.device)[0] // 2)
    per_row = activation_bytes(Shapes.of(lm), "backward", tokens, 1, checkpointing)
    return int(max(1, min(points, budget // max(per_row, 1))))


def is_oom(err: BaseException) -> bool:
    """Out of memory on a GPU (``torch.OutOfMemoryError``) or on the CPU allocator."""
    return isinstance(err, torch.OutOfMemoryError) or "can't allocate memory" in str(err)


def _gb(n: float) -> str:
    return f"{n / 2**30:.2f} GB"


def plan(lm: LoadedModel, method, tokens: int, checkpointing: str = "auto") -> bool:
    """Whether to checkpoint; raises a one-line :class:`LlmattrError` when the run cannot fit.

    ``method`` gives ``memory_kind`` (a :class:`MemoryProfile`'s name: ``forward``, ``backward`` or one its module
    registers), ``memory_rows(lm, tokens)`` and ``memory_extra(lm, tokens)`` (bytes beside the activations, e.g. a
    sampler's distributions over the vocabulary).
    ``checkpointing``: ``on``, ``off``, or ``auto`` (on only when the plain backward does not fit).
    """
    check_checkpointing(checkpointing)
    shapes, kind = Shapes.of(lm), method.memory_kind
    limit, source = memory_limit(lm.device)
    rows = method.memory_rows(lm, tokens)
    graph = profile_of(kind).graph
    head = head_cast_bytes(lm, graph)

    def need(n: int, checkpoint: bool) -> int:
        return activation_bytes(shapes, kind, n, rows, checkpoint) + method.memory_extra(lm, n) + head

    use = graph and checkpointing == "on"
    if need(tokens, use) > limit and graph and checkpointing == "auto":
        use = True
    needed = need(tokens, use)
    if needed <= limit:
        return use
    fits = tokens
    while fits > 1 and need(fits, use) > limit:
        fits = fits * 9 // 10
    hints = [f"at most about {fits:,} tokens"]
    if rows > 1:
        hints.append("a smaller batch (internal_batch_size / batch_size)")
    if graph and checkpointing == "off":
        hints.append("--checkpointing on")
    raise LlmattrError(
        f"{method.name} on {tokens:,} tokens needs about {_gb(needed)} (estimate, see llmattr.models.memory) "
        f"but the limit is {_gb(limit)} ({source}); what fits: {', or '.join(hints)}"
    )


@contextmanager
def checkpointed(lm: LoadedModel, enable: bool = True,
                 recompute: Callable[[], AbstractContextManager] | None = None) -> Iterator[None]:
    """Activation checkpointing of every decoder block for the duration (``torch.utils.checkpoint``, non-reentrant):
    the backward pass keeps each block's input and recomputes the block. Not transformers' own
    ``gradient_checkpointing_enable``: that drops the key/value cache, which the shared template prefix needs
    (our prefix cache stores nothing, so recomputing a block with it is exact). ``recompute``: a context the
    recomputation runs in (a method whose forward runs under its own rules gives them again)."""
    if not enable:
        yield
        return
    options = {} if recompute is None else {"context_fn": lambda: (nullcontext(), recompute())}
    wrap = partial(checkpointing.checkpoint, use_reentrant=False, **options)
    with patched_blocks(lm.model, lambda _, forward: partial(wrap, forward), transparent=True):
        yield
