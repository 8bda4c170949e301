"""Gathered positions are judged on their exact value, never on an int64 that wrapped
around (issue 9, item 4): ``x[idx[i] + 1]`` with idx[i] = INT64_MAX reads position 2**63,
so bounds='clip' gives the last element, 'wrap' 2**63 mod n, 'fill' the fill value and
'check' an error, on every backend.  uint64 index values are unsigned.  The oracle is
Python's own integers."""

import numpy as np
import pytest

import einfuse as ef
from einfuse import errors

MAX, MIN = 2**63 - 1, -2**63
X = np.arange(10.0) * 10 + 1          # x[p] = 10 p + 1: a wrong position shows
FILL = -5.0


def exact(positions, bounds, n=len(X)):
    """What each read gives, by the notation's rules, from exact positions."""
    out = []
    for v in positions:
        if 0 <= v < n:
            out.append(X[v])
        elif bounds == "clip":
            out.append(X[min(max(v, 0), n - 1)])
        elif bounds == "wrap":
            out.append(X[v % n])
        elif bounds == "fill":
            out.append(FILL)
        else:
            return None   # check: an OutOfBoundsError
    return np.array(out)


# (statement, index arrays, exact position of element i)
CASES = [
    ("y[i] := x[idx[i] + 1]", {"idx": np.array([MAX, MAX - 9, 3, -1])},
     lambda a, i: a["idx"][i] + 1),
    ("y[i] := x[idx[i] - 3]", {"idx": np.array([MIN, MIN + 2, 5, 12])},
     lambda a, i: a["idx"][i] - 3),
    ("y[i] := x[7 - idx[i]]", {"idx": np.array([MIN, MIN + 1, 2, MAX])},
     lambda a, i: 7 - a["idx"][i]),
    ("y[i] := x[idx[i] + i - 2]", {"idx": np.array([2**63 + 1, 2**64 - 1, 3, 2**63],
                                                   dtype=np.uint64)},
     lambda a, i: a["idx"][i] + i - 2),
    ("y[i] := x[MAXMINUS - idx[i]]".replace("MAXMINUS", str(MAX)),
     {"idx": np.array([2**64 - 1, MAX - 4, 0, 2**63 + 2], dtype=np.uint64)},
     lambda a, i: MAX - a["idx"][i]),
    # the wide form: a coefficient, or two gathers in one subscript
    ("y[i] := x[3*idx[i]]", {"idx": np.array([6148914691236517206, 3, -6148914691236517206,
                                              MAX])},
     lambda a, i: 3 * a["idx"][i]),
    ("y[i] := x[idx[i] + jdx[i] + 1]", {"idx": np.array([MAX, MAX, MIN, 4]),
                                        "jdx": np.array([MAX, MIN, MIN, MIN])},
     lambda a, i: a["idx"][i] + a["jdx"][i] + 1),
    ("y[i] := x[2*idx[i] - jdx[i]]", {"idx": np.array([2**63 + 3, 2**64 - 1, 1, 0],
                                                      dtype=np.uint64),
                                      "jdx": np.array([2**64 - 1, 2**64 - 9, 2, 2**63],
                                                      dtype=np.uint64)},
     lambda a, i: 2 * a["idx"][i] - a["jdx"][i]),
]


@pytest.mark.parametrize("statement, arrays, position", CASES,
                         ids=[case[0] for case in CASES])
def test_gathered_positions_are_exact(backend, statement, arrays, position):
    positions = [int(position({k: [int(v) for v in a] for k, a in arrays.items()}, i))
                 for i in range(4)]
    for bounds in ("clip", "wrap", "fill", "check"):
        want = exact(positions, bounds)
        if want is None:
            with pytest.raises(errors.OutOfBoundsError):
                ef.ein(statement, x=X, **arrays, bounds=bounds, backend=backend)
            continue
        got = ef.ein(statement, x=X, **arrays, bounds=bounds, fill=FILL, backend=backend)
        np.testing.assert_array_equal(got, want, err_msg=f"bounds={bounds}")


