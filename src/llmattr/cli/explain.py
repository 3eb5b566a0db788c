"""``llmattr explain``: explain one text in the terminal, as HTML and as JSON."""

from __future__ import annotations

import inspect
import warnings
from contextlib import nullcontext
from json import dumps
from pathlib import Path
from types import SimpleNamespace

import typer
from rich.console import Console

from ..checks import (
    FIGURE_SUFFIXES,
    ROUTINGS,
    check_text,
    check_texts,
    dtype_name,
    one_of,
    parse_params,
    positive_int,
    writable_file,
)
from ..errors import LlmattrError, NotExplainedWarning
from ..readers import read_rows, row_texts
from ..request import FIELDS, Request, task_asked
from ..targets import check_target
from ..tasks.base import task_facts
from ..tasks.datasets import check_shots
from .app import DERIVED, app, command, field_option, own, plugin_command

FORMATS = ("text", "json")
METHOD_PANEL = "Method parameters"


def method_options() -> list[inspect.Parameter]:
    """An option ``--NAME`` per parameter of the registered methods (their ``defaults``), its help naming the
    methods that take it and their defaults. A name that is one of explain's own options wins: ``--objective``
    (with its list of objectives), ``--seed``, ``--method``; give such a method parameter as ``--param
    NAME=VALUE`` where the own option means something else."""
    from .. import methods  # the registry, importing no torch (llmattr.lazy)

    takers: dict[str, list[str]] = {}
    for name in methods.available():
        for key, value in methods.REGISTRY[name].defaults.items():
            takers.setdefault(key, []).append(f"{name} {value}")
    return [inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, annotation=str, default=typer.Option(
        None, f"--{key.replace('_', '-')}", rich_help_panel=METHOD_PANEL,
        help=f"Method parameter {key} (default: {', '.join(names)}).")) for key, names in sorted(takers.items())]


def parse_fields(text: str, fields: list[str], valid: tuple[str, ...] = ()) -> str | dict:
    """``--field NAME=VALUE`` options: extra fields of multi-field tasks (BoolQ's question).

    A name outside ``valid`` (when given) is refused rather than silently ignored.
    """
    if not fields:
        return text
    example = {}
    for item in fields:
        if "=" not in item:
            raise LlmattrError(f"--field expects NAME=VALUE, got {item!r}")
        name, value = item.split("=", 1)
        if valid and name.strip() not in valid:
            raise LlmattrError(f"unknown --field {name.strip()!r} for this task; valid: {', '.join(valid)}")
        example[name.strip()] = value
    return {"__text__": text, **example}


def run_evaluation(expl, lm, console: Console, spinner: Console, routing: str, samples: int, seed: int) -> dict:
    """``--evaluate``: pi-Soft-NC/NS of the explanation (``spinner``: the console of the spinner meanwhile);
    prints the AUCs and returns the result."""
    from ..faithfulness import evaluate

    with spinner.status(f"evaluating (pi-Soft-NC/NS, {routing} routing, {samples} samples) ..."):
        result = evaluate(expl, lm, routing=routing, samples=samples, seed=seed).to_dict()
    metrics = result["metrics"]
    console.print(f"AUC pi-Soft-NS {metrics['pi_soft_ns']['auc']:.4f}   "
                  f"AUC pi-Soft-NC {metrics['pi_soft_nc']['auc']:.4f}   "
                  f"(Soft-NS {metrics['soft_ns']:.4f}, Soft-NC {metrics['soft_nc']:.4f}, "
                  f"E[R] {metrics['expected_retained']:.2f}; D0 {result['d0']:.4f}; {routing} routing, "
                  f"scope {result['scope']})")
    for warning in result["warnings"]:
        console.print(f"[yellow]warning:[/] {warning}")
    return result


def print_classification(record: dict, console: Console) -> None:
    """One line for a label-word target: explained token, free answer, label-word probabilities, gold."""
    if not record:
        return
    probs = "  ".join(f"p({word})={p:.3f}" for word, p in record["label_probs"].items())
    gold = "" if record["gold"] is None else (
        f"  gold {record['gold']} ({'correct' if record['correct'] else 'wrong'})")
    console.print(f"explained: {record['target']} ({record['predicted']} predicted)  free answer "
                  f"{record['free_answer']!r}{'' if record['began_with_label'] else ' (not a label word)'}  "
                  f"{probs}{gold}", highlight=False, soft_wrap=True)


