"""Sources (issue 34 points 1, 2, 5, 6): documents, sentences and spans as the prompt's Sources, every method's
source scores, LIME and random per source, the views, the refusals, the gold-source task."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from rich.console import Console

import llmattr
from llmattr import methods
from llmattr.errors import LlmattrError
from llmattr.explanation import Explanation
from llmattr.faithfulness.inputs import target_from_explanation
from llmattr.methods.base import spread
from llmattr.methods.lime import lime_step
from llmattr.render import grid_html, heatmap_html, number, print_explanation
from llmattr.request import Request
from llmattr.sources import Sources
from llmattr.sources.build import build_sources, check_spans, context_text, token_groups
from llmattr.sources.split import sentences
from test_cli_checks import NO_MODEL, one_line_error, run_cli

DOCS = ["The tower is in Paris. It was built in 1889.", "Bananas are yellow.", "The mountain is high."]


def test_context_text_places_each_document_after_its_label():
    text, ranges = context_text(["ab", "cde"])
    assert text == "Document [1]: ab\n\nDocument [2]: cde"
    assert [text[s:e] for s, e in ranges] == ["ab", "cde"]


def test_token_groups_by_characters_straddling_token_to_the_larger_part():
    # tokens: "Doc: " template (0..5), "ab" (5..7), "cX" straddles: 1 char of source 0, 1 of source 1 -> tie ->
    # the earlier; "XYZw" 3 chars of source 1 and 1 of source 2 -> source 1; a gap token; a control token (0, 0)
    offsets = [(0, 5), (5, 7), (7, 9), (9, 13), (13, 15), (0, 0), (15, 18)]
    ranges = [(5, 8), (8, 12), (12, 13), (15, 18)]
    groups = token_groups(offsets, (1, 7), ranges)
    assert groups == [(1, 2), (3,), (), (6,)]  # range 2 lost its one character to token 3: tokenises to nothing
    assert token_groups(offsets, (2, 7), ranges)[0] == (2,)  # only span tokens belong to a source
    with pytest.raises(LlmattrError, match="tokenises to nothing"):
        build_sources(ranges, "x" * 18, offsets, (1, 7))


def test_sentences_are_contiguous_character_ranges():
    text = "Dr. Smith went home. He slept!  Then?"
    ranges = sentences(text)
    assert [text[s:e].strip() for s, e in ranges] == ["Dr. Smith went home.", "He slept!", "Then?"]
    assert ranges[0][0] == 0 and ranges[-1][1] == len(text)
    assert all(e == s for (_, e), (s, _) in zip(ranges, ranges[1:], strict=False))


@pytest.mark.parametrize("spans, message", [
    ([], "non-empty list"), ([(0, 3), (2, 5)], "overlap"), ([(3, 3)], "empty or outside"),
    ([(0, 1.5)], "two integers"),
])
def test_bad_spans_are_one_line(spans, message):
    with pytest.raises(LlmattrError, match=message):
        check_spans(spans)


@pytest.mark.parametrize("kwargs, message", [
    ({"documents": []}, "no documents"), ({"documents": ["a", " "]}, "document 2 is empty"),
    ({"documents": "one text"}, "list of texts"), ({"documents": ["a"], "task": "sentiment"}, "takes no documents"),
    ({"spans": [(0, 4), (3, 6)], "task": "sentiment"}, "overlap"), ({"sources": "word"}, "sources"),
])
def test_request_refuses_bad_sources_before_any_model(kwargs, message):
    kwargs = {"task": "context", **kwargs}
    with pytest.raises(LlmattrError, match=message):
        Request(**kwargs)


def test_request_refuses_a_span_outside_the_text():
    with pytest.raises(LlmattrError, match="outside the text of 5"):
        Request("sentiment", spans=[(0, 9)]).check_text("short")


def sources_explanation(signed: bool = True) -> Explanation:
    raw = torch.tensor([[1.0, -2.0, 0.5, 4.0, 0.25], [0.0, 1.0, 1.0, -1.0, 2.0]])
    sources = Sources(("document 1", "document 2"), ((3, 4), (6,)), ((10, 14), (20, 24)))
    tokens = ["<s>", "Doc", ":", " ab", "cd", "\n\n", " efgh"]
    return Explanation.from_raw(raw, signed, step_tokens=["x", "y"], step_ids=[5, 6], positions=[6, 7],
                                model="m", method="saliency", params={}, tokens=tokens, token_ids=list(range(7)),
                                span=(2, 7), text="<s>Doc: abcd\n\nDoc: efgh" + " " * 2, sources=sources)


def test_source_scores_sum_each_sources_raw_columns_keeping_the_sign():
    expl = sources_explanation()
    # columns of source 1: positions 3, 4 - span start 2 = 1, 2; source 2: 6 - 2 = 4
    assert expl.source_scores().tolist() == [[-2.0 + 0.5, 0.25], [1.0 + 1.0, 2.0]]
    assert np.allclose(expl.source_scores(raw=False), np.stack([expl.to_numpy()[:, 1:3].sum(-1),
                                                                expl.to_numpy()[:, 4]], -1))


def test_sources_round_trip_through_json_and_old_json_still_reads():
    expl = sources_explanation()
    back = Explanation.from_json(expl.to_json())
    assert back.sources == expl.sources and back.source_scores().tolist() == expl.source_scores().tolist()
    old = json.loads(expl.to_json())
    del old["sources"]
    assert Explanation.from_dict(old).sources is None
    plain = sources_explanation()
    plain.sources = None
    assert "sources" not in plain.to_dict()  # an explanation without sources writes the JSON it wrote before


def test_spread_keeps_each_sources_value_as_its_sum():
    owner = torch.tensor([-1, 0, 0, 1, -1, 0])
    values = torch.tensor([[3.0, -2.0]])
    tokens = spread(values, owner)
    assert tokens.tolist() == [[0.0, 1.0, 1.0, -2.0, 0.0, 1.0]]


def test_lime_per_source_recovers_a_linear_models_source_effects():
    """f(x) = sum_i w . x_i is linear in the kept sources: removing source j (zero embeddings) lowers f by
    c_j = sum_{i in j} w . x_i, so LIME's weighted ridge (alpha 0) returns exactly c_j; the tokens of no source
    (baseline = themselves) have no effect."""
    gen = torch.Generator().manual_seed(0)
    n, d = 7, 3
    x, w = torch.randn(1, n, d, generator=gen), torch.randn(d, generator=gen)
    owner = torch.tensor([0, 0, -1, 1, 1, 1, -1])
    coef = lime_step(lambda e: (e @ w).sum(-1), x, n_samples=40, batch_size=8, alpha=0.0, seed=0, owner=owner)
    per_token = (x[0] @ w)
    expected = torch.stack([per_token[owner == j].sum() for j in range(2)])
    assert coef.shape == (2,)
    assert torch.allclose(coef.double(), expected.double(), atol=1e-4 * float(per_token.abs().sum()))


def test_views_show_each_source_with_its_bar():
    expl = sources_explanation()
    buffer = io.StringIO()
    print_explanation(expl, Console(file=buffer, force_terminal=True, color_system="truecolor", width=160))
    out = buffer.getvalue()
    assert "document 1" in out and "document 2" in out and "sources" in out
    assert "\x1b[38;2;214;39;40m\u2588" in out  # a red bar (positive), truecolor foreground
    assert "\x1b[38;2;31;119;180m\u2588" in out  # a blue bar (negative)
    page = heatmap_html(expl)
    assert 'class="side"' in page and "document 2" in page and 'class="fill"' in page
    assert expl._repr_html_() == page  # the notebook view


def long_answer_sources(steps: int = 8, signed: bool = True) -> Explanation:
    """Three documents with long names and texts, explained over ``steps`` generated tokens (small signed values, as
    leave-one-out's)."""
    words = ["The", " Eiffel", " Tower", " was", " built", " in", " 1889", " ."][:steps]
    texts = ["The Eiffel Tower is a wrought-iron tower in Paris, built in 1889 for the World's Fair.",
             "Bananas are yellow fruits that grow in tropical regions.", "Mount Everest is the highest mountain."]
    text = "\n\n".join(texts)
    tokens = ["<s>", *texts, "?"]
    starts = np.cumsum([0, *(len(t) + 2 for t in texts)])
    sources = Sources(("Document [1]", "Document [2]", "Document [3]"), ((1,), (2,), (3,)),
                      tuple((int(a), int(a) + len(t)) for a, t in zip(starts, texts, strict=False)))
    gen = torch.Generator().manual_seed(steps)
    raw = torch.randn(steps, 4, generator=gen, dtype=torch.float64) * 0.3
    raw[:, 2] = -0.004  # a source of small negative values
    return Explanation.from_raw(raw, signed, step_tokens=words, step_ids=list(range(steps)),
                                positions=list(range(5, 5 + steps)), model="m", method="leave-one-out", params={},
                                tokens=tokens, token_ids=list(range(5)), span=(1, 5), text=text, sources=sources)


def rendered(expl: Explanation, width: int, terminal: bool) -> str:
    buffer = io.StringIO()
    colours = "truecolor" if terminal else None
    print_explanation(expl, Console(file=buffer, force_terminal=terminal, color_system=colours, width=width))
    out = buffer.getvalue()
    return out[out.index("sources ("):]


@pytest.mark.parametrize("terminal", [False, True])
@pytest.mark.parametrize("steps", [1, 8])
def test_source_view_keeps_names_values_and_the_total_at_80_columns(terminal, steps):
    """Issue 51 item 3: piped or on a terminal at 80 columns, every source's whole name, every value whole and the
    whole answer's total (a one-step answer: its step); no line over 80 columns; the steps that do not fit said."""
    expl = long_answer_sources(steps)
    out = rendered(expl, 80, terminal)
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out)
    assert all(len(line) <= 80 for line in plain.splitlines())
    scores = np.asarray(expl.source_scores(raw=True))
    header = plain.splitlines()[1]
    if steps > 1:
        assert "total (8 steps)" in header and "more steps: --html or --json show them" in plain
        shown = scores.sum(axis=0)
    else:
        assert "step 'The'" in header and "more step" not in plain
        shown = scores[0]
    for name, value in zip(expl.sources.names, shown, strict=True):
        row = next(line for line in plain.splitlines() if line.startswith(name))
        assert number(float(value)) in row.split()  # the value whole, never "-0...."
    assert "-0.00" not in plain and "\u2026" in plain  # the texts, not the values, are cut
    if terminal:
        assert "\x1b[38;2;214;39;40m\u2588" in out or "\x1b[38;2;31;119;180m\u2588" in out  # coloured bars


