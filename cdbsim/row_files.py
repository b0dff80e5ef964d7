"""Rows streamed to Parquet (and CSV) in batches, under temporary names that are renamed into place only
when every row is written: memory stays flat in the number of rows, and a failed or interrupted run leaves
no half-written file behind (nor a previous file of the same name damaged)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from cdbsim.outputs import check_file, staging_name

if TYPE_CHECKING:
    import pyarrow as pa

BATCH_ROWS = 128


class RowWriter:
    """Writes rows of ``schema`` to a Parquet file and/or a CSV file (either may be None)."""

    def __init__(self, schema: pa.Schema, parquet: str | Path | None = None, csv: str | Path | None = None) -> None:
        import pyarrow.csv as pcsv
        import pyarrow.parquet as pq

        self.schema = schema
        kinds = [(parquet, "--out", ".parquet", pq.ParquetWriter), (csv, "--csv", ".csv", pcsv.CSVWriter)]
        chosen = [(check_file(path, what, (suffix,)), make) for path, what, suffix, make in kinds if path is not None]
        self.targets = [target for target, _ in chosen]
        self.temporaries = [staging_name(target) for target in self.targets]
        self.writers: list[Any] = []
        self.batch: list[dict[str, Any]] = []
        try:
            for (_, make), temporary in zip(chosen, self.temporaries, strict=True):
                self.writers.append(make(temporary, schema))
        except BaseException:
            self.abort()
            raise

    def add(self, row: dict[str, Any]) -> None:
        self.batch.append(row)
        if len(self.batch) >= BATCH_ROWS:
            self.flush()

    def flush(self) -> None:
        if self.batch and self.writers:
            import pyarrow as pa

            table = pa.Table.from_pylist(self.batch, schema=self.schema)
            for writer in self.writers:
                writer.write_table(table)
        self.batch = []

    def close(self) -> None:
        """Write what is left and move every file into place."""
        self.flush()
        for writer in self.writers:
            writer.close()
        self.writers = []
        for temporary, target in zip(self.temporaries, self.targets, strict=True):
            os.replace(temporary, target)

    def abort(self) -> None:
        """Drop everything written so far."""
        for writer in self.writers:
            with contextlib.suppress(Exception):  # the file is removed next either way
                writer.close()
        self.writers = []
        for temporary in self.temporaries:
            temporary.unlink(missing_ok=True)

    def __enter__(self) -> RowWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()
