"""The checks of what a user asks that need no model, written once for the library and the CLI.

The library runs them where the values are built (a method with its parameters, a :class:`~llmattr.request.Request`
with its sources, a finetune's or an evaluation's config and plan), reading its registries; ``llmattr`` builds the
same objects before any model loads (nothing in llmattr imports torch until a model runs: :mod:`llmattr.lazy`), so
each refusal is the same line and comes at once.
"""

from __future__ import annotations

import importlib.util
import json
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from .checks import (
    SCOPES,
    TARGET_MODES,
    check_model_path,
    examples_wanted,
    known_items,
    mask_rate,
    member,
    one_of,
    one_source,
    positive_int,
    split_list,
    split_spec,
)
from .declarations import current_params
from .errors import LlmattrError, article
from .model_card import CARD_NAME, read_card
from .readers import parse_labels, read_rows
from .sources.build import check_documents, check_spans
from .sources.spans import GRANULARITIES


def check_objective(name: object, foil: object, objectives: Iterable[str], contrastive: Iterable[str],
                    option: str = "objective") -> str:
    """``name`` if it is one of ``objectives`` and ``foil`` fits it: a ``contrastive`` objective needs a foil, any
    other takes none (it would be silently ignored)."""
    contrastive = tuple(contrastive)
    one_of(name, objectives, option)
    if name in contrastive and foil is None:
        raise LlmattrError(f"objective {name} compares the target with a foil token: give --foil WORD (foil=...)")
    if foil is not None and name not in contrastive:
        raise LlmattrError(f"--foil needs a contrastive objective ({', '.join(contrastive)}); the objective is {name}")
    return name


def request_params(params: Mapping | None, objective: object, foil: object) -> dict:
    """The method parameters of a request: ``params`` with ``objective`` and ``foil`` (``llmattr.explain``'s
    keywords, ``explain --objective/--foil``) where given."""
    return {**(params or {}), **{key: value for key, value in (("objective", objective), ("foil", foil))
                                 if value is not None}}


def check_method_params(name: str, params: Mapping, takes: Iterable[str], objective: str | None,
                        objectives: Iterable[str], contrastive: Iterable[str]) -> dict:
    """The parameters ``params`` of method ``name`` under their current names, refused in one line when the
    method does not take one (``takes``: its parameters, with ``objective`` and ``foil`` where it scores a model
    output, its default ``objective``; None: it scores none) or its objective and foil do not fit
    (:func:`check_objective`)."""
    params = current_params(params, f"method {name}")  # target=: the objective's earlier name
    scoring = {"objective", "foil"} if objective else set()
    unknown = sorted(set(params) - set(takes) - scoring)
    if unknown and objective is None and {"objective", "foil"} & set(unknown):
        raise LlmattrError(f"method {name} scores no model output, so it takes no objective or foil")
    if unknown:
        valid = ", ".join(sorted(set(takes) | scoring)) or "none"
        raise LlmattrError(f"method {name} has no parameter {', '.join(unknown)}; valid: {valid}")
    if objective:
        check_objective(params.get("objective", objective), params.get("foil"), objectives, contrastive,
                        f"{name} objective")
    return params


def task_asked(task: object, documents: object) -> object:
    """The task a request names, or the default one: ``context`` where documents are given (``documents=``,
    ``--document``, ``--context``), else ``sentiment``."""
    return task if task is not None else "context" if documents is not None else "sentiment"


def check_sources(task: str, takes_documents: bool, sources: str | None, documents: object,
                  spans: object) -> tuple[tuple[str, ...] | None, tuple[tuple[int, int], ...] | None]:
    """The sources a request asks for (``documents``, ``spans``: None when not given) checked: ``sources`` one of
    the granularities, documents a non-empty list of non-empty texts for a task that ``takes_documents`` and not
    beside spans, spans disjoint ranges; returns them as tuples."""
    if sources is not None:
        member(sources, GRANULARITIES, "sources")
    if documents is not None:
        if not takes_documents:
            raise LlmattrError(f"task {task} takes no documents; use --task context (or a task that shows documents)")
        if spans is not None:
            raise LlmattrError("give documents or spans, not both")
        documents = check_documents(documents)
    return documents, None if spans is None else check_spans(spans)


