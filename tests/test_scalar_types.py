"""What a scalar parameter or an array may be: Python and NumPy numbers of bool, int and
float dtypes up to float64; a Fraction, a Decimal or a long double is an
EinfuseTypeError naming it (a Fraction ran as a NumPy object array on the reference and
failed in C; a long double ran on the reference only).  A lazily negated torch view is
read as its values on every backend."""

from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest

import einfuse as ef
from einfuse import errors

X = np.arange(3.0)


@pytest.mark.parametrize("value", [Fraction(1, 3), Decimal("0.5"), np.longdouble(0.5)])
def test_numbers_without_a_computing_dtype_are_refused(value, backend):
    with pytest.raises(errors.EinfuseTypeError, match="a "):
        ef.ein("y[i] := x[i] * a", x=X, a=value, backend=backend)


def test_a_long_double_array_is_refused(backend):
    with pytest.raises(errors.EinfuseTypeError, match="x has dtype float128"):
        ef.ein("y[i] := x[i] * 2", x=np.ones(3, np.longdouble), backend=backend)


@pytest.mark.parametrize("value, want", [(np.float16(0.5), X * 0.5), (np.int8(3), X * 3),
                                         (True, X), (np.float32(2.0), X * 2)])
def test_numpy_and_python_numbers_are_taken(value, want, backend):
    np.testing.assert_array_equal(ef.ein("y[i] := x[i] * a", x=X, a=value,
                                         backend=backend), want)


def test_a_lazily_negated_view_is_read_as_its_values(backend):
    torch = pytest.importorskip("torch")
    z = torch.complex(torch.arange(4.0), torch.arange(4.0) + 1)
    view = z.conj().imag             # a view with torch's negative bit set
    assert view.is_neg()
    got = ef.ein("y[i] := v[i] * 2", v=view, backend=backend)
    np.testing.assert_array_equal(got.numpy(), -2 * (np.arange(4.0) + 1))
