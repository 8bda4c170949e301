"""Analysis of statements: the Spec, index rules, the implicit-sum warning, range
inference, gather bounds, dtypes, argument binding and option validation."""

import warnings

import numpy as np
import pytest

import einfuse as ef
from einfuse import errors
from einfuse.analysis.options import make_options
from einfuse.analysis.ranges import infer_ranges
from einfuse.analysis.spec import analyse
from einfuse.lang import parse
from einfuse.lang.ast import Reduce


def spec_of(text):
    return analyse(parse(text))


def ranges_of(text, shapes, output_shape=None, **options):
    """Inferred (lo, hi) of every index, hi exclusive."""
    bounds = infer_ranges(spec_of(text), shapes, make_options(**options), output_shape)
    return bounds.range_map


def caret_start(error, source):
    """Column of the first caret under ``source`` in str(error)."""
    lines = str(error).split("\n")
    shown = "    " + source
    assert shown in lines, f"statement not shown in:\n{error}"
    caret = lines[lines.index(shown) + 1]
    assert set(caret.strip()) == {"^"}, f"no caret line in:\n{error}"
    return len(caret) - len(caret.lstrip(" ")) - 4


def check_error(info, cls, builtin, *names):
    """The raised error is ``cls``, an EinfuseError and ``builtin``, and names ``names``."""
    error = info.value
    assert type(error) is cls
    assert isinstance(error, ef.EinfuseError) and isinstance(error, builtin)
    text = str(error)
    for name in names:
        assert str(name) in text, f"{name!r} missing from:\n{text}"
    return text


x3 = np.array([10., 20., 30.])


# -- the Spec ------------------------------------------------------------------------------

def test_spec_of_matmul_makes_the_implicit_sum_explicit():
    spec = spec_of("C[i,j] := A[i,k] * B[k,j]")
    assert spec.output_indices == ("i", "j")
    assert spec.reduction_indices == ("k",)
    assert spec.all_indices == ("i", "j", "k")
    assert spec.implicit_reduction
    assert isinstance(spec.rhs, Reduce) and spec.rhs.op == "sum" and spec.rhs.indices == ("k",)
    assert spec.rhs.body == parse("C[i,j] := A[i,k] * B[k,j]").rhs
    assert spec.arg_order == ("A", "B")
    assert spec.params == ()
    assert [(t.name, t.rank, t.as_value, t.as_index) for t in spec.tensors] == [
        ("A", 2, True, False), ("B", 2, True, False)]
    assert not spec.result_is_bool


@pytest.mark.parametrize("text, out, reduced", [
    ("t := A[i,i]", (), ("i",)),
    ("d[i] := A[i,i]", ("i",), ()),
    ("F := A[i,j] * A[i,j]", (), ("i", "j")),
    ("O[i,j] := a[i] * b[j]", ("i", "j"), ()),
    ("y[i] := x[i+a] * k[a]", ("i",), ("a",)),
    ("y[b,o] := sum[i](x[b,i]*W[i,o]) + bias[o]", ("b", "o"), ("i",)),
    ("v := max[i](sum[j](abs(A[i,j])))", (), ("i", "j")),
    ("y[i] := sum[j,k](x[i,j,k])", ("i",), ("j", "k")),
    ("Z[i] := log(sum[j](exp(X[i,j] - M[i])))", ("i",), ("j",)),
])
def test_output_and_reduction_indices(text, out, reduced):
    spec = spec_of(text)
    assert spec.output_indices == out
    assert set(spec.reduction_indices) == set(reduced)
    assert len(spec.reduction_indices) == len(reduced)


def test_explicit_reductions_are_not_implicit():
    spec = spec_of("y[b,o] := sum[i](x[b,i]*W[i,o]) + bias[o]")
    assert not spec.implicit_reduction
    assert spec.rhs == parse("y[b,o] := sum[i](x[b,i]*W[i,o]) + bias[o]").rhs
    assert spec.reduction_of("i").op == "sum"
    assert spec.reduction_of("b") is None


def test_nested_reductions_outermost_first():
    spec = spec_of("v := max[i](sum[j](abs(A[i,j])))")
    assert spec.reduction_indices == ("i", "j")
    assert spec.reduction_of("i").op == "max" and spec.reduction_of("j").op == "sum"


@pytest.mark.parametrize("text, order, params", [
    ("C[i,j] := A[i,k] * B[k,j]", ("A", "B"), ()),
    ("y[i] := alpha * x[idx[i]] + beta", ("alpha", "x", "idx", "beta"), ("alpha", "beta")),
    ("y[b,o] := sum[i](x[b,i]*W[i,o]) + bias[o]", ("x", "W", "bias"), ()),
    ("y[i] := x[p[q[i]]]", ("x", "p", "q"), ()),
    ("y[i] := B[i] * alpha + A[i] * alpha + B[i]", ("B", "alpha", "A"), ("alpha",)),
    ("A[i,j] = A[i,j] * s + 50", ("s",), ("s",)),          # the output is not positional
    ("C[i,j] += A[i,k] * B[k,j]", ("A", "B"), ()),
    ("r[i] := i * i", (), ()),
])
def test_arg_order_is_first_appearance(text, order, params):
    spec = spec_of(text)
    assert spec.arg_order == order
    assert spec.params == params


