"""A model's anatomy: where each part that llmattr's methods read sits in the module tree (docs/architecture.md).

The methods read a decoder-only transformer's parts by role, never by an attribute name of their own:

* ``blocks``: the stack of decoder blocks (checkpointing, DeepLIFT's blocks, value zeroing, the decompositions);
* ``attention``: a block's attention module, and ``out_proj``: that module's output projection ``W_O``
  (the decompositions);
* ``post_attention_norm``: the norm a block applies to the attention output before the residual sum (Gemma 2/3's
  sandwich norm), told apart from ``pre_mlp_norm``, the norm before the MLP: transformers' Llama-style blocks
  name their pre-MLP norm ``post_attention_layernorm``, so that name is a post-attention norm only where the
  pre-MLP norm is another module;
* ``final_norm``: the norm after the last block, and ``head``: the LM head (the head-on-top methods, ALTI-Logit,
  the float32 logits); ``score``, ``classifier`` and ``pooler``: a sequence classifier's heads.

Each role's attribute paths (dotted, ``"model.blocks"``) are one field of :class:`Parts`. :data:`DEFAULT` holds the
names transformers' architectures use, tried in order; an architecture with other names is declared in one call::

    register_parts("ToyForCausalLM", blocks="model.blocks", attention="mixer", out_proj="proj",
                   final_norm="model.ln_out", head="unembed")

and every method then finds its parts. A model takes the row of the first class in its MRO that has one (a
subclass keeps its base's names), else :data:`DEFAULT`; a role the row does not name keeps DEFAULT's paths.
Paths start at the model (``blocks``, ``final_norm``, ``head``, ``score``, ``classifier``, ``pooler``), at a block
(``attention``, ``post_attention_norm``, ``pre_mlp_norm``) or at the attention module (``out_proj``). Empty
``blocks``: the decoder's stack found from the structure (:func:`decoder_blocks`); empty ``head``: transformers'
``get_output_embeddings()``. The input embeddings are read through transformers' ``get_input_embeddings()``,
which every model has.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from ..checks import register_once
from ..errors import LlmattrError
from ..lazy import torch

Paths = tuple[str, ...]


@dataclass(frozen=True)
class Parts:
    """One architecture's attribute paths per role (module docstring), each tried in order."""

    blocks: Paths = ()
    attention: Paths = ("self_attn", "attn")
    out_proj: Paths = ("o_proj", "c_proj", "out_proj", "dense")
    post_attention_norm: Paths = ("post_attention_layernorm",)
    pre_mlp_norm: Paths = ("pre_feedforward_layernorm", "post_attention_layernorm")
    final_norm: Paths = ("base_model.norm", "base_model.ln_f", "base_model.final_layernorm", "base_model.norm_f")
    head: Paths = ()
    score: Paths = ("score",)
    classifier: Paths = ("classifier",)
    pooler: Paths = ("pooler", "base_model.pooler")


DEFAULT = Parts()
REGISTERED: dict[str, Parts] = {}  # model class name -> its parts
ROLES = tuple(f.name for f in fields(Parts))


def register_parts(architecture: str, **paths: str | Paths) -> Parts:
    """Declare the part names of the model class named ``architecture`` (and its subclasses): each keyword a role
    of :class:`Parts`, its value one path or a tuple of paths; the roles left out keep :data:`DEFAULT`'s."""
    unknown = sorted(set(paths) - set(ROLES))
    if unknown:
        raise LlmattrError(f"unknown part role(s) {', '.join(unknown)}; valid: {', '.join(ROLES)}")
    row = replace(DEFAULT, **{role: (p,) if isinstance(p, str) else tuple(p) for role, p in paths.items()})
    return register_once(REGISTERED, architecture, row, "architecture")


def parts_of(model: torch.nn.Module) -> Parts:
    """The row of the first class in ``model``'s MRO that has one, else :data:`DEFAULT`."""
    return next((REGISTERED[c.__name__] for c in type(model).__mro__ if c.__name__ in REGISTERED), DEFAULT)


def part(model: torch.nn.Module, role: str, within: torch.nn.Module | None = None) -> torch.nn.Module | None:
    """``model``'s part in ``role``: the first of its row's paths that leads from ``within`` (a block or attention
    module of ``model``; default the model) to a module, ``None`` if none does."""
    for path in getattr(parts_of(model), role):
        found = within if within is not None else model
        for name in path.split("."):
            found = getattr(found, name, None)
        if isinstance(found, torch.nn.Module):
            return found
    return None


def required(model: torch.nn.Module, role: str, within: torch.nn.Module | None = None) -> torch.nn.Module:
    """:func:`part`, or one line naming what was looked for and how to declare it."""
    found = part(model, role, within)
    if found is None:
        where = type(within if within is not None else model).__name__
        paths = ", ".join(getattr(parts_of(model), role))
        raise LlmattrError(f"cannot find the {role} of {where} (looked for {paths}); "
                           f"declare it with llmattr.models.anatomy.register_parts({type(model).__name__!r}, "
                           f"{role}=...)")
    return found


def decoder_blocks(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The stack of transformer blocks: the registered ``blocks`` path, else read from the model's own structure:
    the child of its decoder (``model.get_decoder()``: ``layers`` in Llama-style models, ``h`` in GPT-2) that is a
    ModuleList of the block class transformers keeps whole on one device (``_no_split_modules``), one block per
    hidden layer."""
    if parts_of(model).blocks:
        return required(model, "blocks")
    n_layers = model.config.get_text_config().num_hidden_layers
    decoder = model.get_decoder()
    block_types = set(getattr(model, "_no_split_modules", None) or ())
    stacks = [child for child in decoder.children()
              if isinstance(child, torch.nn.ModuleList) and len(child) == n_layers
              and (not block_types or type(child[0]).__name__ in block_types)]
    if len(stacks) != 1:
        raise LlmattrError(f"cannot find the {n_layers} transformer blocks of {type(model).__name__} "
                           f"({len(stacks)} candidate stacks in its decoder {type(decoder).__name__}); declare them "
                           f"with llmattr.models.anatomy.register_parts({type(model).__name__!r}, blocks=...)")
    return stacks[0]


def attention_parts(model: torch.nn.Module, block: torch.nn.Module
                    ) -> tuple[torch.nn.Module, torch.nn.Module | None]:
    """A block's attention output projection ``W_O`` and the norm applied to the attention output
    (``post_attention_norm``; ``None`` where the block has none: Llama, Qwen2, Mistral, GPT-2)."""
    proj = required(model, "out_proj", required(model, "attention", block))
    norm = part(model, "post_attention_norm", block)
    return proj, None if norm is part(model, "pre_mlp_norm", block) else norm


def final_norm(model: torch.nn.Module) -> torch.nn.Module | None:
    """The normalisation applied after the last block (``None`` for post-norm encoders such as BERT)."""
    return part(model, "final_norm")


def output_head(model: torch.nn.Module) -> torch.nn.Module | None:
    """The LM head (``None`` for a model without one, e.g. a sequence classifier)."""
    return part(model, "head") if parts_of(model).head else model.get_output_embeddings()
