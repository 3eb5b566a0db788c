"""What the CLI's help, derived options and model-free refusals read of the registries: each registered method
parameter's help, each method's default objective and the objectives, the tasks with what reading a file for each
needs, the datasets and their groups, the metrics with their outputs and each option a metric declares, and
finetune's losses and heads.

The registries are read where they are declared (methods, metrics, tasks: with what a plugin registered), and
importing them loads no torch (:mod:`llmattr.lazy`): so ``--help`` and a refusal answer without it."""

from __future__ import annotations

from .. import model_free
from ..checks import one_of, option_value
from ..errors import LlmattrError, method_refusal, metric_refusal, unknown_name
from ..model_free import check_method_params, check_param_values, check_training, task_facts

TYPES = {"bool": bool, "int": int, "float": float, "str": str}  # a metric option's type, by its name in the view


def registered() -> dict:
    """The view read from the registries (importing them, and torch): ``methods`` (the registered names),
    ``not_defined`` ({name: why}: methods refused for decoder-only models), ``method_params`` ({parameter: [``"method
    default"``, ...]}), ``tasks``, ``datasets``, ``groups`` ({group: datasets}), ``metrics`` and ``metric_options``
    ({name: {flag, type, default, valid, help, positive, check, metrics}}: check names the option's check hook where
    it is one of :mod:`llmattr.model_free`'s functions, else None; metrics, the metrics a ``lists_metrics`` option
    may name, else None), ``scoring`` ({method: its default objective}), ``objectives``, ``outputs`` (the metrics'
    output names), ``losses`` and ``heads`` (``finetune``'s), ``takes`` ({method: its parameters}),
    ``layer_sweeps`` ({method: the parameter ``evaluate --layers`` sweeps}), ``source_methods`` (those that score
    sources), ``source_metrics`` (those that read them), ``metric_needs`` ({metric: {option: why}}: the options a
    metric cannot run without), ``default_methods``, ``default_metrics`` and
    ``default_datasets`` (``evaluate``'s without ``--methods``, ``--metrics``, ``--datasets``), ``rules``
    ({method: {parameter: its values' rule}}: :func:`llmattr.model_free.check_param_values`), ``contrastive``
    (the objectives that need a foil), ``task_facts`` ({task: :func:`llmattr.model_free.task_facts`}) and
    ``config_keys`` (the keys of ``llmattr evaluate --config`` besides the metric options)."""
    from .. import methods
    from ..evaluation.config import FIELDS, EvalConfig
    from ..evaluation.run_datasets import dataset_groups, dataset_names
    from ..faithfulness import METRICS, OUTPUTS, declared_options, metric_needs, source_metrics
    from ..finetuning import HEADS, LOSSES
    from ..objectives import OBJECTIVES, contrastive
    from ..tasks import TASKS

    takers: dict[str, list[str]] = {}
    for name in methods.available():
        for key, value in methods.REGISTRY[name].defaults.items():
            takers.setdefault(key, []).append(f"{name} {value}")
    return {
        "methods": methods.available(),
        "not_defined": dict(sorted(methods.NOT_DEFINED.items())),
        "method_params": dict(sorted(takers.items())),
        "tasks": sorted(TASKS),
        "datasets": list(dataset_names()),
        "groups": {group: list(names) for group, names in dataset_groups().items()},
        "metrics": sorted(METRICS),
        "metric_options": {name: {
            "flag": option.flag,
            "type": type(option.default).__name__ if isinstance(option.default, int | float | str) else "str",
            "default": str(option.default), "valid": [str(v) for v in option.valid or ()], "help": option.help,
            "positive": option.positive, "check": hook_name(option.validate),
            "metrics": option.listable() if option.lists_metrics else None}
            for name, option in sorted(declared_options().items())},
        "scoring": {name: methods.REGISTRY[name].objective for name in methods.available()
                    if methods.REGISTRY[name].objective},
        "objectives": list(OBJECTIVES),
        "outputs": sorted(OUTPUTS),
        "losses": list(LOSSES),
        "heads": list(HEADS),
        "takes": {name: sorted(methods.REGISTRY[name].defaults) for name in methods.available()},
        "layer_sweeps": {name: methods.REGISTRY[name].layer_sweep for name in methods.available()
                         if methods.REGISTRY[name].layer_sweep},
        "source_methods": [name for name in methods.available() if methods.REGISTRY[name].granularity == "source"],
        "source_metrics": source_metrics(),
        "metric_needs": metric_needs(),
        "default_methods": EvalConfig().methods,
        "default_metrics": EvalConfig().metrics,
        "default_datasets": EvalConfig().dataset_names(),
        "rules": {name: methods.REGISTRY[name].rules for name in methods.available()},
        "contrastive": contrastive(),
        "task_facts": {name: task_facts(TASKS[name]) for name in sorted(TASKS)},
        "config_keys": sorted(FIELDS - {"options"}),
    }


