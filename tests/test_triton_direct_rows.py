"""A repeated recorded Triton program call launches its row groups directly
(runtime/run_groups.RowLaunches): the node's forward, and its backward without
``create_graph``, call the groups' runners without the prepared run's steps, on the
tensors as passed (a launch reads their storage).  What must not change: the values
and gradients (against torch's own functions), torch's refusal of a backward after an
input or an output was modified in place, a label outside its axis raised as the
statements' error on the repeated path, a scalar parameter's new value, and a
create_graph backward (still the statement-by-statement graph)."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.triton import backend as triton_backend, launch
from einfuse.errors import EinfuseError
from einfuse.runtime import run_groups

from program_texts import LAYERNORM, SOFTMAX

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not triton_backend.available(),
                                reason="Triton is not installed")
DEVICE = torch.device("cpu" if triton_backend.interpreted() else "cuda")
CROSS_ENTROPY = ("m[i] := max[j](X[i,j])\n"
                 "l[i] := log(sum[j](exp(X[i,j] - m[i]))) + m[i] - X[i, t[i]]")


def _x(rows=6, columns=10, dtype=torch.float64, seed=0):
    rng = np.random.default_rng(seed)
    return torch.from_numpy(rng.standard_normal((rows, columns))).to(dtype).to(DEVICE)


@pytest.fixture
def counted(monkeypatch):
    """Calls of the prepared run's steps (PreparedRun.__call__) and of RowLaunches."""
    counts = {"prepared": 0, "direct": 0}
    prepared, direct = run_groups.PreparedRun.__call__, run_groups.RowLaunches.__call__

    def prepared_call(self, env):
        counts["prepared"] += 1
        return prepared(self, env)

    def direct_call(self, env):
        counts["direct"] += 1
        return direct(self, env)
    monkeypatch.setattr(run_groups.PreparedRun, "__call__", prepared_call)
    monkeypatch.setattr(run_groups.RowLaunches, "__call__", direct_call)
    return counts


def test_a_repeated_softmax_step_launches_its_row_groups_directly(counted):
    program = ef.compile(SOFTMAX, backend="triton")
    x = _x().requires_grad_(True)
    for _ in range(2):           # the first call plans and prepares, the second repeats
        program(X=x).backward(torch.ones_like(x))
    for seed_number in range(3):
        seed = _x(seed=10 + seed_number)
        counted["prepared"] = counted["direct"] = 0
        x.grad = None
        with launch.observed() as seen:
            got = program(X=x)
            got.backward(seed)
        assert [r.kernel for r in seen] == ["einfuse_rows", "einfuse_rows"]
        assert counted == {"prepared": 0, "direct": 2}      # forward, backward
        reference = x.detach().clone().requires_grad_(True)
        want = torch.softmax(reference, 1)
        want.backward(seed)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(x.grad, reference.grad)
        assert not got.requires_grad or got.grad_fn is not None
        assert x.grad.grad_fn is None and not x.grad.requires_grad


def test_a_repeated_layernorm_step_gives_torchs_gradients(counted):
    columns = 12
    program = ef.compile(LAYERNORM.format(n=columns), backend="triton")
    x = _x(7, columns).requires_grad_(True)
    g = _x(1, columns, seed=1)[0].requires_grad_(True)
    b = _x(1, columns, seed=2)[0].requires_grad_(True)
    for repeat in range(4):
        seed = _x(7, columns, seed=20 + repeat)
        for tensor in (x, g, b):
            tensor.grad = None
        program(X=x, g=g, b=b).backward(seed)
        ref = [t.detach().clone().requires_grad_(True) for t in (x, g, b)]
        torch.nn.functional.layer_norm(ref[0], (columns,), ref[1], ref[2], 1e-5).backward(
            seed)
        for tensor, want in zip((x, g, b), ref):
            torch.testing.assert_close(tensor.grad, want.grad)
    assert counted["direct"] >= 2


@pytest.mark.parametrize("modified", ["input", "output"])
def test_a_backward_after_an_in_place_change_is_refused(modified):
    program = ef.compile(SOFTMAX, backend="triton")
    x = _x().requires_grad_(True)
    for _ in range(3):
        program(X=x).backward(torch.ones_like(x))
    if modified == "input":
        leaf = _x().requires_grad_(True)
        program(X=leaf).backward(torch.ones_like(leaf))    # (this leaf's own repeat)
        base = _x().requires_grad_(True)
        inner = base * 1.0          # a non-leaf input, modified after the forward
        out = program(X=inner)
        with torch.no_grad():
            inner.add_(1.0)
    else:
        out = program(X=x)
        with torch.no_grad():
            out.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.backward(torch.ones_like(out))


