"""The launch log and the per-request log: one schema, whichever clock (simulated or GPU) filled them.

Both drivers call :meth:`RunRecorder.record` once per launch with its device start and end (seconds from the start
of the run) and the host time spent planning it. :class:`RunLog` is what the report, the plots and ``cdbsim
validate`` read; :meth:`RunLog.save` writes it as Parquet or CSV, with ``meta.json`` and a Trace Event timeline.

Launch log columns: ``index, stage, size, padded, items, context, longest, kv_copies, start, end, host_s,
step_mix`` (``"0:12 1:30"``, core launches), ``exits``, ``tokens`` (tokens produced),
``queue_waiting, queue_core, queue_coda, active``, ``kv_used`` (KV blocks held when the launch was planned).

Request log columns: ``request_id, prompt_len, output_len, arrival, scheduled`` (first prefill launch
start), ``first_token, finish``, and ``token_times`` (the time each output token was produced).
"""

from __future__ import annotations

import json
import mmap
import struct
from dataclasses import dataclass, field
from itertools import compress
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from cdbsim.errors import ConfigError, read_json, require
from cdbsim.serving.config import Policy
from cdbsim.serving.launch import STAGES, Launch, SchedulerState, Stage
from traces.choice import Choice
from traces.request import Request

if TYPE_CHECKING:
    from cdbsim.serving.scheduler import Scheduler

TIMELINE = "trace.json.gz"  # the Trace Event file beside each saved log (Perfetto UI, chrome://tracing)
# zstd without dictionaries: launch times are distinct floats, which a dictionary only inflates
PARQUET = {"compression": "zstd", "compression_level": 9, "use_dictionary": False}


class LogFormat(Choice):
    """How launch and request logs are saved: Parquet (typed, compact) or CSV (readable anywhere)."""

    PARQUET = "parquet"
    CSV = "csv"

    @property
    def suffix(self) -> str:
        return f".{self.value}"

    @classmethod
    def what(cls) -> str:
        return "log format"


LAUNCH_COLUMNS = ("index", "stage", "size", "padded", "items", "context", "longest", "kv_copies", "start", "end",
                  "host_s", "step_mix", "exits", "tokens", "queue_waiting", "queue_core", "queue_coda",
                  "active", "kv_used")
# RunRecorder's packed row per launch: int32 counts (int64 context: a sum over items; the stage as its index in
# STAGES; steps: how many loop steps the launch lists) and float64 times
_ROW = np.dtype([(name, "<i8" if name == "context" else "<i4")
                 for name in ("index", "stage", "size", "padded", "items", "context", "longest", "kv_copies", "exits",
                              "tokens", "queue_waiting", "queue_core", "queue_coda", "active", "kv_used", "steps")]
                + [(name, "<f8") for name in ("start", "end", "host_s")])
_PACK = struct.Struct("<" + "i" * 5 + "q" + "i" * 10 + "d" * 3)
_CHUNK_ROWS = 8192
_MIX_CHUNK = 1 << 12  # launches whose step mixes are counted at once
_PIECE_TOKENS = 1 << 16  # tokens whose times are placed at once (about: whole launches)
_STAGE_CODE = {stage: code for code, stage in enumerate(STAGES)}
_STAGE_NAME = np.array([stage.value for stage in STAGES], dtype=object)


def run_meta(scheduler: Scheduler, **extra: object) -> dict:
    """What produced a run, as its log records it: the architecture, the serving configuration and what the
    scheduler did, plus the backend's own facts (``extra``: the profile, the device, ...)."""
    arch, config = scheduler.arch, scheduler.config
    return {"arch": arch.name, "split": arch.split, "r_max": arch.r_max, "r_min": scheduler.r_min,
            "policy": config.policy.value, "width": config.width,
            "coda_batch": None if config.policy is Policy.ADAPTIVE else config.coda_batch,  # adaptive has none
            "prefill_budget": config.prefill_budget, "timing": config.timing.value,
            "layout": config.layout.value, "core_launch": config.core_launch.value, "config": config.describe(),
            "kv_blocks": scheduler.kv.total,
            "requests": len(scheduler.requests), "launches": scheduler.launches,
            "preemptions": scheduler.preemptions, **extra}


