"""Byte-identical report from a frozen store (written by tests/data/make_report_store.py before the layout
refactor of issue 11): the md, LaTeX, CSV and HTML output must not change while the code is reorganised.

Compared byte for byte: report.md, tables.tex and every table CSV except the timing table (wall times).
The HTML is compared after two normalisations, because it embeds non-deterministic or platform-dependent
bytes: the timing section (``strip_timings`` in conftest.py) and the base64 PNG data of the
figures (matplotlib's rasteriser may differ between versions), which is replaced by ``PNG``. The PNG
files themselves are not compared. ``python tests/test_report_golden.py --update`` rewrites the expected
files (only when a change of the report is intended).
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest

from conftest import strip_timings
from llmattr.api import catalog
from llmattr.report import build_report

DATA = Path(__file__).parent / "data"
STORE = DATA / "report_store.sqlite"
EXPECTED = DATA / "report_expected"
PNG = re.compile(r"data:image/png;base64,[A-Za-z0-9+/=]+")


def rendered(out: Path) -> dict[str, bytes]:
    """The report's comparable files, normalised as the module docstring says."""
    store = out / STORE.name
    shutil.copy(STORE, store)  # render from a copy: the committed file is never opened for writing
    _, written = build_report([store], out / "report", ("md", "latex", "csv", "html"), catalog=catalog())
    files = {}
    for path in written:
        if path.suffix == ".png" or path.stem == "table6_time":
            continue
        data = path.read_bytes()
        if path.suffix == ".html":
            data = PNG.sub("data:image/png;base64,PNG", strip_timings(data.decode("utf-8"))).encode("utf-8")
        files[path.name] = data
    return files


def test_report_is_byte_identical_to_the_frozen_one(tmp_path):
    expected = {path.name: path.read_bytes() for path in sorted(EXPECTED.iterdir())}
    assert len(expected) >= 10
    got = rendered(tmp_path)
    assert sorted(got) == sorted(expected)
    assert b"\\caption{Table " not in got["tables.tex"]  # LaTeX writes "Table N:" itself
    for name, data in expected.items():
        assert got[name] == data, f"{name} differs from tests/data/report_expected/{name}"


if __name__ == "__main__" and "--update" in sys.argv:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        files = rendered(Path(tmp))
    shutil.rmtree(EXPECTED, ignore_errors=True)
    EXPECTED.mkdir()
    for name, data in files.items():
        (EXPECTED / name).write_bytes(data)
    print(f"wrote {len(files)} files into {EXPECTED}")
elif __name__ == "__main__":
    pytest.main([__file__])