def example_fields(task: str, fields: Sequence[str], text: str | Mapping) -> dict:
    """The example of ``text``: a plain string is the first of the task's ``fields``, a dict holds every field
    (:meth:`llmattr.tasks.Task.example_from_text`); an empty or missing field refused in one line."""
    example = dict(text) if isinstance(text, Mapping) else {fields[0]: text}
    missing = [name for name in fields if not str(example.get(name, "")).strip()]
    if missing:
        raise LlmattrError(f"task {task} needs non-empty field(s) {', '.join(missing)}"
                           + (" (CLI: --field NAME=VALUE)" if len(fields) > 1 else ""))
    return example


def check_gold_word(task: str, word: str | None) -> None:
    """One line when ``target="gold"`` on a next-word task has no gold word to explain."""
    if not word:
        raise LlmattrError(f"target='gold' needs the example's gold next word (task {task}'s label: "
                           "gold=WORD, or --field label=WORD)")


def check_example(task: Mapping, example: Mapping, scoring: Sequence[str], sources: str | None,
                  gold: str | None) -> None:
    """Refuse what :meth:`llmattr.request.Request.check_text` refuses of one ``example`` of ``task``
    (:func:`task_facts`): documents that are not a non-empty list of texts (a task that takes them), spans outside
    its text, a prompt without sources for a method that scores them (``scoring``: their names) and, where the gold
    word is explained (``gold`` not False: the word, or None), a next-word task without it."""
    if task["documents"]:
        check_documents(example.get("documents") if example.get("documents") is not None else ())
    if example.get("spans") is not None:
        check_spans(example["spans"], len(str(example[task["fields"][0]])))
    if scoring and not (task["documents"] or example.get("spans") is not None or sources == "sentence"):
        raise LlmattrError(f"method {scoring[0]} scores sources and needs sources: give documents "
                           "(--document, --context; documents=[...]), spans (--span) or --sources sentence")
    if gold is not False and task["next_word"]:
        check_gold_word(task["name"], gold)


def sample_data(task: Mapping, fix: str = "a JSONL/CSV file") -> str:
    """The name of ``task``'s sample data (:func:`task_facts`), refused in one line that says to pass ``fix``
    (a finetune's: ``--data FILE``) where it has none."""
    if not task["sample_data"]:
        raise LlmattrError(f"task {task['name']} has no sample data; pass {fix}")
    return task["sample_data"]


def check_shots(task: Mapping, shots: int, shots_from: str | Path | None) -> None:
    """Refuse ``shots`` demonstrations of ``task`` (:func:`task_facts`) drawn from its sample data where it has none,
    or from a ``shots_from`` file whose rows are no examples of it (:func:`example_of_row`; a task that composes or
    pairs its rows runs code on them first, so they are checked when drawn)."""
    if not shots:
        return
    if shots_from is None:
        sample_data(task)
    elif not (task["composed"] or task["paired"]):
        for i, row in enumerate(selected_rows(read_rows(shots_from, "--shots-from file"), task["select"])):
            example_of_row(task, row, i)


def example_of_row(task: Mapping, row: Mapping, index: int, columns: Mapping | None = None) -> dict:
    """One raw row (the ``index``-th) as the id, fields and gold label of an example of ``task`` (:func:`task_facts`;
    its fields read from the columns ``columns`` maps them to, else the task's, else their own names: a name or a
    ``{column}`` format), refused in one line naming the row where a column is missing or the label is none the task
    reads (:func:`gold_label`)."""
    mapping = {**task["columns"], **(columns or {})}
    example = {"id": str(row.get("id", f"{task['name']}-{index}"))}
    for name in task["fields"]:
        column = mapping.get(name, name)
        try:
            example[name] = column.format(**row) if "{" in column else row[column]
        except KeyError as err:
            raise LlmattrError(f"task {task['name']}: row {example['id']} has no column {err.args[0]!r} for field "
                               f"{name!r}; map it with columns={{{name!r}: 'COLUMN'}}") from err
    label_column = mapping.get("label", task["label_field"])
    example["label"] = gold_label(task, row.get(label_column) if label_column else None, example["id"])
    return example


