"""L2 embedding norm, LogAt and NormXLogit (paper 003, sec. 3.2-3.4, eqs. 2-4).

Causal LMs: the head-on-top (HoT) is the final norm followed by the LM head (and Gemma's logit
soft-capping); LogAt(x_i) for step t is the logit of the step's target token when the HoT is applied
to x_i's final representation (eq. 2 with the vocabulary as the label set). Only the target rows of
the LM head are multiplied, so no full-vocabulary projection is made. ``layer=l`` applies the HoT to
layer l's output instead (the per-layer variant of sec. 5). One forward, no backward.

Sequence classifiers (:func:`classifier_attributions`): the classification head applied to every
token's final representation (eq. 2), or |HoT(x_i) - HoT(cls)| for a regression head (eq. 3).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import LlmattrError
from ..lazy import torch
from ..models.anatomy import final_norm, output_head, part
from ..models.loading import LoadedModel
from ..targets import Target
from .base import AttributionMethod, register


def layer_states(model: torch.nn.Module, layer: int | None, **inputs) -> torch.Tensor:
    """Representations ``(S, d)`` of every position at ``layer``'s output, final norm applied.

    Runs the base model only: the head-on-top is applied by the caller to the rows it needs, so no
    full-vocabulary projection is made. ``layer=None`` (or the last layer) gives the base model's final
    representations, after its final norm; earlier layers get the final norm here so the head reads
    them as it reads the last one.
    """
    return states_at(model, [layer], **inputs)[0]


def states_at(model: torch.nn.Module, layers: list[int | None], **inputs) -> torch.Tensor:
    """:func:`layer_states` of each of ``layers`` from one forward pass: ``(len(layers), S, d)``."""
    n_layers = model.config.get_text_config().num_hidden_layers
    last = [layer is None or layer in (-1, n_layers - 1) for layer in layers]
    for layer, is_last in zip(layers, last, strict=True):
        if not is_last and not -n_layers <= layer < n_layers:
            raise LlmattrError(f"layer must be in [0, {n_layers - 1}] (or -1 for the last); got {layer}")
    with torch.no_grad():
        out = model.base_model(**inputs, output_hidden_states=not all(last), use_cache=False)
        norm = final_norm(model) or torch.nn.Identity()
        return torch.stack([out.last_hidden_state[0] if is_last else norm(out.hidden_states[layer % n_layers + 1][0])
                            for layer, is_last in zip(layers, last, strict=True)])


def lm_head_logits(model: torch.nn.Module, states: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """Logits of ``token_ids`` (T,) for every representation in ``states`` (..., n, d): ``(..., T, n)``.

    The LM head restricted to the T target rows: W[y_t] . h_i (+ bias), then Gemma's soft-capping.
    """
    head = output_head(model)
    token_ids = token_ids.to(states.device)
    logits = head.weight[token_ids].to(states.dtype) @ states.mT
    if getattr(head, "bias", None) is not None:
        logits = logits + head.bias[token_ids, None]
    cap = getattr(model.config.get_text_config(), "final_logit_softcapping", None)
    return torch.tanh(logits / cap) * cap if cap else logits


def embedding_norms(lm: LoadedModel, input_ids: torch.Tensor) -> torch.Tensor:
    """||x_i^0||_2 of the input embeddings as fed to the first layer (sec. 3.2): ``(S,)``."""
    with torch.no_grad():
        return lm.embed(input_ids)[0].float().norm(dim=-1)


class _LogitFamily(AttributionMethod):
    family = "head-on-top"
    needs_gradients = False
    defaults = {"layer": None}
    rules = {"layer": ("layer-or", (None,), "{name} layer must be an integer layer index; got {value!r}")}
    use_norm = True
    use_logit = True

    def attribute(self, lm: LoadedModel, target: Target) -> torch.Tensor:
        return self.layer_scores(lm, target, [self.params.get("layer")])[0]

    @classmethod
    def head_scores(cls, model: torch.nn.Module, input_ids: torch.Tensor, seed: int = 0) -> torch.Tensor:
        """Eqs. 2-4 on a sequence head's own output layer (:func:`classifier_scores`)."""
        return classifier_scores(model, input_ids, method=cls.name)[0].double()

    def layer_scores(self, lm: LoadedModel, target: Target, layers: list[int | None]) -> torch.Tensor:
        """``(len(layers), n_steps, n_span)``: the head applied to each layer's output, all from one forward."""
        a, b = target.span
        scores = torch.ones(len(layers), target.n_steps, b - a)
        if self.use_logit:
            ids = target.input_ids.to(lm.device)
            states = states_at(lm.model, layers, input_ids=ids)[:, a:b]
            with torch.no_grad():
                scores = lm_head_logits(lm.model, states, target.target_ids).float().cpu()
        if self.use_norm:
            scores = scores * embedding_norms(lm, target.input_ids)[a:b].cpu()
        return scores


@register
class L2Norm(_LogitFamily):
    """Norm of each content token's input embedding (paper 003, sec. 3.2); the same for every step."""

    name = "l2-norm"
    summary = "L2 norm of the input word embedding, ||x_i^0|| (paper 003 sec. 3.2)"
    signed = False
    cost = "no forward (embedding lookup)"
    defaults = {}
    use_logit = False


@register
class LogAt(_LogitFamily):
    """Logit of the target token from the head applied to x_i's final representation (eq. 2)."""

    name = "logat"
    summary = "LogAt: target-token logit of the LM head applied to each token's final state (eq. 2)"
    signed = True
    head_signed = True
    cost = "1 forward (all steps share it)"
    use_norm = False


