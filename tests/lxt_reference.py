"""The reference side of tests/test_attnlrp.py: AttnLRP / CP-LRP relevances computed by the authors' `lxt` 2.1.

Runs in its own virtual environment (``.venv-lxt``: lxt 2.1 needs transformers 4.x; ``make setup`` builds it),
never imported by the test suite. Reads a JSON request on stdin::

    {"model": folder saved by save_pretrained, "arch": "llama" | "qwen2" | "gemma3" (lxt's rules file),
     "cp": false, "input_ids": [...], "positions": [...], "target_ids": [...]}

and prints ``{"logits": [T], "relevance": [T][S]}``: for each step ``t``, the logit of ``target_ids[t]`` at
``positions[t]`` and the relevance ``sum_d x_d * grad_d`` of every input embedding, one backward per step as lxt
explains (its efficient mode: the model's modules patched with lxt's rules, then input x gradient).
"""

from __future__ import annotations

import importlib
import json
import sys
import types
from pathlib import Path


def lxt_rules(arch: str):
    """lxt's rules file for ``arch`` alone: the package ``__init__`` files import every model lxt knows
    (torchvision for ViT among them), so their packages are stood in for by empty ones."""
    spec = importlib.util.find_spec("lxt")
    root = Path(spec.submodule_search_locations[0])
    for name, folder in (("lxt", root), ("lxt.efficient", root / "efficient"),
                         ("lxt.efficient.models", root / "efficient" / "models")):
        package = types.ModuleType(name)
        package.__path__ = [str(folder)]
        sys.modules[name] = package
    return importlib.import_module(f"lxt.efficient.models.{arch}")


def load(folder: str):
    """The model in float32 with eager attention. transformers 5 writes RoPE bases as ``rope_parameters``;
    4.x reads ``rope_theta`` (and Gemma-3's ``rope_local_base_freq``), so they are lifted back."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder)
    rope = getattr(config, "rope_parameters", None) or {}
    if "rope_theta" in rope:
        config.rope_theta = rope["rope_theta"]
    for layer_type, key in (("full_attention", "rope_theta"), ("sliding_attention", "rope_local_base_freq")):
        if "rope_theta" in rope.get(layer_type, {}):
            setattr(config, key, rope[layer_type]["rope_theta"])
    model = AutoModelForCausalLM.from_pretrained(folder, config=config, torch_dtype="float32",
                                                 attn_implementation="eager")
    return model.eval().requires_grad_(False)


def main() -> None:
    import torch

    request = json.load(sys.stdin)
    rules = lxt_rules(request["arch"])
    for target, patch in (rules.cp_LRP if request["cp"] else rules.attnLRP).items():
        patch(target)
    model = load(request["model"])
    ids = torch.tensor([request["input_ids"]])
    logits, relevance = [], []
    for position, token in zip(request["positions"], request["target_ids"], strict=True):
        embeds = model.get_input_embeddings()(ids).detach().requires_grad_(True)
        logit = model(inputs_embeds=embeds, use_cache=False).logits[0, position, token]
        logit.backward()
        logits.append(float(logit))
        relevance.append((embeds * embeds.grad)[0].sum(-1).tolist())
    print(json.dumps({"logits": logits, "relevance": relevance}))


if __name__ == "__main__":
    main()
