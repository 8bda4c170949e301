"""``einfuse bench``: einfuse against NumPy, PyTorch, JAX and pykeops, as ratios measured
in one run; ``gpu`` holds the ``--device cuda`` cases and their runner."""

from .cases import Case, Peer
from .catalogue import all_cases, gpu_cases
from .gpu import GpuCase, run_gpu_case
from .report import bar_chart, markdown_table, text_table
from .runner import Measurement, PeerUnavailable, run_case

__all__ = ["Case", "Peer", "Measurement", "PeerUnavailable", "all_cases", "run_case",
           "text_table", "markdown_table", "bar_chart", "GpuCase", "gpu_cases",
           "run_gpu_case"]
