"""The model card of a model that ``llmattr finetune`` made: what it was trained on, read wherever it is loaded.

``llmattr finetune --out DIR`` writes ``DIR/llmattr_finetune.json`` (machine-readable) beside ``DIR/README.md``
(the same facts for a person). ``llmattr evaluate --model DIR`` reads it to leave out every row the model was
trained on, and stores its facts with the results so that ``llmattr report`` shows them beside the accuracy table.
Nothing here imports torch (``llmattr finetune --out DIR`` reads its card before the model loads); the old import
path :mod:`llmattr.models.card` keeps working.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .declarations import current_card
from .errors import LlmattrError

CARD_NAME = "llmattr_finetune.json"
CARD_FACTS = ("base_model", "task", "loss", "data", "seed", "n_train", "held_out")  # shown by the report


def card_path(folder: str | Path) -> Path:
    return Path(folder) / CARD_NAME


def read_card(model: str | Path) -> dict | None:
    """The card of a finetune's folder ``model``, its facts under their current names (a card written before a
    fact was renamed reads the same: :func:`~llmattr.declarations.current_card`); None for anything else (a hub id,
    'default', a .gguf)."""
    path = card_path(model)
    try:
        if not path.is_file():
            return None
        return current_card(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError) as err:
        raise LlmattrError(f"{path} is not a readable model card ({err})") from err


def content_hash(text: str) -> str:
    """Short SHA-256 of an example's user content: a row the model saw is recognised in any file."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def card_facts(card: dict) -> dict:
    """The facts a report shows beside its accuracy table (no id lists, no loss curve)."""
    return {key: card[key] for key in CARD_FACTS if key in card}
