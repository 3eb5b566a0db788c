"""Paper 003's BLiMP layer-wise experiment (sec. 5, Figs. 4-5): the ``alignment-layers`` metric against a hand
computation, its store rows from one ``llmattr evaluate`` command, and the report's table and figure."""

from __future__ import annotations

import sqlite3

import matplotlib.image
import numpy as np
import pytest
import torch
from matplotlib.colors import to_rgb
from typer.testing import CliRunner

from llmattr.api import attribute, prepare
from llmattr.cli import app
from llmattr.errors import LlmattrError
from llmattr.evaluation.run_datasets import expand_datasets, load_dataset
from llmattr.explanation import Explanation
from llmattr.faithfulness import METRICS, MetricContext
from llmattr.faithfulness.alignment import evidence_vector, explanation_alignment, layer_scores
from llmattr.methods import REGISTRY, AttributionMethod, layer_parameter
from llmattr.methods import get as get_method
from llmattr.methods.value_zeroing import value_zeroing_distances
from llmattr.plotting import method_colors
from llmattr.request import Request
from llmattr.tasks import get_task

ROW = get_task("blimp-darn").pair({"one_prefix_prefix": "The sister of doctors", "one_prefix_word_good": "writes",
                                   "one_prefix_word_bad": "write"})  # evidence: "sister"


def hand_average_precision(scores: list[float], evidence: list[int]) -> float:
    """Eq. 9 as A.4 walks it: rank by descending score (ties in token order), precision where a hit appears."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    hits, precisions = 0, []
    for k, i in enumerate(order, start=1):
        if evidence[i]:
            hits += 1
            precisions.append(hits / k)
    return sum(precisions) / sum(evidence)


def test_layer_parameters_of_the_registered_methods():
    assert layer_parameter(REGISTRY["normxlogit"]) == layer_parameter(REGISTRY["logat"]) == "layer"
    assert layer_parameter(REGISTRY["value-zeroing"]) == "layers"
    assert all(layer_parameter(REGISTRY[name]) is None for name in ("random", "l2-norm", "grad-ellm", "saliency"))


def test_gold_target_is_the_blimp_target_word(tiny_llama):
    task = get_task("blimp-darn")
    target = prepare(tiny_llama, {"text": ROW["text"]}, Request(task, target="gold", gold=ROW["target"]))
    assert target.forced and target.target_ids.tolist() == tiny_llama.tokenizer(" writes")["input_ids"][:1]
    with pytest.raises(LlmattrError, match="gold next word"):
        prepare(tiny_llama, {"text": ROW["text"]}, Request(task, target="gold"))


def test_explain_cli_takes_the_gold_word_of_a_blimp_prefix(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setattr("llmattr.models.loading.load_model", lambda *args, **kwargs: tiny_llama)
    out = tmp_path / "e.json"
    args = ["explain", ROW["text"], "--task", "blimp-darn", "--method", "normxlogit", "--target", "gold"]
    result = CliRunner().invoke(app, [*args, "--field", "label=writes", "--format", "json"])
    assert result.exit_code == 0, result.output
    expl = Explanation.from_json(result.stdout[result.stdout.index("{"):])
    assert [s.token_id for s in expl.steps] == tiny_llama.tokenizer(" writes")["input_ids"][:1]
    monkeypatch.setattr("llmattr.models.loading.load_model", lambda *args, **kwargs: pytest.fail("loaded"))
    missing = CliRunner().invoke(app, [*args, "--json", str(out)])  # refused before the model loads
    assert isinstance(missing.exception, LlmattrError) and "--field label=WORD" in str(missing.exception)
    assert not out.exists()


def test_per_layer_normxlogit_alignment_equals_hand_computation(tiny_llama):
    """Layer l: NormXLogit = ||e_i|| * W[y] . norm(h_i^l) from hooks on the decoder blocks; dot product of its
    positive part over its sum with the evidence, and AP by A.4's walk, equal the stored rows."""
    task = get_task("blimp-darn")
    target = prepare(tiny_llama, {"text": ROW["text"]}, Request(task, target="gold", gold=ROW["target"]))
    expl = attribute(tiny_llama, target, get_method("normxlogit"), Request(task), ROW)
    rows = METRICS["alignment-layers"].compute(MetricContext(tiny_llama, expl), "none")

    model = tiny_llama.model
    blocks, outputs = model.model.layers, {}
    handles = [b.register_forward_hook(lambda m, a, out, k=k: outputs.__setitem__(k, out[0] if isinstance(out, tuple)
                                                                                 else out))
               for k, b in enumerate(blocks)]
    with torch.no_grad():
        model(target.input_ids.to(tiny_llama.device))
    for h in handles:
        h.remove()
    a, b = target.span
    ids = target.input_ids[0, a:b]
    norms = model.get_input_embeddings().weight[ids].norm(dim=-1)
    w = model.get_output_embeddings().weight[int(target.target_ids[0])]
    evidence = [int(v) for v in evidence_vector(expl, ROW["evidence_words"]).tolist()]  # the tokens of "sister"
    assert 0 < sum(evidence) < len(evidence)
    stored = {(r.metric, r.x): r.value for r in rows}
    assert {r.step for r in rows} == {0} and set(stored) == {(m, pi) for m in ("layer_dot_product",
                                                                               "layer_average_precision")
                                                             for pi in (1, 2)}
    for k in range(len(blocks)):
        with torch.no_grad():
            s = (norms * (model.model.norm(outputs[k][0, a:b]) @ w)).double().cpu()
        pos = s.clamp_min(0)
        dot = float(pos @ torch.tensor(evidence, dtype=torch.float64) / pos.sum())
        tol = 64 * torch.finfo(torch.float32).eps * float(s.abs().sum() / pos.sum())  # float32 sums of |terms|
        assert stored[("layer_dot_product", k + 1)] == pytest.approx(dot, abs=tol)
        assert stored[("layer_average_precision", k + 1)] == pytest.approx(hand_average_precision(s.tolist(), evidence))
    # the last layer's reading is the stored explanation's (NormXLogit's default layer)
    assert stored[("layer_dot_product", 2)] == pytest.approx(explanation_alignment(expl).dot_product[0], abs=1e-12)