def test_a_label_outside_its_axis_on_the_repeated_recorded_path():
    program = ef.compile(CROSS_ENTROPY, backend="triton")
    X = _x(9, 13, dtype=torch.float32)
    labels = torch.from_numpy(np.random.default_rng(4).integers(0, 13, 9)).to(DEVICE)
    for _ in range(3):
        leaf = X.clone().requires_grad_(True)
        program(X=leaf, t=labels).sum().backward()
    bad = labels.clone()
    bad[5] = 13
    leaf = X.clone().requires_grad_(True)
    with pytest.raises(EinfuseError, match=r"t\[5\]"):
        program(X=leaf, t=bad)
    # and the right labels again give torch's values and gradients
    leaf = X.clone().requires_grad_(True)
    got = program(X=leaf, t=labels)
    got.sum().backward()
    ref = X.clone().requires_grad_(True)
    want = torch.nn.functional.cross_entropy(ref, labels, reduction="none")
    want.sum().backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(leaf.grad, ref.grad)


def test_a_scalar_parameter_takes_each_calls_value(counted):
    program = ef.compile("m[i] := max[j](X[i,j])\n"
                         "P[i,j] := exp(a * (X[i,j] - m[i])) / sum[k](exp(a * (X[i,k] - m[i])))",
                         backend="triton")
    x = _x().requires_grad_(True)
    for a in (0.5, 2.0, 0.5, 3.0, 2.0):
        x.grad = None
        seed = _x(seed=7)
        got = program(X=x, a=a)
        got.backward(seed)
        ref = x.detach().clone().requires_grad_(True)
        want = torch.softmax(a * ref, 1)
        want.backward(seed)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(x.grad, ref.grad)
    assert counted["direct"] >= 2


def test_a_differentiable_backward_after_direct_repeats():
    program = ef.compile(SOFTMAX, backend="triton")
    x = _x().requires_grad_(True)
    for _ in range(3):
        program(X=x).backward(_x(seed=5))
    seed = _x(seed=6)
    (grad,) = torch.autograd.grad(program(X=x), x, seed, create_graph=True)
    ref = x.detach().clone().requires_grad_(True)
    (want,) = torch.autograd.grad(torch.softmax(ref, 1), ref, seed, create_graph=True)
    torch.testing.assert_close(grad, want)
    (second,) = torch.autograd.grad(grad.sum(), x)
    (second_want,) = torch.autograd.grad(want.sum(), ref)
    torch.testing.assert_close(second, second_want)


def test_mixed_float_inputs_on_the_direct_path(counted):
    # X (float32) beside W (float64), both requiring gradients: each is launched in its
    # own dtype and as it is (the group computes in float64)
    program = ef.compile("m[i] := max[j](X[i,j] * W[i,j])\n"
                         "P[i,j] := exp(X[i,j] * W[i,j] - m[i])", backend="triton")
    x = _x(5, 9, dtype=torch.float32).requires_grad_(True)
    w = _x(5, 9, seed=1).requires_grad_(True)
    for repeat in range(3):
        x.grad = w.grad = None
        seed = _x(5, 9, seed=30 + repeat)
        got = program(X=x, W=w)
        got.backward(seed)
        rx, rw = (t.detach().clone().requires_grad_(True) for t in (x, w))
        product = rx.double() * rw
        want = torch.exp(product - product.max(1, keepdim=True).values)
        want.backward(seed)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(x.grad, rx.grad)
        torch.testing.assert_close(w.grad, rw.grad)
    with torch.no_grad():            # unrecorded, a tensor requiring a gradient passed
        torch.testing.assert_close(program(X=x, W=w), want.detach())
    assert counted["direct"] >= 1


def test_a_negated_view_requiring_a_gradient_on_the_direct_path(counted):
    # z.conj().imag: a float view carrying torch's negation bit (its storage holds the
    # negatives) that requires a gradient; the signature does not see the bit, so the
    # direct path's runner resolves it (detached first) on every call
    program = ef.compile(SOFTMAX, backend="triton")
    z = torch.complex(_x(), _x(seed=1)).requires_grad_(True)
    for repeat in range(3):              # the first call prepares, the others repeat
        z.grad = None
        seed = _x(seed=40 + repeat)
        view = z.conj().imag
        assert view.is_neg()
        got = program(X=view)
        got.backward(seed)
        ref = z.detach().clone().requires_grad_(True)
        want = torch.softmax(ref.conj().imag, 1)
        want.backward(seed)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(z.grad, ref.grad)
    assert counted["direct"] >= 2
