"""The model card's old home: :mod:`llmattr.model_card` (torch-free, so that ``llmattr finetune`` reads an
``--out`` folder's card before torch is imported)."""

from __future__ import annotations

from ..model_card import CARD_FACTS, CARD_NAME, card_facts, card_path, content_hash, read_card

__all__ = ["CARD_FACTS", "CARD_NAME", "card_facts", "card_path", "content_hash", "read_card"]
