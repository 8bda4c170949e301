"""Random valid statements, run through einfuse and compared with the brute-force oracle.

The generator (strategies.py) knows every index's range in advance, so einfuse's
range inference, shapes, dtypes and values are all checked at once.  Float32
results are compared relative to the *magnitude* of the computation (the
oracle's first-order error bound), not to a result that may have cancelled.
"""

import warnings
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, settings

import einfuse
from oracle import brute_force_with_scale
from strategies import OUTPUT, Example, examples

# rtol per dtype, in units of the computation's magnitude (see oracle.py)
TOLERANCES = {np.float64: 1e-9, np.float32: 1e-5}
# Products of many small factors underflow; the generator's largest later amplification
# (about 1e12) times the smallest normal number bounds what that can cost.
UNDERFLOW = {np.float64: np.finfo(np.float64).tiny * 1e13,
             np.float32: np.finfo(np.float32).tiny * 1e13}

SETTINGS = settings(max_examples=165, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])
# the default run's share (each statement compiles its own kernels: about 0.3 s of CPU
# each on C and on the Triton interpreter, cold); the slow run adds 165, so CI as a whole
# checks as many statements per backend as when the default run held 30
QUICK = settings(SETTINGS, max_examples=15)


def expected_result(ex: Example):
    return brute_force_with_scale(ex.text, ex.ranges, ex.arrays, ex.params, out=ex.out,
                                  **ex.oracle_options())


def cast(array: np.ndarray, dtype) -> np.ndarray:
    """Float arrays in ``dtype``; integer index arrays stay as they are."""
    return array.astype(dtype) if array.dtype.kind == "f" else array


def run_einfuse(ex: Example, backend: str, dtype):
    kwargs = {name: cast(array, dtype) for name, array in ex.arrays.items()}
    kwargs.update(ex.params)
    if ex.out is not None:
        kwargs[OUTPUT] = cast(ex.out, dtype)  # einfuse writes into this copy
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", einfuse.errors.EinfuseWarning)
        result = einfuse.ein(ex.text, backend=backend, **ex.options(), **kwargs)
    if ex.out is not None:  # '=' and '+=' write into the given array and return it
        np.testing.assert_array_equal(kwargs[OUTPUT], result,
                                      err_msg=f"{ex.text!r}: the output array was not updated")
    return result


def assert_matches(actual, expected, scale, rtol, what: str, atol: float = 0.0):
    actual = np.asarray(actual)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    if expected.dtype == np.bool_:
        assert actual.dtype == np.bool_, f"{what}: a comparison should give bool, not " \
                                         f"{actual.dtype}"
        np.testing.assert_array_equal(actual, expected, err_msg=what)
        return
    actual = actual.astype(np.float64)
    same = (actual == expected) | (np.isnan(actual) & np.isnan(expected))
    allowed = rtol * scale + atol
    close = np.abs(actual - expected) <= allowed
    bad = ~(same | close)
    if bad.any():
        where = tuple(np.argwhere(bad)[0]) if bad.ndim else ()
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.size} elements differ; first at {where}: "
            f"einfuse {actual[where]!r}, oracle {expected[where]!r}, allowed "
            f"{allowed[where]!r}\n einfuse: {actual.tolist()}\n oracle:  "
            f"{expected.tolist()}")


def check_statement(backend, ex):
    note(repr(ex))
    if backend == "triton" and zlib.crc32(ex.text.encode()) % 2:
        return     # the interpreter is slow: half of the statements (the same half each run)
    expected, scale = expected_result(ex)
    for dtype, rtol in TOLERANCES.items():
        what = f"{ex.text!r} on {backend} in {dtype.__name__}"
        result = run_einfuse(ex, backend, dtype)
        assert isinstance(result, np.ndarray), f"{what}: returned {type(result).__name__}"
        if expected.dtype != np.bool_:
            assert result.dtype == dtype, f"{what}: result dtype {result.dtype}"
        assert_matches(result, expected, scale, rtol, what, atol=UNDERFLOW[dtype])


@QUICK
@given(ex=examples())
def test_random_statement_matches_oracle(backend, ex):
    check_statement(backend, ex)


@pytest.mark.slow
@SETTINGS
@given(ex=examples())
def test_more_random_statements_match_oracle(backend, ex):
    check_statement(backend, ex)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(ex=examples())
def test_generated_examples_are_valid(ex):
    """The generator's own contract: every read in range (or padded / bounded as asked),
    every value finite, and the output shape what the ranges say."""
    expected, scale = expected_result(ex)
    assert expected.shape == ex.output_shape
    assert np.all(np.isfinite(expected)) and np.all(np.isfinite(scale))
    for name in ex.explicit_ranges:
        assert name in ex.ranges


RNG = np.random.default_rng(0)
FIXED = [
    Example("Out[i] := A[i + a] * K[a]", {"A": RNG.standard_normal(6), "K": RNG.standard_normal(3)},
            {}, {"i": (0, 4), "a": (0, 3)}, {}),
    Example("Out[i, j] := sum[k](A[i, k] * B[k, j])",
            {"A": RNG.standard_normal((5, 6)), "B": RNG.standard_normal((6, 3))},
            {}, {"i": (0, 5), "j": (0, 3), "k": (0, 6)}, {}),
]


@pytest.mark.parametrize("ex", FIXED, ids=lambda ex: ex.text)
def test_fixed_examples_through_the_harness(backend, ex):
    """Two fixed statements, so a broken harness fails loudly and readably."""
    expected, scale = expected_result(ex)
    for dtype, rtol in TOLERANCES.items():
        assert_matches(run_einfuse(ex, backend, dtype), expected, scale, rtol, ex.text)


# Minimal reproductions of mismatches the random test found (einfuse, not oracle, bugs).

def test_pad_is_not_replaced_by_fill(backend):
    """An affine read outside its array reads pad=, even when bounds="fill" is also given
    (fill= is for gathers)."""
    B = np.array([0.5])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", einfuse.errors.EinfuseWarning)
        got = einfuse.ein("Out[i] := B[i + 1]", B=B, pad=0.0, bounds="fill", fill=0.125,
                          ranges={"i": 1}, backend=backend)
    expected = brute_force_with_scale("Out[i] := B[i + 1]", {"i": (0, 1)}, {"B": B},
                                      pad=0.0, bounds="fill", fill=0.125)[0]
    np.testing.assert_array_equal(got, expected)  # [0.0]


def test_elementwise_update_with_offset_range(backend):
    """With ranges={"i": range(1, 3)} output position p holds i = 1 + p; reading Out[i] on
    the right reads the element being updated, so it is always in range."""
    A, out = np.array([1.0, 2.0, 3.0]), np.array([10.0, 20.0])
    expected = brute_force_with_scale("Out[i] = Out[i] + A[i]", {"i": (1, 3)}, {"A": A},
                                      out=out)[0]
    got = einfuse.ein("Out[i] = Out[i] + A[i]", A=A, Out=out.copy(),
                      ranges={"i": range(1, 3)}, backend=backend)
    np.testing.assert_array_equal(got, expected)  # [12.0, 23.0]
