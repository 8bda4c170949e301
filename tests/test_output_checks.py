"""Issue 9, 'correct or loud' for the arrays that '=' and '+=' write into: an output whose
shape disagrees with the ranges, a result that does not cast to the output's dtype, and a
torch leaf that requires grad each raise an EinfuseError naming the culprit, and nothing
is written; the shapes and dtypes that are legal give NumPy's answer on every backend."""

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view

import einfuse as ef
from einfuse import errors

SENTINEL = 7


def caret_span(error, source):
    """(first, last) column of the carets under ``source`` in str(error)."""
    lines = str(error).split("\n")
    assert "    " + source in lines, f"statement not shown in:\n{error}"
    caret = lines[lines.index("    " + source) + 1][4:]
    assert set(caret.strip()) == {"^"}, f"no caret line in:\n{error}"
    first = len(caret) - len(caret.lstrip(" "))
    return first, len(caret.rstrip()) - 1


def raises_at(cls, source, access, call):
    """``call()`` raises ``cls`` (an EinfuseError) whose carets fall on ``access``."""
    with pytest.raises(cls) as info:
        call()
    assert isinstance(info.value, ef.EinfuseError)
    first, last = caret_span(info.value, source)
    start = source.index(access)
    assert start <= first and last < start + len(access), str(info.value)
    return str(info.value)


def correlate2d_valid(img, ker):
    return np.einsum("rcij,ij->rc", sliding_window_view(img, ker.shape), ker)


rng = np.random.default_rng(9)


# -- an index used only plainly: the output's extent must equal every use's -------------

PLAIN = [
    # statement, inputs, wrong output shape, right output shape, culprit, NumPy result
    ("C[i,j] = A[i,k]*B[k,j]", {"A": (3, 4), "B": (4, 5)}, (3, 3), (3, 5), "B[k,j]",
     lambda a: a["A"] @ a["B"]),
    ("C[i,j] += A[i,k]*B[k,j]", {"A": (3, 4), "B": (4, 5)}, (2, 5), (3, 5), "A[i,k]",
     lambda a: SENTINEL + a["A"] @ a["B"]),
    ("y[i] = x[i]", {"x": (10,)}, (6,), (10,), "x[i]", lambda a: a["x"]),
    ("d[i] = S[i,i]", {"S": (4, 4)}, (3,), (4,), "S[i,i]", lambda a: np.diag(a["S"])),
    ("y[b] = W[idx[b]]", {"W": (5,), "idx": (4,)}, (2,), (4,), "idx[b]",
     lambda a: a["W"][a["idx"]]),
]


@pytest.mark.parametrize("source, shapes, wrong, right, culprit, numpy", PLAIN)
def test_output_extent_must_equal_a_plain_use(backend, source, shapes, wrong, right,
                                              culprit, numpy):
    arrays = {name: rng.integers(0, 5, shape) if name == "idx" else rng.random(shape)
              for name, shape in shapes.items()}
    out_name = source.split("[")[0]
    out = np.full(wrong, float(SENTINEL))
    text = raises_at(errors.ShapeError, source, culprit, lambda: ef.ein(
        source, backend=backend, **arrays, **{out_name: out}))
    assert out_name in text and culprit.split("[")[0] in text
    np.testing.assert_array_equal(out, SENTINEL)           # nothing written
    out = np.full(right, float(SENTINEL))
    assert ef.ein(source, backend=backend, **arrays, **{out_name: out}) is out
    np.testing.assert_allclose(out, numpy(arrays))


# -- a reduced index keeps its own range: an output too long is a RangeError -------------

