"""Cross-entropy with the label's logit picked by a comparison (issue 31): ``sum[c](where(c
== y[n], X[n,c], 0))`` and the one-hot product ``sum[c](X[n,c] * (c == y[n]))`` run in
the C log-sum-exp row kernel (plan/row_statistics.RowPick / RowSum) with exactly the
written sums' semantics, which are not a gather's:

* a label naming no column (negative, past the row, not a whole number) gives 0.0 --
  never an error, under every bounds policy (the written form reads no position
  outside X);
* a -0.0 logit summed is +0.0 (the gather gives -0.0);
* the product's other columns add ``X * 0``: NaN where the row holds an inf or a NaN
  anywhere, where the ``where`` (and a gather) does not see them.

Values against tests/oracle.py on numpy, c and triton; on c the row kernel must be the
one that ran.  A user's one-hot tensor of arbitrary floats is a dense product and stays
one (the last tests)."""

import math

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.c import build as c_build, rows as c_rows
from oracle import brute_force
from test_rewrite_rules import same_bits

INF, NAN = math.inf, math.nan
ROWS, COLS = 12, 7

LSE = "logsumexp[c](X[n,c])"
PICKS = {
    "where": "sum[c](where(c == y[n], X[n,c], 0))",
    "where, label first": "sum[c](where(y[n] == c, X[n,c], 0))",
    "one-hot product": "sum[c](X[n,c] * (c == y[n]))",
    "one-hot product, comparison first": "sum[c]((y[n] == c) * X[n,c])",
}
# the pick alone, bitwise: the logsumexp only decides a where whose branches agree, so
# the statement is the row kernel's (it needs a row statistic) and its value the pick's
ALONE = "L[n] := where({lse} > 1e300, {pick}, {pick})"
CROSS_ENTROPY = "L[n] := {lse} - {pick}"


def _matrix(dtype):
    X = np.random.default_rng(3).standard_normal((ROWS, COLS))
    X[0, 2] = -0.0                   # the label's logit is -0.0 (row 0's label is 2)
    X[1, 4] = NAN                    # a NaN away from the label
    X[2, 5] = INF                    # an inf away from the label
    X[3, 1] = -INF                   # -inf away from the label
    X[4, 3] = NAN                    # a NaN at the label
    X[5, 0] = INF                    # inf at the label
    X[6, 6] = -INF                   # -inf at the label
    X[7, :] = -0.0                   # a row of -0.0
    X[8, 1] = NAN                    # a NaN in a row whose label names no column
    return X.astype(dtype)


def _labels(dtype):
    # rows 8..11 name no column: -1, COLS, far past, far below
    return np.array([2, 0, 1, 6, 3, 0, 6, 2, -1, COLS, 10**4, -10**4], dtype)


def _oracle(text, X, y):
    ranges = {"n": (0, ROWS), "c": (0, COLS)}
    return brute_force(text, ranges, {"X": X.astype(np.float64), "y": y})


def _same_specials(got, want, rtol):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = np.isfinite(want)
    np.testing.assert_array_equal(got[~finite & ~np.isnan(want)],
                                  want[~finite & ~np.isnan(want)])
    np.testing.assert_allclose(got[finite], want[finite], rtol=rtol, atol=rtol)


# float32 X with int16 labels and float64 X with int64 ones (labels read only to be
# compared do not promote: docs/notation.md section 10; tests/test_compared_labels.py
# takes float32 X with int64 labels)
DTYPES = [("float32", "int16"), ("float64", "int64")]


@pytest.mark.parametrize("dtypes", DTYPES)
@pytest.mark.parametrize("name", list(PICKS))
def test_the_pick_alone_has_the_written_sums_bits(backend, name, dtypes):
    text = ALONE.format(lse=LSE, pick=PICKS[name])
    X, y = _matrix(dtypes[0]), _labels(dtypes[1])
    want = _oracle(text, X, y)
    got = np.asarray(ef.ein(text, X=X, y=y, backend=backend))
    assert same_bits(got, want)
    assert not np.signbit(got[0]) and got[0] == 0     # -0.0 summed: +0.0
    assert (got[9:] == 0).all()                        # no column named: 0.0
    # the product's NaN from an inf or a NaN away from the label; the where's none
    product = "product" in name
    assert np.isnan(got[[1, 2, 3, 8]]).tolist() == [product] * 4


