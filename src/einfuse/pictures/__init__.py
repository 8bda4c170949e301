"""Pictures of plans (spec v3 section 3; docs/pictures.md): each explanation drawn as a
self-contained HTML page with inline SVG (no network, no script): the dataflow grouped
into kernels with bytes on every edge, each kernel's loop nest, a roofline from this
machine's measured limits (``einfuse calibrate``), and plans on a device mesh.

This package reads the explanation objects' public data and imports none of their
modules: they import it (``_repr_html_``, ``save``, ``page``)."""

from .calibration import (Calibration, cached, calibrate, cpu_model, machine_limits,
                          store)
from .loops import Block
from .page import Page, save_page
from .pages import (bench_page, front_end_page, jit_page, named_page, program_page,
                    sharding_page, statement_page)

__all__ = ["Block", "Calibration", "Page", "bench_page", "cached", "calibrate", "cpu_model",
           "front_end_page", "jit_page", "machine_limits", "named_page", "program_page",
           "save_page", "sharding_page", "statement_page", "store"]
