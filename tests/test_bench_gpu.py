"""benchmarks/bench_gpu.py runs on the CPU with a tiny config (the GPU numbers are taken on a GPU)."""

import importlib.util
import re
from pathlib import Path

import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_gpu.py"
spec = importlib.util.spec_from_file_location("bench_gpu", SCRIPT)
bench_gpu = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench_gpu)


def test_token_counter_counts_every_decoder_token(tiny_llama):
    counter = bench_gpu.TokenCounter(tiny_llama)
    with torch.no_grad():
        tiny_llama.model(input_ids=torch.ones(3, 7, dtype=torch.long, device=tiny_llama.device))
        tiny_llama.model(inputs_embeds=torch.zeros(2, 5, 32, device=tiny_llama.device))
    assert counter.tokens == 3 * 7 + 2 * 5


def test_published_shapes_give_the_published_sizes():
    """The 8B/7B configs count the parameters of the released models (8.03 B and 7.25 B)."""
    with torch.device("meta"):
        sizes = {name: sum(p.numel() for p in bench_gpu.AutoModelForCausalLM.from_config(
            bench_gpu.CONFIGS[name]()).parameters()) for name in ("llama-8b", "mistral-7b")}
    assert round(sizes["llama-8b"] / 1e9, 2) == 8.03
    assert round(sizes["mistral-7b"] / 1e9, 2) == 7.25


def test_runs_on_cpu_with_a_tiny_config():
    text = bench_gpu.main(["--model", "tiny", "--device", "cpu", "--datasets", "sst2", "--n", "1",
                           "--methods", "saliency,random", "--samples", "1"])
    assert "| saliency |" in text and "| 0.63 | 0.81 |" in text  # beside paper 000's Table 6
    assert re.search(r"evaluator: [\d,]+ tokens in [\d.]+ s", text) and "MFU n/a" in text
    hours = float(re.search(r"= ([\d.e+-]+) device-hours", text).group(1))
    assert hours > 0 and "FAILED" not in text


def test_hours_keep_their_digits():
    """A fast device's projection is printed with its digits (0.056 h read "0.0" and failed the check above)."""
    assert [bench_gpu.hours_text(h) for h in (0.0556, 3.14159, 1234.5)] == ["0.0556", "3.1", "1234.5"]


def test_budget_stops_before_the_next_example(tmp_path):
    """``--budget-s``: no example starts once the budget is spent (after the untimed warm-up); every dataset left
    is named as not measured, nothing is projected from it. ``--tokenizer`` reads the tokenizer from a folder."""
    from llmattr.models.loading import converted_folder, default_gguf

    text = bench_gpu.main(["--model", "tiny", "--device", "cpu", "--datasets", "sst2", "--methods", "saliency",
                           "--budget-s", "1e-9", "--tokenizer", str(converted_folder(default_gguf()))])
    assert "x 0 dataset(s)" in text and "= 0 device-hours (not measured: imdb, sst2, boolq, tellmewhy, wikibio)" in text
    assert "| saliency |" not in text and "warm-up" in text
