"""Sibling loops over the same row run as one loop (plan/fuse_siblings.py): layernorm's
backward under torch autograd (three row sums, two column rows) gives the values of the
kernel without that pass to rounding (NaN and inf where it has them, finite values
within a few units of the row's last place: GCC contracts products into FMAs by the
shape of each loop, so bit identity holds on some instruction sets and not on others),
special rows included, on one thread and two, and torch's float64 gradients within
rounding; where the siblings' lengths differ at run
time the guards keep the loops apart; a loop that reads what another writes, a loop
calling a library function and a run touching too many arrays are never merged."""

import dataclasses

import numpy as np
import pytest

import einfuse as ef
from einfuse import ir
from einfuse.backends.c import build as c_build, fused as c_fused
from einfuse.plan import fuse, fuse_siblings, fuse_sums
from einfuse.plan.fuse_sums import GUARD_INT
from fresh_runs import fresh_runs, without_pass
from program_texts import LAYERNORM

pytestmark = pytest.mark.skipif(c_build.find_compiler() is None,
                                reason="fusion runs C kernels")
torch = pytest.importorskip("torch")


@pytest.fixture
def merges(monkeypatch):
    """Per fused kernel built: whether the pass changed its body, and the guards'
    verdicts passed to fused kernels (0: the merged loops run)."""
    seen = {"changed": [], "verdicts": []}
    merge, verdict = fuse.merge_sibling_loops, c_fused.guard_verdict

    def merge_spy(body, loop):
        found = merge(body, loop)
        seen["changed"].append(found.body != tuple(body))
        return found

    def verdict_spy(guards, ints):
        seen["verdicts"].append(verdict(guards, ints))
        return seen["verdicts"][-1]
    monkeypatch.setattr(fuse, "merge_sibling_loops", merge_spy)
    monkeypatch.setattr(c_fused, "guard_verdict", verdict_spy)
    fresh_runs(monkeypatch)
    return seen


