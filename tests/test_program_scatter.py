"""A program backward's scatter prepared for repeated calls (runtime/program_scatter.py):
cross-entropy's ``dX[i, t[i]] += -dl[i]`` under torch autograd gives, call after call,
the bits of the general path (run_reference's) and torch's gradient; labels that change
between calls, clip and wrap bounds, float32 and float64, a gather on the second of two
axes with collisions, and calls the prepared run declines (another layout) are right."""

import numpy as np
import pytest

import einfuse as ef
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
    it was prepared for, which the general path then runs; with the layout it adds."""
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
