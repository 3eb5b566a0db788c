"""The Explanation: one explained prompt, JSON round-trip, word-level aggregation and notebook views; and
:class:`Explanations`, several of them (a batch of texts, methods side by side) viewed and tabulated together."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np

from . import render
from .declarations import current_params
from .display import display_tokens, span_display
from .errors import LlmattrError
from .lazy import torch
from .scores import retain_probs
from .sources import Sources

# A word is a run of non-space characters, except that every CJK ideograph is a word of its own (the
# convention of BERT's basic tokenizer, as Chinese and Japanese text has no spaces between words).
_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002fa1f"
WORD = re.compile(f"[{_CJK}]|[^\\s{_CJK}]+")

SCHEMA_VERSION = 1


@dataclass
class Step:
    """One explained generation step: the generated token and its scores over the content span.

    ``raw`` is the method's own output (signed if the method is signed); ``scores`` the same mapped to
    [0, 1] by :func:`llmattr.scores.retain_probs`.
    """

    token: str
    token_id: int
    raw: list[float]
    scores: list[float]
    position: int  # index of the input position whose logits predict this token
    logit: float | None = None
    target_delta: float | None = None  # path methods, DeepLIFT: F(x) - F(x0)
    convergence_delta: float | None = None  # sum of raw attributions over every input - target_delta (Captum)
    prob: float | None = None  # the model's probability of this token at this step (Inseq's "probability")


@dataclass(repr=False)
class Explanation:
    model: str
    method: str
    params: dict
    tokens: list[str]
    token_ids: list[int]
    span: tuple[int, int]
    steps: list[Step]
    timings: dict = field(default_factory=dict)
    signed: bool = False
    task: str | None = None
    text: str = ""
    offsets: list[tuple[int, int]] = field(default_factory=list)
    generated: str = ""
    forced: bool = False
    warnings: list[str] = field(default_factory=list)
    example: dict = field(default_factory=dict)
    classification: dict = field(default_factory=dict)  # label-word target record (llmattr.targets.label_record)
    scope: str = "span"  # what ``span`` covers: content span, whole prompt, or prompt + generated prefix
    version: int = SCHEMA_VERSION
    sources: Sources | None = None  # which prompt tokens form each source (docs/sources.md); None: no sources

    @classmethod
    def from_raw(cls, raw: torch.Tensor, signed: bool, step_tokens: list[str], step_ids: list[int],
                 positions: list[int], logits: list[float] | None = None, step_probs: list[float] | None = None,
                 step_info: dict | None = None, **kwargs) -> Explanation:
        """Build from a ``(steps, span)`` raw score tensor, mapping it to retain probabilities.

        ``step_info``: per-step values of further :class:`Step` fields (``{"convergence_delta": [...]}``).
        """
        probs, warnings = retain_probs(raw.detach().double().cpu(), signed)
        raw_rows = raw.detach().double().cpu().tolist()
        info = step_info or {}
        steps = [
            Step(token=tok, token_id=int(tid), raw=r, scores=p, position=int(pos),
                 logit=None if logits is None else float(logits[i]),
                 prob=None if step_probs is None else float(step_probs[i]),
                 **{name: float(values[i]) for name, values in info.items()})
            for i, (tok, tid, r, p, pos) in enumerate(zip(step_tokens, step_ids, raw_rows, probs.tolist(),
                                                          positions, strict=True))
        ]
        method = kwargs.get("method")
        named = [f"{method}: {warning}" if method else warning for warning in warnings]
        return cls(steps=steps, signed=signed, warnings=named + kwargs.pop("warnings", []), **kwargs)

    # ------------------------------------------------------------------ views
    @property
    def span_tokens(self) -> list[str]:
        """Tokens the scores cover (``scope="all"``: prompt tokens, then the generated prefix)."""
        return (self.tokens + [s.token for s in self.steps[:-1]])[self.span[0]: self.span[1]]

    @property
    def span_ids(self) -> list[int]:
        return (self.token_ids + [s.token_id for s in self.steps[:-1]])[self.span[0]: self.span[1]]

    def score_matrix(self, raw: bool = False) -> torch.Tensor:
        """``(steps, span)`` tensor of retain probabilities (or raw scores)."""
        return torch.tensor([s.raw if raw else s.scores for s in self.steps], dtype=torch.float64)

    @property
    def display_tokens(self) -> list[str]:
        """Each prompt token as the characters of the text it covers (:func:`llmattr.display.display_tokens`)."""
        return display_tokens(self.tokens, self.offsets, self.text)

    @property
    def span_display(self) -> list[str]:
        """:attr:`display_tokens` of the content span (what heatmaps show; ``scope="all"``: then the generated
        prefix)."""
        return span_display(self.tokens, self.offsets, self.text, self.span, [s.token for s in self.steps])

    def _word_spans(self) -> tuple[list[list[int]], list[str]]:
        """Span token indices grouped by the text's own words, and each group's word.

        Tokens past the prompt's offsets (scope ``all``: the generated prefix) are a word each."""
        a, b = self.span
        n_prompt = max(min(b, len(self.offsets)) - a, 0)
        groups, words = self._prompt_words(self.offsets[a: a + n_prompt]) if n_prompt else ([], [])
        extra = range(n_prompt, b - a)
        return groups + [[j] for j in extra], words + [self.span_tokens[j].strip() for j in extra]

    def _prompt_words(self, offsets: list[tuple[int, int]]) -> tuple[list[list[int]], list[str]]:
        """Prompt tokens (by their character ``offsets``) grouped by the text's words, and each group's text."""
        lo, hi = offsets[0][0], max(e for _, e in offsets)
        words = [m.span() for m in WORD.finditer(self.text, lo, hi)]
        owner = np.full(hi - lo, -1)
        for k, (s, e) in enumerate(words):
            owner[s - lo: e - lo] = k
        groups: list[list[int]] = []
        ranges: list[list[int]] = []  # first and last word of each group
        pending: list[int] = []  # tokens of spaces only: they join the next word
        for j, (s, e) in enumerate(offsets):
            covered = owner[max(s - lo, 0): max(e - lo, 0)]
            covered = covered[covered >= 0]
            if covered.size == 0:
                pending.append(j)
            elif groups and covered.min() <= ranges[-1][1]:  # shares a word (or a character) with the last
                groups[-1] += pending + [j]
                ranges[-1][1] = max(ranges[-1][1], int(covered.max()))
                pending = []
            else:
                groups.append(pending + [j])
                ranges.append([int(covered.min()), int(covered.max())])
                pending = []
        if pending:
            if not groups:
                return [pending], [self.text[lo:hi]]
            groups[-1] += pending
        return groups, [self.text[words[f][0]: words[l][1]] for f, l in ranges]

    def word_groups(self) -> list[list[int]]:
        """Span token indices grouped into the text's words by character offsets (tokenizer-agnostic).

        Words are runs of non-space characters of the text (each CJK ideograph one word, as BERT's basic
        tokenizer splits Chinese). A token belongs to the word(s) its characters fall in, so tokens that
        share a split multi-byte character, byte-level BPE (``Ġ``) and SentencePiece (``▁``) sub-words
        all group the same way; a token of spaces only joins the word after it.
        """
        return self._word_spans()[0]

    def words(self) -> tuple[list[str], np.ndarray]:
        """Words of the content span and ``(steps, words)`` word-level scores (sum of sub-word raw scores,
        paper 004 sec. 5.1), a numpy array like every other score view."""
        groups, words = self._word_spans()
        raw = self.to_numpy(raw=True)
        return words, np.stack([raw[:, g].sum(-1) for g in groups], axis=-1)

    def source_scores(self, raw: bool = True) -> np.ndarray:
        """``(steps, sources)``: each source's score, the sum of its tokens' raw scores (``raw=False``: of their
        [0, 1] scores) over its columns of the span (:meth:`llmattr.sources.Sources.columns`). Summing keeps a
        signed method's sign: a source whose tokens lowered the output gets a negative score. Every method
        gets source scores this way; LIME and the random baseline already spread one value per source evenly
        over its tokens, so the sum is that value (docs/sources.md)."""
        if self.sources is None:
            raise LlmattrError("this explanation has no sources; give documents=[...] or spans=[...] to explain")
        scores = self.to_numpy(raw=raw)
        return np.stack([scores[:, cols].sum(-1) for cols in self.sources.columns(self.span)], axis=-1)

    def source_texts(self) -> list[str]:
        """Each source's text (its characters of the prompt)."""
        return [] if self.sources is None else self.sources.texts(self.text)

    # ------------------------------------------------------------------ notebooks
    def to_numpy(self, raw: bool = False) -> np.ndarray:
        """``(steps, span)`` array of retain probabilities (or the method's raw scores)."""
        return self.score_matrix(raw=raw).numpy()

    def to_pandas(self):
        """Long form, one row per (step, content token): ``step``, ``target`` (the step's generated token),
        ``token``, ``position`` (index in the prompt), ``raw`` and ``score``.

        pandas is an optional dependency (``pip install pandas``); without it this raises LlmattrError.
        """
        n, (a, b) = len(self.steps), self.span
        return _pandas().DataFrame({
            "step": np.repeat(np.arange(n), b - a),
            "target": np.repeat([s.token for s in self.steps], b - a),
            "token": np.tile(np.array(self.span_display, dtype=object), n),
            "position": np.tile(np.arange(a, b), n),
            "raw": self.to_numpy(raw=True).ravel(),
            "score": self.to_numpy().ravel(),
        })

    def __repr__(self) -> str:
        return (f"Explanation(method={self.method!r}, model={self.model!r}, answer={self.generated!r}, "
                f"steps={len(self.steps)}, tokens={self.span[1] - self.span[0]}, task={self.task!r})")

    def _repr_html_(self) -> str:
        """The heatmap inline in Jupyter (the body of :func:`llmattr.render.to_html`)."""
        return render.heatmap_html(self)

    def to_html(self, path: str | Path | None = None, numbers: bool = False, shared_scale: bool = False) -> str:
        """The self-contained HTML page of ``llmattr explain --html`` (written to ``path`` when given)."""
        return _written(render.to_html(self, numbers=numbers, shared_scale=shared_scale), path)

    def show(self, numbers: bool | None = None, shared_scale: bool = False) -> None:
        """Show the heatmap: inline HTML in a notebook (IPython, optional), else in the terminal."""
        if not _show_html(render.heatmap_html(self, numbers=bool(numbers), shared_scale=shared_scale)):
            render.print_explanation(self, numbers=numbers, shared_scale=shared_scale)

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict:
        data = asdict(self)
        data["span"] = list(self.span)
        if self.sources is None:  # an explanation without sources writes the JSON it wrote before them
            del data["sources"]
        else:
            data["sources"] = self.sources.to_dict()
        data["offsets"] = [list(o) for o in self.offsets]
        return data

    def to_json(self, path: str | Path | None = None, indent: int | None = None) -> str:
        text = json.dumps(self.to_dict(), indent=indent, ensure_ascii=False)
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_dict(cls, data: dict) -> Explanation:
        known = {f.name for f in fields(cls)}  # extra keys (e.g. `explain --evaluate --json`'s metrics) are skipped
        data = {key: value for key, value in data.items() if key in known}
        data["steps"] = [Step(**s) for s in data["steps"]]
        data["params"] = current_params(data["params"], "explanation params")  # one written before a rename
        data["span"] = tuple(data["span"])
        data["offsets"] = [tuple(o) for o in data.get("offsets", [])]
        data["sources"] = None if data.get("sources") is None else Sources.from_dict(data["sources"])
        return cls(**data)

    @classmethod
    def from_json(cls, text_or_path: str | Path) -> Explanation:
        """From a JSON text or file (``to_json``'s, or ``llmattr explain --json``'s); a file that is not an
        Explanation raises LlmattrError."""
        text = str(text_or_path)
        where = "the JSON text"
        if not text.lstrip().startswith("{"):
            where = text
            try:
                text = Path(text).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as err:
                raise LlmattrError(f"cannot read explanation file {where}: {err}") from err
        try:
            return cls.from_dict(json.loads(text))
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise LlmattrError(f"{where} is not an llmattr Explanation JSON ({type(err).__name__}: {err})") from err