def _same_bits(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    view = np.int32 if a.dtype == np.float32 else np.int64
    np.testing.assert_array_equal(a.view(view), b.view(view))


ROW_ULPS = 4


def _same_to_rounding(a, b):
    """``a`` has NaN, inf and -inf exactly where ``b`` has them, and every finite value
    within ROW_ULPS units in the last place of its row's largest magnitude (a row of
    dX is a difference of terms of that size: a contraction into an FMA moves the
    rounding of the difference, not of its terms).  Measured on AVX2 (EINFUSE_CPU=avx2,
    which Zen 3 runs natively): 24% of float32 dX elements apart, by at most 2 such
    units; on AVX-512 none."""
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
    finite = np.isfinite(b)
    np.testing.assert_array_equal(a[~finite & ~np.isnan(b)], b[~finite & ~np.isnan(b)])
    assert np.isfinite(a[finite]).all()
    rows = np.atleast_2d(np.where(finite, np.abs(b), 0))
    scale = np.spacing(rows.max(axis=-1, keepdims=True)).reshape(
        (-1, 1) if b.ndim == 2 else (1,) * b.ndim)
    with np.errstate(invalid="ignore"):      # inf - inf where both are inf
        apart = np.abs(a.astype(np.float64) - b.astype(np.float64))
    assert (apart[finite] <= (ROW_ULPS * np.broadcast_to(scale, b.shape))[finite]).all(), \
        f"{(apart / scale)[finite].max():.1f} units of a row's last place apart"


def _pin_threads(monkeypatch, threads):
    """Fused kernels on ``threads`` threads: the backward does not take the program's
    ``threads=``, and the cores a call finds free would split the column sums anew."""
    monkeypatch.setattr(c_fused, "thread_count", lambda requested, work: threads)
    monkeypatch.setattr(c_fused, "is_adaptive", lambda members: False)


def _layernorm_backward(X, g, b, seed, threads):
    """(dX, dg, db) of the layernorm program under torch autograd."""
    leaves = [torch.from_numpy(a.copy()).requires_grad_() for a in (X, g, b)]
    program = ef.compile(LAYERNORM.format(n=X.shape[1]), threads=threads)
    program(X=leaves[0], g=leaves[1], b=leaves[2]).backward(torch.from_numpy(seed))
    return [leaf.grad.numpy() for leaf in leaves]


def _inputs(rows, cols, dtype, special):
    rng = np.random.default_rng(rows * cols)
    X = rng.standard_normal((rows, cols)).astype(dtype)
    if special:
        X[1, 3] = np.nan                      # a NaN row
        X[2, 5] = np.inf                      # an inf entry
        X[3] = 0.0                            # variance 0
        X[3, ::3] = -0.0
        X[4] *= np.finfo(dtype).max / 8       # squares overflow: 1/sqrt(v) is 0, not normal
        X[5] *= 1e-30                         # tiny values
    g, b = (rng.standard_normal(cols).astype(dtype) for _ in range(2))
    seed = rng.standard_normal((rows, cols)).astype(dtype)
    if special:
        seed[6, 7] = np.inf
    return X, g, b, seed


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", [(64, 1000), (40, 2049), (300, 37)])
def test_layernorm_backward_unchanged_to_rounding(monkeypatch, merges, shape, dtype, threads):
    inputs = _inputs(*shape, dtype, special=True)
    _pin_threads(monkeypatch, threads)

    def run():
        return _layernorm_backward(*inputs, threads)
    with np.errstate(all="ignore"):
        merged = run()
        assert True in merges["changed"] and 0 in merges["verdicts"]
        unmerged = without_pass(monkeypatch, "merge_sibling_loops", run)
    for got, want in zip(merged, unmerged):
        _same_to_rounding(got, want)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", [(64, 1000), (40, 2049), (300, 37), (3, 5)])
def test_layernorm_backward_equals_torch(merges, shape, dtype):
    X, g, b, seed = _inputs(*shape, dtype, special=False)
    got = _layernorm_backward(X, g, b, seed, threads=2)
    assert (True in merges["changed"]) == (shape != (3, 5))    # 3x5 is too small to fuse
    leaves = [torch.from_numpy(a.astype(np.float64)).requires_grad_() for a in (X, g, b)]
    out = torch.nn.functional.layer_norm(leaves[0], (shape[1],), leaves[1], leaves[2],
                                         eps=1e-5)
    out.backward(torch.from_numpy(seed.astype(np.float64)))
    tolerance = dict(rtol=2e-4, atol=2e-4) if dtype == "float32" else \
        dict(rtol=1e-9, atol=1e-10)
    for mine, leaf in zip(got, leaves):
        np.testing.assert_allclose(mine, leaf.grad.numpy(), **tolerance)


SUMS = """a[i] := sum[j](X[i,j])
b[i] := sum[k](X[i,k] * X[i,k])
Z[i,j] := X[i,j] * a[i] - b[i]"""


def test_sums_of_one_length_merge_and_keep_their_bits(monkeypatch, merges):
    X = np.random.default_rng(1).standard_normal((200, 90))
    X[3, 4] = np.nan

    def run():
        return ef.compile(SUMS)(X=X)
    merged = run()
    assert merges["changed"] == [True] and 0 in merges["verdicts"]
    _same_bits(merged, without_pass(monkeypatch, "merge_sibling_loops", run))


@pytest.mark.parametrize("k", [range(0, 50), range(1, 90)])
def test_sums_of_other_lengths_keep_their_loops(merges, k):
    X = np.random.default_rng(2).standard_normal((200, 90))
    Z = ef.compile(SUMS, ranges={"k": k})(X=X)
    assert merges["changed"] == [True] and merges["verdicts"] and \
        0 not in merges["verdicts"]
    want = X * X.sum(1, keepdims=True) - (X[:, k.start:k.stop] ** 2).sum(1, keepdims=True)
    np.testing.assert_allclose(Z, want, rtol=1e-12, atol=1e-12)


def test_a_sum_of_a_value_stored_between_is_not_merged(monkeypatch, merges):
    # the variance reads the mean stored after the first sum: the two stay apart
    # (layernorm's forward, here on the generic fused kernel)
    from einfuse.plan import row_kernel
    X = np.random.default_rng(3).standard_normal((400, 128))
    monkeypatch.setattr(row_kernel, "match", lambda members, rows: None)   # (the schedule's match)
    out = ef.compile("""mu[i] := sum[j](X[i,j]) / 128
                        v[i] := sum[j]((X[i,j] - mu[i])**2) / 128
                        y[i,j] := (X[i,j] - mu[i]) / sqrt(v[i] + 0.00001)""")(X=X)
    assert merges["changed"] == [False]
    want = (X - X.mean(1, keepdims=True)) / np.sqrt(X.var(1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------ the pass on IR

def _load(slot, counter=None, row="f0"):
    subscripts = [ir.Subscript(ir.Affine.var(row), (), "none", "n0", "s0" if counter
                               else None)]
    if counter:
        subscripts.append(ir.Subscript(ir.Affine.var(counter), (), "none", "n1", None))
    return ir.Load(slot, tuple(subscripts))


def _row_loop(var, extent, store, value):
    return ir.Loop(var, ir.Affine.var(extent), "parallel", (
        ir.Store(store, (ir.Affine.var("f0"), ir.Affine.var(var)), ("s0", None), value),),
        simd=True)


def _row_sum(acc, var, extent, value):
    loop = ir.Loop(var, ir.Affine.var(extent), "reduction",
                   (ir.Accumulate(acc, "sum", value),), simd=True,
                   reductions=((acc, "sum"),))
    return [ir.DeclareAcc(acc, "sum"),
            ir.Branch((ir.Affine.var(extent),), 2048, (loop,), (ir.Compensate(acc, acc),))]


def _merge(body):
    return fuse_siblings.merge_sibling_loops(tuple(body), "f0")


def test_row_loops_of_one_extent_merge_without_guards():
    body = [_row_loop("p", "n", 2, _load(0, "p")), _row_loop("q", "n", 3, _load(1, "q"))]
    found = _merge(body)
    assert found.guards == () and len(found.body) == 1
    loop = found.body[0]
    assert loop.var == "p" and [s.buffer for s in loop.body] == [2, 3]
    assert loop.body[1].value == _load(1, "p")      # the counter renamed


def test_row_loops_of_two_extents_merge_under_a_guard():
    body = [_row_loop("p", "n", 2, _load(0, "p")), _row_loop("q", "m", 3, _load(1, "q"))]
    found = _merge(body)
    assert found.guards == (ir.Affine.var("m") + ir.Affine.var("n", -1),)
    branch = found.body[0]
    assert isinstance(branch, ir.Branch) and branch.extents == (ir.Affine.var(GUARD_INT),)
    assert branch.large == tuple(body)              # the loops apart where it fails


@pytest.mark.parametrize("second", [
    _row_loop("q", "n", 3, _load(2, "q")),          # reads the row the first writes
    _row_loop("q", "n", 0, _load(1, "q")),          # writes what the first reads
    _row_loop("q", "n", 2, _load(1, "q")),          # writes what the first writes
    _row_loop("q", "n", 3, ir.Call("exp", (_load(1, "q"),))),    # a library call
    _row_loop("q", "n", 3, _load(1, "q", row="q")),  # a strided read
])
def test_row_loops_that_cannot_merge(second):
    body = (_row_loop("p", "n", 2, _load(0, "p")), second)
    assert _merge(body).body == body


def test_a_literal_difference_of_extents_never_merges():
    first = _row_loop("p", "n", 2, _load(0, "p"))
    second = dataclasses.replace(_row_loop("q", "n", 3, _load(1, "q")),
                                 extent=ir.Affine.var("n") + ir.Affine(const=1))
    assert _merge((first, second)).body == (first, second)


def test_a_run_stops_at_the_array_limit():
    # each loop touches two arrays: the limit's worth merge, the next starts anew
    count = fuse_siblings.MOST_ARRAYS // 2 + 1
    body = tuple(_row_loop(f"p{n}", "n", 100 + n, _load(n, f"p{n}")) for n in range(count))
    found = _merge(body)
    assert len(found.body) == 2 and found.body[1] == body[-1]
    assert len(found.body[0].body) == count - 1


def test_row_sums_merge_with_their_stores_after():
    store = ir.Store(9, (ir.Affine.var("f0"),), (None,), ir.AccValue("a", "sum"))
    body = _row_sum("a", "p", "n", _load(0, "p")) + [store] + \
        _row_sum("b", "q", "m", _load(1, "q"))
    found = _merge(body)
    declare_a, declare_b, branch, after = found.body
    assert (declare_a.name, declare_b.name, after) == ("a", "b", store)
    # short and merged in one test: the verdict 1 reads as a long row
    assert branch.extents == (ir.Affine.var("n") + ir.Affine.var(GUARD_INT, 2049),)
    (loop,) = branch.small
    assert loop.reductions == (("a", "sum"), ("b", "sum"))
    assert branch.large == (body[1], body[4])       # each sum's own branch


def test_row_sums_of_one_extent_merge_their_long_sides_too():
    body = _row_sum("a", "p", "n", _load(0, "p")) + _row_sum("b", "q", "n", _load(1, "q"))
    found = _merge(body)
    assert found.guards == ()
    branch = found.body[2]
    assert branch.extents == (ir.Affine.var("n"),)
    assert branch.large == body[1].large + body[3].large


def test_a_normal_branch_is_merged_into_both_arms():
    loop = _row_loop("p", "n", 2, _load(0, "p"))
    arms = [_row_loop("q", "n", 3, ir.Binary("*", _load(1, "q"), ir.Local("r"))),
            _row_loop("q", "n", 3, ir.Binary("/", _load(1, "q"), _load(4)))]
    reciprocal = ir.Let("r", ir.Binary("/", ir.Const(1), _load(4)))
    body = (loop, reciprocal, ir.NormalBranch(("r",), (arms[0],), (arms[1],)))
    found = _merge(body)
    assert found.body[0] == reciprocal              # the scalar goes before the loop
    branch = found.body[1]
    assert isinstance(branch, ir.NormalBranch) and len(found.body) == 2
    for arm, merged in zip(arms, (branch.then[0], branch.otherwise[0])):
        assert merged.body == loop.body + (
            dataclasses.replace(arm.body[0], value=fuse_sums.substitute_affine(
                arm.body[0].value, "q", ir.Affine.var("p")),
                position=(ir.Affine.var("f0"), ir.Affine.var("p"))),)


def test_a_sum_reading_a_store_between_is_not_merged():
    store = ir.Store(9, (ir.Affine.var("f0"),), (None,), ir.AccValue("a", "sum"))
    body = tuple(_row_sum("a", "p", "n", _load(0, "p")) + [store] +
                 _row_sum("b", "q", "n", ir.Binary("-", _load(1, "q"), _load(9))))
    assert _merge(body).body == body
