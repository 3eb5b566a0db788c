"""The name of :mod:`llmattr.declarations` before issue 39: a metric plugin written then keeps importing its table
and figure declarations from here (``from llmattr.specs import MetricRow, TableSpec``, as docs/evaluate.md showed).
"""

from __future__ import annotations

from .declarations import Catalog, FigureSpec, MetricRow, TableSpec

__all__ = ["Catalog", "FigureSpec", "MetricRow", "TableSpec"]
