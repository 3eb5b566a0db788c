"""Shared base of attribution methods and the registry by name (Captum/Inseq layout)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import ClassVar

from .. import objectives
from ..checks import positive_int, register_once
from ..declarations import RENAMED_PARAMS, current_params
from ..errors import LlmattrError
from ..lazy import torch
from ..models import memory
from ..models.loading import LoadedModel
from ..objectives import check_objective
from ..targets import Target, foil_id

REGISTRY: dict[str, type[AttributionMethod]] = {}
NOT_DEFINED: dict[str, str] = {}  # methods of the literature with no reading for a causal LM -> why (one line)


class MethodParams(dict):
    """A method's parameters (``self.params``). A parameter's earlier name
    (:data:`~llmattr.declarations.RENAMED_PARAMS`) still reads its value, so code written before the rename
    (``self.params["target"]``, now ``objective``) keeps working; the keys, and so what is stored and shown, are the
    current names."""

    def __missing__(self, key):
        if RENAMED_PARAMS.get(key) in self:
            return self[RENAMED_PARAMS[key]]
        raise KeyError(key)

    def get(self, key, default=None):
        return self[key] if key in self or RENAMED_PARAMS.get(key) in self else default


class AttributionMethod:
    """One attribution method. Subclasses set the class attributes and implement :meth:`attribute`.

    ``attribute`` returns raw scores ``(n_steps, n_span_tokens)`` for the content span of ``target``:
    one row per explained generation step.

    ``objective``: what a method that scores a model output explains by default (a name in
    :mod:`llmattr.objectives`); its ``objective`` parameter picks another (``target=``, its earlier name, is
    still accepted: :func:`~llmattr.declarations.current_params`), and ``foil`` (a single-token word or a
    token id) is the alternative a contrastive objective compares the target with. ``None``: the method reads
    no output score (attention weights, embedding norms, hidden-state distances) and takes neither.

    ``layer_param``: the parameter that gives one layer's own reading (paper 003 sec. 5's per-layer
    attributions: NormXLogit and LogAt at layer l, value zeroing of layer l); per-layer alignment
    (:mod:`llmattr.faithfulness.alignment`) sweeps it over the layers of every method whose ``defaults`` hold it.

    ``control``: the method is the control every other one is tested against in the report, its own grey column
    or row, never ranked (the random baseline, family ``control``).

    ``granularity``: ``"token"``, or ``"source"`` for a method whose unit is a whole source (a document, a
    sentence: :mod:`llmattr.methods.source_estimators`), which needs a prompt with sources and spreads each source's
    value over its tokens.

    ``layer_sweep``: the parameter ``llmattr evaluate --layers`` sweeps (Grad-ELLM's ``layers``, the number of last
    layers aggregated: paper 000 Fig. 5) and the report's layer-sweep figure plots along; ``None``: no sweep.
    """

    name: ClassVar[str]
    family: ClassVar[str]
    summary: ClassVar[str]
    needs_gradients: ClassVar[bool]
    signed: ClassVar[bool]
    cost: ClassVar[str]  # forward/backward passes, in words
    defaults: ClassVar[dict] = {}
    rules: ClassVar[dict] = {}  # {parameter: its values' rule}, checked torch-free (base.check_param_values)
    memory_kind: ClassVar[str] = "forward"  # a MemoryProfile's name (llmattr.models.memory.PROFILES): forward,
    # backward, or one the method's module registers beside it (DeepLIFT's)
    objective: ClassVar[str | None] = None
    layer_param: ClassVar[str] = "layer"
    layer_sweep: ClassVar[str | None] = None
    control: ClassVar[bool] = False
    granularity: ClassVar[str] = "token"  # "source": scores whole sources and needs a prompt with them
    head_signed: ClassVar[bool] = False  # its scores of a sequence head's label (head_scores) take both signs

    def __init__(self, **params):
        scored = self.defaults.get("objective", self.objective) if self.objective else None  # the default's
        params = check_method_params(self.name, params, self.defaults, scored, objectives.OBJECTIVES,
                                     objectives.contrastive())
        self.params = MethodParams({**self.defaults, **params})
        check_param_values(self.name, self.params, self.rules)

    def explained(self, lm: LoadedModel) -> tuple[objectives.Objective, torch.Tensor | None]:
        """The objective this method scores and its foil token id (a 0-d tensor; ``None`` without a foil)."""
        foil = self.params.get("foil")
        found = objectives.get(self.params.get("objective", self.objective), foil)
        return found, None if foil is None else torch.tensor(foil_id(lm.tokenizer, foil))

    def attribute(self, lm: LoadedModel, target: Target) -> torch.Tensor:
        raise NotImplementedError

    def layer_scores(self, lm: LoadedModel, target: Target, layers: list[int]) -> torch.Tensor:
        """``(len(layers), n_steps, n_span)`` raw scores with the layer parameter (``layer_param``) set to each
        of ``layers``: one :meth:`attribute` per layer. A method that reads every layer from one pass (the
        head-on-top family, value zeroing) overrides it with that pass."""
        param = layer_parameter(type(self))
        if param is None:
            raise LlmattrError(f"method {self.name} has no layer parameter; per-layer scores need one")
        return torch.stack([type(self)(**{**self.params, param: layer}).attribute(lm, target) for layer in layers])

    def attribute_with_info(self, lm: LoadedModel, target: Target) -> tuple[torch.Tensor, dict]:
        """:meth:`attribute` plus per-step diagnostics ``{name: (n_steps,) values}`` recorded on each
        :class:`~llmattr.explanation.Step` (path methods and DeepLIFT: ``target_delta`` and
        ``convergence_delta``)."""
        return self.attribute(lm, target), {}

    def memory_rows(self, lm: LoadedModel, tokens: int) -> int:
        """Sequences of ``tokens`` one pass holds at once (the memory guard's ``R``)."""
        return 1

    def memory_extra(self, lm: LoadedModel, tokens: int) -> int:
        """Bytes the method holds beside the activations of its passes (the memory guard adds them to the
        estimate of its ``memory_kind``); none by default."""
        return 0

    def checkpointing(self, lm: LoadedModel, enable: bool) -> AbstractContextManager:
        """The context a run goes in when the memory guard chose activation checkpointing (``enable``): every
        decoder block recomputed in the backward pass (:func:`llmattr.models.memory.checkpointed`)."""
        return memory.checkpointed(lm, enable)


def source_features(target: Target) -> torch.Tensor | None:
    """``(n_span,)``: the source of each span token (-1: none), where the prompt has sources
    (:attr:`llmattr.prompting.Prompt.sources`): the features of a method that perturbs or draws whole sources
    instead of tokens (LIME, the random baseline); None without sources."""
    sources = target.prompt.sources
    return None if sources is None else torch.from_numpy(sources.owners(target.span))


def spread(values: torch.Tensor, owner: torch.Tensor) -> torch.Tensor:
    """``(T, k)`` per-source values as ``(T, n_span)`` token scores: each source's value divided evenly over its
    tokens (so a source's summed score, :meth:`llmattr.explanation.Explanation.source_scores`, is its value),
    0 on the tokens of no source."""
    sizes = torch.bincount(owner[owner >= 0], minlength=values.shape[1]).to(values.dtype)
    per_token = torch.cat([values / sizes, torch.zeros_like(values[:, :1])], dim=1)
    return per_token[:, torch.where(owner >= 0, owner, values.shape[1])]


def layer_parameter(cls: type[AttributionMethod]) -> str | None:
    """The parameter of ``cls`` that picks one layer's reading (``layer_param`` where its defaults have it), or
    ``None`` for a method without per-layer scores."""
    return cls.layer_param if cls.layer_param in cls.defaults else None


def explains_head(cls: type[AttributionMethod]) -> bool:
    """Whether ``cls`` explains a sequence head (paper 003, ``llmattr finetune --head``): it defines
    ``head_scores(model, input_ids (1, S), seed) -> (S,)`` float64, the scores of every token for the head's
    predicted label (a regression head: its output)."""
    return callable(getattr(cls, "head_scores", None))


def register(cls: type[AttributionMethod]) -> type[AttributionMethod]:
    """Class decorator: make a method available by its kebab-case name."""
    return register_once(REGISTRY, cls.name, cls, "method")


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
