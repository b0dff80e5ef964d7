"""Every repository path the README and the guides cite (``benchmarks/...``, ``calibration/...``, ``docs/...``)
exists, so a moved or deleted file cannot leave a dangling reference behind."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
CITED = re.compile(r"(?<![\w/.-])((?:benchmarks|calibration|docs)/[\w./-]*[\w/])")


def _cited(doc: Path) -> list[str]:
    return sorted({m.group(1).rstrip("/.") for m in CITED.finditer(doc.read_text())})


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(ROOT)))
def test_every_cited_path_exists(doc: Path) -> None:
    missing = [path for path in _cited(doc) if not (ROOT / path).exists()]
    assert not missing, f"{doc.relative_to(ROOT)} cites missing paths: {missing}"