def task_facts(task) -> dict:
    """What the checks here read of a :class:`~llmattr.tasks.Task` (and the registries' view holds): its name,
    fields, columns (field -> file column), label field and whether it takes documents (what reading a file for it
    needs: :func:`llmattr.readers.shaped_rows`), its kind, head, whether it classifies, is a regression, has a gold
    word, is a next-word task or is explained at its label word, its sample data (a name, or None), label words and
    label map (a file's label value -> its label word), the sample rows it selects, whether it composes them (code:
    their number is known once composed) and whether its rows hold minimal pairs (code: the label is the pair's next
    word)."""
    return {"name": task.name, "kind": task.kind, "head": task.head, "fields": list(task.fields),
            "columns": dict(task.columns), "label_field": task.label_field, "documents": task.documents,
            "classifies": task.classifies, "numeric": task.numeric, "has_gold_word": task.has_gold_word,
            "next_word": task.next_word, "explains_label_word": task.explains_label_word,
            "sample_data": task.data, "label_words": list(task.label_words), "label_map": dict(task.label_map),
            "select": dict(task.select), "composed": task.compose is not None, "paired": task.pairing is not None}


def training_loss(loss: str, objective: str | None, label_loss: str) -> str:
    """A finetune's loss: ``loss``, or ``objective`` (its name before issue 39) where given, refused beside a
    ``loss`` other than the default ``label_loss``."""
    if objective is None:
        return loss
    if loss not in (label_loss, objective):
        raise LlmattrError("finetune takes --loss (or its old name --objective), not both")
    return objective


def check_training(task: Mapping, loss: str, head: str | None, permute_labels: bool, mask_augment: float,
                   losses: Sequence[str], heads: Sequence[str]) -> None:
    """Refuse a finetune whose ``loss`` (one of ``losses``, the first the label loss), ``head`` (one of ``heads``, or
    None: the LM head), label permutation or mask augmentation does not fit the task (``task``:
    :func:`task_facts`)."""
    one_of(loss, losses, "--loss")
    if head is not None:
        one_of(head, heads, "--head")
        if loss != losses[0]:
            raise LlmattrError(f"--head {head} trains the head on the labels; --loss {loss} is for the LM head")
        wanted = "regression" if task["numeric"] else "classification" if task["classifies"] else None
        if wanted is None:
            raise LlmattrError(f"--head {head} needs a classification or regression task; {task['name']} is a "
                               f"{task['kind']} task")
        if head != wanted:
            raise LlmattrError(f"task {task['name']} is {article(task['kind'])} task: give --head {wanted}, not --head "
                               f"{head}")
    elif task["head"] != "lm":
        raise LlmattrError(f"task {task['name']} is read by a sequence-{task['head']} head: give --head "
                           f"{task['head']}")
    elif loss == "label" and not task["classifies"]:
        regression = (" (paper 003's regression head: --task stsb-regression --head regression)"
                      if task["numeric"] else "")
        raise LlmattrError(f"finetune --loss label needs a classification task with label words; {task['name']} "
                           f"is {article(task['kind'])} task{regression}; use --loss lm to fine-tune on its text")
    if permute_labels and not (head or loss == "label"):
        raise LlmattrError("--permute-labels permutes the labels a model learns: give --loss label or --head")
    mask_rate(mask_augment, "--mask-augment")
    if mask_augment and (head or loss != "label"):
        raise LlmattrError("--mask-augment deletes text tokens of the task's prompt: it trains with --loss label, "
                           "without --head")


HEAD_LORA_R = 4  # paper 003 sec. 4.1: LLaMA-2 fine-tuned with LoRA of rank 4 (PEFT)


def lora_rank(lora_r: int | None, head: str | None) -> int:
    """The LoRA rank a finetune trains: ``lora_r``, or by default 4 with a ``head`` (paper 003's recipe) and 0 (full
    fine-tuning) without."""
    if lora_r is not None:
        return lora_r
    return HEAD_LORA_R if head else 0


def check_schedule(settings: Mapping) -> None:
    """Refuse a finetune's counts (held-out rows, epochs, batch size, tokens, steps: those in ``settings``, each a
    whole number >= 1), learning rate, LoRA rank (``lora_r``, resolved: :func:`lora_rank`) and 4-bit loading where
    they cannot train, or need a package that is not installed."""
    for name in ("held_out", "epochs", "batch_size", "max_tokens", "save_steps", "logging_steps"):
        if name in settings:
            positive_int(settings[name], f"--{name.replace('_', '-')}")
    learning_rate, rank = settings["learning_rate"], settings["lora_r"]
    if not (isinstance(learning_rate, float | int) and 0 < learning_rate < 1):
        raise LlmattrError(f"--learning-rate must be in (0, 1), got {learning_rate!r}")
    if rank < 0:
        raise LlmattrError(f"--lora-r must be 0 (full fine-tuning) or a rank >= 1, got {rank}")
    if rank and importlib.util.find_spec("peft") is None:
        raise LlmattrError("--lora-r needs peft: pip install 'llmattr[finetune]'")
    if settings.get("load_in_4bit") and importlib.util.find_spec("bitsandbytes") is None:
        raise LlmattrError("--load-in-4bit needs bitsandbytes (a CUDA GPU): pip install 'llmattr[quant]'")
    if settings.get("load_in_4bit") and not rank:
        raise LlmattrError("--load-in-4bit trains LoRA adapters on the frozen 4-bit weights: give --lora-r")


