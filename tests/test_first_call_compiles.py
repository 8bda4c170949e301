"""Compiles of a first call: a backward's gradient kernels made side by side and a
progress line while compiles last long (backends/c/compile_progress.py)."""

from __future__ import annotations

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.c import build as c_build, compile_progress

pytestmark = pytest.mark.skipif(c_build.find_compiler() is None, reason="no C compiler")


def test_the_progress_line_comes_once_a_run_of_compiles_passes_its_time(monkeypatch):
    said = []
    monkeypatch.setattr(compile_progress, "say", said.append)
    compile_progress.reset()
    clock = [100.0]

    def compile_once(seconds):
        compile_progress.compile_started("DIR", clock[0])
        clock[0] += seconds
        compile_progress.compile_ended("DIR", clock[0])
        clock[0] += 0.01                 # the call runs a little between compiles

    for _ in range(3):
        compile_once(0.5)
    assert said == []                     # 1.5 s so far: quiet
    compile_once(0.6)
    assert len(said) == 1 and "4 kernels built" in said[0] and "DIR" in said[0]
    for _ in range(3):
        compile_once(0.5)
    assert len(said) == 1                 # the next line only after PROGRESS_EVERY_S more
    clock[0] += 5.0                       # a pause: the next compile is another first call
    compile_once(0.5)
    assert len(said) == 1
    compile_progress.reset()


def test_a_first_call_that_compiles_long_says_so_on_the_einfuse_logger(tmp_path, monkeypatch,
                                                                        caplog):
    monkeypatch.setenv("EINFUSE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compile_progress, "PROGRESS_AFTER_S", 0.0)   # any compile is long
    compile_progress.reset()
    c_build.clear_memory_cache()
    with caplog.at_level("WARNING", logger="einfuse"):
        y = ef.ein("y[i] := sum[j](X[i,j] * 7.25)", X=np.ones((3, 2)), backend="c")
    np.testing.assert_array_equal(y, np.full(3, 14.5))
    lines = [r.getMessage() for r in caplog.records if "first call is compiling" in r.getMessage()]
    assert lines and str(tmp_path) in lines[0]
    compile_progress.reset()


def test_a_first_backward_computes_its_gradients_side_by_side_with_the_loops_values(
        monkeypatch):
    torch = pytest.importorskip("torch")
    import threading
    threads = set()
    load = c_build.load

    def spy(*args, **kwargs):
        threads.add(threading.current_thread().name.startswith("einfuse-gradient"))
        return load(*args, **kwargs)
    # (a first backward runs runtime/gradients.py or, where the forward ran prepared,
    # runtime/torch_prepared.py: either makes its kernels in gradient threads)
    monkeypatch.setattr(c_build, "load", spy)
    torch.manual_seed(3)
    # (shapes of their own: the first backward of this signature in the process)
    w = torch.randn(5, 7, dtype=torch.float64, requires_grad=True)
    x = torch.randn(5, 6, dtype=torch.float64, requires_grad=True)
    D = ef.ein("D[i,j] := (w[k,i] - x[k,j])**2", w=w, x=x, backend="c")
    weight = torch.randn(7, 6, dtype=torch.float64)
    (D * weight).sum().backward()
    assert True in threads
    threads.clear()
    w2, x2 = w.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
    ((w2[:, :, None] - x2[:, None, :]) ** 2).sum(0).mul(weight).sum().backward()
    torch.testing.assert_close(w.grad, w2.grad)
    torch.testing.assert_close(x.grad, x2.grad)
    w.grad = x.grad = None     # a repeat of the signature: the loop again, the same values
    ef.ein("D[i,j] := (w[k,i] - x[k,j])**2", w=w, x=x, backend="c").mul(weight).sum().backward()
    assert True not in threads
    torch.testing.assert_close(w.grad, w2.grad)


def test_side_by_side_gradients_raise_the_error_the_loop_would_raise_first(monkeypatch):
    from einfuse.errors import OutOfBoundsError
    from einfuse.runtime import gradients

    def failing(statement, options, arrays, output_grad, wanted, output=None):
        raise OutOfBoundsError(f"the gradient of {wanted[0]}")
    monkeypatch.setattr(gradients, "compute_gradients", failing)
    with pytest.raises(OutOfBoundsError, match="the gradient of a"):
        gradients._side_by_side("y[i] := a[i] * b[i]", None, {}, None, ["a", "b"], None)