def _written(text: str, path: str | Path | None) -> str:
    if path is not None:
        Path(path).write_text(text, encoding="utf-8")
    return text


def _show_html(fragment: str) -> bool:
    """Display ``fragment`` when running in IPython/Jupyter (optional); False elsewhere."""
    try:
        from IPython import get_ipython
        from IPython.display import HTML, display
    except ImportError:
        return False
    if get_ipython() is None:
        return False
    display(HTML(fragment))
    return True


class Explanations(list):
    """Several explanations: a batch of texts and/or methods side by side (``llmattr.explain`` with a list
    of texts or of methods). A list of :class:`Explanation` (indexing, ``len``, iteration as usual) that

    - renders as one grid per text, tokens aligned in columns and a row per (method, step), in a notebook
      (``_repr_html_``), :meth:`show` and :meth:`to_html`;
    - tabulates as one long table with ``method``, ``model`` and ``example`` columns (:meth:`to_pandas`);
    - keeps ``examples`` (the index in the input list of each explanation's text) and ``failed``
      (``{input index: why}``: the items that could not be explained; the others are kept).
    """

    def __init__(self, items: Iterable[Explanation] = (), examples: Iterable[int] | None = None,
                 failed: dict[int, str] | None = None):
        super().__init__(items)
        self.examples = list(range(len(self))) if examples is None else list(examples)
        self.failed = dict(failed or {})

    def _example(self, k: int) -> int:
        return self.examples[k] if len(self.examples) == len(self) else k

    def __repr__(self) -> str:
        methods = ", ".join(dict.fromkeys(e.method for e in self))
        texts = len({self._example(k) for k in range(len(self))})
        failed = f"; failed {self.failed}" if self.failed else ""
        return f"Explanations({len(self)} of {texts} text(s); methods {methods or '-'}{failed})"

    def _failed_html(self) -> str:
        return "".join(f'<p class="meta">item {i} not explained: {html.escape(why)}</p>'
                       for i, why in self.failed.items())

    def _repr_html_(self) -> str:
        return render.grid_html(self) + self._failed_html()

    def to_html(self, path: str | Path | None = None, numbers: bool = False, shared_scale: bool = False) -> str:
        """A self-contained page of the grid (written to ``path`` when given)."""
        return _written(render.grid_page(self, numbers=numbers, shared_scale=shared_scale), path)

    def show(self, numbers: bool | None = None, shared_scale: bool = False) -> None:
        """The grid in a notebook; in a terminal each explanation's heatmap in turn."""
        if not _show_html(render.grid_html(self, numbers=bool(numbers), shared_scale=shared_scale)
                          + self._failed_html()):
            for expl in self:
                render.print_explanation(expl, numbers=numbers, shared_scale=shared_scale)

    def to_pandas(self):
        """Every explanation's :meth:`Explanation.to_pandas` rows, after ``method``, ``model`` and ``example``
        (the index of its text in the input list) columns."""
        if not self:
            raise LlmattrError("no explanations to tabulate")
        frames = [expl.to_pandas() for expl in self]
        for k, (frame, expl) in enumerate(zip(frames, self, strict=True)):
            frame.insert(0, "example", self._example(k))
            frame.insert(0, "model", expl.model)
            frame.insert(0, "method", expl.method)
        return _pandas().concat(frames, ignore_index=True)


def _pandas():
    """pandas, an optional dependency: without it ``to_pandas()`` raises LlmattrError with the install line."""
    try:
        import pandas
    except ImportError as err:
        raise LlmattrError("to_pandas() needs pandas, which llmattr does not install: pip install pandas") from err
    return pandas