def test_check_is_not_fooled_by_wrap_around(backend):
    # 3 * 6148914691236517206 = 2**64 + 2: an int64 product wraps to 2, in range
    idx = np.array([1, 6148914691236517206])
    with pytest.raises(errors.OutOfBoundsError, match="18446744073709551618"):
        ef.ein("y[i] := x[3*idx[i]]", x=X, idx=idx, backend=backend)
    with pytest.raises(errors.OutOfBoundsError, match="9223372036854775808"):
        ef.ein("y[i] := x[idx[i] + 1]", x=X, idx=np.array([0, MAX]), backend=backend)


def test_gathers_nested_and_in_reductions(backend):
    p = np.array([3, MAX, -5, 4])
    q = np.array([0, 1, 2, 3, 7, -1])
    got = ef.ein("y[i] := x[p[q[i]] + 1]", x=X, p=p, q=q, bounds="wrap", backend=backend)
    np.testing.assert_array_equal(got, X[[4, 2**63 % 10, 6, 5, 5, 5]])
    got = ef.ein("s := sum[i](x[idx[i] - 2])", x=X, idx=np.array([MIN, 5, MAX]),
                 bounds="clip", backend=backend)
    assert float(got) == X[0] + X[3] + X[9]
    W = np.arange(20.0).reshape(4, 5)
    idx = np.array([2**64 - 1, 1, 2**63], dtype=np.uint64)
    got = ef.ein("E[b,d] := W[idx[b], d]", W=W, idx=idx, bounds="clip", backend=backend)
    np.testing.assert_array_equal(got, W[[3, 1, 3]])


def test_uint64_torch_index_tensors(backend):
    torch = pytest.importorskip("torch")
    x = torch.arange(10.0, dtype=torch.float64)
    idx = torch.tensor([2**63 + 3, 1], dtype=torch.uint64)
    got = ef.ein("y[i] := x[idx[i]]", x=x, idx=idx, bounds="clip", backend=backend)
    np.testing.assert_array_equal(np.asarray(got), [9.0, 1.0])
    with pytest.raises(errors.OutOfBoundsError, match="9223372036854775811"):
        ef.ein("y[i] := x[idx[i]]", x=x, idx=idx, backend=backend)
    ok = torch.tensor([0, 9], dtype=torch.uint64)
    np.testing.assert_array_equal(np.asarray(ef.ein("y[i] := x[idx[i]]", x=x, idx=ok,
                                                    backend=backend)), [0.0, 9.0])


def test_too_large_for_exact_arithmetic_is_an_error_everywhere(backend):
    # coefficients near 2**62 on two int64 gathers: beyond what kernels compute exactly
    statement = "y[i] := x[4611686018427387904*idx[i] + 4611686018427387904*jdx[i]]"
    with pytest.raises(errors.EinfuseOverflowError, match="exact index arithmetic"):
        ef.ein(statement, x=X, idx=np.zeros(2, np.int64), jdx=np.zeros(2, np.int64),
               bounds="clip", backend=backend)
    # the same with int8 index arrays is well within reach
    got = ef.ein(statement, x=X, idx=np.zeros(2, np.int8), jdx=np.zeros(2, np.int8),
                 bounds="clip", backend=backend)
    np.testing.assert_array_equal(got, [X[0], X[0]])


def test_a_nested_fill_must_be_a_position(backend):
    p, q = np.array([1, 2]), np.array([0, 5])
    with pytest.raises(errors.EinfuseOverflowError, match="fill="):
        ef.ein("y[i] := x[p[q[i]]]", x=X, p=p, q=q, bounds="fill", fill=np.inf,
               backend=backend)
    got = ef.ein("y[i] := x[p[q[i]]]", x=X, p=p, q=q, bounds="fill", fill=3.0,
                 backend=backend)
    np.testing.assert_array_equal(got, [X[1], X[3]])


def test_subscript_coefficients_beyond_int32(backend):
    # Triton used to make 9223372036854775807 an int32 constant
    got = ef.ein("y[i] := x[9223372036854775807*i]", x=X, pad=0, ranges={"i": 2},
                 backend=backend)
    np.testing.assert_array_equal(got, [X[0], 0.0])
    got = ef.ein("y[i] := x[i + 4000000000]", x=X, pad=-1, ranges={"i": 2},
                 backend=backend)
    np.testing.assert_array_equal(got, [-1.0, -1.0])
