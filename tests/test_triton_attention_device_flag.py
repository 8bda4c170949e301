"""The fused Triton attention recorded by autograd with a value holding inf or NaN: no
host round trip (issue 36).  The forward is the kernel's whatever the value holds (it
weighs every key as the statements do) and writes, per program, a flag on the device;
the backward reads those flags with its own checks in one host read and takes the
statements' formula where they are raised.  Output and gradients equal the statements
on the NumPy backend (NaN and inf in the same places), causal or not, with a window and
a padding mask, the non-finite value at a key some rows weigh and at one no row weighs;
no host synchronisation, item or bool of a tensor in the forward, one in the backward.
Under TRITON_INTERPRET=1 on CPU tensors (compiled on a GPU where one is lent)."""

import sys

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.triton import backend as triton_backend
from test_attention import program as plain_program
from test_attention_terms import PADDED, program as terms_program

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(
    not triton_backend.available() or not (triton_backend.interpreted() or
                                           torch.cuda.is_available()),
    reason="needs triton under TRITON_INTERPRET=1, or compiled with a CUDA GPU")
DEVICE = "cpu" if triton_backend.interpreted() else "cuda"
from einfuse.backends.triton import launch as triton_launch  # noqa: E402

FORWARD = ["attention_forward"]
FUSED_BACKWARD = {"attention_backward_keys", "attention_backward_rows"}
N = 40      # two blocks of 32 rows (one a tail), keys in blocks of 16 (interpreted)

# (program text, extra inputs) by name
PROGRAMS = {
    "causal": (plain_program("j <= i"), {}),
    "not masked": (plain_program(None), {}),
    "window": (terms_program(window="i - j < W"), {"W": 9}),
    "padding mask, no causal": (terms_program(PADDED, mask=None), {"M": None}),
}
# where the value is poisoned: (row, feature, what); under the causal mask and the
# window key 39 is weighed by the last rows only, key 2 by rows 2-10 (window) or 2-39
POISONS = {
    "inf at a key the first rows do not see": [(35, 1, np.inf)],
    "nan at a key the first rows see": [(2, 0, np.nan)],
    "inf and -inf": [(10, 2, np.inf), (30, 2, -np.inf)],
    "-inf in the key tail": [(39, 3, -np.inf)],
}


def inputs(name, poison, seed=0):
    g = torch.Generator().manual_seed(seed)
    Q, K, V = (torch.randn(1, 2, N, 4, generator=g) for _ in range(3))
    for row, feature, value in POISONS[poison]:
        V[0, 1, row, feature] = value
    extra = dict(PROGRAMS[name][1])
    if "M" in extra:
        extra["M"] = torch.where(torch.rand(1, N, generator=g) < 0.3, -torch.inf, 0.0)
        extra["M"][0, 35] = -torch.inf          # the poisoned key 35 is masked too
    seed_grad = torch.randn(1, 2, N, 4, generator=g)
    return (Q, K, V), extra, seed_grad


def run(name, backend, tensors, extra, seed_grad):
    text = PROGRAMS[name][0]
    Q, K, V = (t.clone().to(DEVICE).requires_grad_() for t in tensors)
    named = {k: (v.to(DEVICE) if isinstance(v, torch.Tensor) else v) for k, v in extra.items()}
    with triton_launch.observed() as forward:
        out = ef.ein(text, Q=Q, K=K, V=V, scale=0.5, backend=backend, **named)
    with triton_launch.observed() as backward:
        out.backward(seed_grad.to(DEVICE))
    found = [out.detach()] + [t.grad for t in (Q, K, V)]
    return [x.cpu().numpy() for x in found], [r.kernel for r in forward], \
        [r.kernel for r in backward]


@pytest.mark.parametrize("poison", sorted(POISONS))
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_nonfinite_values_forward_and_backward_are_the_statements(name, poison):
    tensors, extra, seed_grad = inputs(name, poison)
    got, forward, backward = run(name, "triton", tensors, extra, seed_grad)
    want, _, _ = run(name, "numpy", tensors, extra, seed_grad)
    # the kernel's result is kept: one launch, nothing beside it; the backward takes
    # the statements' formula (the flags raised), not the fused kernels
    assert forward == FORWARD
    assert not FUSED_BACKWARD & set(backward)
    assert not np.isfinite(want[0]).all()
    for what, a, b in zip(("output", "dQ", "dK", "dV"), got, want):
        np.testing.assert_array_equal(np.isnan(a), np.isnan(b), err_msg=what)
        np.testing.assert_array_equal(np.isposinf(a), np.isposinf(b), err_msg=what)
        np.testing.assert_array_equal(np.isneginf(a), np.isneginf(b), err_msg=what)
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=what)


@pytest.mark.parametrize("name", ["causal", "window"])
def test_finite_values_still_take_the_fused_backward(name):
    tensors, extra, seed_grad = inputs(name, "nan at a key the first rows see")
    tensors[2][0, 1, 2, 0] = 0.5
    got, forward, backward = run(name, "triton", tensors, extra, seed_grad)
    want, _, _ = run(name, "numpy", tensors, extra, seed_grad)
    assert forward == FORWARD
    assert sorted(backward) == sorted(FUSED_BACKWARD)
    for a, b in zip(got, want):
        assert np.isfinite(a).all()
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)