def print_convergence(expl, console: Console) -> None:
    """``--verbose``: completeness of path methods and DeepLIFT per step (Captum's convergence delta)."""
    for i, step in enumerate(expl.steps):
        if step.convergence_delta is not None:
            console.print(f"step {i} {step.token!r}: target_delta F(x)-F(x0) = {step.target_delta:.6g}  "
                          f"convergence_delta = {step.convergence_delta:.3g}", highlight=False)
def explanation_data(expl, result: dict | None) -> dict:
    """The Explanation JSON, with the evaluation's keys at the top level (metrics.pi_soft_ns, ...) and in
    full under ``evaluation`` when ``--evaluate`` ran."""
    data = expl.to_dict()
    if result is not None:
        data.update({key: result[key] for key in ("metrics", "routing", "samples", "seed", "mode", "d0")})
        data["evaluation"] = result
    return data


def task_help() -> dict[str, str]:
    """``--task``'s help, naming every registered task."""
    from ..tasks import TASKS

    return {"task": f"Prompt recipe (default sentiment; context with --document/--context): "
                    f"{', '.join(sorted(TASKS))}."}


def context_documents(path: Path) -> list[str]:
    """``--context FILE``'s documents: a ``.json`` file holds a list of texts; any other file is text whose
    paragraphs (separated by blank lines) are the documents."""
    from ..readers import file_text, read_json
    from ..sources.build import check_documents

    if path.suffix == ".json":
        return list(check_documents(read_json(path, "--context file")))
    text = file_text(path, "--context file", "give the documents as text, separated by blank lines (or a .json "
                     "list of texts)").replace("\r\n", "\n")
    return [part.strip() for part in text.split("\n\n") if part.strip()]


def parse_spans(items: list[str]) -> list[tuple[int, int]] | None:
    """``--span START:END`` options as character ranges (None without any)."""
    spans = []
    for item in items:
        start, sep, end = item.partition(":")
        if not sep or not start.strip().isdigit() or not end.strip().isdigit():
            raise LlmattrError(f"--span expects START:END character offsets into the text, got {item!r}")
        spans.append((int(start), int(end)))
    return spans or None