def file_labels(task: Mapping, labels: str) -> tuple[tuple[str, ...], dict]:
    """``--labels`` of a file's rows for ``task`` (:func:`task_facts`; a classification task only) as
    :func:`llmattr.readers.parse_labels` reads them."""
    if not task["classifies"]:
        raise LlmattrError(f"--labels applies to classification tasks; {task['name']} is {article(task['kind'])} task")
    return parse_labels(labels)


def read_toml(path: str | Path) -> dict:
    """The keys of ``llmattr evaluate --config``'s TOML file, refused in one line when it is missing or not TOML."""
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError as err:
        raise LlmattrError(f"config file not found: {path}") from err
    except tomllib.TOMLDecodeError as err:
        raise LlmattrError(f"{path} is not valid TOML: {err}") from err


def config_values(data: Mapping, keys: Iterable[str]) -> dict:
    """``llmattr evaluate``'s settings from a TOML file or the command line: names with ``_`` (``max-new-tokens``
    is ``max_new_tokens``), unset (None) values left out, lists given as ``a,b`` split; a name that is none of
    ``keys`` refused, listing them."""
    keys = sorted(keys)
    data = {key.replace("-", "_"): value for key, value in data.items() if value is not None}
    unknown = sorted(set(data) - set(keys))
    if unknown:
        raise LlmattrError(f"unknown config key(s) {', '.join(unknown)}; valid: {', '.join(keys)}")
    for key in ("datasets", "methods", "metrics", "layers"):
        if isinstance(data.get(key), str | int):
            data[key] = split_list(str(data[key]))
    return data


def check_evaluation(values: Mapping) -> None:
    """``llmattr evaluate``'s settings that need no registry (a key left out is unset): ``n``, ``data`` beside
    ``datasets``, ``max_new_tokens``, ``seed``, ``target`` and ``scope``."""
    examples_wanted(values.get("n"))
    one_source(values.get("data"), values.get("datasets"))
    if values.get("max_new_tokens") is not None:
        positive_int(values["max_new_tokens"], "--max-new-tokens")
    seed = values.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise LlmattrError(f"--seed must be a whole number, got {seed!r}")
    for key, valid in (("target", TARGET_MODES), ("scope", SCOPES)):
        if key in values:
            member(values[key], valid, key)


def check_needs(metrics: Sequence[str], given: Mapping, needs: Mapping[str, Mapping[str, str]]) -> None:
    """Refuse a metric asked without an option it needs (``needs``: {metric: {option: why}}, each metric's
    :attr:`~llmattr.faithfulness.Metric.needs`; ``given``: the options' values, empty or absent when not given)."""
    for metric in metrics:
        for option, why in needs.get(metric, {}).items():
            if not given.get(option):
                raise LlmattrError(f"{metric} {why}")


def check_sources_asked(asked: Sequence[str], tasks: Sequence[Mapping], with_sources: Sequence[str]) -> None:
    """Refuse source-level work (``asked``: the methods and metrics that score or read sources) on a task whose
    prompts have none (``tasks``: :func:`task_facts` of the evaluated datasets' tasks), naming the datasets that have
    them (``with_sources``) and the tasks a user's own ``--data`` file can take them by."""
    lacking = [task["name"] for task in tasks if not task["documents"]]
    if asked and lacking:
        raise LlmattrError(f"{asked[0]} works on sources (documents) and {lacking[0]}'s prompts have none: evaluate "
                           f"it on a dataset with sources ({', '.join(with_sources)}) or on your own file "
                           "(--data FILE --task context, each row's documents in its 'documents' field)")