def test_one_pass_sweeps_equal_one_layer_per_call(tiny_llama):
    """NormXLogit's and value zeroing's one-pass ``layer_scores`` give what their layer parameter gives."""
    task = get_task("blimp-darn")
    target = prepare(tiny_llama, {"text": ROW["text"]}, Request(task, target="gold", gold=ROW["target"]))
    a, b = target.span
    swept = layer_scores(tiny_llama, target, "normxlogit")
    assert swept.shape == (2, 1, b - a)
    for k in range(2):
        assert torch.equal(swept[k], get_method("normxlogit", layer=k).attribute(tiny_llama, target).double())
    swept = layer_scores(tiny_llama, target, "value-zeroing", batch_size=2)
    # zeroing one layer or both in the same pass: float32 1 - cos differs by a few eps per token, divided by
    # each layer's sum of distances
    sums = value_zeroing_distances(tiny_llama, target.input_ids, target.positions, target.span, [0, 1], 16).sum(-1)
    tol = 16 * torch.finfo(torch.float32).eps / float(sums.min())
    for k in range(2):
        one = get_method("value-zeroing", layers=k, batch_size=2).attribute(tiny_llama, target).double()
        assert torch.allclose(swept[k], one, rtol=0, atol=tol)
    mean = get_method("value-zeroing", layers="all", batch_size=2).attribute(tiny_llama, target).double()  # "average"
    assert torch.allclose(mean, swept.mean(0), rtol=0, atol=torch.finfo(torch.float32).eps)


class LayerIndex(AttributionMethod):
    """A toy method with a layer parameter (as ALTI- and GlobEnc- have): score of token i at layer l = (l + 1) * i,
    so the evidence's rank and share are known by hand."""

    name, family, summary, cost = "toy-layer-index", "test", "toy", "none"
    needs_gradients, signed = False, False
    defaults = {"layer": None}

    def attribute(self, lm, target):
        a, b = target.span
        return (self.params["layer"] + 1) * torch.arange(b - a, dtype=torch.float32)[None]


def test_a_new_method_with_a_layer_parameter_joins_with_no_change(tiny_llama, monkeypatch):
    monkeypatch.setitem(REGISTRY, LayerIndex.name, LayerIndex)
    task = get_task("blimp-darn")
    target = prepare(tiny_llama, {"text": ROW["text"]}, Request(task, target="gold", gold=ROW["target"]))
    expl = attribute(tiny_llama, target, LayerIndex(layer=0), Request(task), ROW)
    rows = METRICS["alignment-layers"].compute(MetricContext(tiny_llama, expl), "none")
    evidence = evidence_vector(expl, ROW["evidence_words"]).tolist()
    m = len(evidence)
    hit = [i for i, e in enumerate(evidence) if e]
    share = sum(hit) / sum(range(m))  # (l + 1) cancels in the sum-normalised dot product
    ap = hand_average_precision(list(range(m)), evidence)  # ranked from the last token down
    assert sorted((r.metric, r.x, r.value) for r in rows) == [
        ("layer_average_precision", 1, pytest.approx(ap)), ("layer_average_precision", 2, pytest.approx(ap)),
        ("layer_dot_product", 1, pytest.approx(share)), ("layer_dot_product", 2, pytest.approx(share))]


