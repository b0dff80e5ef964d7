"""cdbsim: serving throughput and latency of looped language models under Continuous Depth Batching.

The simulator side of the project: architectures, the shared scheduler, latency models, the SimPy
simulator and the report. Pure Python (numpy, scipy, pandas, simpy); it never imports torch.
"""

__version__ = "0.1.0"