def test_source_view_at_160_columns_shows_more_steps():
    expl = long_answer_sources(8)
    narrow, wide = (re.sub(r"\x1b\[[0-9;]*m", "", rendered(expl, w, False)).splitlines()[1] for w in (80, 160))
    assert narrow.count("step '") < wide.count("step '") and "total (8 steps)" in wide


def test_html_sources_of_several_methods_stay_within_the_page():
    """Side by side, the source table has one bar per method (its total over the answer); it and the token grid are
    each inside a box that scrolls rather than widen the page (seen in headless Chromium: docs/sources.md)."""
    members = [long_answer_sources(8), long_answer_sources(8, signed=False)]
    members[1].method = "saliency"
    page = grid_html(members)
    assert page.count('<div class="wide"><table class="grid">') == 1  # the token grid scrolls in its own box too
    table = page[page.index('<div class="wide"><p class="meta">sources'):]
    first_row = table[table.index("<tr><td><b>Document [1]"):].split("</tr>")[0]
    assert first_row.count('class="sbar"') == 2 and "total (8 steps)" in table
    assert ".llmattr .sources,.llmattr .wide{max-width:100%;overflow-x:auto}" in page


def test_every_method_gives_source_scores_on_documents(tiny_llama):
    """Every registered method on a question over three documents: Sources hold no template token, and the
    source scores are the sums of each source's token columns (no code per method)."""
    fast = {"n_steps": 4, "n_samples": 8, "num_ablations": 8}
    template = set()
    for name in methods.available():
        cls = methods.REGISTRY[name]
        params = {k: v for k, v in fast.items() if k in cls.defaults}
        granularity = "sentence" if name == "attribot-hierarchical" else "document"  # it searches documents' sentences
        expl = llmattr.explain("When was it built?", documents=DOCS, sources=granularity, model=tiny_llama,
                               method=name, max_new_tokens=2, progress=False, **params)
        assert expl.sources is not None and len(expl.sources) == (4 if granularity == "sentence" else 3)
        raw = expl.to_numpy(raw=True)
        for k, cols in enumerate(expl.sources.columns(expl.span)):
            assert np.allclose(expl.source_scores()[:, k], raw[:, cols].sum(-1))
        if cls.granularity == "source":  # the estimator's own per-source values, spread and summed back
            want = methods.get(name, **params).scores(tiny_llama, target_from_explanation(expl)).float()
            want = want.expand(expl.source_scores().shape[0], -1)
            torch.testing.assert_close(torch.as_tensor(expl.source_scores()).float(), want,
                                       atol=1e-6 * float(want.abs().sum()) + 1e-7, rtol=0)
        template |= {expl.tokens[p] for g in expl.sources.groups for p in g} & {"<|im_start|>", "<|im_end|>"}
        assert [expl.text[s:e] for s, e in expl.sources.chars] == DOCS or granularity == "sentence"
    assert template == set()


