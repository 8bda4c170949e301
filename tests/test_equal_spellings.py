"""Two spellings of one computation share one compiled kernel: a Spec's structural key
(analysis/spec_key.py) is equal where their statements differ only in index names,
whitespace or an implicit sum, and exact where Python's equality is not (-0.0 and
0.0, 2 and 2.0, NaN payloads); the C backend's loop nests and fused groups are shared
through LoopChoice.key.  Builds are counted at backends/c/build.load; values against
tests/oracle.py and NumPy."""

import struct

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import einfuse as ef
from einfuse.analysis.spec import spec_of
from einfuse.analysis.spec_key import constant_key, expression_key
from einfuse.backends.c import backend as c_backend, build as c_build, fused as c_fused
from einfuse.lang.ast import Number
from einfuse.schedule.cache_key import CacheKind
from einfuse.schedule.choose import choose
from oracle import brute_force

pytestmark = pytest.mark.skipif(c_build.find_compiler() is None, reason="no C compiler")
rng = np.random.default_rng(30)


class Builds:
    """The libraries loaded (backends/c/build.load calls) since the fixture began, on
    empty caches of compiled loop nests and fused groups."""

    def __init__(self, monkeypatch):
        self.count = 0
        load = c_build.load

        def counted(*args, **kwargs):
            self.count += 1
            return load(*args, **kwargs)
        monkeypatch.setattr(c_build, "load", counted)
        for module, name in ((c_backend, "_kernels"), (c_backend, "_compiled_by_structure"),
                             (c_fused, "_fused"), (c_fused, "_compiled_by_structure")):
            monkeypatch.setattr(module, name, {})


@pytest.fixture
def builds(monkeypatch):
    return Builds(monkeypatch)


def oracle(statement, kernel, arrays, **options):
    call = kernel.bind(**arrays)
    ranges = {name: call.bounds.range_map[name] for name in call.spec.all_indices}
    return brute_force(statement, ranges, arrays, **options)


def loop_nest_keys():
    return [key for key in c_backend._kernels if key.kind is CacheKind.LOOP_NEST]


SUM_ROWS = ["y[i] := sum[j](exp(A[i,j]) * B[i,j])",
            "y[r] := sum[c](exp(A[r,c]) * B[r,c])",
            "y[i] := exp(A[i,j]) * B[i,j]",                  # the sum implicit
            "y[ q ] :=sum[ w ]( exp( A[q,w] )*B[q,w] )"]


def test_equal_spellings_compile_one_kernel(builds):
    arrays = {"A": rng.standard_normal((6, 40)), "B": rng.standard_normal((6, 40))}
    results = []
    for text in SUM_ROWS:
        kernel = ef.compile(text, backend="c", threads=1)
        assert choose(kernel, kernel.bind(**arrays)).loops is not None   # (a loop nest)
        results.append(np.asarray(kernel(**arrays)))
        np.testing.assert_allclose(results[-1], oracle(text, kernel, arrays), rtol=1e-12)
    assert len({spec_of(text).key for text in SUM_ROWS}) == 1
    assert len({spec_of(text) for text in SUM_ROWS}) == len(SUM_ROWS)   # (identity)
    assert builds.count == 1
    assert len(loop_nest_keys()) == len(SUM_ROWS)     # one entry per spelling's choice,
    for result in results[1:]:                        # all of them one kernel
        np.testing.assert_array_equal(result, results[0])


@pytest.mark.parametrize("first, second", [
    ("y[i,j] := A[i,j] * 0.0", "y[i,j] := A[i,j] * -0.0"),     # Number(-0.0) == Number(0.0)
    ("y[i,j] := A[i,j] * 2", "y[i,j] := A[i,j] * 2.0"),        # 2 == 2.0
    ("y[i,j] := A[i,j] - 3", "y[a,b] := A[a,b] - 3.0"),        # (renamed too)
])
def test_unequal_constants_get_their_own_kernels(builds, first, second):
    arrays = {"A": np.array([[1.5, -2.0, 0.0], [-0.0, 3.0, -1.0]])}
    assert spec_of(first).key != spec_of(second).key
    for text in (first, second):
        kernel = ef.compile(text, backend="c")
        got = np.asarray(kernel(**arrays))
        want = oracle(text, kernel, arrays)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
    assert builds.count == 2


def test_other_bounds_policies_and_dtypes_get_their_own_kernels(builds):
    text = "y[i] := sum[j](W[idx[i], j])"
    W = rng.standard_normal((5, 33))
    idx = np.array([0, 4, 7, -2, 3, 9])
    choices = []
    for bounds in ("clip", "wrap"):
        arrays = {"W": W, "idx": idx}
        kernel = ef.compile(text, backend="c", bounds=bounds)
        choices.append(choose(kernel, kernel.bind(**arrays)).loops.choice)
        np.testing.assert_allclose(kernel(**arrays), oracle(text, kernel, arrays,
                                                            bounds=bounds), rtol=1e-12)
    single = {"W": W.astype(np.float32), "idx": idx}
    kernel = ef.compile(text, backend="c", bounds="clip")
    choices.append(choose(kernel, kernel.bind(**single)).loops.choice)
    np.testing.assert_allclose(kernel(**single), oracle(text, kernel, single, bounds="clip"),
                               rtol=1e-5)
    assert len({choice.key for choice in choices}) == 3
    assert builds.count == 3


