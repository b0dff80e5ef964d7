"""The committed result tables read back on a CPU (``calibration.tables``): every executor target gets a verdict
from them, and a missing or malformed table is one ValueError naming the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from calibration.tables import matrix_errors, read_table, verdicts

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
TABLES = (RESULTS / "executor" / "stages.csv", RESULTS / "executor" / "attention.csv",
          RESULTS / "executor" / "throughput.csv", ROOT / "calibration" / "profiles" / "h200-kernels.json",
          RESULTS / "validation" / "summary.csv")


def test_every_target_has_a_verdict_from_the_committed_tables() -> None:
    rows = verdicts(*TABLES)
    assert len(rows) == 6
    assert all(row.target and row.measured for row in rows)
    assert rows[-1].met  # the validation matrix: median and worst error within their limits


def test_validation_summary_figures_are_errors_in_percent() -> None:
    import pandas as pd

    errors = matrix_errors(pd.read_csv(RESULTS / "validation" / "summary.csv"))
    assert all(0 <= value < 100 for value in errors.values())


def test_a_missing_or_foreign_table_is_named(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"none\.csv"):
        read_table(tmp_path / "none.csv", "stage", ("model",))
    with pytest.raises(ValueError, match="no nosuch column"):
        read_table(RESULTS / "executor" / "attention.csv", "stage", ("nosuch",))
