"""Hostile input (issue 9): every input gets the right result or an EinfuseError that
names the offender, on every backend -- never a raw Python/NumPy exception or a crash.

Covered here: threads= (libgomp used to abort the process), huge integers anywhere
(literals, subscripts, ranges, parameters, results), narrow integer dtypes with
out-of-range literals, tensor names that equal the API's own parameters, and Unicode
names."""

import os

import numpy as np
import pytest

import einfuse as ef
from carets import caret_text
from einfuse import errors
from einfuse.analysis.options import MAX_THREADS

INT64_MAX = 2**63 - 1
x5 = np.arange(5.0)


# -- threads= ---------------------------------------------------------------------------

@pytest.mark.parametrize("threads", [10**9, MAX_THREADS + 1, 0, -2, 2.0, True, "4",
                                     np.ones(2)])
def test_threads_out_of_bounds_is_an_option_error(threads):
    with pytest.raises(errors.OptionError, match=rf"threads= takes an int from 1 to "
                                                 rf"{MAX_THREADS}") as info:
        ef.compile("y[i] := x[i] * 2", threads=threads)
    assert isinstance(info.value, ValueError)


def test_threads_within_bounds_run(backend):
    assert MAX_THREADS >= max(1024, 4 * (os.cpu_count() or 1))
    with pytest.raises(errors.OptionError):
        ef.ein("y[i] := x[i] * 2", x=x5, threads=10**9, backend=backend)
    np.testing.assert_array_equal(ef.ein("y[i] := x[i] * 2", x=x5, threads=3,
                                         backend=backend), 2 * x5)


# -- huge integers ------------------------------------------------------------------------

@pytest.mark.parametrize("source, literal", [
    ("y[i] := x[i+99999999999999999999]", "99999999999999999999"),
    ("y[i] := x[i] + 99999999999999999999", "99999999999999999999"),
    ("y[i] := x[i] * -9223372036854775808", "9223372036854775808"),
    ("y[i] := x[2*i + 9223372036854775808]", "9223372036854775808"),
    ("y[i] := x[i] + " + "9" * 5000, "9" * 5000),   # int() refuses > 4300 digits
])
def test_integer_literals_must_fit_int64(backend, source, literal):
    with pytest.raises(errors.EinfuseOverflowError, match="does not fit in int64") as info:
        ef.ein(source, x=x5, backend=backend)
    assert isinstance(info.value, OverflowError)
    assert caret_text(info.value, source) == literal


def test_the_largest_int64_literal_is_fine(backend):
    y = ef.ein("y[i] := x[i] + 9223372036854775807", x=np.zeros(2, np.int64),
               backend=backend)
    assert y.tolist() == [INT64_MAX, INT64_MAX]
    long_zero = "0" * 5000 + "7"   # leading zeros do not count, even past int()'s limit
    assert ef.ein(f"y[i] := x[i] + {long_zero}", x=np.zeros(2, np.int64),
                  backend=backend).tolist() == [7, 7]
    with pytest.raises(errors.EinfuseOverflowError):
        ef.ein("y[i] := x[i] + 9223372036854775808", x=np.zeros(2, np.int64),
               backend=backend)


@pytest.mark.parametrize("source, part", [
    ("y[i] := x[9223372036854775807*i + 9223372036854775807*i]",
     "9223372036854775807*i + 9223372036854775807*i"),
    ("y[i] := x[2*(4611686018427387904*i)]", "2*(4611686018427387904*i)"),
    ("y[i] := x[i + 9223372036854775807 + 1]", "i + 9223372036854775807 + 1"),
])
def test_subscript_arithmetic_must_fit_int64(source, part):
    with pytest.raises(errors.EinfuseOverflowError, match="subscript arithmetic") as info:
        ef.compile(source)
    assert caret_text(info.value, source) == part


def test_index_arithmetic_must_fit_int64(backend):
    # with pad= the reads may leave the array, but i + 2 itself must still be an int64
    top = {"i": range(INT64_MAX - 1, INT64_MAX)}
    with pytest.raises(errors.EinfuseOverflowError, match=r"x\[i \+ 2\].*beyond int64"):
        ef.ein("y[i] := x[i + 2]", x=x5, pad=0, ranges=top, backend=backend)
    with pytest.raises(errors.EinfuseOverflowError, match="beyond int64"):
        ef.ein("y[i] := x[i - 1]", x=x5, pad=0, backend=backend,
               ranges={"i": range(-INT64_MAX, -INT64_MAX + 1)})
    np.testing.assert_array_equal(
        ef.ein("y[i] := x[i + 1]", x=x5, pad=-1, ranges=top, backend=backend), [-1.0])


@pytest.mark.parametrize("ranges", [{"i": 2**63}, {"i": range(-2**63, 0)},
                                    {"i": range(0, 2**64)},
                                    {"i": range(-INT64_MAX, INT64_MAX)}])