def parse_shard(text: str) -> tuple[int, int]:
    """``--shard i/n`` as (rank, world size), refused in one line when it is not two whole numbers."""
    try:
        rank, world = (int(part) for part in text.split("/"))
    except ValueError as err:
        raise LlmattrError(f"--shard expects i/n (e.g. 0/2), got {text!r}") from err
    return rank, world


def check_shard(rank: int, world: int) -> tuple[int, int]:
    """(rank, world size) if ``0 <= rank < world``, else one line."""
    if world < 1 or not 0 <= rank < world:
        raise LlmattrError(f"shard {rank}/{world} is out of range: use i/n with 0 <= i < n")
    return rank, world


def choice(valid: Sequence, line: str = "{name} {key} must be one of {valid}; got {value!r}") -> tuple:
    """A method parameter's rule (:func:`check_param_values`): one of ``valid``."""
    return ("choice", tuple(valid), line.replace("{valid}", ", ".join(map(repr, valid))))


COUNT = ("count", None, "{name} {key} must be a positive integer")  # a whole number >= 1
COUNT_OR_AUTO = ("count", "auto", "{name} {key} must be a positive integer or 'auto'")
WHOLE = ("whole", None, None)  # checks.positive_int's lines
WHOLE_OR_AUTO = ("whole", "auto", None)


def _accepts(kind: str, arg: object, value: object) -> bool:
    """Whether ``value`` keeps a rule of ``kind`` (with ``arg``) other than ``whole``."""
    if kind == "choice":
        return value in arg
    if kind == "count":
        return (arg is not None and value == arg) or (isinstance(value, int) and not isinstance(value, bool)
                                                      and value >= 1)
    if kind == "last-layers":  # 'all' or a number of last layers >= 1 (given as text or a number)
        return value == arg or (str(value).isdigit() and int(value) >= 1)
    if kind == "layer-or":  # one of arg or a layer index
        return value in arg or (isinstance(value, int) and not isinstance(value, bool))
    try:
        number = float(value)
    except (TypeError, ValueError):
        return False
    low, high = arg
    if kind == "at-least":
        return number >= low
    return low < number and (kind == "above" or number < high)  # above, between


def check_param_values(name: str, params: Mapping, rules: Mapping) -> None:
    """Refuse a value of method ``name``'s ``params`` outside its rule in ``rules`` ({parameter: (kind, arg,
    line)}: ``choice`` one of arg, ``count`` a whole number >= 1 or arg, ``whole`` as :func:`checks.positive_int`
    (or arg), ``last-layers`` arg or a number >= 1, ``layer-or`` one of arg or an int, ``above``/``at-least``/
    ``between`` a number > arg[0], >= arg[0], in (arg[0], arg[1]), ``needed-when`` below), in one line
    (``{name}``, ``{key}``, ``{value}`` filled in); a parameter not given is not checked, but for ``needed-when``:
    arg (another parameter, a value of it) needs this one given (not None) when that parameter has that value."""
    for key, (kind, arg, line) in rules.items():
        if kind == "needed-when":
            if params.get(arg[0]) == arg[1] and params.get(key) is None:
                raise LlmattrError(line.format(name=name, key=key, value=None))
            continue
        if key not in params:
            continue
        value = params[key]
        if kind == "whole":
            if arg is None or value != arg:
                positive_int(value, f"{name} {key}")
        elif not _accepts(kind, arg, value):
            raise LlmattrError(line.format(name=name, key=key, value=value))


def metric_list(names: object, metrics: Sequence[str], flag: str) -> list[str]:
    """An option's comma-separated metric ``names`` (``--reliability-of``), each one of ``metrics``; else one line
    naming the option and listing them."""
    return known_items(names, metrics, lambda unknown: f"{flag}: unknown metric "
                       f"{', '.join(map(repr, unknown)) or repr(names)}; valid: {', '.join(sorted(metrics))}")


def ffid_beta(value: float) -> float:
    """``--ffid-beta``'s check hook (f-fidelity's option): a fraction in [0, 1) (:func:`checks.mask_rate`)."""
    return mask_rate(value, "--ffid-beta")


def check_permuted_model(path: object) -> None:
    """``--permuted-model``'s check hook (data randomisation's option): a folder with ``config.json``, a .gguf or a
    hub id (empty: not given; data-randomization then asks for it), refused before any model loads."""
    if path:
        try:
            check_model_path(str(path))
        except LlmattrError as err:
            raise LlmattrError(f"--permuted-model: {err}") from None


