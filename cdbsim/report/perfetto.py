"""A run as a timeline in the Trace Event format (JSON, gzipped), for the Perfetto UI or chrome://tracing.

Built from a :class:`~cdbsim.report.logs.RunLog` alone, so simulated and measured runs open side by side: a
``device`` track (a slice per launch) and a ``host`` track (planning, ending when its launch starts); an async track
per request (``queued``, ``prefill``, ``decode``, ``done``); counters of queue lengths, resident requests and KV
blocks at each launch. Times are microseconds from the start of the run.
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cdbsim.report.logs import RunLog

DEVICE_PID, REQUESTS_PID = 1, 2
HOST_TID, DEVICE_TID = 1, 2
US = 1e6  # seconds -> the format's microseconds


def _meta_events(log: RunLog) -> list[dict[str, Any]]:
    label = log.meta.get("config") or log.meta.get("policy") or "run"
    source = log.meta.get("profile")
    name = f"{label} ({'simulated, ' + str(source) if source else 'measured'})"
    return [
        {"ph": "M", "pid": DEVICE_PID, "name": "process_name", "args": {"name": f"device and host: {name}"}},
        {"ph": "M", "pid": DEVICE_PID, "tid": HOST_TID, "name": "thread_name", "args": {"name": "host"}},
        {"ph": "M", "pid": DEVICE_PID, "tid": DEVICE_TID, "name": "thread_name", "args": {"name": "device"}},
        {"ph": "M", "pid": DEVICE_PID, "tid": HOST_TID, "name": "thread_sort_index", "args": {"sort_index": 0}},
        {"ph": "M", "pid": DEVICE_PID, "tid": DEVICE_TID, "name": "thread_sort_index", "args": {"sort_index": 1}},
        {"ph": "M", "pid": REQUESTS_PID, "name": "process_name", "args": {"name": "requests"}},
    ]


def _launch_events(log: RunLog) -> list[dict[str, Any]]:
    """Device and host slices and the counters, one set per launch."""
    events: list[dict[str, Any]] = []
    total_blocks = log.meta.get("kv_blocks")
    has_kv = "kv_used" in log.launches.columns
    host_free = -math.inf  # when the host track is next free (host slices never overlap)
    for row in log.launches.itertuples(index=False):
        start, end = float(row.start) * US, float(row.end) * US
        events.append({"ph": "X", "pid": DEVICE_PID, "tid": DEVICE_TID, "name": str(row.stage), "ts": start,
                       "dur": end - start, "args": {
                           "launch": int(row.index), "batch": int(row.size), "padded": int(row.padded),
                           "items": int(row.items), "context": int(row.context), "step_mix": str(row.step_mix),
                           "exits": int(row.exits), "tokens": int(row.tokens)}})
        host = float(row.host_s) * US
        if host > 0:
            begin = max(start - host, host_free)
            events.append({"ph": "X", "pid": DEVICE_PID, "tid": HOST_TID, "name": f"plan {row.stage}",
                           "ts": begin, "dur": max(start - begin, 0.0),
                           "args": {"launch": int(row.index), "host_us": host}})
            host_free = start
        events.append({"ph": "C", "pid": DEVICE_PID, "name": "queues", "ts": start,
                       "args": {"waiting prompts": int(row.queue_waiting), "core": int(row.queue_core),
                                "coda": int(row.queue_coda)}})
        events.append({"ph": "C", "pid": DEVICE_PID, "name": "resident requests", "ts": start,
                       "args": {"active": int(row.active)}})
        if has_kv:
            used = int(row.kv_used)
            kv = {"used": used, **({"free": int(total_blocks) - used} if total_blocks is not None else {})}
            events.append({"ph": "C", "pid": DEVICE_PID, "name": "KV blocks", "ts": start, "args": kv})
    return events


def _request_events(log: RunLog) -> list[dict[str, Any]]:
    """One async track per request: the whole request, its phases inside it, and a mark when done."""
    events: list[dict[str, Any]] = []
    columns = ("request_id", "prompt_len", "output_len", "arrival", "scheduled", "first_token", "finish")
    for rid, prompt, output, *times in log.requests[list(columns)].itertuples(index=False, name=None):
        arrival, scheduled, first, finish = (float(t) * US for t in times)
        if not math.isfinite(finish):
            continue  # never served (a run cut short): no track
        common = {"pid": REQUESTS_PID, "cat": "request", "id": int(rid)}
        events.append({"ph": "b", "name": f"request {rid}", "ts": arrival, **common,
                       "args": {"prompt_len": int(prompt), "output_len": int(output)}})
        phases = (("queued", arrival, scheduled), ("prefill", scheduled, first), ("decode", first, finish))
        for name, begin, end in phases:
            if math.isfinite(begin) and math.isfinite(end) and end > begin:
                events.append({"ph": "b", "name": name, "ts": begin, **common})
                events.append({"ph": "e", "name": name, "ts": end, **common})
        events.append({"ph": "n", "name": "done", "ts": finish, **common})
        events.append({"ph": "e", "name": f"request {rid}", "ts": finish, **common})
    return events


def timeline(log: RunLog) -> dict[str, Any]:
    """The run as a Trace Event JSON object (``traceEvents`` plus the run's meta as ``metadata``)."""
    return {"traceEvents": [*_meta_events(log), *_launch_events(log), *_request_events(log)],
            "displayTimeUnit": "ms", "metadata": {k: str(v) for k, v in log.meta.items()}}


def write_timeline(log: RunLog, path: str | Path) -> Path:
    """Write :func:`timeline` to ``path`` as gzipped JSON (``.json.gz``)."""
    path = Path(path)
    text = json.dumps(timeline(log), separators=(",", ":"))  # one C-encoded string (faster than streaming)
    path.write_bytes(gzip.compress(text.encode("utf-8"), compresslevel=5))
    return path