def test_source_methods_refuse_a_prompt_without_sources_before_the_model_loads(tiny_llama):
    """One line, exit 2, before the model loads (the CLI) or any forward pass (the API)."""
    for name in ("leave-one-out", "contextcite", "attribot-hierarchical"):
        one_line_error(run_cli("explain", "a question", "--method", name, *NO_MODEL),
                       f"method {name} scores sources and needs sources")
    with pytest.raises(LlmattrError, match="method contextcite scores sources and needs sources"):
        llmattr.explain("a question", model=tiny_llama, method="contextcite")


def test_random_and_lime_perturb_whole_sources(tiny_llama):
    for name in ("random", "lime"):
        expl = llmattr.explain("When?", documents=DOCS, model=tiny_llama, method=name, max_new_tokens=1,
                               progress=False)
        raw = expl.to_numpy(raw=True)[0]
        for cols in expl.sources.columns(expl.span):
            assert np.allclose(raw[cols], raw[cols][0])  # one value per source, spread evenly
        outside = np.setdiff1d(np.arange(raw.size), np.concatenate(expl.sources.columns(expl.span)))
        assert np.all(raw[outside] == 0)


def test_sentences_and_spans_as_sources(tiny_llama):
    expl = llmattr.explain("When was it built?", documents=DOCS, sources="sentence", model=tiny_llama,
                           method="saliency", max_new_tokens=1, progress=False)
    assert expl.sources.parents == (0, 0, 1, 2) and len(expl.sources.documents) == 3
    assert expl.text[slice(*expl.sources.chars[1])] == "It was built in 1889."
    text = "good food, bad service"
    expl = llmattr.explain(text, spans=[(0, 9), (11, 22)], model=tiny_llama, method="saliency", progress=False)
    assert [expl.text[s:e] for s, e in expl.sources.chars] == ["good food", "bad service"]
    expl = llmattr.explain("It rained. We stayed in.", sources="sentence", model=tiny_llama, method="saliency",
                           progress=False)
    assert expl.sources.names == ("text, sentence 1", "text, sentence 2") and expl.sources.parents == (0, 0)


