"""The launch log and the per-request log: one schema, whichever clock (simulated or GPU) filled them.

Both drivers call :meth:`RunRecorder.record` once per launch with its device start and end time (seconds
from the start of the run) and the host time spent planning it; the recorder derives which tokens each
launch produced and when. :class:`RunLog` is what the report, the plots and ``cdbsim validate`` read.

Launch log columns: ``index, stage, size, padded, items, context, longest, kv_copies, start, end, host_s,
step_mix`` (``"0:12 1:30"``, core launches), ``exits``, ``tokens`` (tokens produced),
``queue_waiting, queue_core, queue_coda, active``.

Request log columns: ``request_id, prompt_len, output_len, arrival, scheduled`` (first prefill launch
start), ``first_token, finish``, and ``token_times`` (the time each output token was produced).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from cdbsim.launch import Launch, Stage
from traces.request import Request

if TYPE_CHECKING:
    from cdbsim.scheduler import Scheduler

LAUNCH_COLUMNS = ("index", "stage", "size", "padded", "items", "context", "longest", "kv_copies", "start", "end",
                  "host_s", "step_mix", "exits", "tokens", "queue_waiting", "queue_core", "queue_coda",
                  "active")


def run_meta(scheduler: Scheduler, **extra: object) -> dict:
    """What produced a run, as its log records it: the architecture, the serving configuration and what the
    scheduler did, plus the backend's own facts (``extra``: the profile, the device, ...)."""
    arch, config = scheduler.arch, scheduler.config
    return {"arch": arch.name, "split": arch.split, "r_max": arch.r_max, "r_min": scheduler.r_min,
            "policy": config.policy.value, "width": config.width, "coda_batch": config.coda_batch,
            "prefill_budget": config.prefill_budget, "timing": config.timing.value,
            "layout": config.layout.value, "core_launch": config.core_launch.value, "config": config.describe(),
            "kv_blocks": scheduler.kv.total,
            "requests": len(scheduler.requests), "launches": scheduler.launches,
            "preemptions": scheduler.preemptions, **extra}


class RunRecorder:
    """Collects launch rows and token times during a run (one tuple per launch: this is a hot path)."""

    def __init__(self, requests: list[Request], keep_step_mix: bool = True) -> None:
        self.requests = requests
        self.keep_step_mix = keep_step_mix
        self._rows: list[tuple] = []
        self._tokens: list[list[float]] = [[] for _ in requests]
        self._scheduled = [np.nan] * len(requests)

    def record(self, launch: Launch, start: float, end: float, host_s: float = 0.0) -> None:
        stage = launch.stage
        tokens = self._tokens
        if stage is Stage.PREFILL:
            produced = 0
            for i, final in zip(launch.requests, launch.finishes, strict=True):
                if self._scheduled[i] != self._scheduled[i]:  # NaN: first time scheduled
                    self._scheduled[i] = start
                if final:
                    tokens[i].append(end)
                    produced += 1
        elif stage is Stage.CODA or stage is Stage.DECODE:
            for i in launch.requests:
                tokens[i].append(end)
            produced = len(launch.requests)
        else:
            produced = 0
        steps = launch.steps
        self._rows.append((
            launch.index, stage.value, launch.size, launch.padded, len(launch.requests), launch.context,
            launch.longest, launch.kv_copies, start, end, host_s, _mix(steps) if steps and self.keep_step_mix else "",
            launch.exits.count(True) if launch.exits else 0, produced, launch.queue_waiting,
            launch.queue_core, launch.queue_coda, launch.active))

    def finish(self, meta: dict | None = None) -> RunLog:
        launches = pd.DataFrame.from_records(self._rows, columns=list(LAUNCH_COLUMNS))
        reqs = self.requests
        times = [np.asarray(t) for t in self._tokens]
        requests = pd.DataFrame({
            "request_id": [r.request_id for r in reqs],
            "prompt_len": [r.prompt_len for r in reqs],
            "output_len": [r.output_len for r in reqs],
            "arrival": [r.arrival for r in reqs],
            "scheduled": self._scheduled,
            "first_token": [t[0] if len(t) else np.nan for t in times],
            "finish": [t[-1] if len(t) else np.nan for t in times],
        })
        return RunLog(launches=launches, requests=requests, token_times=times, meta=dict(meta or {}))


def _mix(steps: list[int]) -> str:
    """``"0:12 1:30"``: how many items sat at each 0-based loop step."""
    return " ".join(f"{s}:{steps.count(s)}" for s in sorted(set(steps)))


@dataclass
class RunLog:
    """A finished run: launch rows, request rows, each request's token times, and what produced it."""

    launches: pd.DataFrame
    requests: pd.DataFrame
    token_times: list[np.ndarray]
    meta: dict = field(default_factory=dict)

    def save(self, directory: str | Path) -> Path:
        """Write ``launches.csv``, ``requests.csv`` (token times space-separated) and ``meta.json``."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        self.launches.to_csv(out / "launches.csv", index=False)
        req = self.requests.copy()
        req["token_times"] = [" ".join(f"{t:.9g}" for t in ts) for ts in self.token_times]
        req.to_csv(out / "requests.csv", index=False)
        (out / "meta.json").write_text(json.dumps(self.meta, indent=2, default=str))
        return out

    @classmethod
    def load(cls, directory: str | Path) -> RunLog:
        src = Path(directory)
        launches = pd.read_csv(src / "launches.csv", keep_default_na=False,
                               dtype={"step_mix": str})
        if "longest" not in launches:  # logs written before the column existed: longest item unknown
            launches.insert(LAUNCH_COLUMNS.index("longest"), "longest", 0)
        req = pd.read_csv(src / "requests.csv", keep_default_na=False, dtype={"token_times": str})
        times = [np.array(s.split(), dtype=float) for s in req.pop("token_times")]
        for col in ("scheduled", "first_token", "finish"):
            req[col] = pd.to_numeric(req[col], errors="coerce")
        meta = json.loads((src / "meta.json").read_text()) if (src / "meta.json").exists() else {}
        return cls(launches=launches, requests=req, token_times=times, meta=meta)
