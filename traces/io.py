"""Reading and writing request + exit-depth traces as CSV or Parquet (by extension; one schema).

One row per request: ``request_id`` (int, unique), ``prompt_len`` (int >= 1), ``output_len`` (int >= 1, the first
token included), ``arrival_s`` (float >= 0, seconds from the run's start), ``exit_depths`` (the 1-indexed loops asked
for by output tokens 1 .. output_len - 1: space-separated in CSV, a list<int16> in Parquet). A malformed file is a
one-line error naming the file and the line (CSV, header = 1) or row (Parquet).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from traces.errors import InputError, require, require_file
from traces.request import MAX_ARRIVAL_S, Request

COLUMNS = ("request_id", "prompt_len", "output_len", "arrival_s", "exit_depths")
FORMATS = (".csv", ".parquet")
MAX_ID = 2**53  # ids are parsed as floats: larger ones would collide
MAX_TOKENS = 2**31 - 1  # a longer prompt or output overflows the per-token int32 metadata


def _format(path: Path) -> str:
    suffix = path.suffix.lower()
    require(suffix in FORMATS, f"{path}: trace files must end in .csv or .parquet")
    return suffix


def write_trace(requests: list[Request], path: str | Path) -> Path:
    """Write ``requests`` to ``path`` (.csv or .parquet)."""
    import pandas as pd  # a costly import that only reading and writing files need

    path = Path(path)
    fmt = _format(path)
    frame = pd.DataFrame({"request_id": [r.request_id for r in requests],
                          "prompt_len": [r.prompt_len for r in requests],
                          "output_len": [r.output_len for r in requests],
                          "arrival_s": [float(r.arrival) for r in requests]})
    if fmt == ".csv":
        frame["exit_depths"] = [" ".join(map(str, r.depths.tolist())) for r in requests]
        frame.to_csv(path, index=False)
    else:
        frame["exit_depths"] = [np.asarray(r.depths, dtype=np.int16) for r in requests]
        frame.to_parquet(path, index=False, compression="zstd")
    return path


def read_trace(path: str | Path, r_max: int | None = None) -> list[Request]:
    """Read a trace; with ``r_max`` every depth must lie in ``[1, r_max]``."""
    import pandas as pd

    path = Path(path)
    fmt = _format(path)
    require_file(path, "trace file")
    where = (lambda i: f"{path}:{i + 2}") if fmt == ".csv" else (lambda i: f"{path}: row {i}")
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False) if fmt == ".csv" else pd.read_parquet(path)
    except Exception as exc:
        raise InputError(f"{path}: not a readable {fmt[1:]} trace ({str(exc).splitlines()[0]})") from None
    # pandas takes a first data row with one field more than the header as an index column, shifting
    # every value one column left: refuse it rather than report the shifted values
    require(isinstance(frame.index, pd.RangeIndex),
            f"{where(0)}: more fields than the header's {len(frame.columns)}")
    missing = [c for c in COLUMNS if c not in frame.columns]
    require(not missing, f"{path}: missing column(s) {', '.join(missing)}; expected {', '.join(COLUMNS)}")
    empty = f"{where(0)}: no requests (the file has only a header)" if fmt == ".csv" else f"{path}: no rows"
    require(len(frame) > 0, empty)

    def numbers(column: str, kind: type, minimum: float, maximum: float) -> np.ndarray:
        values = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=float)
        bad = ~np.isfinite(values) | (values < minimum) | (values > maximum)
        if kind is int:
            bad |= values != np.round(values)
        if bad.any():
            i = int(np.argmax(bad))
            raise InputError(f"{where(i)}: {column} must be a {'whole ' if kind is int else ''}number "
                             f"in [{minimum:g}, {maximum:g}], got {frame[column].iloc[i]!r}")
        return values

    ids = numbers("request_id", int, 0, MAX_ID).astype(np.int64)
    prompt = numbers("prompt_len", int, 1, MAX_TOKENS).astype(np.int64)
    output = numbers("output_len", int, 1, MAX_TOKENS).astype(np.int64)
    arrival = numbers("arrival_s", float, 0.0, MAX_ARRIVAL_S)
    dup = pd.Series(ids).duplicated().to_numpy()
    require(not dup.any(), f"{where(int(np.argmax(dup)))}: duplicate request_id {ids[np.argmax(dup)]}")

    requests = []
    for i, raw in enumerate(frame["exit_depths"]):
        depths = _parse_depths(raw, where(i))
        require(len(depths) == output[i] - 1,
                f"{where(i)}: exit_depths has {len(depths)} values, expected output_len - 1 = {output[i] - 1}")
        if len(depths):
            low, high = int(depths.min()), int(depths.max())
            limit = r_max if r_max is not None else np.iinfo(np.int16).max
            require(low >= 1 and high <= limit,
                    f"{where(i)}: exit depth {low if low < 1 else high} is outside [1, r_max = {limit}]")
        requests.append(Request(int(ids[i]), int(prompt[i]), int(output[i]), float(arrival[i]),
                                depths.astype(np.int16)))
    return requests


def _parse_depths(raw: object, where: str) -> np.ndarray:
    if isinstance(raw, str):
        try:
            return np.array([int(tok) for tok in raw.split()], dtype=np.int64)
        except (ValueError, OverflowError):  # not a whole number, or one past int64
            raise InputError(f"{where}: exit_depths must be space-separated whole numbers, got {raw[:40]!r}") from None
    try:
        values = np.asarray(raw if raw is not None else [], dtype=float)
    except (TypeError, ValueError):
        raise InputError(f"{where}: exit_depths must be a list of whole numbers") from None
    if values.ndim != 1 or not np.all(values == np.round(values)):
        raise InputError(f"{where}: exit_depths must be a list of whole numbers")
    return values.astype(np.int64)