@pytest.mark.parametrize("dtypes", DTYPES)
@pytest.mark.parametrize("name", list(PICKS))
def test_the_cross_entropy_against_the_oracle(backend, name, dtypes):
    text = CROSS_ENTROPY.format(lse=LSE, pick=PICKS[name])
    X, y = _matrix(dtypes[0]), _labels(dtypes[1])
    got = ef.ein(text, X=X, y=y, backend=backend)
    _same_specials(got, _oracle(text, X, y), 3e-6 if dtypes[0] == "float32" else 1e-13)


needs_c = pytest.mark.skipif(c_build.find_compiler() is None, reason="a C kernel")


@needs_c
@pytest.mark.parametrize("bounds", ["check", "promise", "clip", "wrap", "fill"])
@pytest.mark.parametrize("name", list(PICKS))
def test_no_bounds_policy_raises_for_a_label_the_sum_never_selects(row_patterns, name,
                                                                  bounds):
    text = CROSS_ENTROPY.format(lse=LSE, pick=PICKS[name])
    X, y = _matrix("float32"), _labels("int16")
    program = ef.compile(text, bounds=bounds)
    first, again = program(X=X, y=y), program(X=X, y=y)     # first call, prepared repeat
    assert same_bits(first, again)
    _same_specials(first, _oracle(text, X, y), 3e-6)
    if bounds in ("check", "promise"):     # (the row kernel's policies: no gather here)
        assert row_patterns == [c_rows.RowPattern.LOGSUMEXP] * 2


@needs_c
@pytest.mark.parametrize("name", list(PICKS))
def test_the_row_kernel_takes_them_at_size(row_patterns, name):
    rng = np.random.default_rng(5)
    X = rng.standard_normal((300, 1500)).astype(np.float32)
    y = rng.integers(-3, 1503, 300).astype(np.int16)
    X[7, :] = -0.0
    X[9, 40] = NAN
    text = ALONE.format(lse=LSE, pick=PICKS[name])
    got = ef.ein(text, X=X, y=y)
    assert row_patterns == [c_rows.RowPattern.LOGSUMEXP]
    picked = np.array([X[i, t] + np.float32(0) if 0 <= t < 1500 else 0
                       for i, t in enumerate(y)], np.float32)
    if "product" in name:
        picked[9] = NAN
    assert same_bits(got, picked)


@needs_c
@pytest.mark.parametrize("labels", [np.array([0.0, 2.5, 6.0, -0.0, NAN, INF, 3.0, 1.0,
                                              -1.0, 7.0, 1e30, -INF])])
def test_float_labels_name_a_column_only_where_whole(row_patterns, labels):
    # (a label array of floats: == compares values; 2.5 names no column)
    X = _matrix("float64")
    for name, pick in PICKS.items():
        text = ALONE.format(lse=LSE, pick=pick)
        got = ef.ein(text, X=X, y=labels)
        assert same_bits(got, _oracle(text, X, labels)), name
    assert row_patterns == [c_rows.RowPattern.LOGSUMEXP] * len(PICKS)


@needs_c
def test_other_row_sums_run_as_written_in_the_row_kernel(row_patterns):
    # a row sum of any row value: summed as written, in one pass over the cached row
    text = "L[n] := logsumexp[c](X[n,c]) - sum[c](X[n,c]**2 * (c != y[n])) / 3"
    X, y = _matrix("float64"), _labels("int64")
    got = ef.ein(text, X=X, y=y)
    assert row_patterns == [c_rows.RowPattern.LOGSUMEXP]
    _same_specials(got, _oracle(text, X, y), 1e-13)


@needs_c
def test_a_users_one_hot_tensor_is_a_dense_product(row_patterns):
    # a tensor of arbitrary floats is no label: every column counts (0.5 of one, 2 of
    # another, 0 * inf = NaN), so it stays the written dense product
    text = "L[n] := logsumexp[c](X[n,c]) - sum[c](X[n,c] * O[n,c])"
    X = _matrix("float64")
    O = np.zeros((ROWS, COLS))
    O[:, 2], O[:, 4] = 0.5, 2.0
    got = ef.ein(text, X=X, O=O)
    assert row_patterns == []
    want = brute_force(text, {"n": (0, ROWS), "c": (0, COLS)}, {"X": X, "O": O})
    _same_specials(got, want, 1e-13)


