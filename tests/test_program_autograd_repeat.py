"""Repeated calls of a program under torch autograd (program/autograd.py's PreparedCall):
a call whose signature was seen before goes straight to its prepared forward and
backward.  These check that the shortcut never changes a result: new data, seeds of
other layouts (a broadcast seed from ``.sum().backward()``, a transposed one), gradients
that torch accumulates, a gradient that would share memory with its seed, several
Python threads at once, a negative-bit tensor, and grad mode switched off."""

import threading

import numpy as np
import pytest

import einfuse as ef
from program_texts import LAYERNORM, SOFTMAX, SOFTMAX_STATEMENT

torch = pytest.importorskip("torch")
from torch_checks import close  # noqa: E402  (needs torch)


def _softmax(X):
    return torch.softmax(X, 1)


def _layernorm(X, g, b):
    return torch.nn.functional.layer_norm(X, (X.shape[1],), g, b, eps=1e-5)


def _leaves(*arrays):
    return [torch.from_numpy(a).requires_grad_() for a in arrays]


def _grads(fn, tensors, seed):
    for t in tensors:
        t.grad = None
    out = fn(*tensors)
    out.backward(seed)
    return out.detach().clone(), [t.grad.clone() for t in tensors]


CASES = [("softmax program", SOFTMAX, _softmax, 1),
         ("softmax statement", SOFTMAX_STATEMENT, _softmax, 1),
         ("layernorm", LAYERNORM.format(n=48), _layernorm, 3)]


@pytest.mark.parametrize("dtype", [np.float32, pytest.param(np.float64, marks=pytest.mark.slow)])
@pytest.mark.parametrize("name, source, formula, count", CASES, ids=[c[0] for c in CASES])
def test_repeated_calls_with_new_data_and_seeds_of_other_layouts(name, source, formula,
                                                                 count, dtype):
    program = ef.compile(source)
    rng = np.random.default_rng(5)
    shapes = [(40, 48), (48,), (48,)][:count]
    seeds = [lambda out: torch.from_numpy(rng.standard_normal(out.shape).astype(dtype)),
             lambda out: torch.ones((), dtype=out.dtype).expand(out.shape),    # .sum()
             lambda out: torch.from_numpy(
                 rng.standard_normal(out.shape[::-1]).astype(dtype)).T]    # transposed
    for call in range(9):
        arrays = [rng.standard_normal(s).astype(dtype) for s in shapes]
        ours, theirs = _leaves(*arrays), _leaves(*arrays)
        out = program(*ours)
        seed = seeds[call % 3](out)
        out.backward(seed)
        want = formula(*theirs)
        want.backward(seed)
        close(out.detach(), want.detach(), torch.float32 if dtype == np.float32 else
              torch.float64)
        for mine, other in zip(ours, theirs):
            close(mine.grad, other.grad, mine.dtype)


def test_gradients_accumulate_over_repeated_calls():
    program = ef.compile(SOFTMAX)
    X = torch.randn(16, 24, dtype=torch.float64, requires_grad=True)
    Y = X.detach().clone().requires_grad_()
    seed = torch.randn(16, 24, dtype=torch.float64)
    for _ in range(3):
        program(X=X).backward(seed)
        torch.softmax(Y, 1).backward(seed)
    close(X.grad, Y.grad, torch.float64)


def test_a_gradient_never_shares_memory_with_its_seed():
    """dX of ``Y := X * 2`` is ``dY * 2``, and of ``Y := X + 1`` dY itself: torch keeps a
    gradient it is handed as ``.grad`` and adds the next one into it in place, so a
    gradient sharing the seed's memory would change the caller's seed."""
    for source in ("m[i] := max[j](X[i,j]); Y[i,j] := X[i,j] + 1 + 0 * m[i]",
                   "Y[i,j] := X[i,j] + 1"):
        program = ef.compile(source)
        X = torch.randn(8, 5, dtype=torch.float64, requires_grad=True)
        for call in range(3):
            seed = torch.randn(8, 5, dtype=torch.float64)
            kept = seed.clone()
            program(X=X).backward(seed)
            assert torch.equal(seed, kept)
        assert X.grad.data_ptr() != seed.data_ptr()


def test_a_negative_bit_tensor_after_prepared_calls():
    program = ef.compile(SOFTMAX)
    X = torch.randn(6, 7, dtype=torch.float64, requires_grad=True)
    program(X=X).sum().backward()
    program(X=X).sum().backward()
    neg = torch.randn(6, 7, dtype=torch.float64)._neg_view().requires_grad_()
    assert neg.is_neg()
    out = program(X=neg)
    out.backward(torch.ones_like(out))
    close(out.detach(), torch.softmax(neg.detach().clone(), 1), torch.float64)


def test_no_grad_after_recorded_calls_records_nothing():
    program = ef.compile(SOFTMAX)
    X = torch.randn(6, 7, requires_grad=True)
    program(X=X).sum().backward()
    program(X=X).sum().backward()
    with torch.no_grad():
        out = program(X=X)
    assert out.grad_fn is None and not out.requires_grad
    close(out, torch.softmax(X.detach(), 1), torch.float32)