def check_shards(shards: int, shard: str | None) -> None:
    """Refuse ``--shards`` (a launcher's shard count) below 1, or beside ``--shard`` (one shard run by hand)."""
    if shards < 1:
        raise LlmattrError(f"--shards must be at least 1, got {shards}")
    if shard:
        raise LlmattrError(f"--shard {shard} runs one shard yourself; the launcher runs them all: give --shards "
                           "n instead")


def out_folder(out: Path) -> None:
    """Refuse finetune's ``--out`` where it is a file (its folder's contents are checked against the run later)."""
    if out.exists() and not out.is_dir():
        raise LlmattrError(f"--out {out} is a file; give a folder")


def new_tokens(max_new_tokens: int) -> int:
    """``max_new_tokens`` of a generated target, refused below 1."""
    if max_new_tokens < 1:
        raise LlmattrError("max_new_tokens must be at least 1")
    return max_new_tokens


def forced_answer(answer: str | Sequence[int]) -> str | Sequence[int]:
    """A forced answer (its text, or its token ids), refused when empty."""
    if not answer:
        raise LlmattrError("the forced answer is empty")
    return answer


def gold_label_word(label_words: Sequence[str], gold: object) -> None:
    """Refuse ``target="gold"`` on a task explained at its label word when the gold label ``gold`` is none of its
    ``label_words``."""
    if gold not in label_words:
        raise LlmattrError(f"target='gold' needs the gold label, one of {list(label_words)}; got {gold!r}")


def check_target(task: Mapping, target: str, max_new_tokens: int | None, answer: str | None,
                 gold: object = None) -> None:
    """``explain``'s ``--answer``, ``--target gold`` and ``--max-new-tokens`` for ``task`` (:func:`task_facts`) as
    the target's construction (:mod:`llmattr.targets`) refuses them: an empty forced answer; without one, a gold label
    (``gold``: the text's ``label`` field) that is none of the label words where the label word is explained, and
    fewer than one new token where the target generates (every target but a next-word task's gold word)."""
    if answer is not None:
        forced_answer(answer)
        return
    if target == "gold" and task["explains_label_word"]:
        gold_label_word(task["label_words"], gold)
    if max_new_tokens is not None and not (task["next_word"] and target == "gold"):
        new_tokens(max_new_tokens)


def swept_texts(text: str, layers: Sequence | None, swept: str | None) -> list[str]:
    """``evaluate --methods``' item ``text`` as the items it runs: one per value of ``layers`` (``--layers``) with
    the parameter ``swept`` (the method's ``layer_sweep``) set, where the method has one and the text does not set
    it; else the item itself."""
    if layers and swept and swept not in split_spec(text)[1]:
        return [f"{text}:{swept}={k}" for k in layers]
    return [text]


# A user's file's labels, and finetune's data, held-out rows and --out folder: refused before torch loads.


def label_text(value) -> str | None:
    """A label cell as text: CSV cells are text already; JSON ``1`` -> ``"1"``, ``true`` -> ``"true"``."""
    return value if value is None or isinstance(value, str) else json.dumps(value)


def gold_label(task: Mapping, value: object, row: str | None = None) -> object:
    """A raw dataset label ``value`` as ``task`` (:func:`task_facts`) reads it: a classification task's label word
    (its label map applied), a regression task's number, else the value (None stays None); refused in one line,
    naming ``row`` (an example's id) where given, when a classification task's label is none of its words or a
    regression task's is not a number."""
    of_row = "" if row is None else f" of row {row}"
    if task["numeric"]:
        if value is None:
            return None
        try:
            return float(value)
        except (TypeError, ValueError):
            raise LlmattrError(f"task {task['name']}: label {value!r}{of_row} is not a number; fix the file or map "
                               "the label column") from None
    label = None if value is None else task["label_map"].get(value, value)
    if task["classifies"] and label not in task["label_words"]:
        raise LlmattrError(f"task {task['name']}: label {value!r}{of_row} is not one of "
                           f"{list(task['label_map']) or list(task['label_words'])}; fix the file or map the label "
                           "column")
    return label


