"""Memory sizes as users write them, one convention for the whole tool.

``2GB``, ``512 MB``, ``1.5G``, ``20GiB`` or a plain number of bytes. Units are binary (1 GB = 1 GiB = 2**30 bytes),
as the memory guard prints them, for ``LLMATTR_MEMORY_LIMIT`` and ``--max-memory`` alike. (accelerate alone would
read ``--max-memory``'s ``GB`` as 10**9 bytes; llmattr hands it bytes.)
"""

from __future__ import annotations

import re

from .errors import LlmattrError

UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(?:([KMGT])I?)?B?", re.IGNORECASE)


def parse_size(text: str) -> int | None:
    """Bytes of ``text``, or None when it is not a size."""
    found = SIZE.fullmatch(text.strip())
    return int(float(found[1]) * UNITS[(found[2] or "").upper()]) if found else None


def parse_max_memory(text: str | dict | None) -> dict | None:
    """``"cpu=2GB,0=20GB"`` -> ``{"cpu": 2 * 2**30, 0: 20 * 2**30}``: accelerate's ``max_memory`` in bytes per device
    (``cpu``, a GPU index, ``disk``; binary units as everywhere in llmattr, :func:`parse_size`); a dict passes through.
    One-line error for anything else."""
    if text is None or isinstance(text, dict):
        return text
    found: dict = {}
    for item in filter(None, (part.strip() for part in str(text).split(","))):
        key, _, size = (x.strip() for x in item.partition("="))
        size_bytes = parse_size(size)
        if not (key in ("cpu", "disk") or key.isdigit()) or size_bytes is None:
            raise LlmattrError(f"max-memory {item!r} is not device=size; write e.g. cpu=2GB,0=20GB")
        found[int(key) if key.isdigit() else key] = size_bytes
    if not found:
        raise LlmattrError("max-memory is empty; write e.g. cpu=2GB,0=20GB")
    return found