@pytest.mark.parametrize("args, fragment", [
    (["--document", "a", "--document", " "], "document 2 is empty"),
    (["--span", "0:4", "--span", "2:6", "--task", "sentiment"], "overlap"),
    (["--document", "a", "--task", "sentiment"], "takes no documents"),
    (["--context", "{tmp}/blank.txt"], "blank.txt is empty; give the documents as text, separated by blank lines"),
])
def test_cli_refuses_bad_sources_before_the_model_loads(tmp_path, args, fragment):
    """One line, exit 2, before the model loads (the named model does not exist)."""
    (tmp_path / "blank.txt").write_text("\n\n")
    result = subprocess.run([sys.executable, "-m", "llmattr", "explain", "a question", "--model",
                             "/nonexistent/model.gguf", *(a.format(tmp=tmp_path) for a in args)],
                            capture_output=True, text=True, timeout=600)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and fragment in lines[0], result.stderr


def test_bio_lookup_rows_hold_the_gold_document_at_the_asked_position():
    from llmattr.tasks import load_examples
    from llmattr.tasks.datasets import data_dir, read_rows
    from llmattr.tasks.documents import POSITIONS, gold_index, with_documents

    rows = read_rows(data_dir() / "wikibio.jsonl")
    for position in POSITIONS:
        for ex in with_documents(rows, 4, position)[:10]:
            where = gold_index(position, 4)
            assert ex["gold_sources"] == [where] and ex["answer"] in ex["documents"][where]
            assert not any(ex["answer"] in doc for i, doc in enumerate(ex["documents"]) if i != where)
    absent = with_documents(rows, 4, "middle", gold=False)
    assert all(ex["gold_sources"] == [] and not any(ex["answer"] in d for d in ex["documents"]) for ex in absent)
    loaded = load_examples("bio-lookup", n=3)
    assert all(len(ex["documents"]) == 5 and ex["gold_sources"] for ex in loaded)


