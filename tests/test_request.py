"""One Request for an explanation (llmattr.request): checked once when built, the same from the Python API and the
CLI, and the same internals behind both."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import llmattr
from llmattr import api, methods
from llmattr.cli import app
from llmattr.errors import LlmattrError
from llmattr.request import Request

TEXT = "A fine film."

# (explain keyword, value, the CLI's option, the one line): every check a request makes, before any model loads
BAD = [
    ("target", "free", "--target", "target must be one of label, generated, gold; got 'free'"),
    ("scope", "content", "--scope", "scope must be one of span, prompt, all; got 'content'"),
    ("checkpointing", "sometimes", "--checkpointing", "checkpointing must be one of auto, on, off; got 'sometimes'"),
    ("task", "sentimental", "--task", "unknown task 'sentimental'"),
    ("method", "salience", "--method", "unknown method 'salience'"),
    ("objective", "prob", "--objective", "unknown grad-ellm objective 'prob'"),
]


@pytest.fixture
def no_model(monkeypatch):
    """Any model load fails the test: every refusal below comes before it."""
    def refuse(*args, **kwargs):
        pytest.fail("model loaded")

    monkeypatch.setattr("llmattr.models.loading.load_model", refuse)
    monkeypatch.setattr(api, "load_model", refuse)
    api._cached_model.cache_clear()


@pytest.mark.parametrize("keyword, value, option, line", BAD, ids=[case[0] for case in BAD])
def test_a_bad_value_gives_one_line_from_the_api_and_the_cli_before_the_model_loads(no_model, keyword, value,
                                                                                      option, line):
    with pytest.raises(LlmattrError) as from_api:
        llmattr.explain(TEXT, model="/nonexistent/model.gguf", **{keyword: value})
    result = CliRunner().invoke(app, ["explain", TEXT, "--model", "/nonexistent/model.gguf", option, value])
    assert isinstance(result.exception, LlmattrError)
    assert str(result.exception) == str(from_api.value) and str(from_api.value).startswith(line)
    with pytest.raises(LlmattrError, match=line):
        Request.of(**{keyword: value})


def test_a_next_word_gold_target_without_its_word_is_refused_before_the_model_loads(no_model):
    with pytest.raises(LlmattrError) as from_api:
        llmattr.explain(TEXT, model="/nonexistent/model.gguf", task="blimp-ana", target="gold")
    result = CliRunner().invoke(app, ["explain", TEXT, "--model", "/nonexistent/model.gguf", "--task", "blimp-ana",
                                      "--target", "gold"])
    assert str(result.exception) == str(from_api.value) and "needs the example's gold next word" in str(
        from_api.value)


def captured_request(monkeypatch) -> list[Request]:
    """Make :func:`api.explain_text` record the request it is given and explain nothing."""
    seen: list[Request] = []
    monkeypatch.setattr(api, "explain_text",
                        lambda lm, text, request, skipped=None, advance=None: seen.append(request) or [])
    return seen


def test_the_cli_and_the_api_build_equal_requests(tiny_llama, monkeypatch):
    seen = captured_request(monkeypatch)
    monkeypatch.setattr("llmattr.models.loading.load_model", lambda *args, **kwargs: tiny_llama)
    CliRunner().invoke(app, ["explain", TEXT, "--method", "saliency,input-x-gradient", "--task", "sst2",
                             "--target", "generated", "--scope", "prompt", "--checkpointing", "off",
                             "--objective", "contrast", "--foil", "Negative", "--max-new-tokens", "3",
                             "--shots", "2", "--answer", " fine"])
    llmattr.explain(TEXT, model=tiny_llama, method=["saliency", "input-x-gradient"], task="sst2", target="generated",
                    scope="prompt", checkpointing="off", objective="contrast", foil="Negative", max_new_tokens=3,
                    shots=2, answer=" fine")
    llmattr.explain(TEXT, model=tiny_llama, request=Request("sst2", ["saliency", "input-x-gradient"],
                                                            {"objective": "contrast", "foil": "Negative"},
                                                            target="generated", scope="prompt", max_new_tokens=3,
                                                            answer=" fine", shots=2, checkpointing="off"))
    assert len(seen) == 3 and seen[0] == seen[1] == seen[2]
    assert seen[0].methods == ("saliency", "input-x-gradient") and seen[0].task.name == "sst2"
    assert [m.params["foil"] for m in seen[0].method_objs] == ["Negative", "Negative"]


def test_explain_keywords_keep_their_meaning(tiny_llama, monkeypatch):
    """The earlier spellings still read: ``target="logit"`` is the objective, ``method_params`` and keywords are
    method parameters, a method instance is used as given."""
    seen = captured_request(monkeypatch)
    llmattr.explain([TEXT], model=tiny_llama, method="integrated-gradients", target="logit",
                    method_params={"n_steps": 4}, internal_batch_size=2)
    assert seen[0] == Request("sentiment", ("integrated-gradients",),
                              {"n_steps": 4, "internal_batch_size": 2, "objective": "logit"})
    given = methods.get("saliency")
    llmattr.explain([TEXT], model=tiny_llama, method=given)
    assert seen[1].method_objs == (given,)
    with pytest.raises(LlmattrError, match="objective= and foil= go with a method name"):
        llmattr.explain(TEXT, model=tiny_llama, method=given, objective="logit")
    with pytest.raises(LlmattrError, match="method: give a method name"):
        llmattr.explain(TEXT, model=tiny_llama, method=[])


def test_a_request_goes_alone(tiny_llama):
    with pytest.raises(LlmattrError, match="give the method, task and options to the Request"):
        llmattr.explain(TEXT, model=tiny_llama, request=Request(methods="saliency"), scope="prompt")


def test_one_request_explains_as_the_keywords_do(tiny_llama):
    by_keywords = llmattr.explain(TEXT, model=tiny_llama, method="input-x-gradient", task="generate",
                                  answer=" it was", scope="prompt")
    by_request = llmattr.explain(TEXT, model=tiny_llama, request=Request("generate", "input-x-gradient",
                                                                         answer=" it was", scope="prompt"))
    assert by_request.to_dict() | {"timings": None} == by_keywords.to_dict() | {"timings": None}


def test_the_cli_and_the_api_default_to_the_same_task(tiny_llama, monkeypatch):
    """Without a task, both take the one rule (``request.task_asked``): ``context`` where documents are given,
    else ``sentiment``."""
    seen = captured_request(monkeypatch)
    monkeypatch.setattr("llmattr.models.loading.load_model", lambda *args, **kwargs: tiny_llama)
    question, document = "Who wrote it?", "Ann wrote the letter."
    for args in (["explain", TEXT, "--method", "random"],
                 ["explain", question, "--method", "random", "--document", document]):
        CliRunner().invoke(app, args)
    llmattr.explain(TEXT, model=tiny_llama, method=["random"])
    llmattr.explain(question, model=tiny_llama, method=["random"], documents=[document])
    assert [request.task.name for request in seen] == ["sentiment", "context", "sentiment", "context"]
    assert seen[1] == seen[3] and seen[0] == seen[2]
