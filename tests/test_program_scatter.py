"""A program backward's scatter prepared for repeated calls (runtime/program_scatter.py):
cross-entropy's ``dX[i, t[i]] += -dl[i]`` under torch autograd gives, call after call,
the bits of the general path (run_reference's) and torch's gradient; labels that change
between calls, clip and wrap bounds, float32 and float64, a gather on the second of two
axes with collisions, and calls the prepared run declines (another layout) are right."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.lang import ast
from einfuse.backends.c import build as c_build
from einfuse.runtime import program_backward, program_scatter

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(c_build.find_compiler() is None,
                                reason="the prepared scatter adds with a C loop")

B, V = 48, 96
CROSS_ENTROPY = f"""m[i] := max[j](X[i,j])
l[i] := log(sum[j](exp(X[i,j] - m[i]))) + m[i] - X[i, t[i]]
L := sum[i](l[i]) / {B}"""
# a scatter whose positions collide: every b adds into column idx[b] of each row d
COLUMNS = "y[d, b] := W[d, idx[b]] * s[b]\nL := sum[d, b](y[d, b] * y[d, b])"


def _gradients(program, calls, wrt):
    out = []
    for arrays in calls:
        leaves = {k: torch.tensor(v, requires_grad=k in wrt) if k in wrt else torch.tensor(v)
                  for k, v in arrays.items()}
        loss = program(**leaves)
        out.append(torch.autograd.grad(loss, [leaves[k] for k in wrt]))
    return out


def _general(monkeypatch, run):
    """``run()`` with the prepared scatter off (the general path every call)."""
    with monkeypatch.context() as patch:
        patch.setattr(program_backward, "prepared_scatter", lambda *a: None)
        return run()


@pytest.mark.parametrize("dtype, bounds", [
    (np.float32, "check"), pytest.param(np.float64, "check", marks=pytest.mark.slow),
    pytest.param(np.float64, "clip", marks=pytest.mark.slow), (np.float32, "wrap")])
def test_cross_entropy_backward_as_the_general_path(monkeypatch, dtype, bounds):
    rng = np.random.default_rng(5)
    X = rng.standard_normal((B, V)).astype(dtype)
    low, high = (0, V) if bounds == "check" else (-V, 2 * V)
    calls = [{"X": X, "t": rng.integers(low, high, B)} for _ in range(4)]
    prepared = _gradients(ef.compile(CROSS_ENTROPY, bounds=bounds), calls, ["X"])
    general = _general(monkeypatch, lambda: _gradients(
        ef.compile(CROSS_ENTROPY, bounds=bounds), calls, ["X"]))
    for (mine,), (theirs,), arrays in zip(prepared, general, calls):
        assert torch.equal(mine, theirs)
        t = torch.tensor(arrays["t"])
        t = t.clamp(0, V - 1) if bounds == "clip" else t % V
        X = torch.tensor(arrays["X"], requires_grad=True)
        want, = torch.autograd.grad(torch.nn.functional.cross_entropy(X, t), [X])
        tolerance = 1e-6 if dtype == np.float32 else 1e-12
        torch.testing.assert_close(mine, want, rtol=tolerance, atol=tolerance)


def test_colliding_positions_as_the_general_path(monkeypatch):
    rng = np.random.default_rng(6)
    calls = [{"W": rng.standard_normal((7, 20)), "idx": rng.integers(0, 20, 50),
              "s": rng.standard_normal(50)} for _ in range(3)]
    prepared = _gradients(ef.compile(COLUMNS), calls, ["W", "s"])
    general = _general(monkeypatch, lambda: _gradients(ef.compile(COLUMNS), calls,
                                                       ["W", "s"]))
    for mine, theirs, arrays in zip(prepared, general, calls):
        for a, b in zip(mine, theirs):
            assert torch.equal(a, b)
        W = torch.tensor(arrays["W"], requires_grad=True)
        s = torch.tensor(arrays["s"], requires_grad=True)
        y = W[:, torch.tensor(arrays["idx"])] * s
        want = torch.autograd.grad((y * y).sum(), [W, s])
        for a, b in zip(mine, want):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_a_declined_call_runs_the_general_path(monkeypatch):
    """The prepared run declines (False, nothing written) arrays of another layout than
    it was prepared for, which the general path then runs; with the layout it adds.
    (Cross-entropy's scatter as a scatter: its gather form off.)"""
    monkeypatch.setattr(program_backward, "where_form", lambda *a: None)
    rng = np.random.default_rng(7)
    rows = 31               # a signature no other test planned (plans are kept per one)
    X, t = rng.standard_normal((rows, V)), rng.integers(0, V, rows)
    made = []
    original = program_backward.BackwardRun.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        made.append(self)
    monkeypatch.setattr(program_backward.BackwardRun, "__init__", init)
    _gradients(ef.compile(CROSS_ENTROPY), [{"X": X, "t": t}], ["X"])
    runs = [r for r in made[-1]._runs if isinstance(r, program_backward._ScatterRun)]
    assert runs and all(r.prepared for r in runs)
    run = runs[0]
    values, = run.piece.statements[0].inputs
    dl = np.linspace(-1.0, 1.0, rows)
    env = {"X": X, "t": t, values: dl.astype(np.float32)}
    assert run.prepared(env) is False and run.piece.key not in env
    env[values] = dl
    assert run.prepared(env) is True
    want = np.zeros((rows, V))
    np.add.at(want, (np.arange(rows), t), -dl)
    np.testing.assert_array_equal(env[run.piece.key], want)


def _backward_runs(monkeypatch):
    made = []
    original = program_backward.BackwardRun.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        made.append(self)
    monkeypatch.setattr(program_backward.BackwardRun, "__init__", init)
    return made


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cross_entropy_scatter_runs_as_a_gather_in_the_row_kernel(monkeypatch, dtype):
    """dX[i, t[i]] += -dl[i] adds one value per position: it runs as where(j == t[i],
    -dl[i], 0) inside the backward's one kernel run (no scatter piece), with the
    gradient of the scatter path and of torch, labels changing call after call."""
    rng = np.random.default_rng(8)
    rows = 29               # a signature no other test planned
    calls = [{"X": rng.standard_normal((rows, V)).astype(dtype),
              "t": rng.integers(0, V, rows)} for _ in range(3)]
    calls.append({"X": calls[0]["X"], "t": np.full(rows, V - 1)})   # every label alike
    program = ef.compile(CROSS_ENTROPY.replace(f"/ {B}", f"/ {rows}"))
    made = _backward_runs(monkeypatch)
    mine = _gradients(program, calls, ["X"])
    pieces = made[-1].pieces
    assert [type(p).__name__ for p in pieces] == ["_Labels", "_Kernels"]
    with monkeypatch.context() as patch:
        patch.setattr(program_backward, "where_form", lambda *a: None)
        scattered = _gradients(ef.compile(CROSS_ENTROPY.replace(f"/ {B}", f"/ {rows}")),
                               calls, ["X"])
    tolerance = 1e-6 if dtype == np.float32 else 1e-12
    for (got,), (theirs,), arrays in zip(mine, scattered, calls):
        assert got.dtype == torch.from_numpy(arrays["X"]).dtype
        torch.testing.assert_close(got, theirs, rtol=tolerance, atol=tolerance)
        X = torch.tensor(arrays["X"], requires_grad=True)
        want, = torch.autograd.grad(torch.nn.functional.cross_entropy(
            X, torch.tensor(arrays["t"])), [X])
        torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("bad", [V, -1])
def test_a_label_outside_raises_in_the_gather_form(monkeypatch, bad):
    """The gather form checks the labels first: one outside raises the scatter's own
    out-of-bounds error (an EinfuseError naming the value), and nothing is written."""
    rng = np.random.default_rng(9)
    rows = 27 if bad > 0 else 25         # signatures no other test planned
    X, t = rng.standard_normal((rows, V)), rng.integers(0, V, rows)
    program = ef.compile(CROSS_ENTROPY.replace(f"/ {B}", f"/ {rows}"))
    made = _backward_runs(monkeypatch)
    _gradients(program, [{"X": X, "t": t}], ["X"])
    run = made[-1]
    env = dict(X=X, t=t.copy(), m=X.max(1), dL=np.array(1.0), l=np.zeros(rows))
    assert run(dict(env))["X"].shape == X.shape
    env["t"][3] = bad
    before = set(env)
    with pytest.raises(ef.EinfuseError, match=f"index value {bad} is outside"):
        run(env)
    assert set(env) == before
    # and through torch: the forward names the label first
    with pytest.raises(ef.EinfuseError):
        program(X=torch.tensor(X, requires_grad=True), t=torch.tensor(env["t"]))


def test_scatters_that_are_not_one_value_per_position_stay_scatters(monkeypatch):
    """Colliding positions (every b of a row adds into column idx[b]) and a scatter
    over part of its target keep the scatter piece."""
    rng = np.random.default_rng(10)
    made = _backward_runs(monkeypatch)
    _gradients(ef.compile(COLUMNS), [{"W": rng.standard_normal((5, 20)),
                                      "idx": rng.integers(0, 20, 40),
                                      "s": rng.standard_normal(40)}], ["W", "s"])
    assert not any(isinstance(p, program_backward._Labels) for p in made[-1].pieces)
    # the labels address the second axis, but only rows 0..3 of 6 are scattered into
    part = "y[i] := X[i, t[i]] * X[i, t[i]]\nL := sum[i](y[i])"
    X = rng.standard_normal((6, 9))
    got, = _gradients(ef.compile(part, ranges={"i": range(4)}),
                      [{"X": X, "t": rng.integers(0, 9, 6)}], ["X"])[0]
    assert not any(isinstance(p, program_backward._Labels) for p in made[-1].pieces)
    assert got.shape == X.shape


EMBED_NORM = """h[b,d] := E[ids[b], d] * s[d]
r[b] := sqrt(sum[d](h[b,d]**2) / 24 + 0.000001)
y[b,d] := h[b,d] / r[b]
L := sum[b, d](y[b, d] * W[b, d])"""


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_an_embedding_backward_adds_prepared_rows(monkeypatch, dtype):
    """dE[ids[b], d] += v[b, d] (whole rows, repeated ids among them) prepared once:
    call after call the general path's bits and torch's gradient, ids changing."""
    rng = np.random.default_rng(11)
    rows = 37 if dtype == np.float32 else 35            # signatures no other test planned
    calls = [{"E": rng.standard_normal((rows, 24)).astype(dtype),
              "ids": rng.integers(0, rows, 40), "s": rng.standard_normal(24).astype(dtype),
              "W": rng.standard_normal((40, 24)).astype(dtype)} for _ in range(3)]
    calls[1]["ids"][:5] = 3                             # the same row five times
    made = _backward_runs(monkeypatch)
    mine = _gradients(ef.compile(EMBED_NORM), calls, ["E", "s"])
    scatters = [r for r in made[-1]._runs if isinstance(r, program_backward._ScatterRun)]
    assert scatters and all(r.prepared for r in scatters)
    general = _general(monkeypatch, lambda: _gradients(ef.compile(EMBED_NORM), calls,
                                                       ["E", "s"]))
    tolerance = 1e-5 if dtype == np.float32 else 1e-12
    for got, theirs, arrays in zip(mine, general, calls):
        for a, b in zip(got, theirs):
            assert torch.equal(a, b)
        E = torch.tensor(arrays["E"], dtype=torch.float64, requires_grad=True)
        s = torch.tensor(arrays["s"], dtype=torch.float64, requires_grad=True)
        h = E[torch.tensor(arrays["ids"])] * s
        y = h / torch.sqrt((h * h).mean(1, keepdim=True) + 1e-6)
        W = torch.tensor(arrays["W"], dtype=torch.float64)
        want = torch.autograd.grad((y * W).sum(), [E, s])
        for a, b in zip(got, want):       # (float32: to its rounding at b's scale)
            scale = float(b.abs().max())
            torch.testing.assert_close(a.double(), b, rtol=tolerance,
                                       atol=tolerance * scale)


def test_an_embedding_id_outside_runs_the_general_path(monkeypatch):
    """The prepared rows decline (False, nothing written) ids outside the table, which
    the general path then refuses with the statement's own error."""
    rng = np.random.default_rng(12)
    rows = 33
    arrays = {"E": rng.standard_normal((rows, 24)), "ids": rng.integers(0, rows, 40),
              "s": rng.standard_normal(24), "W": rng.standard_normal((40, 24))}
    made = _backward_runs(monkeypatch)
    _gradients(ef.compile(EMBED_NORM), [arrays], ["E"])
    run = next(r for r in made[-1]._runs if isinstance(r, program_backward._ScatterRun))
    assert run.prepared
    env = {"E": arrays["E"], "ids": arrays["ids"].copy(), "s": arrays["s"]}
    extents = {"b": 40, "d": 24}
    statement = run.piece.statements[0]
    for access in ast.accesses(statement.spec.rhs):     # the values' inputs (dh, s, ...)
        if access.tensor in statement.inputs:
            env.setdefault(access.tensor, np.ones(tuple(
                extents[sub.plain_index] for sub in access.indices)))
    assert run.prepared(dict(env)) is True
    env["ids"][7] = rows
    assert run.prepared(env) is False and run.piece.key not in env
    with pytest.raises(ef.EinfuseError, match=f"index value {rows} is outside"):
        run(env)
