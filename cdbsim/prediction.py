"""``cdbsim.predict``: simulate one experiment from Python (a notebook, a script) and get its report.

The command line's ``cdbsim predict`` runs the same function, so a notebook and the table agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cdbsim.experiment import BuiltExperiment, Experiment
from cdbsim.logs import RunLog
from cdbsim.report import Report
from cdbsim.study import Progress, RunResult, run_one, with_baseline

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class Prediction:
    """A simulated run of an experiment: its report and logs, and the CB run it was compared with."""

    setup: BuiltExperiment
    report: Report
    log: RunLog
    baseline: RunResult | None = None

    def to_frame(self) -> pd.DataFrame:
        """The report's flat row (with speed-up and bound share when a baseline ran) as a one-row frame."""
        import pandas as pd

        return pd.DataFrame([self.report.row()])


def predict(experiment: Experiment | BuiltExperiment, baseline: bool = False,
            progress: Progress | None = None) -> Prediction:
    """Simulate ``experiment``; with ``baseline``, also CB on the same requests (unless it is CB itself),
    which gives the report its speed-up and the share of S_e2e it realises."""
    setup = experiment.build() if isinstance(experiment, Experiment) else experiment
    args = (setup.arch, setup.config, setup.requests, setup.latency, setup.kv, progress)
    result, base = with_baseline(*args) if baseline else (run_one(*args), None)
    return Prediction(setup, result.report, result.log, base)