def long_documents(tokenizer, n_docs: int = 20, tokens: int = 7600) -> list[str]:
    """``n_docs`` IMDb reviews from the shipped sample, each cut to about ``tokens / n_docs`` tokens."""
    from llmattr.tasks.datasets import data_dir, read_rows

    per = tokens // n_docs
    reviews = [row["text"] for row in read_rows(data_dir() / "imdb.jsonl")]
    docs = []
    for review in reviews:
        ids = tokenizer(review, add_special_tokens=False)["input_ids"]
        if len(ids) >= per:
            docs.append(tokenizer.decode(ids[:per]).strip())
        if len(docs) == n_docs:
            return docs
    raise AssertionError("not enough long reviews")


def test_twenty_documents_of_8k_tokens_build_their_sources_fast(tiny_tokenizer):
    """Point 6: the token assignment is two binary searches per token, so 20 documents of 8k tokens (and their
    sentences) take well under a second."""
    import time

    from llmattr.prompting import build_prompt
    from llmattr.tasks import get_task

    docs = long_documents(tiny_tokenizer)
    example = {"question": "Which review is the most positive?", "documents": docs}
    start = time.perf_counter()
    prompt = build_prompt(tiny_tokenizer, get_task("context"), example, sources="sentence")
    seconds = time.perf_counter() - start
    assert prompt.length > 7600 and len(prompt.sources.documents) == 20 and len(prompt.sources) > 20
    assert seconds < 5.0, seconds  # tokenising 8k tokens dominates; generous for a loaded 2-core machine


@pytest.mark.slow
def test_twenty_documents_of_8k_tokens_on_the_embedded_model(smollm):
    """Point 6 on the real model: 20 documents filling SmolLM2's 8k context are explained at source level
    (the random control: one forward for the answer); the memory guard plans every method at that length,
    admitting it or refusing it in one line."""
    from llmattr.models import memory

    docs = long_documents(smollm.tokenizer)
    expl = llmattr.explain("Which review is the most positive?", documents=docs, model=smollm, method="random",
                           max_new_tokens=1, progress=False)
    assert len(expl.sources) == 20 and expl.span[1] - expl.span[0] > 7600
    assert expl.source_scores().shape == (1, 20)
    for name in ("lime", "saliency", "attention"):
        try:
            memory.plan(smollm, methods.get(name), len(expl.tokens), "auto")
        except LlmattrError as err:
            assert "\n" not in str(err) and name in str(err)