def test_ranges_must_be_int64(ranges):
    with pytest.raises(errors.OptionError, match="index values are int64"):
        ef.compile("y[i] := i", ranges=ranges)


@pytest.mark.parametrize("ranges, shape", [
    ({"i": 10**12}, "(1000000000000,)"),
    ({"i": 2**40, "j": 2**40}, "(1099511627776, 1099511627776)"),
])
def test_a_result_too_large_to_allocate_names_its_shape(backend, ranges, shape):
    source = "y[i] := i" if len(ranges) == 1 else "y[i,j] := i + j"
    with pytest.raises(errors.AllocationError) as info:
        ef.ein(source, ranges=ranges, backend=backend)
    assert isinstance(info.value, MemoryError)
    assert f"the result y has shape {shape}" in str(info.value)


@pytest.mark.parametrize("value", [10**30, -10**30, np.uint64(2**64 - 1)])
@pytest.mark.parametrize("dtype", [np.int64, np.float64])
def test_integer_parameters_must_fit_int64(backend, value, dtype):
    with pytest.raises(errors.EinfuseOverflowError, match="a=.* does not fit in int64") \
            as info:
        ef.ein("y[i] := x[i] + a", x=np.arange(3, dtype=dtype), a=value, backend=backend)
    assert caret_text(info.value, "y[i] := x[i] + a") == "a"


@pytest.mark.parametrize("value", [1e30, -1e30])
def test_huge_float_parameters_on_integer_inputs(backend, value):
    x = np.arange(3)
    y = ef.ein("y[i] := x[i] * a", x=x, a=value, backend=backend)
    assert y.dtype == np.float64
    np.testing.assert_array_equal(y, x * value)


@pytest.mark.parametrize("source, dtype, kwargs, offender", [
    ("y[i] := x[i] + 300", np.int8, {}, "300"),
    ("y[i] := x[i] * -1", np.uint8, {}, "-1"),
    ("y[i] := where(x[i] > 0, x[i], -129)", np.int8, {}, "-129"),
    ("y[i] := x[i] + a", np.int8, {"a": 300}, "a"),
    ("y[i] := x[i] - a", np.uint8, {"a": -1}, "a"),
    ("y[i] := x[i] + 70000", np.int16, {}, "70000"),
])
def test_out_of_range_literals_on_narrow_integers(backend, source, dtype, kwargs,
                                                   offender):
    x = np.arange(3, dtype=dtype)
    with pytest.raises(OverflowError):   # NumPy 2's rule (NEP 50), which einfuse follows
        x + (kwargs.get("a", 300) if dtype == np.int8 else 70000 if dtype == np.int16
             else -1)
    with pytest.raises(errors.EinfuseOverflowError, match=np.dtype(dtype).name) as info:
        ef.ein(source, x=x, backend=backend, **kwargs)
    assert isinstance(info.value, OverflowError)
    assert caret_text(info.value, source) == offender


@pytest.mark.parametrize("source, dtype, expected", [
    ("y[i] := x[i] - 1", np.uint8, lambda x: x - 1),        # wraps, as in NumPy
    ("y[i] := x[i] + 127", np.int8, lambda x: x + 127),     # wraps, as in NumPy
    ("y[i] := x[i] * -128", np.int8, lambda x: x * -128),
    ("y[i] := x[i] + 300", np.int16, lambda x: x + 300),
])
def test_in_range_literals_on_narrow_integers_match_numpy(backend, source, dtype,
                                                           expected):
    x = np.arange(3, dtype=dtype)
    with np.errstate(over="ignore"):
        want = expected(x)
    got = ef.ein(source, x=x, backend=backend)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    with pytest.raises(errors.EinfuseOverflowError):   # and one past the range is loud
        ef.ein("y[i] := x[i] + 40000", x=x, backend=backend)


# -- tensors named like the API's parameters ----------------------------------------------

NAMES = ["self", "statement", "arrays", "ranges", "pad", "bounds", "fill", "dtype",
         "backend", "threads", "memory_limit", "shapes", "gradients", "args"]


@pytest.mark.parametrize("name", NAMES)
def test_every_tensor_name_is_usable(backend, name):
    source = f"y[i] := {name}[i] * 2 + x[i]"
    a, x = np.arange(3.0), np.ones(3)
    want = 2 * a + x
    np.testing.assert_array_equal(
        ef.ein(source, arrays={name: a}, x=x, backend=backend), want)
    np.testing.assert_array_equal(ef.ein(source, a, x, backend=backend), want)
    kernel = ef.compile(source, backend=backend)
    np.testing.assert_array_equal(kernel(**{name: a, "x": x}), want)
    np.testing.assert_array_equal(kernel(arrays={name: a, "x": x}), want)
    text = str(ef.explain(source, arrays={name: a}, x=x, backend=backend))
    assert "0..2" in text


