"""Shared fixtures: a tiny in-process tokenizer, tiny random models of five architectures, the real model.

``LLMATTR_TEST_DEVICE`` (default ``cpu``; e.g. ``cuda``) is the device every model of the suite is built on:
the tiny models, the embedded model and Gemma, in the dtypes each test chose. Tests marked ``gpu`` need a CUDA
GPU and are skipped without one.
"""

from __future__ import annotations

import os
from functools import partial

import pytest
import torch

from llmattr.models.loading import LoadedModel, wrap_model
from llmattr.report.html import TIMINGS_END, TIMINGS_START
from llmattr.tasks.datasets import data_dir

CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CORPUS = [
    "An engrossing film that is never boring, with a terrific cast.",
    "The movie was dull and the plot made no sense at all.",
    "Positive Negative true false Text: Passage: Question: Answer:",
    "You are a helpful sentiment classifier. Please help to do the sentiment classification "
    "of the given text and respond ONLY with the single word Positive or Negative.",
    "the quick brown fox jumps over the lazy dog 0123456789 .,;:!?'\"()",
]
ARCHS = ("llama", "mistral", "qwen2", "gemma3", "gpt2")
TEST_DEVICE = os.environ.get("LLMATTR_TEST_DEVICE") or "cpu"  # the suite's one device switch (README, Tests)


def pytest_configure(config):
    if TEST_DEVICE.startswith("cuda") and not torch.cuda.is_available():
        raise pytest.UsageError(f"LLMATTR_TEST_DEVICE={TEST_DEVICE} but torch sees no CUDA GPU")
    if not (TEST_DEVICE == "cpu" or TEST_DEVICE.startswith("cuda")):
        raise pytest.UsageError(f"LLMATTR_TEST_DEVICE={TEST_DEVICE!r}: use cpu, cuda or cuda:N")


@pytest.fixture(autouse=True, scope="session")
def compare_across_devices():
    """Off the CPU a test's reference may live on the device or on the CPU (some methods return their scores on
    the CPU): ``torch.testing.assert_close`` then compares the values, within the test's own tolerance, not where
    they live."""
    if TEST_DEVICE == "cpu":
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.testing, "assert_close", partial(torch.testing.assert_close, check_device=False))
        yield


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` skip, with the reason, where torch sees no CUDA GPU."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (marker gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def token_methods() -> list[str]:
    """The registered methods that score tokens on any prompt; the source-level ones (granularity "source") need a
    prompt with sources, and tests/test_sources.py runs every method, theirs included, on documents."""
    from llmattr import methods

    return [name for name in methods.available() if methods.REGISTRY[name].granularity == "token"]


def peak_tensor_bytes(run) -> int:
    """The most bytes of tensors alive at once during ``run()`` on the suite's device, beyond those alive before.

    CPU: the running sum of the profiler's allocation and free events (what the memory guard estimates; a process's
    resident size adds the C allocator's own retention, see docs/methods-lrp.md, Cost). CUDA: the caching
    allocator's peak of allocated bytes over what was allocated before (a matrix product first, so that cuBLAS's
    workspace, kept for the process, is not counted as the run's)."""
    if TEST_DEVICE.startswith("cuda"):
        square = torch.ones(8, 8, device=TEST_DEVICE)
        (square @ square).sum().item()  # cuBLAS's workspace is allocated by the first product and kept
        del square
        torch.cuda.synchronize(TEST_DEVICE)
        torch.cuda.reset_peak_memory_stats(TEST_DEVICE)
        before = torch.cuda.memory_allocated(TEST_DEVICE)
        run()
        torch.cuda.synchronize(TEST_DEVICE)
        return torch.cuda.max_memory_allocated(TEST_DEVICE) - before
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    alive = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        alive += event.nbytes()
        peak = max(peak, alive)
    return peak


def make_tiny_tokenizer():
    """A byte-level BPE tokenizer trained in-process, with a ChatML template (SmolLM2's format)."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS * 5, vocab_size=400, min_frequency=1,
                            special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<|im_start|>",
                                  eos_token="<|im_end|>", pad_token="<|im_end|>", unk_token="<|endoftext|>")
    tok.chat_template = CHAT_TEMPLATE
    tok.add_tokens(["Negative"])  # both sentiment label words one token each (the label-word target needs it)
    return tok


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return make_tiny_tokenizer()


def tiny_config(arch: str, vocab_size: int, **overrides):
    """A 2-layer random config of ``arch`` with GQA where the architecture has it."""
    from transformers import Gemma3TextConfig, GPT2Config, LlamaConfig, MistralConfig, Qwen2Config

    common = dict(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  eos_token_id=2, bos_token_id=1, pad_token_id=2)
    if arch == "gpt2":
        cfg = GPT2Config(vocab_size=vocab_size, n_embd=32, n_layer=2, n_head=4, n_positions=256,
                         eos_token_id=2, bos_token_id=1, pad_token_id=2)
    elif arch == "gemma3":
        cfg = Gemma3TextConfig(**common, head_dim=8, sliding_window=4, query_pre_attn_scalar=8)
    else:
        cfg = {"llama": LlamaConfig, "mistral": MistralConfig, "qwen2": Qwen2Config}[arch](**common)
    for key, value in overrides.items():
        setattr(cfg, key, value)
    types = getattr(cfg, "layer_types", None)
    if types:  # keep one layer type per layer when the depth is overridden
        cfg.layer_types = [types[i % len(types)] for i in range(cfg.num_hidden_layers)]
    return cfg


def build_tiny(arch: str, tokenizer, seed: int = 0, **overrides) -> LoadedModel:
    """A tiny random causal LM of ``arch`` wrapped for llmattr (float32 weights, on ``TEST_DEVICE``)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = tiny_config(arch, len(tokenizer), **overrides)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").to(TEST_DEVICE)
    return wrap_model(model, tokenizer, model_id=f"tiny-{arch}")


@pytest.fixture(params=ARCHS)
def tiny_lm(request, tiny_tokenizer) -> LoadedModel:
    return build_tiny(request.param, tiny_tokenizer)


@pytest.fixture
def tiny_llama(tiny_tokenizer) -> LoadedModel:
    return build_tiny("llama", tiny_tokenizer)


@pytest.fixture(scope="session")
def smollm() -> LoadedModel:
    """The real embedded model (SmolLM2-135M-Instruct); converted once into the cache."""
    from llmattr.models.loading import load_model

    return load_model("default", device=TEST_DEVICE, dtype="fp32")


@pytest.fixture(scope="session")
def gemma() -> LoadedModel:
    """Gemma-3-270M base (a second real architecture: sliding-window layers, a 262k vocabulary)."""
    from llmattr.models.loading import load_model

    return load_model("gemma-3-270m", device=TEST_DEVICE, dtype="fp32")


@pytest.fixture(scope="session")
def shared_data():
    """The sample files shipped with the package (never skipped: a clone of the project alone has them)."""
    return data_dir()


def foreign_sqlite(path):
    """A SQLite database of another program (one table, one row), as a user might pass by mistake as --out."""
    import sqlite3

    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, total REAL)")
    conn.execute("INSERT INTO orders VALUES (1, 9.5)")
    conn.commit()
    conn.close()
    return path


def strip_timings(text: str) -> str:
    """An HTML report without its timing section (wall times differ between runs), for byte comparisons."""
    while TIMINGS_START in text:
        head, rest = text.split(TIMINGS_START, 1)
        text = head + rest.split(TIMINGS_END, 1)[1]
    return text