AFFINE = [
    # statement, inputs, wrong output shape, right output shape, culprit, NumPy result
    ("y[i] = x[i+a]*k[a]", {"x": (10,), "k": (3,)}, (10,), (8,), "x[i+a]",
     lambda a: np.correlate(a["x"], a["k"], "valid")),
    ("y[i] = sum[a](x[i+a]*k[a])", {"x": (10,), "k": (3,)}, (10,), (8,), "x[i+a]",
     lambda a: np.correlate(a["x"], a["k"], "valid")),
    ("y[i] += x[i+a]*k[a]", {"x": (10,), "k": (3,)}, (9,), (8,), "x[i+a]",
     lambda a: SENTINEL + np.correlate(a["x"], a["k"], "valid")),
    ("o[r,c] = img[r+dr, c+dc]*K[dr,dc]", {"img": (6, 7), "K": (3, 2)}, (6, 7), (4, 6),
     "img[r+dr, c+dc]", lambda a: correlate2d_valid(a["img"], a["K"])),
    ("o[r,c] = sum[dr,dc](img[r+dr, c+dc]*K[dr,dc])", {"img": (6, 7), "K": (3, 2)}, (4, 7),
     (4, 6), "img[r+dr, c+dc]", lambda a: correlate2d_valid(a["img"], a["K"])),
]


@pytest.mark.parametrize("source, shapes, wrong, right, culprit, numpy", AFFINE)
def test_reduced_index_is_not_shrunk_to_fit_the_output(backend, source, shapes, wrong,
                                                       right, culprit, numpy):
    arrays = {name: rng.random(shape) for name, shape in shapes.items()}
    out_name = source.split("[")[0]
    out = np.full(wrong, float(SENTINEL))
    text = raises_at(errors.RangeError, source, culprit, lambda: ef.ein(
        source, backend=backend, **arrays, **{out_name: out}))
    assert culprit.split("[")[0] in text
    np.testing.assert_array_equal(out, SENTINEL)
    out = np.full(right, float(SENTINEL))
    assert ef.ein(source, backend=backend, **arrays, **{out_name: out}) is out
    np.testing.assert_allclose(out, numpy(arrays))


def test_explicit_output_range_does_not_shrink_a_reduced_index(backend):
    source = "y[i] := x[i+a]*k[a]"
    x, k = rng.random(10), rng.random(3)
    raises_at(errors.RangeError, source, "x[i+a]", lambda: ef.ein(
        source, x=x, k=k, ranges={"i": 10}, backend=backend))
    y = ef.ein(source, x=x, k=k, ranges={"i": range(1, 6)}, backend=backend)
    np.testing.assert_allclose(y, np.correlate(x, k, "valid")[1:6])
    # the output's extent still comes from a plain use when that use is the only source
    out = np.full(8, float(SENTINEL))
    ef.ein("y[i] = x[i+a]", x=x, y=out, backend=backend)      # a: 0..2, from y and x
    np.testing.assert_allclose(out, sliding_window_view(x, 3).sum(1))
    out = np.full(10, float(SENTINEL))                         # pad=: y sets i's range
    ef.ein("y[i] = x[i+a-1]*k[a]", x=x, k=k, y=out, pad=0, backend=backend)
    np.testing.assert_allclose(out, np.correlate(np.pad(x, 1), k, "valid"))


def test_reduced_index_keeps_its_range_when_the_output_index_has_a_plain_use(backend):
    # i has a plain use (z) and a shifted one (x); a is reduced with a plain use (k).
    # a keeps 0..2 and i takes the intersection, 0..7, whatever order they settle in.
    x, k, z = rng.random(10), rng.random(3), rng.random(10)
    y = ef.ein("y[i] := x[i+a]*k[a]*z[i]", x=x, k=k, z=z, backend=backend)
    np.testing.assert_allclose(y, np.correlate(x, k, "valid") * z[:8])


# -- casting the result into the output: NumPy's same_kind rule ---------------------------