def test_a_data_column_holding_a_list_of_documents(tmp_path):
    """--data: a JSONL list column, or a CSV cell holding the list as JSON text."""
    from llmattr.tasks.files import read_file_texts

    (tmp_path / "rows.jsonl").write_text(json.dumps({"question": "q?", "docs": ["a b", "c d"]}) + "\n")
    (tmp_path / "rows.csv").write_text('question,documents\nq?,"[""a b"", ""c d""]"\n')
    assert read_file_texts("context", tmp_path / "rows.jsonl", documents_field="docs") == [
        {"question": "q?", "documents": ["a b", "c d"]}]
    assert read_file_texts("context", tmp_path / "rows.csv") == [{"question": "q?", "documents": ["a b", "c d"]}]
    with pytest.raises(LlmattrError, match="no column 'documents'"):
        read_file_texts("context", tmp_path / "rows.jsonl")


def test_gold_sources_of_the_bio_lookup_task_reach_the_prompt(tiny_tokenizer):
    from llmattr.prompting import build_prompt
    from llmattr.tasks import get_task, load_examples

    task = get_task("bio-lookup")
    for example in load_examples(task, n=4):
        inputs = task.inputs(example)
        prompt = build_prompt(tiny_tokenizer, task, inputs, sources="sentence")
        gold_doc = example["gold_sources"][0]
        assert prompt.sources.documents.gold == (gold_doc,)
        assert prompt.sources.gold == tuple(i for i, d in enumerate(prompt.sources.parents) if d == gold_doc)
        assert example["label"] in prompt.text[slice(*prompt.sources.documents.chars[gold_doc])]


def test_a_context_longer_than_the_model_is_one_line_before_any_forward(tiny_llama):
    """The tiny model's context is 256 tokens: 20 documents of about 60 tokens are refused by the prompt-length
    check of :func:`llmattr.targets.make_target`, before the generation and the method run."""
    docs = long_documents(tiny_llama.tokenizer, 20, 1200)
    with pytest.raises(LlmattrError, match="context of 256 tokens") as err:
        llmattr.explain("Which review is best?", documents=docs, model=tiny_llama, method="saliency", progress=False)
    assert "\n" not in str(err.value)


@pytest.fixture(scope="module")
def weightless_model(tmp_path_factory, tiny_tokenizer):
    """A model folder with the tiny tokenizer and a llama config of 160 positions but no weights: loading the
    model itself fails ("cannot load model"), so a refusal naming the prompt was made before the load."""
    from conftest import tiny_config

    folder = tmp_path_factory.mktemp("weightless")
    tiny_tokenizer.save_pretrained(folder)
    config = tiny_config("llama", len(tiny_tokenizer), max_position_embeddings=160)
    config.architectures = ["LlamaForCausalLM"]
    config.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("args, fragment", [
    (["the cat sat on the mat", "--task", "sentiment", "--span", "4:6", "--span", "6:7"], "tokenises to nothing"),
    (["a question", "--document", "the cat sat on the mat " * 40], "text too long"),
    (["a question", "--document", "the cat sat"], "cannot load model"),  # a fine prompt reaches the load
])
def test_cli_refuses_empty_sources_and_long_contexts_before_the_model_loads(weightless_model, args, fragment):
    """A source inside another's token and a context beyond the model's positions: one line, exit 2, from the
    tokenizer and config alone (the folder holds no weights, so the load's own error would name the model)."""
    result = subprocess.run([sys.executable, "-m", "llmattr", "explain", *args, "--model", str(weightless_model),
                             "--max-new-tokens", "1"], capture_output=True, text=True, timeout=600)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and fragment in lines[0], result.stderr