OPTIONS = [  # in the order of the help
    inspect.Parameter("text", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=str, default=typer.Argument(
        None, help="The text to explain (the content span of the prompt); or --data FILE.")),
    own("model", str, "default", "'default' (SmolLM2-135M-Instruct), 'gemma-3-270m', a hub id, a folder or a .gguf."),
    own("task", str, None, "Prompt recipe: sentiment, boolq, generate, context, ..."),
    own("method", str, "grad-ellm", "Attribution method (see `llmattr methods`); several, comma-separated, explain "
                                    "one generation side by side (--html: one aligned grid)."),
    *(field_option(FIELDS[name]) for name in ("max_new_tokens", "answer", "scope", "target")),
    own("field", list[str], [], "Extra task field NAME=VALUE (e.g. question=... for boolq)."),
    field_option(FIELDS["shots"]), field_option(FIELDS["shots_from"]),
    own("param", list[str], [], "Method parameter NAME=VALUE (e.g. layers=4)."),
    field_option(FIELDS["objective"]), field_option(FIELDS["foil"]),
    own("device", str, "auto", "cpu, cuda or auto."),
    own("dtype", str, None, "float32, bfloat16, float16 or auto (float32 on a CPU, bfloat16 on a GPU; bfloat16 pays "
                            "on CPUs with bf16 matrix units, docs/scale.md)."),
    own("html", Path, None, "Write a self-contained HTML heatmap here."),
    own("json", Path, None, "Write the Explanation JSON here."),
    own("verbose", bool, False, "Say where the model folder is; print each step's convergence delta (path methods, "
                                "DeepLIFT).", "--verbose"),
    own("evaluate", bool, False, "Score the explanation: pi-Soft-NC/NS AUCs.", "--evaluate"),
    own("routing", str, "dynamic", "--evaluate protocol: dynamic or fixed (clean attention)."),
    own("samples", int, 15, "--evaluate: Monte-Carlo samples per pi."),
    own("seed", int, 0, "--evaluate: seed of the Monte-Carlo masks."),
    own("eval_json", Path, None, "--evaluate: write the evaluation result JSON here."),
    field_option(FIELDS["checkpointing"]),
    own("plot", Path, None, "--evaluate: draw pi-Soft-NC/NS vs pi to this image (.png/.svg/.pdf)."),
    own("figure", Path, None, "Draw the source x target attribution matrix to this image (.png/.svg/.pdf)."),
    own("numbers", bool, None, "Print each token's value in the heatmaps (default: on when stdout is not a "
                               "terminal).", "--numbers/--no-numbers"),
    own("shared_scale", bool, False, "One colour scale for all steps instead of one per step.", "--shared-scale"),
    own("format", str, "text", "text (heatmap) or json (the Explanation JSON on stdout, messages on stderr).",
        "--format"),
    own("data", Path, None, "Explain every row of your own JSONL/JSON/CSV/TSV file instead of TEXT (--json: a list, "
                            "--html: one grid per row)."),
    own("text_field", str, None, "--data: the column holding the text (default: the task's field)."),
    own("n", int, None, "--data: explain the first N rows only."),
    own("document", list[str], [], "A document of the context TEXT (the question) is asked about; repeat for several. "
                                   "Each is one source (docs/sources.md)."),
    own("context", Path, None, "The documents from a file: its paragraphs (blank-line separated), or a .json list of "
                               "texts."),
    own("span", list[str], [], "A source as START:END character offsets into TEXT; repeat."),
    field_option(FIELDS["sources"]),
    own("documents_field", str, None, "--data with a task that takes documents: the column holding each row's list "
                                      "of documents (default documents)."),
]


@app.command(cls=plugin_command(method_options, task_help))
@command(OPTIONS)
def explain(ctx: typer.Context, **given) -> None:
    """Explain the model's answer to TEXT (or to every row of --data FILE): answer, token heatmap, optional HTML
    and JSON. Every registered method's parameters are options (the Method parameters panel)."""
    o = SimpleNamespace(**given)
    one_of(o.format, FORMATS, "--format")
    request, content, many = checked_request(ctx, o)
    from ..api import explain as run_explain
    from ..models.loading import load_model
    from ..render import progress_console

    if request.has_sources:  # a source that tokenises to nothing, a context too long: the tokenizer says so
        check_prompts(request, o.model, content if o.data is not None else [content], o.data)
    spinner = progress_console()  # stderr; drawn only where stderr is a terminal
    with spinner.status(f"loading model {o.model} ..."):
        lm = load_model(o.model, device=o.device, dtype=o.dtype, verbose=o.verbose)
    bar = many and o.format == "text"  # a bar over (text, method) explanations; one method on one text: a spinner
    with spinner.status(f"explaining with {', '.join(request.methods)} ...") if not bar else nullcontext(), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore", NotExplainedWarning)  # the API's warning: this command's error line names them
        explained = run_explain(content, model=lm, request=request, progress=bar)
    show(explained, lm, o, many, spinner)




