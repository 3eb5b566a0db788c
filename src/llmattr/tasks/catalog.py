"""The tasks of the papers: prompts, label words and where their data comes from (docs/tasks.md).

Paper 000 (appendix C, D): IMDb, SST2 (sentiment prompt), BoolQ, TellMeWhy, WikiBio.
Paper 003 (sec. 4.1, 5.1): SST-2, MNLI, QNLI, STS-B, BLiMP (ana, dna, dnaa, darn, rpsv).
Paper 003 fine-tunes classification/regression heads; with a causal LM the same tasks are prompted
with single-token label words (MNLI, QNLI) or a prompted 0-5 score (STS-B).
"""

from __future__ import annotations

from dataclasses import replace

from ..checks import one_of, register_once
from .base import BUILTIN, GENERATE, SENTIMENT, Task, shown
from .blimp import BLIMP
from .documents import DOCUMENT_TASKS

GLUE = "nyu-mll/glue"


def glue(name: str, split: str = "validation", **source) -> dict:
    """The Hugging Face source of a GLUE task's rows (``hf``): its config ``name``, ``split`` and the rest of
    ``source`` (``labels``: the label ids' names; ``columns``, ``label``)."""
    return {"path": GLUE, "name": name, "split": split, **source}

IMDB = replace(
    SENTIMENT, name="imdb",
    display="IMDb", report_order=0, data="imdb", description="IMDb review sentiment (paper 000 appendix D prompt)",
    hf={"path": "stanfordnlp/imdb", "split": "test", "labels": {0: "negative", 1: "positive"}},
)
SST2 = replace(
    SENTIMENT, name="sst2",
    display="SST2", report_order=1, data="sst2", description="SST-2 sentence sentiment (paper 000 appendix D prompt)",
    hf=glue("sst2", columns={"text": "sentence"}, labels={0: "negative", 1: "positive"}),
)
TELLMEWHY = replace(
    GENERATE, name="tellmewhy",
    display="TellMeWhy", report_order=3, max_new_tokens=20, data="tellmewhy", columns={"text": "prompt"},
    label_field="answer", description="TellMeWhy story + why-question, open generation (paper 000)",
    hf={"path": "StonyBrookNLP/tellmewhy", "split": "test", "columns": {"text": "{narrative} {question}"}},
)
WIKIBIO = replace(
    GENERATE, name="wikibio",
    display="WikiBio", report_order=4, max_new_tokens=20, data="wikibio", columns={"text": "prompt"},
    description="WikiBio: first two sentences of a biography, open generation (paper 000)",
)

MNLI = Task(
    name="mnli", **shown(("Premise", "premise"), ("Hypothesis", "hypothesis")),
    system=("You are a natural language inference system. Determine whether the premise entails the "
            "hypothesis. Respond ONLY with the single word yes (entailment), maybe (neutral) or no "
            "(contradiction), in lowercase, without any punctuation or additional text."),
    kind="classification", label_words=("yes", "maybe", "no"), max_new_tokens=1, label_field="label",
    label_map={"entailment": "yes", "neutral": "maybe", "contradiction": "no"},
    hf=glue("mnli", "validation_matched", labels={0: "entailment", 1: "neutral", 2: "contradiction"}),
    description="MultiNLI premise/hypothesis entailment (paper 003), prompted with yes/maybe/no",
)
QNLI = Task(
    name="qnli", display="QNLI", **shown(("Question", "question"), ("Sentence", "sentence")),
    system=("You are a question answering system. Determine whether the sentence contains the answer to "
            "the question. Respond ONLY with the single word yes or no, in lowercase, without any "
            "punctuation or additional text."),
    kind="classification", label_words=("yes", "no"), max_new_tokens=1, data="qnli", label_field="label",
    label_map={"entailment": "yes", "not_entailment": "no"},
    hf=glue("qnli", labels={0: "entailment", 1: "not_entailment"}),
    description="QNLI question/sentence answer entailment (paper 003), prompted with yes/no",
)
STSB = Task(
    name="stsb", display="STS-B", **shown(("Sentence 1", "sentence1"), ("Sentence 2", "sentence2")),
    description="STS-B similarity 0-5 (paper 003) as a prompted score: sum_d d * p(d) over the digits",
    kind="regression", label_words=tuple("012345"), max_new_tokens=1, data="stsb", label_field="score",
    hf=glue("stsb", label="label"),
    system=("You are a semantic similarity rater. Rate how similar in meaning the two sentences are, from "
            "0 (unrelated) to 5 (same meaning). Respond ONLY with a single digit from 0 to 5, without any "
            "punctuation or additional text."),
)
STSB_REGRESSION = replace(
    STSB, name="stsb-regression", display="", head="regression", extra={"num_labels": 1, "lm_alternative": "stsb"},
    description="STS-B with a sequence-regression head (paper 003); not available on causal LMs",
)


def head_version(task: Task) -> Task:
    """``task`` read by a sequence-classification head (``NAME-head``; ``llmattr finetune --head
    classification``): the same data and label words, one head output per label word in their order."""
    return replace(task, name=f"{task.name}-head", display="", head="classification",
                   extra={"num_labels": len(task.label_words), "lm_alternative": task.name},
                   description=f"{task.description or task.name} with a sequence-classification head (paper 003); "
                               "not available on causal LMs")


PAPER_TASKS = {t.name: t for t in (IMDB, SST2, TELLMEWHY, WIKIBIO, MNLI, QNLI, STSB, STSB_REGRESSION)}
PAPER_TASKS.update(BLIMP)
PAPER_TASKS.update(DOCUMENT_TASKS)
HEAD_TASKS = {t.name: t for t in map(head_version, (SST2, QNLI, MNLI, IMDB, BUILTIN["boolq"], SENTIMENT))}
PAPER_TASKS.update(HEAD_TASKS)


TASKS: dict[str, Task] = {**BUILTIN, **PAPER_TASKS}  # every task by name


def register_task(task: Task) -> Task:
    """Make ``task`` available by its name (a name already taken by another task is refused)."""
    return register_once(TASKS, task.name, task, "task")


def get_task(name: str | Task) -> Task:
    """A task by name (``sentiment``, ``boolq``, ``generate``, ``sst2``, ``blimp-darn``, ...)."""
    if isinstance(name, Task):
        return name
    return TASKS[one_of(name, sorted(TASKS), "task")]
