"""The Explanation: one explained prompt, JSON round-trip and word-level aggregation."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch

from .scores import retain_probs

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


@dataclass
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

    @classmethod
    def from_raw(cls, raw: torch.Tensor, signed: bool, step_tokens: list[str], step_ids: list[int],
                 positions: list[int], logits: list[float] | None = None, step_info: dict | None = None,
                 **kwargs) -> Explanation:
        """Build from a ``(steps, span)`` raw score tensor, mapping it to retain probabilities.

        ``step_info``: per-step values of further :class:`Step` fields (``{"convergence_delta": [...]}``).
        """
        probs, warnings = retain_probs(raw.detach().double().cpu(), signed)
        raw_rows = raw.detach().double().cpu().tolist()
        info = step_info or {}
        steps = [
            Step(token=tok, token_id=int(tid), raw=r, scores=p, position=int(pos),
                 logit=None if logits is None else float(logits[i]),
                 **{name: float(values[i]) for name, values in info.items()})
            for i, (tok, tid, r, p, pos) in enumerate(zip(step_tokens, step_ids, raw_rows, probs.tolist(),
                                                          positions, strict=True))
        ]
        return cls(steps=steps, signed=signed, warnings=warnings + kwargs.pop("warnings", []), **kwargs)

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

    def word_groups(self) -> list[list[int]]:
        """Span token indices grouped into words by character offsets (tokenizer-agnostic).

        A token continues the previous word when it starts exactly where the previous one ends and
        neither side of the boundary is whitespace (a token that is only a space joins the next word);
        this works for byte-level BPE (``Ġ``-prefixed GPT-2/SmolLM tokens) and SentencePiece (``▁``) alike
        because it reads the text, not the markers.
        """
        a, b = self.span
        groups: list[list[int]] = []
        visible = True  # does the last group hold any non-space text yet?
        prev_end = None
        for j, i in enumerate(range(a, b)):
            if i >= len(self.offsets):  # a generated token (scope "all"): a word of its own
                groups.append([j])
                visible, prev_end = True, None
                continue
            s, e = self.offsets[i]
            piece = self.text[s:e]
            glued = (prev_end is not None and s == prev_end and piece[:1].strip() != ""
                     and self.text[s - 1: s].strip() != "")
            if groups and (glued or not visible):  # a lone space token ('▁') joins the word after it
                groups[-1].append(j)
                visible = visible or piece.strip() != ""
            else:
                groups.append([j])
                visible = piece.strip() != ""
            prev_end = e
        return groups

    def words(self) -> tuple[list[str], torch.Tensor]:
        """Words of the content span and word-level scores (sum of sub-word raw scores, paper 004 sec. 5.1)."""
        groups = self.word_groups()
        a = self.span[0]
        words = [self.text[self.offsets[a + g[0]][0]: self.offsets[a + g[-1]][1]].strip()
                 if a + g[-1] < len(self.offsets) else self.span_tokens[g[0]].strip() for g in groups]
        raw = self.score_matrix(raw=True)
        summed = torch.stack([raw[:, g].sum(-1) for g in groups], dim=-1)
        return words, summed

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict:
        data = asdict(self)
        data["span"] = list(self.span)
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
        data["span"] = tuple(data["span"])
        data["offsets"] = [tuple(o) for o in data.get("offsets", [])]
        return cls(**data)

    @classmethod
    def from_json(cls, text_or_path: str | Path) -> Explanation:
        text = str(text_or_path)
        if not text.lstrip().startswith("{"):
            text = Path(text).read_text()
        return cls.from_dict(json.loads(text))
