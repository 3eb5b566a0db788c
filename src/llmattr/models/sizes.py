"""Memory sizes as users write them, one convention for the whole tool.

``2GB``, ``512 MB``, ``1.5G``, ``20GiB`` or a plain number of bytes. Units are binary (1 GB = 1 GiB = 2**30 bytes),
as the memory guard prints them, for ``LLMATTR_MEMORY_LIMIT`` and ``--max-memory`` alike. (accelerate alone would
read ``--max-memory``'s ``GB`` as 10**9 bytes; llmattr hands it bytes.)
"""

from __future__ import annotations

import re

UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(?:([KMGT])I?)?B?", re.IGNORECASE)


def parse_size(text: str) -> int | None:
    """Bytes of ``text``, or None when it is not a size."""
    found = SIZE.fullmatch(text.strip())
    return int(float(found[1]) * UNITS[(found[2] or "").upper()]) if found else None