def test_gradients_against_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(11)
    X = torch.from_numpy(rng.standard_normal((5, 6))).requires_grad_(True)
    y = torch.tensor([0, 5, 2, -1, 6])          # two labels that name no column
    for name, pick in PICKS.items():
        program = ef.compile(CROSS_ENTROPY.format(lse=LSE, pick=pick))
        assert torch.autograd.gradcheck(lambda X: program(X=X, y=y), (X,)), name
        got = torch.autograd.grad(program(X=X, y=y).sum(), X)[0]
        want = torch.softmax(X, 1) - torch.nn.functional.one_hot(
            y.clamp(0, 5), 6) * ((y >= 0) & (y < 6))[:, None]
        torch.testing.assert_close(got, want.double(), rtol=1e-12, atol=1e-12)


# -- -log(exp(x_t) / sum(exp(x))): the written quotient in the row kernel -------------------
QUOTIENT = "L[n] := -log(exp(X[n, y[n]]) / sum[c](exp(X[n,c])))"


@needs_c
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_quotient_form_runs_the_row_kernel_as_written(row_patterns, dtype):
    # computed as written: exp(x) overflows where x is large (inf / inf = NaN, where
    # the logsumexp form is finite), a row of -inf is 0 / 0 = NaN; no rule changes that
    X = _matrix(dtype)
    X[9, :] = 100.0 if dtype == "float32" else 1000.0     # exp overflows: NaN as written
    X[10, :3] = 50.0                                      # float32's sum overflows
    X[11, :] = -INF
    y = np.array([2, 0, 1, 6, 3, 0, 6, 2, 1, 4, 0, 5])
    program = ef.compile(QUOTIENT)
    got, again = program(X=X, y=y), program(X=X, y=y)
    assert same_bits(got, again)
    assert row_patterns == [c_rows.RowPattern.LOGSUMEXP] * 2
    want = _oracle(QUOTIENT, X, y)
    if dtype == "float32":      # (the oracle is float64: float32's own overflow)
        want[9] = want[11] = NAN
        assert np.isnan(got[10]) or np.isfinite(got[10])
        got, want = np.delete(got, 10), np.delete(want, 10)
    assert np.isnan(got[8]) and np.isnan(want[8])
    _same_specials(got, want, 3e-6 if dtype == "float32" else 1e-13)


@needs_c
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_quotient_form_either_side_of_the_fast_exponentials_range(row_patterns, dtype):
    # a row's unshifted exponentials take the fast exponential where the row's extremes
    # are within its range (float32 84, float64 704: rows_source.EF_BIG) and the full one
    # else -- the same bits either way, so each row is its float64 value to rounding
    big = 84.0 if dtype == "float32" else 704.0
    rng = np.random.default_rng(21)
    X = rng.standard_normal((8, 300)).astype(dtype)
    X[0, 5], X[1, 7] = big * 0.99, -big * 0.99      # inside: fast
    X[2, 5], X[3, 7] = big * 1.01, -big * 1.01      # outside: the full exponential
    X[4, 0], X[4, 1] = big * 0.99, -big * 1.01      # one end outside
    X[5, 3] = np.nan                                # passed over by the range: NaN
    y = np.array([5, 7, 5, 1, 0, 3, 2, 9])
    program = ef.compile(QUOTIENT)
    got, again = program(X=X, y=y), program(X=X, y=y)
    assert same_bits(got, again) and row_patterns == [c_rows.RowPattern.LOGSUMEXP] * 2
    wide = X.astype(np.float64)
    with np.errstate(all="ignore"):
        want = -np.log(np.exp(wide[np.arange(8), y]) / np.exp(wide).sum(1))
    assert np.isnan(got[5]) and np.isnan(want[5])
    keep = np.arange(8) != 5
    np.testing.assert_allclose(got[keep], want[keep], rtol=3e-6 if dtype == "float32"
                               else 1e-13, atol=1e-6 if dtype == "float32" else 1e-12)


@needs_c
def test_an_out_of_range_label_in_the_quotient_form_is_the_statements_error(row_patterns):
    # a gather (X[n, y[n]]) under bounds='check': the statement's error, first and repeat
    X, y = _matrix("float64"), _labels("int64")
    program = ef.compile(QUOTIENT)
    for _ in range(2):
        with pytest.raises(ef.EinfuseError, match="out of bounds|outside"):
            program(X=X, y=y)