def test_an_input_modified_in_place_after_a_repeated_forward_is_refused():
    program = ef.compile(LAYERNORM.format(n=5))
    X, g, b = (torch.randn(4, 5, requires_grad=True), torch.randn(5), torch.randn(5))
    program(X=X, g=g, b=b).sum().backward()
    out = program(X=X, g=g, b=b)
    g.add_(1)               # read by the backward, not differentiated
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_python_threads_share_a_prepared_program():
    """Each thread's calls use the prepared runs; a fused kernel whose scratch another
    thread holds (the GIL is let go while a kernel runs) allocates its own."""
    program = ef.compile(LAYERNORM.format(n=300))
    rng = np.random.default_rng(2)
    inputs = [(rng.standard_normal((200, 300)), rng.standard_normal(300),
               rng.standard_normal(300)) for _ in range(4)]
    wanted = []
    for arrays in inputs:
        tensors = _leaves(*[a.copy() for a in arrays])
        wanted.append(_grads(_layernorm, tensors, torch.ones(200, 300, dtype=torch.float64)))
    failures = []

    def work(number):
        try:
            for _ in range(20):
                tensors = _leaves(*[a.copy() for a in inputs[number]])
                out, grads = _grads(program, tensors,
                                    torch.ones(200, 300, dtype=torch.float64))
                close(out, wanted[number][0], torch.float64)
                for mine, other in zip(grads, wanted[number][1]):
                    close(mine, other, torch.float64)
        except Exception as error:      # reported by the main thread
            failures.append(error)
    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures[0]


@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("source", ["y[i,j] := x[i,j] * 2", "y[i] := max[j](x[i,j])",
                                    SOFTMAX_STATEMENT.replace("X", "x")])
def test_a_negative_bit_tensor_is_read_as_its_values(source, requires_grad):
    """torch's lazily negated views (``x._neg_view()``, as ``torch.neg`` of a view may
    give) have no NumPy view; einfuse reads their values."""
    base = torch.randn(4, 6, dtype=torch.float64)
    x = base._neg_view().requires_grad_(requires_grad)
    plain = (-base).requires_grad_(requires_grad)
    for _ in range(2):      # the full path, then the prepared one
        got, want = ef.ein(source, x=x), ef.ein(source, x=plain)
        close(got.detach(), want.detach(), torch.float64)
        if requires_grad:
            seed = torch.randn(got.shape, dtype=torch.float64)
            (gx,), (gp,) = torch.autograd.grad(got, [x], seed), \
                torch.autograd.grad(want, [plain], seed)
            close(gx, gp, torch.float64)


def test_attention_reads_a_negative_bit_query():
    attention = ef.compile("""S[i,j] := Q[i,d] * K[j,d]
        m[i] := max[j](S[i,j])
        P[i,j] := exp(S[i,j] - m[i])
        O[i,e] := sum[j](P[i,j] * V[j,e]) / sum[j](P[i,j])""", outputs="O")
    Q, K, V = (torch.randn(n, d, dtype=torch.float64) for n, d in ((16, 8), (16, 8), (16, 4)))
    close(attention(Q=Q._neg_view(), K=K, V=V), attention(Q=-Q, K=K, V=V), torch.float64)


def test_a_0d_tensor_input_repeats():
    program = ef.compile("m[i] := max[j](X[i,j]); y[i,j] := (X[i,j] - m[i]) * s[]")
    X = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    s = torch.tensor(1.5, dtype=torch.float64, requires_grad=True)
    for _ in range(3):
        X.grad = s.grad = None
        program(X=X, s=s).sum().backward()
    X2, s2 = X.detach().clone().requires_grad_(), s.detach().clone().requires_grad_()
    ((X2 - X2.max(1, keepdim=True).values) * s2).sum().backward()
    close(X.grad, X2.grad, torch.float64)
    close(s.grad, s2.grad, torch.float64)


@pytest.mark.parametrize("threads", [None, 1])
def test_the_backward_runs_on_the_programs_threads(monkeypatch, threads):
    """threads= fixes the thread count of the backward's kernels too (compiled without
    it, they chose theirs from the free cores per call, which splits the column sums
    differently from call to call)."""
    from einfuse.backends.c import (fused_prepared as c_fused_prepared, repeat as c_repeat,
                                    rows as c_rows)
    from einfuse.runtime import torch_node     # (the C++ node asks once a call)
    asked = []
    for module in (c_fused_prepared, c_repeat, c_rows, torch_node):
        monkeypatch.setattr(module, "free_threads", lambda: asked.append(1) or 0)
    options = {} if threads is None else {"threads": threads}
    program = ef.compile(LAYERNORM.format(n=300), **options)
    X, g, b = (torch.randn(*s, dtype=torch.float64, requires_grad=True)
               for s in ((300, 300), (300,), (300,)))
    for _ in range(3):
        program(X=X, g=g, b=b).backward(torch.ones(300, 300, dtype=torch.float64))
    assert bool(asked) == (threads is None)