def test_constants_are_keyed_by_type_and_bits():
    def nan(payload):
        return struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000000 | payload))[0]
    assert constant_key(-0.0) != constant_key(0.0)
    assert constant_key(2) != constant_key(2.0) and constant_key(True) != constant_key(1)
    assert constant_key(nan(1)) != constant_key(nan(2))
    assert constant_key(nan(1)) == constant_key(nan(1))
    assert constant_key(np.float32(0.0)) != constant_key(np.float32(-0.0))
    assert constant_key(np.float32(2)) != constant_key(2.0)
    assert expression_key(Number(-0.0), {}) != expression_key(Number(0.0), {})
    assert Number(-0.0) == Number(0.0)      # (why the key does not use ==)


PROGRAMS = ["""a[i,j] := X[i,j] * 2 + G[j]
               b[i,j] := exp(a[i,j]) - X[i,j]""",
            """a[p,q] := X[p,q] * 2 + G[q]
               b[r,s] := exp(a[r,s]) - X[r,s]"""]


def test_fused_groups_of_equal_spellings_compile_once(builds, monkeypatch):
    X, G = rng.standard_normal((70, 90)), rng.standard_normal(90)
    groups = []
    run = c_fused.run

    def spy(members, thread_rows=frozenset()):
        groups.append(len(members))
        return run(members, thread_rows)
    monkeypatch.setattr(c_fused, "run", spy)
    for text in PROGRAMS:
        out = ef.compile(text, backend="c")(X=X, G=G)
        np.testing.assert_allclose(out["b"] if isinstance(out, dict) else out,
                                   np.exp(X * 2 + G) - X, rtol=1e-12)
    assert groups == [2, 2]
    assert builds.count == 1
    assert len([k for k in c_fused._fused if k.kind is CacheKind.FUSED_GROUP]) == 2
    # an unequal constant: its own group
    other = PROGRAMS[1].replace("* 2 ", "* 2.0 ")
    ef.compile(other, backend="c")(X=X, G=G)
    assert builds.count == 2


# -- random statements and index renamings ---------------------------------------------

NAMES = ["i", "j", "k", "a", "b", "p", "q", "r", "s", "t", "u", "w"]


@st.composite
def expressions(draw, depth=0):
    """An expression over the row index R and the column index C (placeholders), and
    its NumPy value as a function of (A, v, h) broadcast to rows x columns."""
    leaves = [("A[R,C]", lambda A, v, h: A), ("v[C]", lambda A, v, h: v[None, :]),
              ("h[R]", lambda A, v, h: h[:, None]), ("1.5", lambda A, v, h: 1.5),
              ("2", lambda A, v, h: 2)]
    if depth >= 2 or draw(st.booleans()):
        return draw(st.sampled_from(leaves))
    kind = draw(st.sampled_from(["+", "-", "*", "exp", "abs"]))
    left = draw(expressions(depth + 1))
    if kind in ("exp", "abs"):
        f = {"exp": np.exp, "abs": np.abs}[kind]
        return (f"{kind}({left[0]} * 0.1)", lambda A, v, h, g=left[1], f=f: f(g(A, v, h) * 0.1))
    right = draw(expressions(depth + 1))
    op = {"+": np.add, "-": np.subtract, "*": np.multiply}[kind]
    return (f"({left[0]} {kind} {right[0]})",
            lambda A, v, h, l=left[1], r=right[1], op=op: op(l(A, v, h), r(A, v, h)))


def spelled(template: str, summed: bool, row: str, col: str) -> str:
    body = template.replace("R", row).replace("C", col)
    return f"y[{row}] := sum[{col}]({body})" if summed else f"y[{row},{col}] := {body}"


@settings(max_examples=12, deadline=None)
@given(expressions(), st.booleans(),
       st.permutations(NAMES).map(lambda names: names[:4]))
def test_renamed_indices_give_the_same_key_and_values(expression, summed, names):
    template, value = expression
    if "A[" not in template:
        template = f"({template} + A[R,C])"
        inner = value
        value = lambda A, v, h, g=inner: g(A, v, h) + A     # noqa: E731
    first, second = spelled(template, summed, *names[:2]), spelled(template, summed,
                                                                   *names[2:])
    assert spec_of(first).key == spec_of(second).key
    A, v, h = rng.standard_normal((5, 19)), rng.standard_normal(19), rng.standard_normal(5)
    want = np.broadcast_to(value(A, v, h), A.shape)
    want = want.sum(1) if summed else want
    results = []
    loaded = []
    load = c_build.load
    for text in (first, second):
        count = [0]

        def counted(*args, count=count, **kwargs):
            count[0] += 1
            return load(*args, **kwargs)
        c_build.load = counted
        arrays = {name: array for name, array in (("A", A), ("v", v), ("h", h))
                  if f"{name}[" in text}
        try:
            results.append(np.asarray(ef.compile(text, backend="c", threads=1)(**arrays)))
        finally:
            c_build.load = load
        loaded.append(count[0])
        np.testing.assert_allclose(results[-1], want, rtol=1e-10, atol=1e-12)
    assert loaded[1] == 0, (first, second, loaded)     # the second shares the first's
    np.testing.assert_array_equal(results[1], results[0])


def test_triton_spellings_share_one_kernel_module():
    from einfuse.backends.triton import backend as triton_backend
    if not triton_backend.available():
        pytest.skip("no Triton")
    arrays = {"A": rng.standard_normal((6, 40)).astype(np.float32),
              "B": rng.standard_normal((6, 40)).astype(np.float32)}
    before = set(triton_backend._modules)
    results = []
    for text in SUM_ROWS[:2]:
        kernel = ef.compile(text, backend="triton")
        results.append(np.asarray(kernel(**arrays)))
        np.testing.assert_allclose(results[-1], oracle(text, kernel, arrays), rtol=1e-5)
    assert len(set(triton_backend._modules) - before) <= 1
    np.testing.assert_array_equal(results[1], results[0])
