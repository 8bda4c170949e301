"""Dropping what keeps a compiled fused kernel alive between calls, so that a test's
next call builds its kernel anew (under whatever pass it has switched on or off)."""

from einfuse.backends.c import fused as c_fused
from einfuse.program import compile as program_compile
from einfuse.runtime import hoisted, kernel_maker


def fresh_runs(monkeypatch) -> None:
    """Fused kernels, and the shared programs, statements and hoisted forms of
    ``ef.compile``/``ef.ein``, built anew: each keeps the prepared runs (so the
    compiled kernel) of its first call."""
    monkeypatch.setattr(c_fused, "_fused", {})
    program_compile.shared_program.cache_clear()
    kernel_maker.shared_kernel.cache_clear()
    hoisted.hoisted_form.cache_clear()


def without_pass(monkeypatch, name: str, run):
    """``run()`` with plan/fuse.py's pass ``name`` (``merge_row_sums``,
    ``merge_sibling_loops``) leaving the row body as it is, on kernels built anew; it
    checks that a kernel was built that way."""
    from einfuse.plan import fuse, fuse_sums
    with monkeypatch.context() as patch:
        patch.setattr(fuse, name, lambda body, loop: fuse_sums.MergedSums(tuple(body), ()))
        fresh_runs(patch)
        built = []
        compiled = c_fused.compiled_for
        patch.setattr(c_fused, "compiled_for", lambda *a: built.append(1) or compiled(*a))
        result = run()
        assert built        # a kernel without the pass ran
        return result
