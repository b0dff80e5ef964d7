"""Every committed result the documentation names is in the repository.

README.md, docs/ and the results folders' READMEs quote figures beside the folder or file they came from. A
path that a fresh clone lacks (never committed, or caught by an ignore rule) leaves a figure without its
evidence, so each ``benchmarks/results/...`` path they name must exist; a ``*`` in it must match something.
Paths read from an older commit (``git show COMMIT:benchmarks/results/...``) are exempt.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PATH = re.compile(r"(?<![\w:/.-])benchmarks/results/[\w./*-]+")


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
            *sorted((ROOT / "benchmarks" / "results").rglob("README.md"))]


def named_paths(text: str) -> list[str]:
    """The ``benchmarks/results/...`` paths ``text`` names, trailing punctuation dropped."""
    return [m.group(0).rstrip(".,") for m in PATH.finditer(text)]


def missing(paths: list[str]) -> list[str]:
    return [p for p in paths if not (any(ROOT.glob(p)) if "*" in p else (ROOT / p).exists())]


def test_the_path_pattern_finds_paths_and_skips_older_commits() -> None:
    text = ("(`benchmarks/results/executor-table/stages/stages.csv`, see benchmarks/results/nowhere/x.csv.) "
            "`git show 544a3bb:benchmarks/results/head-major/board2/measured-logs.tgz`")
    assert named_paths(text) == ["benchmarks/results/executor-table/stages/stages.csv",
                                 "benchmarks/results/nowhere/x.csv"]
    assert missing(named_paths(text)) == ["benchmarks/results/nowhere/x.csv"]


def test_every_result_the_documents_name_is_committed() -> None:
    gaps = {str(doc.relative_to(ROOT)): gone for doc in documents()
            if (gone := missing(named_paths(doc.read_text())))}
    assert not gaps, gaps