def test_index_arrays_are_flagged():
    spec = spec_of("y[i] := x[idx[i]] + idx[i]")
    assert spec.tensor("idx").as_index and spec.tensor("idx").as_value
    spec = spec_of("h[b,t,d] := E[tok[b,t], d]")
    assert spec.tensor("tok").as_index and not spec.tensor("tok").as_value
    assert spec.tensor("E").as_value and not spec.tensor("E").as_index
    assert spec.tensor("tok").rank == 2
    spec = spec_of("y[i] := x[p[q[i]]]")
    assert [spec.tensor(n).as_index for n in "xpq"] == [False, True, True]


@pytest.mark.parametrize("text, is_bool", [
    ("p[i] := x[i] > 0", True),
    ("p[i] := (a[i] > 0) & (b[i] < 1)", True),
    ("p[i] := (a[i] > 0) | (b[i] < 1)", True),
    ("p[i,j,k] := i < j < k", True),
    ("r[i] := (x[i] > 0) * x[i]", False),
    ("r[i] := x[i]", False),
])
def test_result_is_bool(text, is_bool):
    assert spec_of(text).result_is_bool == is_bool


# -- the implicit-sum warning ----------------------------------------------------------------

LINEAR = np.arange(6.).reshape(2, 3), np.arange(12.).reshape(3, 4), np.array([1., 2., 3., 4.])


def test_linear_layer_pitfall_warns_and_shows_explicit_form():
    x, W, bias = LINEAR
    source = "y[b,o] := x[b,i]*W[i,o] + bias[o]"
    with pytest.warns(ef.EinfuseWarning) as record:
        y = ef.ein(source, x=x, W=W, bias=bias)
    assert len(record) == 1
    message = str(record[0].message)
    assert "bias[o]" in message and "i" in message
    assert "sum[i](x[b, i] * W[i, o]) + bias[o]" in message
    assert caret_start(message, source) == source.index("bias[o]")
    assert record[0].filename == __file__            # attributed to the caller's line
    # it still runs, and adds bias once per value of i
    np.testing.assert_allclose(y, x @ W + 3 * bias)


def test_warning_is_a_user_warning_and_repeats_every_compile():
    assert issubclass(ef.EinfuseWarning, UserWarning)
    for _ in range(2):
        with pytest.warns(ef.EinfuseWarning, match="implicit sum over j"):
            ef.compile("r[i] := A[i,j] + 1")


@pytest.mark.parametrize("text", [
    "y[b,o] := sum[i](x[b,i]*W[i,o]) + bias[o]",   # the explicit form
    "y[b,o] := sum[i](x[b,i]*W[i,o] + bias[o])",   # repeated addition, written on purpose
    "C[i,j] := A[i,k] * B[k,j]",                   # one term
    "C[i,j] := A[i,k] * B[k,j] + A[i,k]",          # every term uses k
    "y[i] := x[i] + 1",                            # nothing summed
    "r[i] := A[i,j] * 2",
])
def test_no_warning(text):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ef.compile(text)
    assert spec_of(text).warnings == ()


def test_warning_recorded_in_the_spec():
    spec = spec_of("r[i] := A[i,j] + 1")
    assert len(spec.warnings) == 1
    message, span = spec.warnings[0]
    assert "j" in message and "sum[j](A[i, j]) + 1" in message
    assert span == (17, 18)


# -- index rules -----------------------------------------------------------------------------

# (source, error class, offending text, which occurrence, names the message must hold)
INDEX_RULES = [
    # unbound index with explicit reductions
    ("y[i] := max[j](x[i,j]) + y2[i,j]", errors.IndexRuleError, "j", 2, ["j"]),
    ("y[i] := sum[j](x[i,j]) + j", errors.IndexRuleError, "j", 2, ["j"]),
    ("y[i] := sum[j](x[i,j] * z[k])", errors.IndexRuleError, "k", 0, ["k"]),
    # reducing an output index
    ("y[i] := sum[i](x[i])", errors.IndexRuleError, "sum", 0, ["i", "output"]),
    ("y[i,j] := max[k,j](x[i,j,k])", errors.IndexRuleError, "max", 0, ["j", "output"]),
    # re-binding an index in a nested reduction
    ("y[i] := sum[j](sum[j](x[i,j]))", errors.IndexRuleError, "sum", 1, ["j"]),
    ("s := max[i](sum[j,i](x[i,j]))", errors.IndexRuleError, "sum", 0, ["i"]),
    # ':=' output read on its right side
    ("C[i,j] := C[i,j] + 1", errors.IndexRuleError, "C[i,j]", 1, ["C", ":="]),
    ("s := x[i] * s[]", errors.IndexRuleError, "s[]", 0, ["s", ":="]),
    # '=' / '+=' output read at other indices than the LHS
    ("C[i,j] = C[j,i] + 1", errors.IndexRuleError, "C[j,i]", 0, ["C[i, j]", "C[j, i]"]),
    ("C[i] += C[i+1]", errors.IndexRuleError, "C[i+1]", 0, ["C[i]", "C[i + 1]"]),
    ("C[i,j] = C[i,j] * 2 + C[i,0]", errors.IndexRuleError, "C[i,0]", 0, ["C[i, 0]"]),
    ("C[i] = sum[k](C[k])", errors.IndexRuleError, "C[k]", 0, ["C[k]"]),
    # inconsistent rank of a tensor
    ("y[i] := x[i] * x[i,j]", errors.IndexRuleError, "x[i,j]", 0, ["x", "1", "2"]),
    ("y[i] := sum[j](A[i,j] * A[i])", errors.IndexRuleError, "A[i]", 0, ["A", "1", "2"]),
    # the output used as a parameter
    ("y[i] := x[i] * y", errors.EinfuseNameError, "y", 1, ["y"]),
]