@register
class NormXLogit(_LogitFamily):
    """NormXLogit(x_i) = ||x_i^0||_2 * LogAt(x_i) (paper 003, eq. 4)."""

    name = "normxlogit"
    summary = "NormXLogit: ||x_i^0|| * LogAt(x_i) (paper 003 eq. 4)"
    signed = True
    head_signed = True
    cost = "1 forward (all steps share it)"


# --- sequence-classification models -------------------------------------------------------------


@dataclass
class ClassifierAttribution:
    """Per-token scores of a sequence classifier for one label (or the regression output)."""

    tokens: list[str]
    scores: list[float]
    label: int | None  # None for a regression head
    prediction: list[float]  # the model's own output (logits, or the regression value)
    method: str


def classification_head(model: torch.nn.Module):
    """``(hot, cls_index)``: the head-on-top as a map (n, d) -> (n, C), and the pooled position.

    Decoder classifiers (Llama, Mistral, Qwen2, GPT-2 ``score``) pool the last token; encoder
    classifiers (BERT pooler + classifier, RoBERTa classification head) pool the first ([CLS]). Each
    token is fed to the encoder head as its own length-1 sequence, so the head's own pooling reads it.
    """
    score = part(model, "score")
    if score is not None:
        return score, -1
    classifier = part(model, "classifier")
    if classifier is None:
        raise LlmattrError(f"{type(model).__name__} has no classification head (score or classifier)")
    pooler = part(model, "pooler")

    def hot(states: torch.Tensor) -> torch.Tensor:
        x = states[:, None, :]
        return classifier(pooler(x) if pooler is not None else x)

    return hot, 0


EMBEDDINGS = ("hidden", "word")


def classifier_scores(model: torch.nn.Module, input_ids: torch.Tensor, label: int | None = None,
                      method: str = "normxlogit", layer: int | None = None, embedding: str = "hidden",
                      token_type_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, int | None, torch.Tensor]:
    """Scores ``(S,)`` of every token for ``label`` (default: the predicted class), the label, the output.

    LogAt: HoT(x_i^L)[label] (eq. 2); regression heads (one output): |HoT(x_i^L) - HoT(cls^L)| (eq. 3).
    NormXLogit multiplies by ||x_i^0|| (eq. 4); l2-norm is ||x_i^0|| alone. ``embedding`` says what
    x_i^0 is: ``"hidden"`` (default) the embedding layer's output ``hidden_states[0]``, as the authors'
    code reads it (BERT: word + position + token-type embeddings, then LayerNorm; a decoder: its input
    embeddings), or ``"word"`` the raw word-embedding row. ``token_type_ids`` (sentence pairs) reach
    every forward.
    """
    if method not in ("l2-norm", "logat", "normxlogit"):
        raise LlmattrError(f"classifier method must be l2-norm, logat or normxlogit; got {method!r}")
    if embedding not in EMBEDDINGS:
        raise LlmattrError(f"embedding must be one of {', '.join(EMBEDDINGS)}; got {embedding!r}")
    inputs = {"input_ids": input_ids, **({} if token_type_ids is None else {"token_type_ids": token_type_ids})}
    hot, cls_index = classification_head(model)
    states = layer_states(model, layer, **inputs)
    with torch.no_grad():
        per_token = hot(states).float()  # (S, C)
        out = model(**inputs, output_hidden_states=embedding == "hidden")
        output = out.logits[0].float()
        x0 = out.hidden_states[0] if embedding == "hidden" else model.get_input_embeddings()(input_ids)
        norms = x0[0].float().norm(dim=-1)
    if per_token.shape[-1] == 1:
        label = None
        logat = (per_token[:, 0] - per_token[cls_index, 0]).abs()
    else:
        label = int(output.argmax()) if label is None else int(label)
        if not 0 <= label < per_token.shape[-1]:
            raise LlmattrError(f"label must be in [0, {per_token.shape[-1] - 1}]; got {label}")
        logat = per_token[:, label]
    scores = {"l2-norm": norms, "logat": logat, "normxlogit": norms * logat}[method]
    return scores, label, output


def classifier_attributions(model: torch.nn.Module, tokenizer, text: str, label: int | None = None,
                            method: str = "normxlogit", layer: int | None = None, text_pair: str | None = None,
                            embedding: str = "hidden") -> ClassifierAttribution:
    """Paper 003's attributions for an ``AutoModelForSequenceClassification`` model on ``text``.

    ``label`` defaults to the predicted class; a regression head (``num_labels=1``) uses eq. 3.
    ``text_pair``: the second sentence of a pair task (MNLI, QNLI, STS-B), encoded with the tokenizer's
    pair template and its ``token_type_ids``. ``embedding``: see :func:`classifier_scores`.
    """
    if not text or not text.strip():
        raise LlmattrError("empty text: give the text to explain")
    device = model.get_input_embeddings().weight.device
    enc = tokenizer(text, text_pair, return_tensors="pt")
    ids, types = enc["input_ids"].to(device), enc.get("token_type_ids")
    types = None if types is None or not getattr(model.config, "type_vocab_size", 0) else types.to(device)
    scores, label, output = classifier_scores(model.eval(), ids, label, method, layer, embedding, types)
    return ClassifierAttribution(
        tokens=[tokenizer.decode([i]) for i in ids[0].tolist()], scores=scores.tolist(), label=label,
        prediction=output.tolist(), method=method,
    )