@pytest.fixture
def host_reads(monkeypatch):
    """Every host read of a device value einfuse's own code makes (bool, item, float,
    int, tolist of a tensor; an event's, a stream's or the device's synchronize), by
    the name of the function that made it."""
    seen = []

    def watched(original, what):
        def wrapper(*args, **kwargs):
            caller = sys._getframe(1)
            if "/einfuse/" in caller.f_code.co_filename.replace("\\", "/"):
                seen.append(f"{what} in {caller.f_code.co_name}")
            return original(*args, **kwargs)
        return wrapper
    for name in ("__bool__", "item", "__float__", "__int__", "tolist", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, watched(getattr(torch.Tensor, name), name))
    monkeypatch.setattr(torch.cuda.Event, "synchronize",
                        watched(torch.cuda.Event.synchronize, "Event.synchronize"))
    monkeypatch.setattr(torch.cuda.Stream, "synchronize",
                        watched(torch.cuda.Stream.synchronize, "Stream.synchronize"))
    monkeypatch.setattr(torch.cuda, "synchronize",
                        watched(torch.cuda.synchronize, "torch.cuda.synchronize"))
    return seen


@pytest.mark.parametrize("poison", [None, "inf at a key the first rows do not see"])
def test_no_host_read_in_the_forward_one_in_the_backward(poison, host_reads):
    g = torch.Generator().manual_seed(4)
    Q, K, V = (torch.randn(1, 2, N, 4, generator=g).to(DEVICE).requires_grad_()
               for _ in range(3))
    if poison is not None:
        with torch.no_grad():
            V[0, 1, 35, 1] = torch.inf
    text = PROGRAMS["causal"][0]
    ef.ein(text, Q=Q, K=K, V=V, scale=0.5, backend="triton")     # (compiled, cached)
    host_reads.clear()
    for _ in range(2):       # the first call and a repeated one
        with triton_launch.observed() as seen:
            out = ef.ein(text, Q=Q, K=K, V=V, scale=0.5, backend="triton")
        assert [r.kernel for r in seen] == FORWARD
        assert host_reads == [], "the forward reads nothing on the host"
        grad = torch.ones_like(out)
        with triton_launch.observed() as seen:
            torch.autograd.grad(out, (Q, K, V), grad)
        kernels = {r.kernel for r in seen}
        assert kernels == (FUSED_BACKWARD if poison is None else set())
        # the backward's one read: which kernels (or the formula) it launches
        assert host_reads == ["__bool__ in fusable"], host_reads
        host_reads.clear()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit_values_raise_the_flag(dtype):
    """A 16-bit value's inf is flagged too (its exponent field, in the kernel): the
    backward takes the formula (in float32, as the statements compute 16-bit inputs),
    its NaN and inf where the float32 statements put them for the same rounded inputs."""
    tensors, extra, seed_grad = inputs("window", "inf at a key the first rows do not see")
    tensors = [t.to(dtype) for t in tensors]
    Q, K, V = (t.clone().to(DEVICE).requires_grad_() for t in tensors)
    text = PROGRAMS["window"][0]
    with triton_launch.observed() as forward:
        out = ef.ein(text, Q=Q, K=K, V=V, scale=0.5, backend="triton", **extra)
    with triton_launch.observed() as backward:
        out.backward(seed_grad.to(dtype).to(DEVICE))
    assert [r.kernel for r in forward] == FORWARD and out.dtype == dtype
    assert not FUSED_BACKWARD & {r.kernel for r in backward}
    want, _, _ = run("window", "numpy", [t.float() for t in tensors], extra,
                     seed_grad.to(dtype).float())
    for what, a, b in zip(("output", "dQ", "dK", "dV"),
                          (out.detach(), Q.grad, K.grad, V.grad), want):
        a = a.float().cpu().numpy()
        np.testing.assert_array_equal(np.isnan(a), np.isnan(b), err_msg=what)
        np.testing.assert_array_equal(np.isinf(a), np.isinf(b), err_msg=what)
        assert np.isfinite(b).any(), what
        tol = {torch.float16: 4e-3, torch.bfloat16: 3e-2}[dtype]
        finite = np.isfinite(b)
        np.testing.assert_allclose(a[finite], b[finite], rtol=tol, atol=tol, err_msg=what)


def test_no_host_read_without_autograd(host_reads):
    g = torch.Generator().manual_seed(8)
    Q, K, V = (torch.randn(1, 2, N, 4, generator=g).to(DEVICE) for _ in range(3))
    V[0, 0, 20, 3] = torch.nan
    text = PROGRAMS["window"][0]
    ef.ein(text, Q=Q, K=K, V=V, scale=0.5, backend="triton", W=9)
    host_reads.clear()
    with triton_launch.observed() as seen:
        out = ef.ein(text, Q=Q, K=K, V=V, scale=0.5, backend="triton", W=9)
    assert [r.kernel for r in seen] == FORWARD and host_reads == []
    want, _, _ = run("window", "numpy", (Q, K, V), {"W": 9}, torch.ones(1, 2, N, 4))
    np.testing.assert_array_equal(np.isnan(out.cpu().numpy()), np.isnan(want[0]))
    np.testing.assert_allclose(out.cpu().numpy(), want[0], rtol=1e-5, atol=1e-6)
