"""Hypothesis-generated programs (test_program_fuzz.py's strategy: row-wise chains of
elementwise statements, row reductions and statements with a hoisted inner reduction):
their gradients through the program's fused backward -- torch autograd's node on the
first call and on the prepared repeated one (program/autograd.py), and jax.grad's
tangent primitive under jit (runtime/jax_program.py) -- against central differences
of tests/oracle.py's brute-force loops, which share no code with einfuse."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import einfuse as ef
from test_program_fuzz import _inputs, _used, oracle, programs

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")

ROWS, COLS = 3, 4


def _oracle(source, arrays):
    return oracle(source, arrays, ROWS, COLS)


def _differences(source, arrays, seed, step=1e-6):
    """d sum(seed * program) / d each input, by central differences of the oracle."""
    found = {}
    for name, value in arrays.items():
        grad = np.zeros_like(value)
        for position in np.ndindex(value.shape):
            values = []
            for sign in (1, -1):
                moved = dict(arrays)
                moved[name] = value.copy()
                moved[name][position] += sign * step
                values.append(float((seed * _oracle(source, moved)).sum()))
            grad[position] = (values[0] - values[1]) / (2 * step)
        found[name] = grad
    return found


def check_program_gradients(program, seed):
    source, last = program
    rng = np.random.default_rng(seed)
    arrays = _used(source, _inputs(rng, ROWS, COLS, np.float64))
    weights = rng.standard_normal(_oracle(source, arrays).shape)
    want = _differences(source, arrays, weights)
    compiled = ef.compile(source, outputs=[last])
    for call in range(2):          # the first call, then the prepared one
        tensors = {n: torch.from_numpy(v.copy()).requires_grad_() for n, v in arrays.items()}
        compiled(**tensors).backward(torch.from_numpy(weights))
        for name, tensor in tensors.items():     # (None: the output does not read it)
            got = np.zeros_like(want[name]) if tensor.grad is None else tensor.grad.numpy()
            np.testing.assert_allclose(got, want[name], rtol=1e-5, atol=1e-6,
                                       err_msg=f"torch, call {call}: {source}")
    with jax.enable_x64(True):
        names = tuple(arrays)
        loss = jax.jit(jax.grad(lambda *values: (compiled(**dict(zip(names, values))) *
                                                 weights).sum(), tuple(range(len(names)))))
        for name, got in zip(names, loss(*[jax.numpy.asarray(arrays[n]) for n in names])):
            np.testing.assert_allclose(np.asarray(got), want[name], rtol=1e-5, atol=1e-6,
                                       err_msg=f"jax: {source}")


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.integers(0, 2**32 - 1))
def test_program_gradients_match_the_oracle(program, seed):
    check_program_gradients(program, seed)


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.integers(0, 2**32 - 1))
def test_more_program_gradients_match_the_oracle(program, seed):
    check_program_gradients(program, seed)