@pytest.mark.parametrize("option, value", [
    ("bounds", np.array([0, 1])), ("ranges", np.array([0, 1])), ("pad", np.ones(2)),
    ("backend", np.ones(2)), ("dtype", np.ones(2)), ("fill", np.ones(2)),
    ("threads", np.ones(2)), ("memory_limit", np.ones(2)),
])
def test_a_keyword_that_collides_with_an_option_says_so(option, value):
    source = f"y[i] := x[{option}[i]]" if value.dtype.kind == "i" else \
        f"y[i] := x[i] * {option}[i]"
    with pytest.raises(errors.OptionError) as info:
        ef.ein(source, x=np.ones(2), **{option: value})
    text = str(info.value)
    assert f"{option}= is the option" in text and f"arrays={{'{option}': ...}}" in text
    assert caret_text(info.value, source) == f"{option}[i]"


@pytest.mark.parametrize("option", ["shapes", "gradients"])
def test_explains_own_options_collide_loudly_too(option):
    source = "y[i] := x[i] * shapes[i] * gradients[i]"
    arrays = {"x": x5, "shapes": x5, "gradients": x5}
    with pytest.raises(errors.OptionError, match=rf"arrays=\{{'{option}': \.\.\.\}}") as info:
        ef.explain(source, **{option: x5}, arrays={k: v for k, v in arrays.items()
                                                   if k != option})
    assert caret_text(info.value, source) == f"{option}[i]"
    assert "0..4" in str(ef.explain(source, arrays=arrays, gradients=True))


def test_a_scalar_named_like_an_option_is_missing_with_a_hint(backend):
    source = "y[i] := x[i] * fill"
    with pytest.raises(errors.MissingArgumentError, match=r"arrays=\{'fill': \.\.\.\}"):
        ef.ein(source, x=x5, fill=2.0, backend=backend)
    np.testing.assert_array_equal(ef.ein(source, x=x5, arrays={"fill": 2.0},
                                         backend=backend), 2 * x5)
    np.testing.assert_array_equal(ef.compile(source, backend=backend)(x=x5, fill=2.0),
                                  2 * x5)


def test_arrays_mapping_errors_are_einfuse_errors():
    with pytest.raises(errors.UnexpectedArgumentError, match="arrays= takes a dict"):
        ef.ein("y[i] := x[i]", arrays=np.ones(2))
    with pytest.raises(errors.UnexpectedArgumentError, match="given twice"):
        ef.ein("y[i] := x[i]", x=x5, arrays={"x": x5})
    with pytest.raises(errors.UnexpectedArgumentError, match="not a name"):
        ef.ein("y[i] := x[i]", arrays={1: x5})
    with pytest.raises(errors.UnexpectedArgumentError, match="compile\\(\\) takes"):
        ef.compile("y[i] := x[i]", x=x5)


def test_older_call_forms_still_work():
    np.testing.assert_array_equal(ef.ein(statement="y[i] := x[i] * 2", x=x5), 2 * x5)
    assert ef.compile(statement="y[i] := x[i]").inputs == ("x",)
    assert "x[i]" in str(ef.explain(statement="y[i] := x[i]"))
    with pytest.raises(errors.MissingArgumentError, match="first argument"):
        ef.ein(x=x5)


# -- Unicode names ----------------------------------------------------------------------

def test_unicode_names_run_and_never_reach_generated_code(backend, monkeypatch):
    from einfuse.backends.c import backend as c_backend
    from einfuse.backends.triton import render as triton_render
    sources = []

    def capture(render):
        def wrapped(*args, **kwargs):
            result = render(*args, **kwargs)
            sources.append(result if isinstance(result, str) else result[0])
            return result
        return wrapped

    monkeypatch.setattr(c_backend, "render_c", capture(c_backend.render_c))
    monkeypatch.setattr(triton_render, "render_triton", capture(triton_render.render_triton))
    é, wé = np.arange(6.0).reshape(2, 3), np.array([1.0, 0.5, 2.0])
    # 'ﬁ' is NFKC 'fi', as Python spells the keyword; 'ê' decomposed is NFKC 'ê'
    source = f"ÿ[α, j] := sum[β](é[α, β] * wé[β]) * ﬁ + café[α, j] * α # {backend}"
    got = ef.ein(source, é=é, wé=wé, fi=2.0, **{"cafe\u0301": é}, backend=backend)
    want = (é @ wé)[:, None] * 2.0 + é * np.arange(2)[:, None]
    np.testing.assert_allclose(got, want)
    ids = np.array([1, 0])
    np.testing.assert_array_equal(
        ef.ein(f"y[ℓ] := é[ιδ[ℓ], 0] # {backend}", é=é, ιδ=ids, backend=backend), [3.0, 0.0])
    if backend != "numpy":
        assert sources, "no kernel source was rendered"
        assert all(text.isascii() for text in sources)


@pytest.mark.parametrize("source", ["y[i] := x[i] + ٣", "y[i] := x[i] + ２"])
def test_digits_are_ascii_only(source):
    with pytest.raises(errors.EinfuseSyntaxError):
        ef.compile(source)