@pytest.mark.parametrize("source, out_dtype, result_dtype", [
    ("y[i] = x[i] * 0.5", np.int64, "float64"),
    ("y[i] += x[i] / 2", np.int32, "float64"),
    ("y[i] = x[i] * 0.5", np.bool_, "float64"),
    ("y[i] = n[i] + 1", np.bool_, "int64"),
])
def test_result_must_cast_same_kind_into_the_output(backend, source, out_dtype,
                                                    result_dtype):
    x, n = np.arange(5), np.arange(5)
    args = {name: value for name, value in (("x", x), ("n", n)) if f"{name}[" in source}
    y = np.full(5, SENTINEL, dtype=out_dtype)
    with pytest.raises(errors.EinfuseTypeError) as info:
        ef.ein(source, y=y, backend=backend, **args)
    text = str(info.value)
    assert result_dtype in text and np.dtype(out_dtype).name in text and "dtype=" in text
    assert source.index("y") == caret_span(info.value, source)[0]
    np.testing.assert_array_equal(y, np.full(5, SENTINEL, dtype=out_dtype))
    # an explicit dtype= is the caller's cast
    expected = (x * 0.5).astype(out_dtype) if "0.5" in source else \
        (SENTINEL + (x / 2).astype(out_dtype)) if "/" in source else (n + 1).astype(out_dtype)
    ef.ein(source, y=y, dtype=out_dtype, backend=backend, **args)
    np.testing.assert_array_equal(y, expected)


def test_same_kind_casts_are_written(backend):
    x64 = rng.random(4)
    y = np.zeros(4, np.float32)
    ef.ein("y[i] = x[i] * 2.0", x=x64, y=y, backend=backend)             # float64 -> float32
    np.testing.assert_allclose(y, (x64 * 2).astype(np.float32), rtol=1e-6)
    c = np.zeros(4, np.int32)
    ef.ein("c[i] += n[i] + m[i]", n=np.arange(4), m=np.arange(4), c=c, backend=backend)
    np.testing.assert_array_equal(c, 2 * np.arange(4))                  # int64 -> int32
    f = np.zeros(4)
    ef.ein("f[i] = x[i] > 0.5", x=x64, f=f, backend=backend)             # bool -> float
    np.testing.assert_array_equal(f, (x64 > 0.5).astype(float))
    with pytest.raises(errors.EinfuseTypeError):                        # and float -> int is not
        ef.ein("c[i] = x[i]", x=x64, c=c, backend=backend)


# -- torch: a leaf that requires grad is not written in place ------------------------------

@pytest.mark.parametrize("assign", ["=", "+="])
def test_torch_leaf_that_requires_grad_is_not_overwritten(backend, assign):
    torch = pytest.importorskip("torch")
    source = f"y[i] {assign} x[i] * 2"
    x = torch.arange(3.)
    y = torch.full((3,), float(SENTINEL), requires_grad=True)
    with pytest.raises(ef.EinfuseError) as info:
        ef.ein(source, x=x, y=y, backend=backend)
    assert "leaf" in str(info.value) and "requires grad" in str(info.value)
    assert source.index("y") == caret_span(info.value, source)[0]
    assert torch.equal(y.detach(), torch.full((3,), float(SENTINEL)))
    w = torch.zeros(2, 3, requires_grad=True)                # a view of such a leaf too
    with pytest.raises(ef.EinfuseError, match="leaf"):
        ef.ein(source, x=x, y=w[0], backend=backend)
    assert not w.detach().any()
    # torch allows it with grad mode off (an optimiser step); so does einfuse
    with torch.no_grad():
        ef.ein(source, x=x, y=y, backend=backend)
    expected = x * 2 + (SENTINEL if assign == "+=" else 0)
    assert torch.allclose(y.detach(), expected)


def test_torch_output_dtype_is_checked(backend):
    torch = pytest.importorskip("torch")
    y = torch.full((3,), SENTINEL, dtype=torch.int64)
    with pytest.raises(errors.EinfuseTypeError, match="float32"):
        ef.ein("y[i] = x[i] * 0.5", x=torch.arange(3.), y=y, backend=backend)
    assert (y == SENTINEL).all()
