"""Write ``report_store.sqlite``: the frozen store of the byte-identical report test (tests/test_report_golden.py).

Run once from the repository root (``python tests/data/make_report_store.py``), then render the expected
files with ``python tests/test_report_golden.py --update``. The store was written before the layout
refactor of issue 11; rewriting it is only needed when the store schema changes.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))

from conftest import build_tiny, make_tiny_tokenizer  # noqa: E402
from llmattr.evaluation import EvalConfig, run  # noqa: E402


def main() -> None:
    out = HERE / "report_store.sqlite"
    out.unlink(missing_ok=True)
    lm = build_tiny("llama", make_tiny_tokenizer(), max_position_embeddings=2048)
    cfg = EvalConfig(datasets=["sst2", "imdb"], methods=["grad-ellm", "attention", "random"],
                     metrics=["pi-soft", "soft", "deletion-insertion", "comp-suff", "log-odds"],
                     routing="both", n=3, samples=2, step_stride=5, out=str(out), device="cpu")
    summary = run(cfg, lm=lm, progress=False)
    print(summary)


if __name__ == "__main__":
    main()