class RunRecorder:
    """Collects launch rows and token times during a run (a hot path: each launch packs one fixed-width row into a
    preallocated buffer; the tables are built once, in :meth:`finish`). The request of each token produced is kept
    in launch order, and loop steps laid end to end (step-mix strings are made buffer by buffer)."""

    def __init__(self, requests: list[Request], keep_step_mix: bool = True, chunk_rows: int = _CHUNK_ROWS) -> None:
        self.requests = requests
        self.keep_step_mix = keep_step_mix
        self.chunk_rows = chunk_rows             # launches a buffer holds
        self._chunks: list[mmap.mmap] = []       # full buffers
        self._buffer = _row_buffer(chunk_rows)
        self._offset = 0
        self._producers: list[int] = []           # request of each token produced, in launch order
        self._steps: list[int] = []               # loop steps of the launches that list them, in order
        self._done_producers: list[np.ndarray] = []  # of each full buffer's launches: producers as a narrow
        self._done_mixes: list[np.ndarray] = []      # array, and the step-mix strings
        self._scheduled: list[float] = [np.nan] * len(requests)
        self._first_start: float | None = None

    def record(self, launch: Launch, state: SchedulerState, start: float, end: float, host_s: float = 0.0) -> None:
        if self._offset == len(self._buffer):
            self._next_chunk()
        stage = launch.stage
        requests = launch.requests
        if stage is Stage.PREFILL:
            scheduled = self._scheduled
            for i in requests:
                if scheduled[i] != scheduled[i]:  # NaN: first time scheduled
                    scheduled[i] = start
            finished = list(compress(requests, launch.finishes))
            self._producers += finished
            produced = len(finished)
            if self._first_start is None:
                self._first_start = start
        elif stage is Stage.CODA or stage is Stage.DECODE:
            self._producers += requests
            produced = len(requests)
        else:
            produced = 0
        steps, exits = launch.steps, launch.exits
        if steps:
            self._steps += steps
        _PACK.pack_into(
            self._buffer, self._offset, launch.index, _STAGE_CODE[stage], launch.size, launch.padded,
            len(requests), launch.context, launch.longest, launch.kv_copies, exits.count(True) if exits else 0,
            produced, state.waiting, state.core, state.coda, state.active, state.kv_used,
            len(steps), start, end, host_s)
        self._offset += _PACK.size

    def _next_chunk(self) -> None:
        """Keep the full buffer, start another, and pack its pending tokens and step mixes."""
        full = self._buffer
        self._chunks.append(full)
        self._buffer = _row_buffer(self.chunk_rows)
        self._offset = 0
        self._done_producers.append(np.array(self._producers, dtype=np.int32))
        self._done_mixes.append(self._mixes(np.frombuffer(full, dtype=_ROW)["steps"].copy()))
        self._producers, self._steps = [], []

    def _mixes(self, counts: np.ndarray) -> np.ndarray:
        """The step mixes of the launches whose step counts are ``counts`` and whose steps are pending."""
        if not self.keep_step_mix:
            return np.full(len(counts), "", dtype=object)
        return _step_mixes(np.array(self._steps, dtype=np.int16), counts)

    def finish(self, meta: dict | None = None) -> RunLog:
        # column by column from the packed buffers, each let go once copied: the rows are held once, plus a buffer
        chunks: list = [*self._chunks, self._buffer[:self._offset]]
        self._chunks, self._buffer, self._offset = [], _row_buffer(0), 0
        rows = sum(len(chunk) for chunk in chunks) // _PACK.size
        column = {name: np.empty(rows, dtype=np.float64 if _ROW[name].kind == "f" else np.int64)
                  for name in _ROW.names or ()}
        row = 0
        for k, chunk in enumerate(chunks):
            part = np.frombuffer(chunk, dtype=_ROW)
            for name, values in column.items():
                values[row:row + len(part)] = part[name]
            row += len(part)
            del part
            chunks[k] = b""  # let each buffer go once copied
        if len(column["index"]) == 1 and type(self._first_start) is int:
            column["start"] = column["start"].astype(np.int64)  # a lone prefill at t = 0 keeps its int start
        column["stage"] = _STAGE_NAME[column["stage"]]
        counts = column.pop("steps")
        column["step_mix"] = np.concatenate([*self._done_mixes,
                                             self._mixes(counts[len(self._done_mixes) * self.chunk_rows:])])
        launches = pd.DataFrame({name: column[name] for name in LAUNCH_COLUMNS}, copy=False)
        ends, tokens = column["end"], column["tokens"]
        del column, counts  # the frame holds its own copy: a large run keeps one copy at a time
        producers = [*self._done_producers, np.array(self._producers, dtype=np.int32)]
        self._done_producers, self._producers, self._done_mixes, self._steps = [], [], [], []
        times_of, first, last = _token_times(producers, ends, tokens, len(self.requests), self.chunk_rows)
        requests = pd.DataFrame({**{key: [getattr(r, key) for r in self.requests]
                                    for key in ("request_id", "prompt_len", "output_len", "arrival")},
                                 "scheduled": self._scheduled, "first_token": first, "finish": last})
        return RunLog(launches=launches, requests=requests, token_times=times_of, meta=dict(meta or {}))


