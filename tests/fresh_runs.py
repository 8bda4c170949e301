"""Dropping what keeps a compiled fused kernel alive between calls, so that a test's
next call builds its kernel anew (under whatever pass it has switched on or off)."""

from einfuse.backends import c_fused
from einfuse.runtime import hoisted, kernel as kernel_module


def fresh_runs(monkeypatch) -> None:
    """Fused kernels, and the shared programs, statements and hoisted forms of
    ``ef.compile``/``ef.ein``, built anew: each keeps the prepared runs (so the
    compiled kernel) of its first call."""
    monkeypatch.setattr(c_fused, "_fused", {})
    kernel_module._shared_program.cache_clear()
    kernel_module._shared_kernel.cache_clear()
    hoisted.hoisted_form.cache_clear()