def _nth(source, token, n):
    col = -1
    for _ in range(n + 1):
        col = source.index(token, col + 1)
    return col


@pytest.mark.parametrize("source, cls, token, nth, names", INDEX_RULES,
                         ids=[case[0] for case in INDEX_RULES])
def test_index_rule_errors(source, cls, token, nth, names):
    with pytest.raises(cls) as info:
        ef.compile(source)
    check_error(info, cls, ValueError, *names)
    assert caret_start(info.value, source) == _nth(source, token, nth)


def test_elementwise_updates_are_allowed():
    A = np.ones((2, 2))
    assert ef.ein("A[i,j] = A[i,j] + 50", A=A) is A
    np.testing.assert_array_equal(A, np.full((2, 2), 51.))
    B = np.arange(4.).reshape(2, 2)
    ef.ein("A[i,j] += 2 * A[i,j] + B[i,j]", A=A, B=B)
    np.testing.assert_array_equal(A, 51 + 102 + B)
    total = np.zeros(())
    ef.ein("total += x[i]", x=x3, total=total)
    ef.ein("total += x[i]", x=x3, total=total)
    assert total == 120.


# -- range inference -------------------------------------------------------------------------

def test_plain_uses_agree():
    assert ranges_of("C[i,j] := A[i,k] * B[k,j]", {"A": (3, 5), "B": (5, 2)}) == {
        "i": (0, 3), "j": (0, 2), "k": (0, 5)}


@pytest.mark.parametrize("text, shapes, index, a, b, sizes", [
    ("C[i,j] := A[i,k] * B[k,j]", {"A": (3, 50), "B": (40, 2)}, "k", "A", "B", (50, 40)),
    ("y[i] := a[i] + b[i]", {"a": (3,), "b": (7,)}, "i", "a", "b", (3, 7)),
    ("t := A[i,i]", {"A": (3, 4)}, "i", "A", "A", (3, 4)),
])
def test_disagreeing_extents_name_index_arrays_and_sizes(text, shapes, index, a, b, sizes):
    with pytest.raises(errors.ShapeError) as info:
        ranges_of(text, shapes)
    check_error(info, errors.ShapeError, ValueError, f"index {index}", a, b, *sizes)


def test_disagreement_through_the_api():
    with pytest.raises(errors.ShapeError) as info:
        ef.ein("C[i,j] := A[i,k] * B[k,j]", A=np.ones((3, 50)), B=np.ones((40, 2)))
    check_error(info, errors.ShapeError, ValueError, "k", "A", "B", "50", "40")
    source = "C[i,j] := A[i,k] * B[k,j]"
    assert source.index("B[k,j]") <= caret_start(info.value, source) <= source.index("k,j]")


@pytest.mark.parametrize("shape_b", [(1,), (3, 1)])
def test_no_size_one_broadcasting(shape_b):
    text = "y[i] := a[i] + b[i]" if len(shape_b) == 1 else "y[i,j] := a[i,j] + b[i,j]"
    shape_a = (3,) if len(shape_b) == 1 else (3, 4)
    with pytest.raises(errors.ShapeError) as info:
        ef.ein(text, a=np.ones(shape_a), b=np.ones(shape_b))
    check_error(info, errors.ShapeError, ValueError, "a", "b", "1")


def test_wrong_rank():
    with pytest.raises(errors.ShapeError) as info:
        ef.ein("C[i,j] := A[i,k] * B[k,j]", A=np.ones((3, 5, 1)), B=np.ones((5, 2)))
    check_error(info, errors.ShapeError, ValueError, "A", "3", "2")


@pytest.mark.parametrize("n, k", [(10, 3), (5, 5), (7, 1)])
def test_valid_convolution(n, k):
    assert ranges_of("y[i] := x[i+a] * k[a]", {"x": (n,), "k": (k,)}) == {
        "i": (0, n - k + 1), "a": (0, k)}
    x, ker = np.arange(float(n)), np.arange(1., k + 1)
    y = ef.ein("y[i] := x[i+a] * k[a]", x=x, k=ker)
    np.testing.assert_allclose(y, np.correlate(x, ker, "valid"))


def test_convolution_kernel_longer_than_signal_is_empty():
    y = ef.ein("y[i] := x[i+a] * k[a]", x=np.ones(2), k=np.ones(3))
    assert y.shape == (0,)