def _row_buffer(rows: int) -> mmap.mmap:
    """A buffer of ``rows`` launch rows in pages of its own, so that the memory goes back to the system as
    soon as the buffer is let go (freed heap memory would stay with the process)."""
    return mmap.mmap(-1, max(rows, 1) * _PACK.size)


def _token_times(parts: list[np.ndarray], launch_ends: np.ndarray, tokens: np.ndarray, n: int,
                 part_rows: int) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """Each request's token times (views of one array), its first and its last (NaN without tokens), from
    the request of every token produced, in launch order, in ``parts`` of ``part_rows`` launches each
    (emptied here), and each launch's end and tokens produced. Tokens are placed a few launches at a time
    (:func:`_place`), so the token times are the only array as long as the run's tokens."""
    counts = np.zeros(n, dtype=np.int64)
    for part in parts:
        counts += np.bincount(part, minlength=n)
    bounds = np.cumsum(counts)
    starts = bounds - counts
    times = np.empty(int(bounds[-1]) if n else 0)
    cursor = starts.copy()  # where each request's next token time goes
    for k, part in enumerate(parts):
        made = tokens[k * part_rows:(k + 1) * part_rows]
        ends = launch_ends[k * part_rows:(k + 1) * part_rows]
        edges = np.concatenate(([0], np.cumsum(made)))  # where each launch's tokens start in the part
        step = max(1, len(made) * _PIECE_TOKENS // max(len(part), 1))  # launches a piece
        for a in range(0, len(made), step):
            b = min(a + step, len(made))
            _place(part[edges[a]:edges[b]], np.repeat(ends[a:b], made[a:b]), times, cursor)
    parts.clear()
    per_request = [times[a:b] for a, b in zip(starts.tolist(), bounds.tolist(), strict=True)]
    some = counts > 0
    first = np.full(n, np.nan)
    last = np.full(n, np.nan)
    first[some] = times[starts[some]]
    last[some] = times[bounds[some] - 1]
    return per_request, first, last


def _place(producers: np.ndarray, ends: np.ndarray, times: np.ndarray, cursor: np.ndarray) -> None:
    """Write the times ``ends`` of tokens that ``producers`` produced, in launch order, to the next free places
    of their requests' runs in ``times`` (``cursor``, moved on past them)."""
    if not len(producers):
        return
    order = _stable_order(producers)
    grouped = producers[order]
    # the runs of equal requests in ``grouped``: a run's k-th token goes to its request's cursor plus k
    first = np.flatnonzero(np.concatenate(([True], grouped[1:] != grouped[:-1])))
    sizes = np.diff(np.append(first, len(grouped)))
    run_requests = grouped[first]
    place = np.repeat(cursor[run_requests] - first, sizes)
    place += np.arange(len(grouped))
    times[place] = ends[order]
    cursor[run_requests] += sizes


def _stable_order(keys: np.ndarray) -> np.ndarray:
    """The stable order of non-negative int32 ``keys``, by 16-bit radix passes (numpy sorts 16-bit keys by radix,
    several times faster than its merge sort of wider ones)."""
    order = np.argsort((keys & 0xFFFF).astype(np.uint16), kind="stable")
    if len(keys) and int(keys.max()) > 0xFFFF:
        high = (keys >> 16).astype(np.uint16)[order]
        order = order[np.argsort(high, kind="stable")]
    return order


def _step_mixes(steps: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Per launch, ``"0:12 1:30"`` (how many items sat at each 0-based loop step), from the launches' loop steps
    laid end to end (``counts`` per launch); "" for launches without steps. Each distinct mix is written once."""
    out = np.full(len(counts), "", dtype=object)
    listed = np.flatnonzero(counts)
    if not len(listed):
        return out
    width = int(steps.max()) + 1
    table = np.empty((len(listed), width), dtype=np.int64)
    sizes = counts[listed]
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    for a in range(0, len(listed), _MIX_CHUNK):  # in slices: one row index per step would be 8 bytes a step
        b = min(a + _MIX_CHUNK, len(listed))
        row = np.repeat(np.arange(b - a), sizes[a:b])
        table[a:b] = np.bincount(row * width + steps[bounds[a]:bounds[b]], minlength=(b - a) * width).reshape(
            b - a, width)
    # the distinct mixes: sort the rows, mark where a row differs from the one before
    order = np.lexsort(table.T[::-1])
    ordered = table[order]
    new = np.ones(len(ordered), dtype=bool)
    new[1:] = np.any(ordered[1:] != ordered[:-1], axis=1)
    distinct = np.cumsum(new) - 1
    parts = [[f"{s}:{c}" for c in range(int(table[:, s].max()) + 1)] for s in range(width)]
    text = np.array([" ".join([parts[s][c] for s, c in enumerate(mix) if c]) for mix in ordered[new].tolist()],
                    dtype=object)
    out[listed[order]] = text[distinct]
    return out


@dataclass
class RunLog:
    """A finished run: launch rows, request rows, each request's token times, and what produced it."""

    launches: pd.DataFrame
    requests: pd.DataFrame
    token_times: list[np.ndarray]
    meta: dict = field(default_factory=dict)

    def save(self, directory: str | Path, fmt: LogFormat | str = LogFormat.PARQUET) -> Path:
        """Write ``launches`` and ``requests`` (Parquet, or CSV with token times space-separated), ``meta.json``
        and ``trace.json.gz`` (:mod:`cdbsim.report.perfetto`), all or nothing (:func:`.outputs.atomic_dir`)."""
        from cdbsim.report.outputs import atomic_dir
        from cdbsim.report.perfetto import write_timeline

        fmt = LogFormat.parse(fmt)
        out = Path(directory)
        with atomic_dir(out) as staging:
            if fmt is LogFormat.PARQUET:
                self.launches.to_parquet(staging / "launches.parquet", index=False, **PARQUET)
                self.requests.assign(token_times=[np.asarray(t, dtype=float) for t in self.token_times]).to_parquet(
                    staging / "requests.parquet", index=False, **PARQUET)
            else:
                self.launches.to_csv(staging / "launches.csv", index=False)
                req = self.requests.assign(token_times=[" ".join(f"{t:.9g}" for t in ts) for ts in self.token_times])
                req.to_csv(staging / "requests.csv", index=False)
            (staging / "meta.json").write_text(json.dumps(self.meta, indent=2, default=str))
            write_timeline(self, staging / TIMELINE)
        return out

    @staticmethod
    def foreign_files(directory: str | Path) -> list[str]:
        """The names in ``directory`` that :meth:`save` does not write (which saving there would delete)."""
        ours = {TIMELINE, "meta.json", *(f"{table}{fmt.suffix}" for table in ("launches", "requests")
                                         for fmt in LogFormat)}
        src = Path(directory)
        return sorted(p.name for p in src.iterdir() if p.name not in ours) if src.is_dir() else []

    @staticmethod
    def saved_in(directory: str | Path) -> bool:
        """Whether ``directory`` holds a saved run (Parquet or CSV)."""
        src = Path(directory)
        return any((src / f"launches{fmt.suffix}").is_file() for fmt in LogFormat)

    @classmethod
    def load(cls, directory: str | Path) -> RunLog:
        """Read a run saved by :meth:`save`, as Parquet or CSV (older CSV logs included); a file missing,
        unreadable or short of a column is a one-line error naming it."""
        src = Path(directory)
        fmt = LogFormat.PARQUET if (src / "launches.parquet").is_file() else LogFormat.CSV
        launches = _read_log_table(src / f"launches{fmt.suffix}", SAVED_LAUNCH_COLUMNS, {"step_mix": str})
        path = src / f"requests{fmt.suffix}"
        req = _read_log_table(path, REQUEST_LOG_COLUMNS, {"token_times": str})
        times = []
        for i, raw in enumerate(req.pop("token_times")):
            try:
                times.append(np.array(raw.split() if isinstance(raw, str) else raw, dtype=float).reshape(-1))
            except (TypeError, ValueError):
                where = f"{path}:{i + 2}" if fmt is LogFormat.CSV else f"{path}: row {i}"
                raise ConfigError(f"{where}: token_times must be numbers, got {str(raw)[:40]!r}") from None
        if "longest" not in launches:  # logs written before the column existed: longest item unknown
            launches.insert(LAUNCH_COLUMNS.index("longest"), "longest", 0)
        for col in ("scheduled", "first_token", "finish"):
            req[col] = pd.to_numeric(req[col], errors="coerce")
        meta = read_json(src / "meta.json", "run metadata") if (src / "meta.json").exists() else {}
        require(isinstance(meta, dict), f"{src / 'meta.json'}: expected a JSON object, got {meta!r:.40}")
        return cls(launches=launches, requests=req, token_times=times, meta=meta)


SAVED_LAUNCH_COLUMNS = tuple(c for c in LAUNCH_COLUMNS if c not in ("longest", "kv_used"))  # older logs lack these
REQUEST_LOG_COLUMNS = ("request_id", "prompt_len", "output_len", "arrival", "scheduled", "first_token", "finish",
                       "token_times")
TEXT_COLUMNS = ("stage", "step_mix", "token_times", "scheduled", "first_token", "finish")  # not (always) numbers


def _read_log_table(path: Path, columns: tuple[str, ...], csv_types: dict[str, type]) -> pd.DataFrame:
    """One table of a saved run (Parquet or CSV by its suffix), with ``columns``, at least one row, and
    numbers where numbers belong; anything else is a one-line :class:`ConfigError` naming the file."""
    require(path.is_file(), f"{path}: missing (a saved run holds launches and requests tables)")
    try:
        frame = (pd.read_parquet(path) if path.suffix == ".parquet" else
                 pd.read_csv(path, keep_default_na=False, dtype=csv_types))
    except Exception as exc:  # pyarrow's and pandas' many parse errors, bytes that are not UTF-8
        raise ConfigError(f"{path}: not a readable {path.suffix[1:]} log ({str(exc).splitlines()[0]})") from None
    missing = [c for c in columns if c not in frame.columns]
    require(not missing, f"{path}: missing column(s) {', '.join(missing)}")
    require(len(frame) > 0, f"{path}: no rows")
    for column in columns:
        if column not in TEXT_COLUMNS:
            require(pd.api.types.is_numeric_dtype(frame[column]), f"{path}: column {column} must hold numbers")
    return frame
