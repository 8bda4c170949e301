"""A recorded statement on the Triton backend is one program node
(runtime/triton_statement_autograd.py): a cross-entropy written as one statement is one
Triton kernel forward and one backward (its label's scatter inside the backward's row
kernel), counted at einfuse's launch path, as are one-statement RMSNorm, log-softmax
and mean cross-entropy.  Values against tests/oracle.py (rows of NaN and inf too) and
torch's own functions (values and autograd gradients); a label outside its axis is the
statement's own error, forward or backward, with nothing delivered."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.triton import backend as triton_backend, launch
from einfuse.errors import EinfuseError

from oracle import brute_force

torch = pytest.importorskip("torch")
F = torch.nn.functional
pytestmark = pytest.mark.skipif(not triton_backend.available(),
                                reason="Triton is not installed")
DEVICE = torch.device("cpu" if triton_backend.interpreted() else "cuda")
ROWS, COLUMNS = 7, 19
EPS = 1e-5

# (statement, torch's formulation from X and t, whether it reads t)
STATEMENTS = {
    "cross-entropy, logsumexp": ("L[i] := logsumexp[j](X[i,j]) - X[i, t[i]]",
                                 lambda X, t: F.cross_entropy(X, t, reduction="none")),
    # the canonical rules reach the logsumexp form from the shifted one
    "cross-entropy, shifted": (
        "L[i] := log(sum[j](exp(X[i,j] - max[k](X[i,k])))) + max[k](X[i,k]) - X[i, t[i]]",
        lambda X, t: F.cross_entropy(X, t, reduction="none")),
    "mean cross-entropy": (f"L[] := sum[i](logsumexp[j](X[i,j]) - X[i, t[i]]) / {ROWS}",
                           lambda X, t: F.cross_entropy(X, t)),
    "log-softmax": ("Y[i,j] := X[i,j] - logsumexp[k](X[i,k])",
                    lambda X, t: F.log_softmax(X, 1)),
    "rmsnorm": (f"Y[i,j] := X[i,j] / sqrt(sum[k](X[i,k] * X[i,k]) / {COLUMNS} + {EPS})",
                lambda X, t: X / torch.sqrt((X * X).mean(1, keepdim=True) + EPS)),
}
LABELLED = [name for name, (source, _) in STATEMENTS.items() if "t[" in source]


def _data(dtype, special=False, seed=3):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((ROWS, COLUMNS)).astype(dtype)
    if special:
        X[1, 4] = np.nan                 # a NaN
        X[2, :] = -np.inf                # a row of -inf
        X[3, COLUMNS - 1] = np.inf       # an inf
        X[5] *= 1e4                      # exponentials that underflow
        X[6] += 80                       # exp(x) alone would overflow float32
    return X, rng.integers(0, COLUMNS, ROWS)


def _given(source, X, t):
    return {"X": X, "t": t} if "t[" in source else {"X": X}


def _tensor(value):
    return torch.from_numpy(np.array(value, copy=True)).to(DEVICE)


def _host(value):
    return value.detach().cpu().numpy()


def _tolerance(dtype):
    return dict(rtol=2e-6, atol=2e-6) if dtype == np.float32 else dict(rtol=1e-12,
                                                                        atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", list(STATEMENTS))
def test_one_kernel_forward_and_one_backward_as_torch(name, dtype):
    source, reference = STATEMENTS[name]
    X, t = _data(dtype, seed=5)
    kernel = ef.compile(source, backend="triton")
    for repeat in range(3):   # the first call records and prepares, the others repeat
        ins = {"X": _tensor(X).requires_grad_(True), "t": _tensor(t)}
        with launch.observed() as forward:
            got = kernel(**_given(source, ins["X"], ins["t"]))
        assert len(forward) == 1, (name, repeat, forward)
        seed = _tensor(np.random.default_rng(6).standard_normal(tuple(got.shape))
                       .astype(dtype))
        with launch.observed() as backward:
            (got * seed).sum().backward()
        assert [r.kernel for r in backward] == ["einfuse_rows"], (name, repeat, backward)
        ref = {"X": _tensor(X).requires_grad_(True), "t": _tensor(t)}
        want = reference(ref["X"], ref["t"])
        (want * seed).sum().backward()
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(_host(got), _host(want), **_tolerance(dtype),
                                   err_msg=name)
        np.testing.assert_allclose(_host(ins["X"].grad), _host(ref["X"].grad),
                                   **_tolerance(dtype), err_msg=name)
    with torch.no_grad(), launch.observed() as unrecorded:    # nothing recorded
        again = kernel(**_given(source, ins["X"], ins["t"]))
    assert len(unrecorded) == 1 and not again.requires_grad
    np.testing.assert_allclose(_host(again), _host(want), **_tolerance(dtype))


def _oracle(source, X, t):
    spec_ranges = {"i": (0, ROWS), "j": (0, COLUMNS), "k": (0, COLUMNS)}
    arrays = {"X": X.astype(np.float64), "t": t} if "t[" in source else \
        {"X": X.astype(np.float64)}
    return brute_force(source, {n: r for n, r in spec_ranges.items() if n + "]" in source
                                or n + "," in source or n + ")" in source}, arrays)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", list(STATEMENTS))
def test_special_values_as_the_oracle(name, dtype):
    """Rows of NaN, inf and -inf through the recorded node: the oracle's value where it
    is finite, its NaN and its infinities where it has them; the gradient as the
    statement's own gradient statements give it on the NumPy backend."""
    source, _ = STATEMENTS[name]
    X, t = _data(dtype, special=True)
    # (the shifted spelling's canonical form is logsumexp's, on every backend: a row
    # holding +inf gives its inf, where the shifted text's inf - inf is the oracle's NaN)
    want = _oracle(STATEMENTS["cross-entropy, logsumexp"][0]
                   if name == "cross-entropy, shifted" else source, X, t)
    kernel = ef.compile(source, backend="triton")
    host = ef.compile(source, backend="numpy")
    for _ in range(2):
        ins = {"X": _tensor(X).requires_grad_(True), "t": _tensor(t)}
        with np.errstate(all="ignore"):
            got = kernel(**_given(source, ins["X"], ins["t"]))
            got.sum().backward()
        value = _host(got)
        np.testing.assert_array_equal(np.isnan(value), np.isnan(want), err_msg=name)
        infinite = np.isinf(want)
        np.testing.assert_array_equal(value[infinite], want[infinite])
        finite = np.isfinite(want)
        tolerance = dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else \
            dict(rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(value[finite], want[finite], **tolerance, err_msg=name)
        # the gradient: the statement's own node on the NumPy backend (its gradient
        # statements one by one), NaN where it has NaN (torch's functions give a whole
        # row of NaN for a row holding inf: exp(inf - inf) in each weight)
        ref = torch.from_numpy(X.copy()).requires_grad_(True)
        with np.errstate(all="ignore"):
            host(**_given(source, ref, torch.from_numpy(t))).sum().backward()
        grad, expected = _host(ins["X"].grad), ref.grad.numpy()
        np.testing.assert_array_equal(np.isnan(grad), np.isnan(expected), err_msg=name)
        finite = np.isfinite(expected)
        np.testing.assert_array_equal(grad[~finite & ~np.isnan(expected)],
                                      expected[~finite & ~np.isnan(expected)])
        np.testing.assert_allclose(grad[finite], expected[finite], **tolerance,
                                   err_msg=name)


@pytest.mark.parametrize("name", LABELLED)
def test_a_label_outside_its_axis_is_the_statements_error(name):
    source, _ = STATEMENTS[name]
    X, t = _data(np.float32)
    kernel = ef.compile(source, backend="triton")
    kernel(X=_tensor(X).requires_grad_(True), t=_tensor(t)).sum().backward()  # prepares
    for bad in (COLUMNS, -1, 10 ** 6):
        labels = t.copy()
        labels[4] = bad
        for fresh in (False, True):   # the prepared call, then a first call
            run = ef.compile(source, backend="triton") if fresh else kernel
            with pytest.raises(EinfuseError, match=r"t\[4\]"):
                run(X=_tensor(X).requires_grad_(True), t=_tensor(labels))


@pytest.mark.parametrize("name", LABELLED)
def test_a_label_changed_before_the_backward_is_the_statements_error(name):
    """Labels changed through ``.data`` (which torch's version check does not see)
    between the forward and the backward: the backward's check raises an error naming
    the value and the axis (in the gradient statement derived from the statement), and
    no gradient is delivered."""
    source, _ = STATEMENTS[name]
    X, t = _data(np.float64)
    kernel = ef.compile(source, backend="triton")
    for _ in range(2):
        ins = {"X": _tensor(X).requires_grad_(True), "t": _tensor(t)}
        got = kernel(**ins)
        ins["t"].data[4] = COLUMNS + 3
        with pytest.raises(EinfuseError, match=rf"{COLUMNS + 3} is outside 0\.\.{COLUMNS - 1}"):
            got.sum().backward()
        assert ins["X"].grad is None


@pytest.mark.parametrize("name", ["cross-entropy, logsumexp", "mean cross-entropy"])
def test_gradcheck_and_gradgradcheck(name):
    source, _ = STATEMENTS[name]
    rng = np.random.default_rng(13)
    X = torch.from_numpy(rng.standard_normal((3, 5))).to(DEVICE).requires_grad_(True)
    t = torch.from_numpy(rng.integers(0, 5, 3)).to(DEVICE)
    kernel = ef.compile(source.replace(f"/ {ROWS}", "/ 3"), backend="triton")

    def run(X):
        return kernel(X=X, t=t)
    # (fast mode: the interpreter runs every kernel of every perturbed call in Python)
    assert torch.autograd.gradcheck(run, (X,), fast_mode=True)
    assert torch.autograd.gradgradcheck(run, (X,), fast_mode=True)


def test_ein_records_the_same_node():
    X, t = _data(np.float64, seed=9)
    ins = {"X": _tensor(X).requires_grad_(True), "t": _tensor(t)}
    with launch.observed() as seen:
        got = ef.ein("L[i] := logsumexp[j](X[i,j]) - X[i, t[i]]", **ins, backend="triton")
        got.sum().backward()
    assert len(seen) == 2 and seen[-1].kernel == "einfuse_rows"
    ref = _tensor(X).requires_grad_(True)
    F.cross_entropy(ref, ins["t"], reduction="sum").backward()
    np.testing.assert_allclose(_host(ins["X"].grad), _host(ref.grad), rtol=1e-12,
                               atol=1e-12)
