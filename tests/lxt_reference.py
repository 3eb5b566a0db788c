"""The reference side of tests/test_attnlrp.py: AttnLRP / CP-LRP relevances computed by the authors' `lxt` 2.1.

Runs in its own virtual environment (``.venv-lxt``: lxt 2.1 needs transformers 4.x; ``make setup`` builds it),
never imported by the test suite. Reads a JSON request on stdin::

    {"cp": false (lxt's attnLRP rules) or true (its cp_LRP rules),
     "runs": [{"model": folder saved by save_pretrained, "arch": "llama" | "qwen2" | "gemma3" | "gpt2" (lxt's
               rules file), "input_ids": [...], "positions": [...], "target_ids": [...]}, ...]}

and prints ``{"runs": [{"logits": [T], "relevance": [T][S]}, ...]}``: for each step ``t``, the logit of
``target_ids[t]`` at ``positions[t]`` and the relevance ``sum_d x_d * grad_d`` of every input embedding, one
backward per step as lxt explains (its efficient mode: the model classes patched with lxt's rules, then input x
gradient). lxt patches classes for good, so one process serves one rule set (each architecture its own classes).
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
    if "lxt.efficient.models" in sys.modules:
        return importlib.import_module(f"lxt.efficient.models.{arch}")
    root = Path(importlib.util.find_spec("lxt").submodule_search_locations[0])
    for name, folder in (("lxt", root), ("lxt.efficient", root / "efficient"),
                         ("lxt.efficient.models", root / "efficient" / "models")):
        package = types.ModuleType(name)
        package.__path__ = [str(folder)]
        sys.modules[name] = package
    return importlib.import_module(f"lxt.efficient.models.{arch}")


def load(folder: str):
    """The model in float32 with eager attention, as transformers 4.x reads a transformers 5 folder: the RoPE bases
    written as ``rope_parameters`` are lifted back to ``rope_theta`` (and Gemma-3's ``rope_local_base_freq``), and
    the weights are loaded into the model built from its config, whose tied embedding and head share one tensor
    (version 5 may write that tensor under the head's name only, where 4.x's loader looks for the embedding's)."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder)
    rope = getattr(config, "rope_parameters", None) or {}
    if "rope_theta" in rope:
        config.rope_theta = rope["rope_theta"]
    for layer_type, key in (("full_attention", "rope_theta"), ("sliding_attention", "rope_local_base_freq")):
        if "rope_theta" in rope.get(layer_type, {}):
            setattr(config, key, rope[layer_type]["rope_theta"])
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", torch_dtype="float32")
    state = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        state.update(load_file(path))
    keys = model.load_state_dict(state, strict=False)
    embedding = model.get_input_embeddings().weight
    tied = {name for name, p in model.named_parameters(remove_duplicate=False) if p is embedding}
    if keys.unexpected_keys or set(keys.missing_keys) - tied:
        raise SystemExit(f"weights do not fit the model: {keys}")
    return model.eval().requires_grad_(False)


def explain(run: dict, cp: bool) -> dict:
    import torch

    rules = lxt_rules(run["arch"])
    for target, patch in (rules.cp_LRP if cp else rules.attnLRP).items():
        patch(target)
    model = load(run["model"])
    ids = torch.tensor([run["input_ids"]])
    logits, relevance = [], []
    for position, token in zip(run["positions"], run["target_ids"], strict=True):
        embeds = model.get_input_embeddings()(ids).detach().requires_grad_(True)
        logit = model(inputs_embeds=embeds, use_cache=False).logits[0, position, token]
        logit.backward()
        logits.append(float(logit.detach()))
        relevance.append((embeds * embeds.grad)[0].sum(-1).tolist())
    return {"logits": logits, "relevance": relevance}


def main() -> None:
    request = json.load(sys.stdin)
    print(json.dumps({"runs": [explain(run, request["cp"]) for run in request["runs"]]}))


if __name__ == "__main__":
    main()
