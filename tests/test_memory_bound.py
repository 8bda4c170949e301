"""The reference executor never allocates an intermediate above its memory budget."""

import tracemalloc

import numpy as np
import pytest

import einfuse as ef


def peak_bytes(fn):
    tracemalloc.start()
    tracemalloc.reset_peak()
    try:
        result = fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak


@pytest.mark.parametrize("statement, shapes", [
    ("D[i,j] := (w[k,i] - x[k,j])**2", {"w": (64, 256), "x": (64, 256)}),
    ("o[i] := sum[j](exp(-sum[d]((x[i,d]-y[j,d])**2)) * b[j])",
     {"x": (300, 3), "y": (2000, 3), "b": (2000,)}),
    ("s := logsumexp[i,j](A[i] * B[j])", {"A": (3000,), "B": (3000,)}),
])
def test_peak_memory_stays_within_budget(statement, shapes):
    rng = np.random.default_rng(1)
    arrays = {name: rng.standard_normal(shape) for name, shape in shapes.items()}
    budget = 1 << 20
    result, peak = peak_bytes(lambda: ef.ein(statement, backend="numpy", memory_limit=budget,
                                             **arrays))
    naive = ef.explain(statement, **arrays).naive_intermediate_bytes
    assert naive > 8 * budget  # the broadcast would be far above the budget ...
    assert peak < budget + 2 * result.nbytes + 64 * 1024  # ... yet the peak is not
    unbounded = ef.ein(statement, backend="numpy", memory_limit=1 << 30, **arrays)
    np.testing.assert_allclose(result, unbounded, rtol=1e-10)


def test_paper_sized_dist_plan_is_bounded():
    """K=784, N=M=4096 would broadcast 105 GB in float64; the plan's blocks stay small."""
    from einfuse.backends.numpy.backend import NumpyExecutor
    kernel = ef.compile("D[i,j] := (w[k,i] - x[k,j])**2", backend="numpy")
    w = np.broadcast_to(np.zeros((), np.float64), (784, 4096))
    call = kernel.bind(w=w, x=w)
    executor = NumpyExecutor.for_call(call)
    blocks = executor.split(call.spec.output_indices, executor.budget)
    block_elements = max(hi - lo for lo, hi in blocks[0]) * max(hi - lo for lo, hi in blocks[1])
    chunks = executor.split(("k",), executor.budget, outer=block_elements)
    largest = block_elements * max(hi - lo for lo, hi in chunks[0]) * 8
    assert largest <= call.options.memory_limit
