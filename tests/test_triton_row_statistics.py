"""The log-sum-exp statistics on the Triton row groups (schedule/row_groups.py,
plan/row_gathers.py, backends/triton/rows.py): ``logsumexp[j]``, max + log-sum-exp,
cross-entropy with a label gather ``X[i, t[i]]``, log-softmax ``X - logsumexp`` and the
mean cross-entropy, on torch tensors with backend="triton", each one Triton kernel
forward and one backward (counted at einfuse's launch path), against the NumPy backend
(rows of NaN, inf and -inf) and torch's own functions (values and autograd gradients);
a label outside its axis is the statements' own error, with nothing delivered."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.triton import backend as triton_backend, launch
from einfuse.errors import EinfuseError

torch = pytest.importorskip("torch")
F = torch.nn.functional
pytestmark = pytest.mark.skipif(not triton_backend.available(),
                                reason="Triton is not installed")
DEVICE = torch.device("cpu" if triton_backend.interpreted() else "cuda")
ROWS, COLUMNS = 11, 37

LSE = "m[i] := max[j](X[i,j])\nl[i] := m[i] + log(sum[j](exp(X[i,j] - m[i])))"
CROSS_ENTROPY = ("m[i] := max[j](X[i,j])\n"
                 "l[i] := log(sum[j](exp(X[i,j] - m[i]))) + m[i] - X[i, t[i]]")
# (program, torch's formulation of its output from X and t)
PROGRAMS = {
    "lse": (LSE, lambda X, t: torch.logsumexp(X, 1)),
    "logsumexp and a row's value": ("l[i] := logsumexp[j](X[i,j])\ny[i] := 2 * l[i]",
                                    lambda X, t: 2 * torch.logsumexp(X, 1)),
    "cross-entropy": (CROSS_ENTROPY,
                      lambda X, t: F.cross_entropy(X, t, reduction="none")),
    "cross-entropy, logsumexp": ("z[i] := logsumexp[j](X[i,j])\n"
                                 "l[i] := z[i] - X[i, t[i]]",
                                 lambda X, t: F.cross_entropy(X, t, reduction="none")),
    "log-softmax": ("Y[i,j] := X[i,j] - logsumexp[k](X[i,k])",
                    lambda X, t: F.log_softmax(X, 1)),
    "log-softmax, two statements": ("z[i] := logsumexp[k](X[i,k])\nY[i,j] := X[i,j] - z[i]",
                                    lambda X, t: F.log_softmax(X, 1)),
    "mean cross-entropy": (CROSS_ENTROPY + f"\nL[] := sum[i](l[i]) / {ROWS}",
                           lambda X, t: F.cross_entropy(X, t)),
    "mean cross-entropy, logsumexp": ("z[i] := logsumexp[j](X[i,j])\n"
                                      f"L[] := sum[i](z[i] - X[i, t[i]]) * (1 / {ROWS})",
                                      lambda X, t: F.cross_entropy(X, t)),
}


def _data(dtype, special=False, seed=3):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((ROWS, COLUMNS)).astype(dtype)
    if special:
        X[1, 4] = np.nan                 # a NaN
        X[2, :] = -np.inf                # a row of -inf
        X[3, COLUMNS - 1] = np.inf       # an inf
        X[4, ::2] = -np.inf              # -inf beside finite values
        X[5] *= 1e4                      # exponentials that underflow
        X[6] += 80                       # exp(x) alone would overflow float32
        X[7, 0], X[7, 1] = np.inf, -np.inf
    return X, rng.integers(0, COLUMNS, ROWS)


def _tensors(**arrays):
    return {name: torch.from_numpy(np.array(value, copy=True)).to(DEVICE)
            for name, value in arrays.items()}


def _host(value):
    return value.detach().cpu().numpy()


def _tolerance(dtype):
    return dict(rtol=2e-6, atol=2e-6) if dtype == np.float32 else dict(rtol=1e-12,
                                                                        atol=1e-12)


def _given(source, X, t):
    return {"X": X, "t": t} if "t[" in source else {"X": X}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_values_as_the_numpy_backend_one_kernel(name, dtype):
    source, _ = PROGRAMS[name]
    X, t = _data(dtype, special=True)
    given = _given(source, X, t)
    want = ef.compile(source, backend="numpy")(**given)
    program = ef.compile(source, backend="triton")
    for _ in range(2):           # the first call groups and prepares, the second repeats
        with launch.observed() as seen:
            got = program(**_tensors(**given))
        assert [r.kernel for r in seen] == ["einfuse_rows"], name
        assert got.dtype == torch.from_numpy(np.asarray(want)).dtype
        got, expected = _host(got), np.asarray(want)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
        np.testing.assert_array_equal(np.isinf(got), np.isinf(expected))
        finite = np.isfinite(expected)
        np.testing.assert_array_equal(got[~finite & ~np.isnan(expected)],
                                      expected[~finite & ~np.isnan(expected)])
        np.testing.assert_allclose(got[finite], expected[finite], **_tolerance(dtype),
                                   err_msg=name)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_values_and_gradients_as_torch_one_kernel_each_way(name, dtype):
    source, reference = PROGRAMS[name]
    X, t = _data(dtype, seed=5)
    program = ef.compile(source, backend="triton")
    for _ in range(2):           # the first call derives and prepares, the second repeats
        ins = _tensors(X=X, t=t)
        ins["X"].requires_grad_(True)
        with launch.observed() as forward:
            got = program(**_given(source, ins["X"], ins["t"]))
        assert [r.kernel for r in forward] == ["einfuse_rows"], name
        seed = torch.from_numpy(np.random.default_rng(6).standard_normal(
            tuple(got.shape))).to(got.dtype).to(DEVICE)
        with launch.observed() as backward:
            (got * seed).sum().backward()
        assert [r.kernel for r in backward] == ["einfuse_rows"], name
        ref = _tensors(X=X, t=t)
        ref["X"].requires_grad_(True)
        want = reference(ref["X"], ref["t"])
        (want * seed).sum().backward()
        np.testing.assert_allclose(_host(got), _host(want), **_tolerance(dtype), err_msg=name)
        np.testing.assert_allclose(_host(ins["X"].grad), _host(ref["X"].grad),
                                   **_tolerance(dtype), err_msg=name)


@pytest.mark.parametrize("name", ["cross-entropy", "cross-entropy, logsumexp",
                                  "mean cross-entropy"])
@pytest.mark.parametrize("recorded", [False, True])
def test_a_label_outside_its_axis_is_the_statements_error(name, recorded):
    source, _ = PROGRAMS[name]
    X, t = _data(np.float32)
    program = ef.compile(source, backend="triton")
    program(**_tensors(X=X, t=t))                 # prepares the repeat
    for bad in (COLUMNS, -1, 10 ** 6):
        labels = t.copy()
        labels[5] = bad
        for fresh in (False, True):   # the prepared run, then the full path first
            ins = _tensors(X=X, t=labels)
            ins["X"].requires_grad_(recorded)
            run = ef.compile(source, backend="triton") if fresh else program
            with pytest.raises(EinfuseError, match=r"t\[5\]"):
                run(**ins)
    # and the right labels again give the right values
    got = program(**_tensors(X=X, t=t))
    want = ef.compile(source, backend="numpy")(X=X, t=t)
    np.testing.assert_allclose(_host(got), want, rtol=2e-6)


def test_int32_labels_and_a_strided_matrix():
    X, t = _data(np.float64)
    wide = torch.from_numpy(np.concatenate([X, X], 1)).to(DEVICE)[:, ::2]
    labels = torch.from_numpy(t.astype(np.int32)).to(DEVICE)
    with launch.observed() as seen:
        got = ef.compile(CROSS_ENTROPY, backend="triton")(X=wide, t=labels)
    assert [r.kernel for r in seen] == ["einfuse_rows"]
    want = F.cross_entropy(wide.cpu(), labels.cpu().long(), reduction="none")
    np.testing.assert_allclose(_host(got), want.numpy(), rtol=1e-12)


def test_clipped_labels_end_the_group_and_explain_says_why():
    # bounds='clip' reads a label outside as the axis's end: no checked row gather
    source = "m[i] := max[j](X[i,j])\nl[i] := m[i] - X[i, t[i]]"
    X, t = _data(np.float64)
    t[3] = COLUMNS + 4
    program = ef.compile(source, backend="triton", bounds="clip")
    got = program(**_tensors(X=X, t=t))
    want = ef.compile(source, backend="numpy", bounds="clip")(X=X, t=t)
    np.testing.assert_allclose(_host(got), want, rtol=1e-12)
    text = str(ef.explain(source, backend="triton", bounds="clip", **_tensors(X=X, t=t)))
    assert "gathers under bounds=" in text, text


SOFTMAX = ("m[i] := max[j](X[i,j])\ne[i,j] := exp(X[i,j] - m[i])\n"
           "y[i,j] := e[i,j] / sum[k](e[i,k])")


@pytest.mark.parametrize("name, source, written", [
    # the folded backward reads the output alone: the row maximum stays in registers
    ("softmax", SOFTMAX, ["y"]),
    # the cross-entropy's backward reads the row maximum: it is written beside the row
    ("cross-entropy", CROSS_ENTROPY, ["m", "l"])])
def test_a_recorded_forward_writes_what_its_backward_reads(monkeypatch, name, source,
                                                           written):
    from einfuse.backends.triton import rows as triton_rows
    stored = []
    original = triton_rows.RowRunner.__call__

    def recording(self, env):
        stored.append([m.key for m in self.group.outputs])
        return original(self, env)
    monkeypatch.setattr(triton_rows.RowRunner, "__call__", recording)
    X, t = _data(np.float64, seed=8)
    program = ef.compile(source, backend="triton")
    for _ in range(2):
        ins = _tensors(X=X, t=t)
        ins["X"].requires_grad_(True)
        stored.clear()
        got = program(**_given(source, ins["X"], ins["t"]))
        assert stored == [written], name
        seed = torch.linspace(-1, 1, got.numel(), dtype=got.dtype).reshape(got.shape)
        (got * seed.to(DEVICE)).sum().backward()
        ref = _tensors(X=X, t=t)
        ref["X"].requires_grad_(True)
        want = torch.softmax(ref["X"], 1) if name == "softmax" else \
            F.cross_entropy(ref["X"], ref["t"], reduction="none")
        (want * seed.to(DEVICE)).sum().backward()
        np.testing.assert_allclose(_host(ins["X"].grad), _host(ref["X"].grad), rtol=1e-10,
                                   atol=1e-12)


GATHERS = {
    # rows picked by a label (an embedding's rows), along the columns as written
    "rows gathered": "Y[i,j] := E[u[i], j] * 2\ns[i] := sum[j](Y[i,j] * X[i,j])",
    # a row's label value beside the whole row
    "a label in a block": "m[i] := max[j](X[i,j])\nY[i,j] := X[i,j] - X[i, t[i]] + m[i]",
    "a label of a label": "m[i] := max[j](X[i,j])\nl[i] := m[i] - X[i, t[w[i]]]",
    "a shifted label": "m[i] := max[j](X[i,j])\nl[i] := m[i] - X[i, t[i] + 1]",
}


@pytest.mark.parametrize("name", list(GATHERS))
def test_other_gathered_reads_are_one_kernel_and_checked(name):
    source = GATHERS[name]
    rng = np.random.default_rng(12)
    arrays = {"X": rng.standard_normal((ROWS, COLUMNS)),
              "E": rng.standard_normal((2 * ROWS, COLUMNS)),
              "t": rng.integers(0, COLUMNS - 1, ROWS), "u": rng.integers(0, 2 * ROWS, ROWS),
              "w": rng.integers(0, ROWS, ROWS)}
    given = {k: v for k, v in arrays.items() if f"{k}[" in source}
    program = ef.compile(source, backend="triton")
    with launch.observed() as seen:
        got = program(**_tensors(**given))
    # one kernel: the row group, or the one statement the canonical program makes of
    # an intermediate read once (rewrite/inline_reductions.py: rows gathered)
    assert [r.kernel for r in seen] in (["einfuse_rows"], ["einfuse_kernel"])
    np.testing.assert_allclose(_host(got), ef.compile(source, backend="numpy")(**given),
                               rtol=1e-12)
    label = next(k for k in ("w", "u", "t") if k in given)
    bad = dict(given)
    bad[label] = given[label].copy()
    bad[label][2] = 10 ** 4
    with pytest.raises(EinfuseError, match=rf"{label}\[2\]"):
        program(**_tensors(**bad))


@pytest.mark.parametrize("name", ["cross-entropy", "mean cross-entropy",
                                  "log-softmax, two statements"])
def test_gradcheck_and_gradgradcheck(name):
    source, _ = PROGRAMS[name]
    rng = np.random.default_rng(13)
    X = torch.from_numpy(rng.standard_normal((3, 5))).to(DEVICE).requires_grad_(True)
    t = torch.from_numpy(rng.integers(0, 5, 3)).to(DEVICE)
    program = ef.compile(source.replace(f"/ {ROWS}", "/ 3"), backend="triton")

    def run(X):
        return program(**_given(source, X, t))
    # (fast mode: the interpreter runs every kernel of every perturbed call in Python)
    assert torch.autograd.gradcheck(run, (X,), fast_mode=True)
    assert torch.autograd.gradgradcheck(run, (X,), fast_mode=True)


TOTALS = {
    "a total of a block": ("Y[i,j] := exp(X[i,j])\nL[] := sum[i](sum[j](Y[i,j]))", 1),
    "a parameter around the sum": ("l[i] := max[j](X[i,j])\nL[] := -sum[i](l[i]) * s + 1", 1),
    "two totals": ("l[i] := max[j](X[i,j])\nA[] := sum[i](l[i])\n"
                   "B[] := sum[i](exp(l[i])) / 13", 1),
    # a total is known once every program has added its rows: a reader runs after
    "read after the group": ("l[i] := max[j](X[i,j])\nL[] := sqrt(sum[i](l[i] * l[i]))\n"
                             "q[i] := l[i] / L[]", 2),
}


@pytest.mark.parametrize("rows", [13, 1, 0])
@pytest.mark.parametrize("name", list(TOTALS))
def test_totals_over_the_rows(name, rows):
    source, launches = TOTALS[name]
    X = np.random.default_rng(rows).standard_normal((rows, 7))
    outputs = ["A", "B"] if name == "two totals" else None
    scalars = {"s": 0.5} if "s *" in source or "* s" in source else {}
    want = ef.compile(source, backend="numpy", outputs=outputs)(X=X, **scalars)
    with launch.observed() as seen:
        got = ef.compile(source, backend="triton", outputs=outputs)(
            X=torch.from_numpy(X).to(DEVICE), **scalars)
    for g, w in zip(got if outputs else [got], want if outputs else [want]):
        np.testing.assert_allclose(_host(g), w, rtol=1e-12)
    if rows:        # (no rows: no program adds an empty sum; the statements run alone)
        assert [r.kernel for r in seen][:1] == ["einfuse_rows"]
        assert len(seen) == launches