def file_rows(task: Mapping, path: Path, rows: Sequence[Mapping], where: Sequence[str],
              label_column: str) -> tuple[list[dict], list]:
    """The ``rows`` of a user's file ``path`` (:func:`llmattr.readers.shaped_rows`, each at ``where``) as ``task``
    (:func:`task_facts`) reads them: each with its id (its own ``id`` column, else ``{file stem}-{i}``) and its
    label cell as text (:func:`label_text`); and each row's gold label (:func:`gold_label`; None for every row of a
    task whose rows hold minimal pairs: the label comes from the pair, read there), refused naming the file and the
    line."""
    rows = [{"id": f"{path.stem}-{i}", **row, label_column: label_text(row[label_column])}
            for i, row in enumerate(rows)]
    gold = [None] * len(rows)
    if not task["paired"]:
        for i, (row, at) in enumerate(zip(rows, where, strict=True)):
            try:
                gold[i] = gold_label(task, row[label_column], str(row["id"]))
            except LlmattrError as err:
                raise LlmattrError(f"{path}: {at}: {err}") from None
    return rows, gold


def selected_rows(rows: Sequence[Mapping], select: Mapping) -> list:
    """The ``rows`` whose columns hold every value of a task's ``select`` (BLiMP's paradigms share a file)."""
    return [row for row in rows if all(row.get(key) == value for key, value in select.items())]


def head_name(task: Mapping) -> str:
    """The task ``finetune --head`` trains for ``task`` (:func:`task_facts`), by name: a head task itself, a
    regression task's ``NAME-regression`` (``stsb-regression``), a classification task's ``NAME-head``."""
    if task["head"] != "lm":
        return task["name"]
    return f"{task['name']}-{'regression' if task['numeric'] else 'head'}"


FINETUNE_DATA = "--data FILE"  # what a finetune without sample data is given instead


def per_class(n: int, k: int, i: int) -> int:
    """How many of a balanced sample of ``n`` the ``i``-th of ``k`` classes gives: ``n // k``, one more for the
    first ``n % k`` classes."""
    return n // k + (1 if i < n % k else 0)


def balanced_limit(sizes: list[int]) -> int:
    """The largest ``n`` :func:`check_balanced` lets through for classes of these sizes (in ``classes`` order): the
    remainder goes to the first classes, so 4 Positive + 1 Negative give 3 (2 + 1), not 2 x 1."""
    return max(n for n in range(sum(sizes) + 1)
               if all(per_class(n, len(sizes), i) <= size for i, size in enumerate(sizes)))


def check_balanced(sizes: Mapping[str, int], n: int) -> None:
    """Refuse a sample of ``n`` balanced over classes of these ``sizes`` (in ``classes`` order; class ``i`` gives
    :func:`per_class`) where a class has too few examples, naming the first such class and the largest ``n``
    (:func:`balanced_limit`)."""
    for i, (label, size) in enumerate(sizes.items()):
        if per_class(n, len(sizes), i) > size:
            raise LlmattrError(f"only {size} examples of class {label!r} for a balanced sample of {n}; ask for n <= "
                               f"{balanced_limit(list(sizes.values()))}, or for every row, unbalanced (--n all)")


def held_out_split(task: Mapping, head: str | None) -> bool:
    """Whether a finetune of ``task`` (:func:`task_facts`; the head task with a ``head``) keeps rows out to measure
    the model on: a head's (its accuracy or Pearson r), or a classification task's label-word accuracy; a task
    without classes trained on its texts (``--loss lm``: WikiBio, STS-B's prompted scores) trains on every row."""
    return bool(head) or task["classifies"]


def held_out_rows(held_out: int, rows: int) -> int:
    """``--held-out``: the rows of ``rows`` kept out of training, refused when none would be left to train on."""
    if held_out >= rows:
        raise LlmattrError(f"--held-out {held_out} leaves no training rows of {rows}")
    return held_out


def resumable_card(out: Path) -> dict | None:
    """The card of finetune's ``--out`` folder where it holds an unfinished finetune (a run to resume, if its
    settings are this run's), None for a new or empty folder; refused in one line when ``out`` is a file
    (:func:`out_folder`), holds something else, or holds a finished finetune."""
    out_folder(out)
    if not out.exists():
        return None
    card = read_card(out)
    if card is None:
        if any(out.iterdir()):
            raise LlmattrError(f"--out {out} exists and is not a llmattr finetune's folder (no {CARD_NAME}); "
                               "give a new or empty folder")
        return None
    if card.get("status") == "done":
        raise LlmattrError(f"--out {out} holds a finished finetune ({card.get('task')}, held-out accuracy "
                           f"{card.get('held_out', {}).get('accuracy')}); give another folder")
    return card
