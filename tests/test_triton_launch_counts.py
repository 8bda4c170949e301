"""Kernels per call on the Triton backend (issue 36 item 2), counted at einfuse's Triton
launch path (backends/triton/launch.observed: every launch einfuse makes goes through
it): the row programs -- softmax, layernorm, RMSNorm, cross-entropy -- forward and
backward, recorded and not, and attention.  Values against torch's own functions (an
independent oracle), in float64."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.triton import backend as triton_backend, launch

from program_texts import LAYERNORM, SOFTMAX

torch = pytest.importorskip("torch")
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
pytestmark = pytest.mark.skipif(not triton_backend.available(),
                                reason="Triton is not installed")
DEVICE = torch.device("cpu" if triton_backend.interpreted() else "cuda")
ROWS, COLUMNS = 9, 20
EPS = 1e-5

RMSNORM = (f"ms[i] := sum[j](X[i,j] * X[i,j]) / {COLUMNS}\n"
           f"y[i,j] := X[i,j] / sqrt(ms[i] + {EPS}) * g[j]")
CROSS_ENTROPY = ("m[i] := max[j](X[i,j])\n"
                 "z[i] := log(sum[j](exp(X[i,j] - m[i]))) + m[i]\n"
                 "loss[i] := z[i] - sum[j](T[i,j] * X[i,j])")


def _inputs():
    rng = np.random.default_rng(11)
    data = {"X": rng.standard_normal((ROWS, COLUMNS)), "g": rng.standard_normal(COLUMNS),
            "b": rng.standard_normal(COLUMNS),
            "T": np.eye(COLUMNS)[rng.integers(0, COLUMNS, ROWS)]}
    return {name: torch.from_numpy(value).to(DEVICE) for name, value in data.items()}


def _softmax(X, **_):
    return torch.softmax(X, 1)


def _layernorm(X, g, b, **_):
    return torch.nn.functional.layer_norm(X, (COLUMNS,), g, b, EPS)


def _rmsnorm(X, g, **_):
    return X / torch.sqrt((X * X).mean(1, keepdim=True) + EPS) * g


def _cross_entropy(X, T, **_):
    return torch.nn.functional.cross_entropy(X, T.argmax(1), reduction="none")


# (program, the inputs it takes and differentiates, torch's function, launches of the
# backward).  The forward is one row-group kernel each, and so is the backward:
# layernorm's and RMSNorm's gradients of g and b (dg[j], db[j]: sums over the rows)
# join the backward's row group as column sums (schedule/row_groups.py), each program
# adding its rows' partial sums and the last one to finish adding those
# (backends/triton/rows.py) -- issue 36 item 2's one launch (it was 3 and 2).
CASES = {
    "softmax": (SOFTMAX, ("X",), _softmax, 1),
    "layernorm": (LAYERNORM.format(n=COLUMNS), ("X", "g", "b"), _layernorm, 1),
    "rmsnorm": (RMSNORM, ("X", "g"), _rmsnorm, 1),
    "cross-entropy": (CROSS_ENTROPY, ("X",), _cross_entropy, 1),
}


@pytest.mark.parametrize("case", list(CASES))
def test_row_programs_forward_and_backward_launches(case):
    source, wrt, reference, backward_launches = CASES[case]
    program = ef.compile(source, backend="triton")
    data = _inputs()
    names = [n for n in ("X", "g", "b", "T") if n in wrt or
             (n == "T" and case == "cross-entropy")]
    seed = torch.from_numpy(np.random.default_rng(12).standard_normal(
        (ROWS, COLUMNS) if case != "cross-entropy" else ROWS)).to(DEVICE)
    for repeat in range(2):          # the first call prepares, the second repeats
        ins = {n: data[n].clone().requires_grad_(n in wrt) for n in names}
        with launch.observed() as forward:
            got = program(**ins)
        assert [r.kernel for r in forward] == ["einfuse_rows"], (case, repeat)
        with launch.observed() as backward:
            (got * seed).sum().backward()
        assert len(backward) == backward_launches, (case, repeat, backward)
        assert backward[0].kernel == "einfuse_rows"
        ref = {n: data[n].clone().requires_grad_(n in wrt) for n in names}
        want = reference(**ref)
        (want * seed).sum().backward()
        np.testing.assert_allclose(got.detach().cpu().numpy(), want.detach().cpu().numpy(),
                                   rtol=1e-10, atol=1e-12, err_msg=case)
        for name in wrt:
            np.testing.assert_allclose(ins[name].grad.cpu().numpy(),
                                       ref[name].grad.cpu().numpy(), rtol=1e-9,
                                       atol=1e-11, err_msg=f"{case}: d{name}")
    with torch.no_grad(), launch.observed() as unrecorded:
        again = program(**{n: data[n] for n in names})
    assert [r.kernel for r in unrecorded] == ["einfuse_rows"]
    np.testing.assert_allclose(again.cpu().numpy(), want.detach().cpu().numpy(),
                               rtol=1e-10, atol=1e-12)


ATTENTION = ("S[b,h,i,j] := where(j <= i, sum[d](Q[b,h,i,d]*K[b,h,j,d]) * scale, -inf)\n"
             "m[b,h,i] := max[j](S[b,h,i,j])\n"
             "P[b,h,i,j] := exp(S[b,h,i,j] - m[b,h,i])\n"
             "O[b,h,i,e] := sum[j](P[b,h,i,j] * V[b,h,j,e]) / sum[j](P[b,h,i,j])")


# what torch runs beside the kernel in a call, allowed: allocations, views and the
# interpreter's copies of its operands (no reduction, no comparison, and no read of a
# device value by the host: aten._local_scalar_dense is that round trip)
MEMORY_OPS = ("aten.empty", "aten.new_empty", "aten.empty_like", "aten.detach",
              "aten.copy_", "aten.set_", "aten.alias", "aten.view", "aten.as_strided",
              "aten._to_copy", "aten.permute", "aten.unsqueeze", "aten.squeeze",
              "aten.select", "aten.slice", "aten.expand", "aten._unsafe_view",
              "aten._reshape_alias", "aten.reshape", "aten.clone")


class _TorchOps(TorchDispatchMode):
    """The names of the aten operations run inside the block."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def test_attention_is_one_kernel():
    """The fused attention is one Triton launch per call, repeated calls too, with no
    host round trip: the value's inf and NaN are the kernel's own question
    (backends/triton/attention.py), so torch runs nothing beside it but allocations --
    with a value holding inf too, which gives the statements' NaN from the kernel."""
    g = torch.Generator().manual_seed(5)
    Q, K, V = (torch.randn(1, 2, 37, 8, generator=g).to(DEVICE) for _ in range(3))
    program = ef.compile(ATTENTION, backend="triton")
    poisoned = V.clone()
    poisoned[0, 1, 30, 2] = torch.inf        # rows 0-29 weigh it 0: NaN in column 2
    for value in (V, V, poisoned, poisoned):
        scores = torch.einsum("bhid,bhjd->bhij", Q.double(), K.double()) * 0.5
        scores = scores.masked_fill(
            ~torch.ones(37, 37, dtype=torch.bool).tril().to(DEVICE), -torch.inf)
        weights = torch.softmax(scores, -1)
        want = (weights[..., None] * value.double()[:, :, None]).sum(-2)   # 0 * inf: NaN
        with launch.observed() as seen, _TorchOps() as ops:
            got = program(Q=Q, K=K, V=value, scale=0.5)
        assert [r.kernel for r in seen] == ["attention_forward"]
        assert all(name.startswith(MEMORY_OPS) for name in ops.names), \
            sorted(set(ops.names))
        np.testing.assert_array_equal(got.isnan().cpu().numpy(), want.isnan().cpu().numpy())
        np.testing.assert_allclose(got.cpu().numpy(), want.cpu().numpy(), rtol=2e-5,
                                   atol=2e-5)
    assert got[0, 1, :30, 2].isnan().all() and got[0, 1, 30:, 2].isinf().all()