def test_blimp_group_expands_to_the_five_paradigms():
    assert expand_datasets(["blimp", "sst2", "blimp-darn"]) == [
        "blimp-ana", "blimp-dna", "blimp-dnaa", "blimp-darn", "blimp-rpsv", "sst2"]
    with pytest.raises(LlmattrError, match="blimp, blimp-ana"):
        load_dataset("blimp-xyz", 1, 0)


def line_pixels(image: np.ndarray, color: str) -> int:
    """Pixels of ``image`` (RGBA floats) within a small distance of ``color``."""
    return int((np.abs(image[..., :3] - np.array(to_rgb(color))).max(-1) < 0.03).sum())


def test_blimp_layerwise_report_from_one_evaluate_command(tiny_llama, tmp_path, monkeypatch):
    """The documented command (docs/blimp.md) on a tiny model: per (paradigm, method, layer) rows in the store,
    a resumed rerun computes nothing, and `llmattr report` renders the per-layer table and figure."""
    monkeypatch.setattr("llmattr.evaluation.loop.load_model", lambda *args, **kwargs: tiny_llama)
    out = tmp_path / "blimp.sqlite"
    command = ["evaluate", "--datasets", "blimp", "--methods", "normxlogit,value-zeroing,random",
               "--metrics", "alignment-layers", "--target", "gold", "--n", "2", "--out", str(out), "--quiet"]
    first = CliRunner().invoke(app, command)
    assert first.exit_code == 0, first.output
    assert "30 computed, 0 already in the store, 0 failed" in first.output  # 5 paradigms x 2 examples x 3 methods
    again = CliRunner().invoke(app, command)
    assert "0 computed, 30 already in the store" in again.output

    with sqlite3.connect(out) as conn:
        keys = conn.execute("SELECT dataset, method, x, count(*) FROM results GROUP BY dataset, method, x").fetchall()
        dots = conn.execute("SELECT dataset, example, value FROM results WHERE method = 'normxlogit' AND x = 2 "
                            "AND metric = 'layer_dot_product'").fetchall()
        texts = dict(((d, e), t) for d, e, t in conn.execute(
            "SELECT dataset, example, explanation FROM explanations WHERE method = 'normxlogit'"))
    paradigms = ["blimp-ana", "blimp-darn", "blimp-dna", "blimp-dnaa", "blimp-rpsv"]
    expected = [(d, m, pi, 4) for d in paradigms for m, layers in (("normxlogit", (1, 2)), ("random", (-1,)),
                                                                   ("value-zeroing", (1, 2))) for pi in layers]
    assert keys == expected  # 2 examples x 2 metrics per (paradigm, method, layer)
    for dataset, example, value in dots:  # the last layer is the stored explanation (NormXLogit's default)
        expl = Explanation.from_json(texts[(dataset, example)])
        assert expl.steps[0].token == tiny_llama.tokenizer.decode(
            tiny_llama.tokenizer(" " + expl.example["label"])["input_ids"][:1])  # the gold word
        assert value == pytest.approx(explanation_alignment(expl).dot_product[0], abs=1e-12)

    report = CliRunner().invoke(app, ["report", str(out), "--out", str(tmp_path / "rep"), "--format", "md,csv",
                                      "--bootstrap", "200"])
    assert report.exit_code == 0, report.output
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "### Per-layer alignment with gold evidence (paper 003 Figs. 4-5)" in text
    lines = text.split("### Per-layer alignment with gold evidence (paper 003 Figs. 4-5)")[1].splitlines()[2:10]
    assert lines[0] == "| Layer | normxlogit | value-zeroing | random (control) |"
    assert [line.split(" | ")[0] for line in lines[2:]] == ["| *Dot product ↑*", "| Layer 1", "| Layer 2",
                                                             "| *AP ↑*", "| Layer 1", "| Layer 2"]
    assert all(line.count(" ± ") == 3 and line.endswith("* |") for line in lines[3:5] + lines[6:8])  # control: italic
    csv = (tmp_path / "rep" / "table_alignment_layers.csv").read_text().splitlines()
    cell = next(line for line in csv if line.startswith("table_alignment_layers,Dot product ↑,Layer 2,normxlogit,"))
    paradigm_means = [np.mean([v for d, _, v in dots if d == p]) for p in paradigms]
    assert float(cell.split(",")[4]) == pytest.approx(np.mean(paradigm_means), rel=1e-5)  # mean of paradigm means

    image = matplotlib.image.imread(tmp_path / "rep" / "fig_alignment_layers.png")
    assert image.shape[1] > 1000 and "fig_alignment_layers.png" in text
    colors = method_colors(["normxlogit", "value-zeroing", "random"])
    assert all(line_pixels(image, color) > 400 for color in colors.values())  # each line (legend alone: ~120 px)