def checked_request(ctx: typer.Context, o: SimpleNamespace):
    """Every check that needs no model, the library's own :class:`~llmattr.request.Request` among them (no torch
    yet): the request, the content (one text, a dict of its fields, or ``--data``'s rows) and whether several
    explanations come back (several methods or ``--data``)."""
    if (o.text is None) == (o.data is None):
        raise LlmattrError("give the text to explain, or --data FILE (not both)")
    if o.data is None and (o.text_field is not None or o.n is not None or o.documents_field is not None):
        raise LlmattrError("--text-field, --documents-field and --n go with --data FILE")
    names = [name.strip() for name in o.method.split(",") if name.strip()] or [o.method]
    derived = {key: value for key, value in ctx.meta.get(DERIVED, {}).items() if value is not None}
    params = parse_params(o.param + [f"{key}={value}" for key, value in derived.items()], "--param NAME=VALUE")
    if o.document and o.context is not None:
        raise LlmattrError("give --document (repeated) or --context FILE, not both")
    documents = context_documents(o.context) if o.context is not None else (o.document or None)
    if o.data is not None and (documents is not None or o.span):
        raise LlmattrError("--document, --context and --span go with one TEXT; with --data each row holds its "
                           "documents (--documents-field)")
    # what was asked, checked once by the library's own Request (task, target, scope, checkpointing, sources, every
    # method with its parameters): the registries import no torch, so neither does this
    request = Request.of(names, task_asked(o.task, documents), params, documents=documents, spans=parse_spans(o.span),
                         **{name: getattr(o, name) for name, declared in FIELDS.items() if declared.metadata["option"]})
    facts = task_facts(request.task)
    if o.data is not None:
        content = file_texts(row_texts(facts, o.data, o.text_field, o.documents_field), o.n, o.field, o.target)
    elif not o.field:
        check_text(o.text)
    many = len(names) > 1 or o.data is not None  # an Explanations collection: lists in the JSON, a grid page
    option_checks(o.evaluate, o.routing, o.samples, o.shots_from, o.data, many, outputs(o))
    if o.data is None:
        gold_field = ("label",) if facts["has_gold_word"] else ()  # --target gold's word
        content = parse_fields(o.text, o.field, (*facts["fields"], *gold_field))
    dtype_name(o.dtype)
    if isinstance(content, dict):
        content = {facts["fields"][0]: content.pop("__text__"), **content}
    each_row(request.check_text, content if o.data is not None else [content], o.data)
    try:  # what the explanation refuses of each text: one line for one method and one text
        check_target(facts, o.target, o.max_new_tokens, o.answer,
                     content.get("label") if isinstance(content, dict) else None)
        check_shots(facts, o.shots, o.shots_from)
    except LlmattrError as err:  # else each text is named as not explained, as llmattr.explain collects them
        raise LlmattrError(str(err) if not many else not_explained(
            dict.fromkeys(range(len(content) if o.data is not None else 1), str(err)), o.data)) from None
    return request, content, many


def outputs(o: SimpleNamespace) -> dict[str, Path | None]:
    """The files asked for, by option."""
    return {"--html": o.html, "--json": o.json, "--eval-json": o.eval_json, "--plot": o.plot, "--figure": o.figure}


def show(explained, lm, o: SimpleNamespace, many: bool, spinner) -> None:
    """Print and write what was explained (the heatmaps, the classification line, ``--evaluate``'s AUCs, the JSON
    and the files asked for); the texts not explained are named last, with exit status 2."""
    from ..render import print_explanation

    console = Console(stderr=o.format == "json")
    expls = list(explained) if many else [explained]
    failed = getattr(explained, "failed", {})
    if not expls:  # every method refused (the memory guard, say) or every row failed: nothing to show or write
        raise LlmattrError(not_explained(failed, o.data))
    for expl in expls:
        if o.format == "text":
            print_explanation(expl, console, numbers=o.numbers, shared_scale=o.shared_scale)
        if o.verbose:
            print_convergence(expl, console)
    if o.data is None:
        print_classification(expls[0].classification, console)
    results = [run_evaluation(expl, lm, console, spinner, o.routing, o.samples, o.seed) if o.evaluate else None
               for expl in expls]
    records = [explanation_data(expl, result) for expl, result in zip(expls, results, strict=True)]
    if o.format == "json":
        typer.echo(dumps(records if many else records[0], ensure_ascii=False))
    write_outputs(explained, records if many else records[0], results if many else results[0],
                  outputs(o), console, numbers=bool(o.numbers), shared_scale=o.shared_scale)
    if failed:  # every good row is written above; the bad ones are named, and the exit code says so
        raise LlmattrError(not_explained(failed, o.data))


