"""A task kind's behaviour lives in one table (``llmattr.tasks.base.KINDS``) and is asked of the task by name
(``classifies``, ``classes``, ``next_word``, ``numeric``, ``explains_label_word``, ``has_gold_word``): no module
outside tasks/base.py tests ``task.kind`` against a kind, so a new kind is one row there (issue 22)."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest

import llmattr
from llmattr.errors import LlmattrError
from llmattr.faithfulness.inputs import evaluated_steps
from llmattr.finetuning import FinetuneConfig
from llmattr.tasks import TASKS, Task
from llmattr.tasks.base import KINDS, Kind
from llmattr.tasks.datasets import draw_demonstrations, load_split, to_example
from llmattr.tasks.files import file_task

SRC = Path(llmattr.__file__).parent
HOME = SRC / "tasks" / "base.py"  # the one module that may read a task's kind


def _is_task_kind(node: ast.AST) -> bool:
    """``task.kind``, ``task_obj.kind``, ``self.task.kind``: a task's kind field."""
    return isinstance(node, ast.Attribute) and node.attr == "kind" and "task" in ast.unparse(node.value).lower()


def _names_kind(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "kind") or (isinstance(node, ast.Attribute)
                                                                 and node.attr == "kind")


def _kind_literals(node: ast.AST) -> set[str]:
    """Task kind names written as a literal (alone or in a tuple, list or set)."""
    items = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
    return {item.value for item in items if isinstance(item, ast.Constant) and item.value in KINDS}


def offences(source: str) -> list[str]:
    """Code that decides by a task's kind: a comparison, lookup or match on ``task.kind``, or anything named
    ``kind`` compared with a task kind's name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(map(_is_task_kind, operands)) or (any(map(_names_kind, operands))
                                                     and any(_kind_literals(op) for op in operands)):
                found.append(ast.unparse(node))
        elif isinstance(node, ast.Subscript) and _is_task_kind(node.slice):
            found.append(ast.unparse(node))
        elif isinstance(node, ast.Match) and _is_task_kind(node.subject):
            found.append(f"match {ast.unparse(node.subject)}")
    return found


@pytest.mark.parametrize("code", [
    'if task.kind == "classification": pass',
    'x = task_obj.kind != "lm"',
    'x = self.task.kind in ("lm", "regression")',
    'x = kind == "regression"',
    'x = {"lm": 1}[task.kind]',
    'match task.kind:\n    case "lm": pass',
])
def test_the_check_finds_a_hard_coded_kind(code):
    assert offences(code)


@pytest.mark.parametrize("code", [
    'x = task.classifies and task.head == "lm"',
    'x = f"a {task.kind} task"',
    'x = kind == "forward"',  # a memory kind, a figure kind: not a task's
    'x = spec.kind == "pi_curves"',
])
def test_the_check_leaves_other_kinds_alone(code):
    assert not offences(code)


def test_no_module_outside_tasks_base_decides_by_a_task_kind():
    found = {str(path.relative_to(SRC)): hits for path in sorted(SRC.rglob("*.py")) if path != HOME
             for hits in [offences(path.read_text(encoding="utf-8"))] if hits}
    assert not found, f"ask the task (tasks/base.py: KINDS, Task properties) instead: {found}"


WORDS = ("yes", "no")
# kind, label words, head -> classifies, classes, next_word, numeric, explains_label_word, has_gold_word
EXPECTED = [
    ("classification", WORDS, "lm", (True, WORDS, False, False, True, True)),
    ("classification", WORDS, "classification", (True, WORDS, False, False, False, True)),
    ("generation", (), "lm", (False, (), False, False, False, False)),
    ("generation", WORDS, "lm", (False, (), False, False, True, True)),
    ("regression", ("0", "1", "2"), "lm", (False, (), False, True, True, True)),
    ("regression", (), "regression", (False, (), False, True, False, False)),
    ("lm", (), "lm", (False, (), True, False, False, True)),
]


@pytest.mark.parametrize("kind,words,head,expected", EXPECTED)
def test_what_each_kind_means(kind, words, head, expected):
    task = Task(name="t", user_template="Text: {text}", fields=("text",), kind=kind, label_words=words, head=head)
    assert (task.classifies, task.classes, task.next_word, task.numeric, task.explains_label_word,
            task.has_gold_word) == expected


def test_every_kind_has_a_row_and_an_unknown_kind_is_refused():
    assert set(KINDS) == {"classification", "generation", "regression", "lm"}
    assert all(isinstance(row, Kind) for row in KINDS.values())
    with pytest.raises(LlmattrError, match="kind must be one of classification, generation, regression, lm"):
        Task(name="t", user_template="{text}", fields=("text",), kind="ranking")


def test_the_built_in_tasks_answer_by_their_kind():
    assert TASKS["sst2"].classes == ("Positive", "Negative") and TASKS["sst2"].explains_label_word
    stsb = TASKS["stsb"]
    assert stsb.numeric and not stsb.classes and stsb.gold_label("3.4") == 3.4
    assert stsb.gold_answer({"label": 3.4}) == "3"
    blimp = TASKS["blimp-ana"]
    assert blimp.next_word and blimp.has_gold_word and not blimp.explains_label_word
    assert blimp.demonstration({"text": "The cat", "label": "sat"}) == "The cat sat\n"
    assert not TASKS["tellmewhy"].classifies and not TASKS["tellmewhy"].has_gold_word


def test_a_new_kind_is_one_row_in_tasks_base(monkeypatch):
    """A kind added to the table alone is checked, drawn, scored and fine-tuned as its row says."""
    monkeypatch.setitem(KINDS, "choice", Kind(classifies=True))
    task = Task(name="toy-choice", user_template="Q: {text}", fields=("text",), kind="choice", label_words=WORDS,
                max_new_tokens=1, label_field="label")
    monkeypatch.setitem(TASKS, task.name, task)
    assert task.classes == WORDS and task.explains_label_word
    with pytest.raises(LlmattrError, match="is not one of"):
        to_example(task, {"text": "a", "label": "maybe"}, 0)
    pool = [to_example(task, {"text": f"q{i}", "label": WORDS[i % 2]}, i) for i in range(8)]
    demos = draw_demonstrations(task, pool, 4)
    assert sorted(ex["label"] for ex in demos) == ["no", "no", "yes", "yes"]  # balanced per class
    assert file_task(task, "y=yes,n=no").label_map == {"y": "yes", "n": "no"}  # --labels applies
    assert FinetuneConfig(task=task.name).validate() is task  # --objective label applies
    assert evaluated_steps(SimpleNamespace(task=task.name, steps=[0, 1, 2]), 1) == [0]  # the label-word step


def test_a_kind_that_does_not_classify_refuses_labels_and_draws_unbalanced(shared_data):
    generate = TASKS["tellmewhy"]
    with pytest.raises(LlmattrError, match="--labels applies to classification tasks; tellmewhy is a generation"):
        file_task(generate, "a,b")
    with pytest.raises(LlmattrError, match="needs a classification task"):
        FinetuneConfig(task="tellmewhy").validate()
    examples, _ = load_split("tellmewhy", n=5)
    assert len(examples) == 5