def test_two_dimensional_window():
    assert ranges_of("o[r,c] := img[r+dr, c+dc] * K[dr,dc]", {"img": (6, 7), "K": (2, 3)}) \
        == {"r": (0, 5), "c": (0, 5), "dr": (0, 2), "dc": (0, 3)}


@pytest.mark.parametrize("n, k", [(10, 3), (11, 3), (9, 4)])
def test_strided_window(n, k):
    # 0 <= 2*i + a <= n-1 for every a in 0..k-1
    assert ranges_of("y[i] := x[2*i + a] * k[a]", {"x": (n,), "k": (k,)})["i"] == \
        (0, (n - k) // 2 + 1)
    x = np.arange(float(n))
    y = ef.ein("y[i] := x[2*i + a] * k[a]", x=x, k=np.ones(k))
    np.testing.assert_allclose(y, [x[2 * i:2 * i + k].sum() for i in range((n - k) // 2 + 1)])


def test_strided_with_offset():
    # 0 <= 2*i + a - 1 <= 9 for a in 0..2  ->  1 <= i <= 4
    assert ranges_of("y[i] := x[2*i + a - 1] * k[a]", {"x": (10,), "k": (3,)})["i"] == (1, 5)


@pytest.mark.parametrize("n", [2, 5])
def test_difference_has_length_n_minus_1(n):
    assert ranges_of("y[i] := x[i+1] - x[i]", {"x": (n,)}) == {"i": (0, n - 1)}
    x = np.arange(float(n)) ** 2
    np.testing.assert_allclose(ef.ein("y[i] := x[i+1] - x[i]", x=x), np.diff(x))


def test_stride_two_subsample():
    assert ranges_of("y[i] := x[2*i]", {"x": (5,)}) == {"i": (0, 3)}
    np.testing.assert_array_equal(ef.ein("y[i] := x[2*i]", x=np.arange(5.)), [0., 2., 4.])


def test_affine_only_index_gets_its_full_valid_range():
    assert ranges_of("y[i] := x[i+1]", {"x": (5,)}) == {"i": (-1, 4)}
    # position p holds the index value lo + p = p - 1, so y[p] = x[p]
    np.testing.assert_array_equal(ef.ein("y[i] := x[i+1]", x=x3), x3)
    np.testing.assert_array_equal(ef.ein("y[i] := i + 0 * x[i+1]", x=x3), [-1, 0, 1])


def test_ranges_int_and_range():
    np.testing.assert_array_equal(ef.ein("y[i] := x[i+1]", x=x3, ranges={"i": 2}), [20., 30.])
    np.testing.assert_array_equal(ef.ein("y[i] := x[i+1]", x=x3, ranges={"i": range(0, 2)}),
                                  [20., 30.])
    np.testing.assert_array_equal(ef.ein("y[i] := x[i]", x=x3, ranges={"i": 2}), [10., 20.])
    assert ranges_of("y[i] := x[i]", {"x": (3,)}, ranges={"i": range(1, 3)}) == {"i": (1, 3)}
    np.testing.assert_array_equal(ef.ein("y[i] := x[i]", x=x3, ranges={"i": range(1, 3)}),
                                  [20., 30.])
    y = np.zeros(2)
    ef.ein("y[i] = x[i]", x=x3, y=y, ranges={"i": range(1, 3)})
    np.testing.assert_array_equal(y, [20., 30.])


@pytest.mark.parametrize("a, b", [(2, 5), (0, 3), (-2, 2), (4, 4)])
def test_output_position_holds_a_plus_p(a, b):
    r = ef.ein("r[i] := i", ranges={"i": range(a, b)})
    assert r.shape == (b - a,)
    np.testing.assert_array_equal(r, np.arange(a, b))
    r2 = ef.ein("r[i,j] := 10 * i + j", ranges={"i": range(a, b), "j": 2})
    np.testing.assert_array_equal(r2, 10 * np.arange(a, b)[:, None] + np.arange(2))


def test_ranges_on_a_reduced_index():
    assert ef.ein("s := sum[j](x[j])", x=x3, ranges={"j": range(1, 3)}) == 50.
    m = ef.ein("m[i] := max[k](x[2*i + k])", x=np.array([1., 5., 2., 2., 7., 0.]),
               ranges={"k": 2})
    np.testing.assert_array_equal(m, [5., 2., 7.])


def test_ranges_naming_an_unknown_index():
    with pytest.raises(errors.RangeError) as info:
        ef.ein("y[i] := x[i]", x=x3, ranges={"q": 3})
    check_error(info, errors.RangeError, ValueError, "'q'")


@pytest.mark.parametrize("text, rng, access", [
    ("y[i] := x[i+1]", 3, "x[i + 1]"),
    ("y[i] := x[i+1]", range(-2, 2), "x[i + 1]"),
    ("y[i] := x[i]", 4, "x[i]"),
    ("y[i] := x[i] * x[2*i]", 3, "x[2*i]"),
])
def test_explicit_range_that_reads_out_of_bounds(text, rng, access):
    with pytest.raises(errors.RangeError) as info:
        ef.ein(text, x=x3, ranges={"i": rng})
    check_error(info, errors.RangeError, ValueError, access)


def test_explicit_range_must_match_the_output_array():
    with pytest.raises(errors.ShapeError) as info:
        ef.ein("y[i] = x[i]", x=x3, y=np.zeros(3), ranges={"i": 2})
    check_error(info, errors.ShapeError, ValueError, "i", "2", "3")


def test_assign_output_shape_is_binding():
    x = np.arange(5.) ** 2
    y = np.zeros(4)
    assert ef.ein("y[i] = x[i+1] - x[i]", x=x, y=y) is y
    np.testing.assert_array_equal(y, np.diff(x))
    assert ranges_of("y[i] = x[i+1] - x[i]", {"x": (5,)}, output_shape=(2,)) == {"i": (0, 2)}


def test_assign_output_affine_read_outside_raises():
    source = "y[i] = x[i+1] - x[i]"
    y = np.full(3, 7.)
    with pytest.raises(errors.RangeError) as info:
        ef.ein(source, x=x3, y=y)
    check_error(info, errors.RangeError, ValueError, "x[i + 1]")
    assert source.index("x[i+1]") <= caret_start(info.value, source) <= source.index("i+1")
    np.testing.assert_array_equal(y, [7., 7., 7.])   # nothing written


def test_assign_output_longer_than_a_plain_input_raises():
    with pytest.raises((errors.RangeError, errors.ShapeError)) as info:
        ef.ein("y[i] = x[i]", x=x3, y=np.zeros(4))
    assert isinstance(info.value, ef.EinfuseError) and isinstance(info.value, ValueError)
    assert "x" in str(info.value)


def test_assign_output_wrong_rank():
    with pytest.raises(errors.ShapeError) as info:
        ef.ein("y[i] = x[i]", x=x3, y=np.zeros((3, 1)))
    check_error(info, errors.ShapeError, ValueError, "y", "(3, 1)")
    with pytest.raises(errors.ShapeError):
        ef.ein("t += x[i]", x=x3, t=np.zeros(1))


def test_pad_same_convolution_with_ranges():
    x, k = np.array([1., 2., 3., 4.]), np.array([1., 1., 1.])
    y = ef.ein("y[i] := x[i + a - 1] * k[a]", x=x, k=k, pad=0, ranges={"i": len(x)})
    np.testing.assert_allclose(y, [3., 6., 9., 7.])
    np.testing.assert_allclose(y, np.convolve(x, k, "same"))
    y = ef.ein("y[i] := x[i + a - 1] * k[a]", x=x, k=k, pad=10., ranges={"i": len(x)})
    np.testing.assert_allclose(y, [13., 6., 9., 17.])


def test_pad_same_convolution_with_assign_output():
    x, k = np.array([1., 2., 3., 4.]), np.array([1., 2., 3.])
    y = np.empty_like(x)
    assert ef.ein("y[i] = x[i + a - 1] * k[a]", x=x, k=k, y=y, pad=0) is y
    np.testing.assert_allclose(y, np.correlate(np.pad(x, 1), k, "valid"))
    assert ranges_of("y[i] = x[i + a - 1] * k[a]", {"x": (4,), "k": (3,)}, output_shape=(4,),
                     pad=0) == {"i": (0, 4), "a": (0, 3)}


def test_pad_with_a_plain_use():
    d = ef.ein("d[i] := x[i+1] - x[i]", x=np.array([1., 4., 9.]), pad=0)
    np.testing.assert_array_equal(d, [3., 5., -9.])


@pytest.mark.parametrize("text, index, kwargs", [
    ("r[i] := i", "i", {}),
    ("r[i] := sum[j](x[i] * j)", "j", {"x": x3}),
    ("y[i] := x[i + a - 1] * k[a]", "i", {"x": x3, "k": np.ones(2), "pad": 0}),
])
def test_index_without_range_source(text, index, kwargs):
    with pytest.raises(errors.RangeError) as info:
        ef.ein(text, **kwargs)
    check_error(info, errors.RangeError, ValueError, f"index {index}", "ranges=")


@pytest.mark.parametrize("text, shape, bad", [
    ("c[i] := A[i, 5]", (3, 4), "5"),
    ("c[i] := A[i, 4]", (3, 4), "4"),
    ("c := A[3, 0]", (3, 4), "3"),
])
def test_constant_subscript_out_of_range(text, shape, bad):
    with pytest.raises(errors.RangeError) as info:
        ef.ein(text, A=np.ones(shape))
    check_error(info, errors.RangeError, ValueError, "A", bad)


def test_constant_subscripts_in_range():
    A = np.arange(12.).reshape(3, 4)
    np.testing.assert_array_equal(ef.ein("c[i] := A[i, 3]", A=A), A[:, 3])
    assert ef.ein("c := A[2, 0]", A=A) == 8.


def test_empty_ranges_produce_empty_outputs():
    assert ef.ein("r[i] := i", ranges={"i": 0}).shape == (0,)
    assert ef.ein("y[i] := x[i] * 2", x=np.zeros(0)).shape == (0,)


# -- gathers -----------------------------------------------------------------------------------

IDX = np.array([-1, 1, 3])


@pytest.mark.parametrize("idx, bad", [
    (np.array([0, 1, 3]), 3),
    (np.array([0, 7, 1]), 7),
    (np.array([0, -1, 2]), -1),      # negative values are out of range: no counting from the end
    (np.array([-3, 0]), -3),
])
def test_gather_check_raises_out_of_bounds(idx, bad):
    source = "y[i] := x[idx[i]]"
    with pytest.raises(errors.OutOfBoundsError) as info:
        ef.ein(source, x=x3, idx=idx)
    text = check_error(info, errors.OutOfBoundsError, IndexError, "idx", str(bad), "0..2")
    assert caret_start(info.value, source) == source.index("idx")
    assert text.count("\n") >= 2


def test_gather_check_applies_to_the_affine_part():
    with pytest.raises(errors.OutOfBoundsError) as info:
        ef.ein("y[i] := x[idx[i] + 1]", x=x3, idx=np.array([0, 2]))
    check_error(info, errors.OutOfBoundsError, IndexError, "idx", "3", "0..2")
    np.testing.assert_array_equal(ef.ein("y[i] := x[idx[i] + 1]", x=x3, idx=np.array([0, 1])),
                                  [20., 30.])


def test_gather_check_on_a_second_axis():
    A = np.arange(6.).reshape(2, 3)
    with pytest.raises(errors.OutOfBoundsError) as info:
        ef.ein("v[n] := A[r[n], c[n]]", A=A, r=np.array([0, 1]), c=np.array([2, 3]))
    check_error(info, errors.OutOfBoundsError, IndexError, "c", "3", "0..2")


@pytest.mark.parametrize("bounds, kwargs, expected", [
    ("wrap", {}, [30., 20., 10.]),
    ("clip", {}, [10., 20., 30.]),
    ("fill", {}, [0., 20., 0.]),
    ("fill", {"fill": -1}, [-1., 20., -1.]),
    ("fill", {"fill": 2.5}, [2.5, 20., 2.5]),
])
def test_gather_bounds_modes(bounds, kwargs, expected):
    y = ef.ein("y[i] := x[idx[i]]", x=x3, idx=IDX, bounds=bounds, **kwargs)
    np.testing.assert_array_equal(y, expected)


def test_wrap_is_python_modulo():
    x = np.arange(5.) * 10
    idx = np.array([-2, -5, -6, 5, 7, 12])
    y = ef.ein("y[i] := x[idx[i]]", x=x, idx=idx, bounds="wrap")
    np.testing.assert_array_equal(y, x[[v % 5 for v in idx]])


def test_clip_with_affine_part():
    y = ef.ein("y[i] := x[idx[i] + 1]", x=x3, idx=np.array([0, 2]), bounds="clip")
    np.testing.assert_array_equal(y, [20., 30.])


def test_promise_with_good_values_runs():
    y = ef.ein("y[i] := x[idx[i]]", x=x3, idx=np.array([2, 0]), bounds="promise")
    np.testing.assert_array_equal(y, [30., 10.])


@pytest.mark.parametrize("idx", [np.array([0, 5]), np.array([-1, 0])])
def test_broken_promise_still_raises(idx):
    with pytest.raises(errors.OutOfBoundsError) as info:
        ef.ein("y[i] := x[idx[i]]", x=x3, idx=idx, bounds="promise")
    check_error(info, errors.OutOfBoundsError, IndexError, "idx")


def test_gathers_work():
    E = np.arange(12.).reshape(4, 3)
    tok = np.array([[3, 0], [1, 1]])
    np.testing.assert_array_equal(ef.ein("h[b,t,d] := E[tok[b,t], d]", E=E, tok=tok), E[tok])
    x = np.array([10., 20., 30., 40., 50.])
    p, q = np.array([4, 3, 2, 1, 0]), np.array([1, 1, 0], dtype=np.int32)
    np.testing.assert_array_equal(ef.ein("y[i] := x[p[q[i]]]", x=x, p=p, q=q), x[p[q]])


@pytest.mark.parametrize("text, dtype", [
    ("y[i] := x[idx[i]]", np.float64),
    ("y[i] := x[idx[i]]", np.float32),
    ("y[i] := x[idx[i]]", np.bool_),
    ("y[i] := x[p[idx[i]]]", np.float64),
])
def test_non_integer_index_array(text, dtype):
    kwargs = {"x": x3, "idx": np.array([0, 1]).astype(dtype)}
    if "p[" in text:
        kwargs["p"] = np.array([0, 1])
    with pytest.raises(errors.EinfuseTypeError) as info:
        ef.ein(text, **kwargs)
    check_error(info, errors.EinfuseTypeError, TypeError, "idx", np.dtype(dtype).name)


# -- dtypes -----------------------------------------------------------------------------------

f32 = np.array([1., -2., 3.], dtype=np.float32)
f64 = np.array([1., 2., 4.])
i32 = np.array([1, 2, 3], dtype=np.int32)
i64 = np.array([1, 2, 3], dtype=np.int64)
bools = np.array([True, False, True])


@pytest.mark.parametrize("text, kwargs, dtype", [
    ("y[i] := x[i] * 0.5", {"x": f32}, np.float32),
    ("y[i] := alpha * x[i]", {"x": f32, "alpha": 2.0}, np.float32),
    ("y[i] := alpha * x[i]", {"x": f32, "alpha": 2}, np.float32),
    ("y[i] := alpha * x[i]", {"x": f32, "alpha": np.float64(2.0)}, np.float64),
    ("y[i] := x[i] + z[i]", {"x": f32, "z": f64}, np.float64),
    ("y[i] := exp(x[i]) / 2", {"x": f32}, np.float32),
    ("y[i] := n[i] * 2", {"n": i32}, np.int32),
    ("y[i] := n[i] * k + n[i]", {"n": i32, "k": 3}, np.int32),
    ("y[i] := n[i] * n[i] - 1", {"n": i64}, np.int64),
    ("s := sum[i](n[i])", {"n": i64}, np.int64),
    ("y[i] := n[i] / 2", {"n": i32}, np.float64),
    ("y[i] := exp(n[i])", {"n": i32}, np.float64),
    ("y[i] := sqrt(n[i])", {"n": i64}, np.float64),
    ("y[i] := n[i] * 0.5", {"n": i32}, np.float64),
    ("c := sum[i](m[i])", {"m": bools}, np.int64),
    ("y[i] := m[i] + m[i]", {"m": bools}, np.int64),
    ("p[i] := x[i] > 0", {"x": f32}, np.bool_),
    ("p[i] := (a[i] > 0) & (b[i] < 1)", {"a": f64, "b": i32}, np.bool_),
    ("p[i] := n[i] == 2", {"n": i32}, np.bool_),
    ("r[i] := (x[i] > 0) * x[i]", {"x": f32}, np.float32),
    ("y[i,j] := A[i,j] / (j + 1)", {"A": np.ones((2, 3), np.float32)}, np.float32),
])
def test_result_dtype(text, kwargs, dtype):
    assert ef.ein(text, **kwargs).dtype == dtype


def test_integer_arithmetic_is_exact():
    n = 3_037_000_498                   # n*n - 1 is odd and above 2**53: not a float64
    y = ef.ein("y[i] := n[i] * n[i] - 1", n=np.array([n, 2], dtype=np.int64))
    assert y.dtype == np.int64 and y.tolist() == [n * n - 1, 3]
    r = ef.ein("r[i] := i * i", ranges={"i": 4})
    assert r.dtype.kind == "i" and r.tolist() == [0, 1, 4, 9]


def test_relu_and_comparison_values():
    np.testing.assert_array_equal(ef.ein("p[i] := x[i] > 0", x=f32), [True, False, True])
    np.testing.assert_array_equal(ef.ein("r[i] := (x[i] > 0) * x[i]", x=f32), [1., 0., 3.])


@pytest.mark.parametrize("dtype, expected", [
    ("float32", np.float32), (np.float32, np.float32), (np.int64, np.int64),
    ("int32", np.int32), ("bool", np.bool_), ("float64", np.float64),
])
def test_dtype_override(dtype, expected):
    y = ef.ein("y[i] := x[i] * 2", x=f64, dtype=dtype)
    assert y.dtype == expected
    np.testing.assert_array_equal(y, (f64 * 2).astype(expected))


# -- argument binding --------------------------------------------------------------------------

def test_positional_arguments_bind_in_order_of_first_appearance():
    x, idx = np.array([1., 2., 3.]), np.array([2, 0])
    by_keyword = ef.ein("y[i] := alpha * x[idx[i]] + beta", alpha=2., x=x, idx=idx, beta=1.)
    by_position = ef.ein("y[i] := alpha * x[idx[i]] + beta", 2., x, idx, 1.)
    mixed = ef.ein("y[i] := alpha * x[idx[i]] + beta", 2., x, beta=1., idx=idx)
    np.testing.assert_array_equal(by_keyword, [7., 3.])
    np.testing.assert_array_equal(by_position, by_keyword)
    np.testing.assert_array_equal(mixed, by_keyword)
    A, B = np.ones((2, 3)), np.arange(6.).reshape(3, 2)
    kernel = ef.compile("C[i,j] := A[i,k] * B[k,j]")
    assert kernel.inputs == ("A", "B")
    np.testing.assert_array_equal(kernel(A, B), A @ B)


@pytest.mark.parametrize("text, args, kwargs, cls, names", [
    ("y[i] := x[i]", (), {}, errors.MissingArgumentError, ["x"]),
    ("C[i,j] := A[i,k] * B[k,j]", (), {"A": np.ones((2, 2))}, errors.MissingArgumentError,
     ["B"]),
    ("y[i] := alpha * x[i]", (), {"x": x3}, errors.MissingArgumentError, ["alpha"]),
    ("y[i] := x[idx[i]]", (x3,), {}, errors.MissingArgumentError, ["idx"]),
    ("y[i] = x[i]", (), {"x": x3}, errors.MissingArgumentError, ["y"]),
    ("y[i] += x[i]", (x3,), {}, errors.MissingArgumentError, ["y"]),
    ("y[i] := x[i]", (), {"x": x3, "z": x3}, errors.UnexpectedArgumentError, ["z"]),
    ("y[i] := x[i]", (), {"x": x3, "alpha": 2.}, errors.UnexpectedArgumentError, ["alpha"]),
    ("y[i] := x[i]", (x3, x3), {}, errors.UnexpectedArgumentError, ["2", "1", "x"]),
    ("y[i] := x[i]", (x3,), {"x": x3}, errors.UnexpectedArgumentError, ["x"]),
    ("y[i] := x[i]", (), {"x": x3, "y": np.zeros(3)}, errors.UnexpectedArgumentError,
     ["y", ":="]),
])
def test_argument_binding_errors(text, args, kwargs, cls, names):
    with pytest.raises(cls) as info:
        ef.ein(text, *args, **kwargs)
    check_error(info, cls, TypeError, *names)


def test_output_of_assign_is_not_positional():
    with pytest.raises(errors.UnexpectedArgumentError):
        ef.ein("y[i] = x[i]", x3, np.zeros(3))


@pytest.mark.parametrize("value", [np.ones(3), np.ones((1,)), [1., 2.]])
def test_scalar_parameter_given_an_array(value):
    with pytest.raises(ef.EinfuseError) as info:
        ef.ein("y[i] := alpha * x[i]", x=x3, alpha=value)
    assert isinstance(info.value, (errors.ShapeError, errors.EinfuseTypeError))
    assert "alpha" in str(info.value)


def test_scalar_parameter_accepts_numbers_and_0d_arrays():
    for alpha in (2, 2., np.float64(2.), np.array(2.), np.int32(2)):
        np.testing.assert_array_equal(ef.ein("y[i] := alpha * x[i]", x=x3, alpha=alpha),
                                      2 * x3)


@pytest.mark.parametrize("value", [np.array([1 + 2j]), np.array(["a", "b"]), object()])
def test_unsupported_tensor_dtypes(value):
    with pytest.raises(errors.EinfuseTypeError) as info:
        ef.ein("y[i] := x[i]", x=value)
    check_error(info, errors.EinfuseTypeError, TypeError, "x")


def test_mixing_frameworks():
    torch = pytest.importorskip("torch")
    with pytest.raises(errors.EinfuseTypeError) as info:
        ef.ein("y[i] := x[i] + z[i]", x=x3, z=torch.ones(3, dtype=torch.float64))
    check_error(info, errors.EinfuseTypeError, TypeError, "x", "z", "numpy", "torch")


# -- options ----------------------------------------------------------------------------------

@pytest.mark.parametrize("options, names", [
    ({"bounds": "clamp"}, ["bounds", "'clamp'"]),
    ({"bounds": None}, ["bounds", "None"]),
    ({"backend": "gpu"}, ["backend", "'gpu'"]),
    ({"ranges": {"i": -1}}, ["ranges", "'i'", "-1"]),
    ({"ranges": {"i": range(0, 4, 2)}}, ["ranges", "'i'", "step"]),
    ({"ranges": {"i": 2.5}}, ["ranges", "2.5"]),
    ({"ranges": {"i": True}}, ["ranges", "True"]),
    ({"ranges": [("i", 3)]}, ["ranges"]),
    ({"ranges": {1: 3}}, ["ranges", "1"]),
    ({"threads": 0}, ["threads", "0"]),
    ({"threads": -2}, ["threads", "-2"]),
    ({"threads": 1.5}, ["threads", "1.5"]),
    ({"threads": True}, ["threads", "True"]),
    ({"threads": "4"}, ["threads", "'4'"]),
    ({"memory_limit": 10}, ["memory_limit", "10"]),
    ({"fill": "a"}, ["fill", "'a'"]),
    ({"pad": "zero"}, ["pad", "'zero'"]),
    ({"dtype": "complex64"}, ["dtype", "complex64"]),
    ({"dtype": "banana"}, ["dtype", "banana"]),
])
def test_invalid_options(options, names):
    for call in (lambda: ef.ein("y[i] := x[i]", x=x3, **options),
                 lambda: ef.compile("y[i] := x[i]", **options)):
        with pytest.raises(errors.OptionError) as info:
            call()
        check_error(info, errors.OptionError, ValueError, *names)


def test_unavailable_backend():
    with pytest.raises(errors.OptionError) as info:
        ef.ein("y[i] := x[i]", x=x3, backend="definitely-not-a-backend")
    check_error(info, errors.OptionError, ValueError, "definitely-not-a-backend")


@pytest.mark.parametrize("options", [
    {"bounds": "clip"}, {"backend": "numpy"}, {"backend": "auto"}, {"threads": 2},
    {"threads": None}, {"memory_limit": 4096}, {"pad": 0}, {"fill": 3},
    {"ranges": {"i": range(0, 3)}}, {"dtype": None},
])
def test_valid_options(options):
    np.testing.assert_array_equal(ef.ein("y[i] := x[i]", x=x3, **options), x3)