def option_checks(evaluate: bool, routing: str, samples: int, shots_from: Path | None, data: Path | None,
                  many: bool, outputs: dict[str, Path | None]) -> None:
    """The options that need no model, checked before torch is imported: ``--evaluate``'s, every output path
    (``outputs``: option -> path), the ``--shots-from`` file, and the outputs that draw one text (``many``: several
    methods or ``--data``)."""
    if not evaluate and (outputs["--eval-json"] or outputs["--plot"]):
        raise LlmattrError("--eval-json and --plot need --evaluate")
    if evaluate:
        one_of(routing, ROUTINGS, "--routing")
        positive_int(samples, "--samples")
    for option, path in outputs.items():  # every output path is checked before the model loads
        if path is not None:
            writable_file(path, option, FIGURE_SUFFIXES if option in ("--plot", "--figure") else None)
    if shots_from is not None:  # a bad file is refused before the model loads, as --data is
        read_rows(shots_from, "--shots-from file")
    if many and outputs["--figure"] is not None:
        raise LlmattrError("--figure draws one method's matrix of one text; give one --method and one TEXT "
                           "(--html shows several)")
    if data is not None and outputs["--plot"] is not None:
        raise LlmattrError("--plot draws one text's curves; with --data, --eval-json holds every row's")


def each_row(check, texts: list, data: Path | None) -> None:
    """``check(text)`` of each text (:meth:`llmattr.request.Request.check_text`, ``check_prompt``), its refusal
    naming the row of ``data`` by its number."""
    for row, text in enumerate(texts, 1):
        try:
            check(text)
        except LlmattrError as err:
            raise LlmattrError(f"{data}: row {row}: {err}" if data is not None else str(err)) from None


def not_explained(failed: dict[int, str], data: Path | None) -> str:
    """One line naming what :func:`llmattr.explain` left out: ``--data``'s rows by number, or for one text the
    methods that refused it (``"saliency: ..."``, or ``"no method fits in memory: ..."``)."""
    if data is None:
        return f"not explained: {failed[0]}"
    return (f"{len(failed)} row(s) of {data} not explained: "
            + "; ".join(f"row {i + 1}: {why}" for i, why in failed.items()))


def check_prompts(request, model: str, texts: list, data: str | None) -> None:
    """Each text's prompt checked with the model's tokenizer and context length only, before the weights load
    (:meth:`llmattr.request.Request.check_prompt`); a row of ``data`` is named by its number."""
    from ..models.loading import load_text_side

    tokenizer, max_length = load_text_side(model)
    each_row(lambda text: request.check_prompt(tokenizer, max_length, text), texts, data)


def file_texts(texts: list, n: int | None, field: list[str], target: str) -> list:
    """``--data``'s texts (the first ``n``), every one checked before the model loads: an empty or malformed row
    is named by its number in one line."""
    if field:
        raise LlmattrError("--field sets one text's extra fields; with --data they come from the file's columns")
    if target == "gold":
        raise LlmattrError("--target gold explains one given gold word; with --data use --target label or "
                           "generated (llmattr evaluate --data reads each row's gold label)")
    texts = texts[:positive_int(n, "--n")] if n is not None else texts
    check_texts(texts, first=1, noun="row")
    return texts


def write_outputs(explained, data: dict | list, result: dict | list | None, outputs: dict, console: Console,
                  numbers: bool, shared_scale: bool) -> None:
    """Write the requested files, the Explanation JSON first (the one a later failure must not lose).

    ``explained``: an Explanation, or the Explanations of several methods (then the JSON files hold lists,
    the HTML page is their grid and the plot draws every method's curves)."""
    from ..plotting import plot_matrix, plot_pi_curves

    expls = explained if isinstance(explained, list) else [explained]
    curves = {expl.method: res for expl, res in zip(expls, result if isinstance(result, list) else [result],
                                                    strict=True)}
    writers = {
        "--json": lambda path: path.write_text(dumps(data, indent=1, ensure_ascii=False)),
        "--html": lambda path: explained.to_html(path, numbers=numbers, shared_scale=shared_scale),
        "--eval-json": lambda path: path.write_text(dumps(result, indent=1)),
        "--plot": lambda path: plot_pi_curves(curves, path, title=f"{expls[0].model}: {expls[0].generated!r}"),
        "--figure": lambda path: plot_matrix(explained, path, numbers=numbers, shared_scale=shared_scale),
    }
    for option, write in writers.items():
        path = outputs[option]
        if path is not None:
            write(path)
            console.print(f"wrote {path}", highlight=False)