@needs_c
def test_the_quotient_forms_at_size(row_patterns):
    rng = np.random.default_rng(8)
    X = rng.standard_normal((200, 3000))
    y = rng.integers(0, 3000, 200)
    got = ef.ein(QUOTIENT, X=X, y=y)
    assert row_patterns == [c_rows.RowPattern.LOGSUMEXP]
    want = -np.log(np.exp(X[np.arange(200), y]) / np.exp(X).sum(1))
    np.testing.assert_allclose(got, want, rtol=1e-13)


# -- Triton: one launch forward and one backward, as the gathered form ----------------------
@pytest.mark.parametrize("name", list(PICKS))
def test_triton_runs_one_kernel_each_way(name):
    torch = pytest.importorskip("torch")
    from einfuse.backends.triton import backend as triton_backend, launch
    if not triton_backend.available():
        pytest.skip("Triton is not installed")
    device = torch.device("cpu" if triton_backend.interpreted() else "cuda")
    rng = np.random.default_rng(4)
    X0 = rng.standard_normal((ROWS, COLS))
    y = torch.from_numpy(_labels("int64")).to(device)
    program = ef.compile(CROSS_ENTROPY.format(lse=LSE, pick=PICKS[name]), backend="triton")
    for _ in range(2):      # recorded and prepared, then repeated
        X = torch.from_numpy(X0.copy()).to(device).requires_grad_(True)
        with launch.observed() as forward:
            got = program(X=X, y=y)
        with launch.observed() as backward:
            got.sum().backward()
        assert len(forward) == 1 and len(backward) == 1, (forward, backward)
    ref = torch.from_numpy(X0.copy()).requires_grad_(True)
    inside = ((y >= 0) & (y < COLS)).cpu()
    want = torch.logsumexp(ref, 1) - torch.where(
        inside, ref.gather(1, y.cpu().clamp(0, COLS - 1)[:, None])[:, 0], 0.0)
    want.sum().backward()
    torch.testing.assert_close(got.detach().cpu(), want.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(X.grad.cpu(), ref.grad, rtol=1e-12, atol=1e-12)



def _triton_device(torch):
    from einfuse.backends.triton import backend as triton_backend
    if not triton_backend.available():
        pytest.skip("Triton is not installed")
    return torch.device("cpu" if triton_backend.interpreted() else "cuda")


def _quotient_in_torch(torch, X, y, picked=None):
    """The quotient as written, in torch (autograd gives its gradient); ``picked``: the
    label's logit where the caller has it (a bounds policy's gather)."""
    if picked is None:
        picked = X.gather(1, y[:, None])[:, 0]
    return -torch.log(torch.exp(picked) / torch.exp(X).sum(1))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_triton_runs_the_quotient_form_in_one_kernel_each_way(dtype):
    # the gradient statements read the labels both as an index (X[n, y[n]]) and as a
    # value (the scatter's where(s1 == y[n], ...)): one row group, one buffer each
    torch = pytest.importorskip("torch")
    from einfuse.backends.triton import launch
    device = _triton_device(torch)
    X0 = _matrix(dtype)
    X0[9, :] = 100.0 if dtype == "float32" else 1000.0    # exp overflows: NaN as written
    X0[10, :3] = 50.0                                     # float32's sum**2 overflows
    X0[11, :] = -INF                                      # 0 / 0
    y = torch.tensor([2, 0, 1, 6, 3, 0, 6, 2, 1, 4, 0, 5], device=device)
    seed = torch.from_numpy(np.random.default_rng(2).standard_normal(ROWS).astype(dtype))
    program = ef.compile(QUOTIENT, backend="triton")
    for _ in range(2):      # recorded and prepared, then repeated
        X = torch.from_numpy(X0.copy()).to(device).requires_grad_(True)
        with launch.observed() as forward:
            got = program(X=X, y=y)
        with launch.observed() as backward:
            got.backward(seed.to(device))
        assert len(forward) == 1 and len(backward) == 1, (forward, backward)
    ref = torch.from_numpy(X0.copy()).requires_grad_(True)
    want = _quotient_in_torch(torch, ref, y.cpu())
    want.backward(seed)
    got, grad, want, want_grad = (got.detach().cpu().numpy(), X.grad.cpu().numpy(),
                                  want.detach().numpy(), ref.grad.numpy())
    assert np.isnan(got[[8, 9, 11]]).all() and np.isnan(grad[[8, 9, 11]]).all()
    if dtype == "float32":
        # the derived gradient's sum**2 overflows in float32 where torch's division
        # backward does not: the statements' formula, as on C; its other rows agree
        assert (grad[10, 1:] == 0).all()
        grad, want_grad = np.delete(grad, 10, 0), np.delete(want_grad, 10, 0)
    rtol = 1e-12 if dtype == "float64" else 1e-5
    _same_specials(got, want, rtol)
    _same_specials(grad, want_grad, rtol)


@pytest.mark.parametrize("bounds", ["check", "promise", "clip", "wrap", "fill"])
def test_triton_quotient_form_under_each_bounds_policy(bounds):
    # a label naming no column: the gather's policy (the quotient reads X[n, y[n]]),
    # raised under 'check' and 'promise' on the first call and the repeat; clip, wrap
    # and fill read the position (or the value) the policy gives, and so does the
    # gradient
    torch = pytest.importorskip("torch")
    device = _triton_device(torch)
    X0 = _matrix("float64")
    labels = np.array([2, 0, 1, 6, 3, 0, 6, 2, 1, -1, COLS, -10**4])
    y = torch.from_numpy(labels).to(device)
    program = ef.compile(QUOTIENT, backend="triton", bounds=bounds)
    if bounds in ("check", "promise"):
        for _ in range(2):
            X = torch.from_numpy(X0.copy()).to(device).requires_grad_(True)
            with pytest.raises(ef.EinfuseError, match="outside"):
                program(X=X, y=y)
        return
    for _ in range(2):
        X = torch.from_numpy(X0.copy()).to(device).requires_grad_(True)
        got = program(X=X, y=y)
        got.sum().backward()
    ranges = {"n": (0, ROWS), "c": (0, COLS)}
    _same_specials(got.detach().cpu(), brute_force(QUOTIENT, ranges, {"X": X0, "y": labels},
                                                   bounds=bounds), 1e-12)
    ref = torch.from_numpy(X0.copy()).requires_grad_(True)
    inside = torch.from_numpy((labels >= 0) & (labels < COLS))
    at = torch.from_numpy(labels.clip(0, COLS - 1) if bounds == "clip" else labels % COLS)
    picked = ref.gather(1, at[:, None])[:, 0]
    if bounds == "fill":     # (fill=0.0: the label's logit is 0 where it names no column)
        picked = torch.where(inside, picked, 0.0)
    want = _quotient_in_torch(torch, ref, at, picked)
    want.sum().backward()
    _same_specials(got.detach().cpu(), want.detach(), 1e-12)
    _same_specials(X.grad.cpu(), ref.grad, 1e-12)


@needs_c
def test_every_audited_cross_entropy_spelling_runs_the_row_kernel(row_patterns):
    # the audit's cross-entropy family (src/einfuse/bench/spelling_audit.py), each
    # spelling one C row kernel call with the family's NumPy values
    from einfuse.bench.spelling_audit import rows_families
    family = next(f for f in rows_families(65, 900) if f.name.startswith("cross-entropy, int16"))
    arrays = family.inputs(np.random.default_rng(0))
    want = family.reference({"X": arrays["X"].astype(np.float64), "y": arrays["y"]})
    for name, text in family.spellings:
        row_patterns.clear()
        got = ef.compile(text)(**arrays)
        assert row_patterns == [c_rows.RowPattern.LOGSUMEXP], name
        assert got.dtype == np.float32, name
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=name)


@needs_c
def test_a_program_of_the_picked_product_runs_one_row_kernel_group(row_patterns):
    source = ("z[n] := logsumexp[c](X[n,c])\np[n] := sum[c](X[n,c] * (c == y[n]))\n"
              "L[n] := z[n] - p[n]")
    X, y = _matrix("float32"), _labels("int16")
    got = ef.ein(source, X=X, y=y)
    assert row_patterns == [c_rows.RowPattern.LOGSUMEXP]
    env = {"X": X.astype(np.float64), "y": y}
    for line in source.splitlines():
        env[line[0]] = brute_force(line, {"n": (0, ROWS), "c": (0, COLS)}, env)
    _same_specials(got, env["L"], 3e-6)