def hook_name(hook: object) -> str | None:
    """The name of an option's check ``hook`` when it is a function of :mod:`llmattr.model_free` (the CLI then runs
    it before torch loads: :func:`check_option`), else None (it runs with the evaluation)."""
    return hook.__name__ if getattr(hook, "__module__", None) == model_free.__name__ else None


def check_option(name: str, value: object) -> None:
    """``value`` of the metric option ``name`` checked as :meth:`llmattr.faithfulness.Option.check` checks it
    (:func:`llmattr.checks.option_value`, the metrics it names, then its check hook where the view names one), from
    the view."""
    option = view()["metric_options"][name]
    value = option_value(value, option["flag"], TYPES[option["type"]](option["default"]), option["positive"],
                         option["valid"])
    if option["metrics"] is not None:
        model_free.metric_list(value, option["metrics"], option["flag"])
    if option["check"] is not None:
        getattr(model_free, option["check"])(value)


def view() -> dict:
    """The registries' view (:func:`registered`)."""
    return registered()


def check_methods(names: list[str]) -> None:
    """Refuse an unknown method name with :func:`llmattr.methods.get`'s line, from the view (no torch)."""
    known = view()
    for name in names:
        refusal = method_refusal(name, known["methods"], known["not_defined"])
        if refusal is not None:
            raise LlmattrError(refusal)


def check_task(name: str) -> dict:
    """The facts of task ``name`` (:func:`llmattr.model_free.task_facts`: what reading a file for it needs among
    them); an unknown name refused with :func:`llmattr.tasks.get_task`'s line."""
    known = view()
    return known["task_facts"][one_of(name, known["tasks"], "task")]


def check_objectives(names: list[str], objective: str | None) -> None:
    """Refuse an unknown ``objective`` (else each method's default) of the methods ``names`` that score a model
    output, with the line the method's construction raises (:func:`llmattr.objectives.get`'s)."""
    known = view()
    for name in names:
        if name in known["scoring"]:
            one_of(objective or known["scoring"][name], known["objectives"], f"{name} objective")


def check_params(names: list[str], params: dict) -> None:
    """Refuse a parameter one of the methods ``names`` does not take, an objective and foil that do not fit it, or
    a value outside its rule, with the line the method's construction raises
    (:func:`llmattr.model_free.check_method_params`, :func:`llmattr.model_free.check_param_values`)."""
    known = view()
    for name in names:
        taken = check_method_params(name, params, known["takes"][name], known["scoring"].get(name),
                                    known["objectives"], known["contrastive"])
        check_param_values(name, taken, known["rules"][name])


def check_finetune(task: str, loss: str, head: str | None, permute_labels: bool, mask_augment: float) -> None:
    """Refuse what :meth:`llmattr.finetuning.FinetuneConfig.validate` refuses of the (registered) task's loss, head,
    label permutation and mask augmentation (:func:`llmattr.model_free.check_training`), from the view."""
    known = view()
    check_training(known["task_facts"][task], loss, head, permute_labels, mask_augment, known["losses"],
                   known["heads"])


def check_datasets(names: list[str]) -> None:
    """Refuse a name that is no dataset nor group with :func:`llmattr.evaluation.load_dataset`'s line."""
    known = view()
    valid = sorted([*known["datasets"], *known["groups"]])
    for name in names:
        if name not in valid:
            raise LlmattrError(unknown_name("dataset", name, valid))


def check_metrics(names: list[str]) -> None:
    """Refuse unknown metric names with :func:`llmattr.faithfulness.registry.select`'s line."""
    known = view()
    refusal = metric_refusal(names, [*known["metrics"], *known["outputs"]])
    if refusal is not None:
        raise LlmattrError(refusal)
