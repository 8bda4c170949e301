"""Why a program's kernels are split where they are (schedule/fusion_reasons.py): the
fusion groups record the rule that stopped each one, explain prints it, and it gives a
reason for each intermediate written to memory.  Each program's values are checked
against NumPy too: recording the reasons must not change what runs."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.schedule.fusion_reasons import Split

RNG = np.random.default_rng(3)
X = RNG.standard_normal((64, 128)).astype(np.float32)
W = RNG.standard_normal((128, 32)).astype(np.float32)


def _explain(text, **arrays):
    explanation = ef.explain(text, **arrays)
    return explanation, [g.ended_by for g in explanation.groups]


def test_a_blas_contraction_runs_alone_and_says_so():
    text = ("s[i,k] := sum[j](x[i,j] * w[j,k])\n"
            "e[i,k] := exp(s[i,k])\n"
            "y[i,k] := e[i,k] * 2")
    explanation, ends = _explain(text, x=X, w=W)
    assert [g.statements for g in explanation.groups] == [(0,), (1, 2)]
    assert ends[0].statement == 0 and ends[0].reason is Split.BLAS and ends[0].alone
    assert ends[1] is None                      # the program ends there
    assert "statement 1 runs alone: it is a contraction that BLAS computes" in \
        str(explanation)
    s = next(m for m in explanation.materialised if m.name == "s")
    assert s.why == "computed by kernel 1, read by kernel 2 after it ends"
    np.testing.assert_allclose(ef.ein(text, x=X, w=W), np.exp(X @ W) * 2, rtol=1e-4)


def test_a_reduction_across_the_rows_ends_the_group_before_its_reader():
    # m sums over the rows (i): the kernel that computes it cannot also run the
    # statement that reads all of m at every row
    text = ("e[i,j] := exp(x[i,j])\n"
            "m[j] := sum[i](e[i,j])\n"
            "y[i,j] := e[i,j] / m[j]")
    explanation, ends = _explain(text, x=X)
    assert [g.statements for g in explanation.groups] == [(0, 1), (2,)]
    assert ends[0].statement == 2 and ends[0].reason is Split.READS_COLUMN_SUM
    assert not ends[0].alone
    assert "statement 3 starts a new kernel: it reads a sum over the kernel's rows" in \
        str(explanation)
    e = np.exp(X)
    np.testing.assert_allclose(ef.ein(text, x=X), e / e.sum(0), rtol=1e-5)


def test_a_read_at_another_row_ends_the_group():
    text = ("e[i,j] := exp(x[i,j])\n"
            "y[i,j] := e[i,j] - e[0,j]")
    explanation, ends = _explain(text, x=X)
    assert [g.statements for g in explanation.groups] == [(0,), (1,)]
    assert ends[0].statement == 1 and ends[0].reason is Split.OTHER_ROW_READ
    e = np.exp(X)
    np.testing.assert_allclose(ef.ein(text, x=X), e - e[0], rtol=1e-5, atol=1e-5)


def test_an_argmax_does_not_join_and_the_first_rule_it_breaks_is_given():
    # its result (int64) is not in the dtype it computes in (float32): the first rule
    # checked, before the position reduction itself
    text = ("e[i,j] := exp(x[i,j])\n"
            "a[i] := argmax[j](e[i,j])\n"
            "y[i] := a[i] * 2")
    explanation, ends = _explain(text, x=X)
    assert ends[0].statement == 1 and ends[0].reason is Split.ROUNDED
    np.testing.assert_array_equal(ef.ein(text, x=X), np.argmax(X, 1) * 2)


def test_a_row_fused_program_has_no_break_and_says_why_its_row_values_are_written():
    text = ("m[i] := max[j](x[i,j])\n"
            "e[i,j] := exp(x[i,j] - m[i])\n"
            "s[i] := sum[j](e[i,j])\n"
            "y[i,j] := e[i,j] / s[i]")
    explanation, ends = _explain(text, x=X)
    assert [g.statements for g in explanation.groups] == [(0, 1, 2, 3)]
    assert ends == [None]
    why = {m.name: m.why for m in explanation.materialised if m.row_bytes is None}
    assert why["m"] == why["s"] == "one value per row, written as each row passes"
    e = np.exp(X - X.max(1, keepdims=True))
    np.testing.assert_allclose(ef.ein(text, x=X), e / e.sum(1, keepdims=True), rtol=1e-5)


def test_small_arrays_are_not_fused_and_the_reason_is_given():
    x = X[:4, :8]
    text = ("e[i,j] := exp(x[i,j])\n"
            "y[i,j] := e[i,j] * 2")
    explanation, ends = _explain(text, x=x)
    assert [g.statements for g in explanation.groups] == [(0,), (1,)]
    assert ends[0].reason is Split.LITTLE_WORK
    assert "too little work" in str(explanation)


def test_an_update_runs_alone():
    text = ("e[i,j] := exp(x[i,j])\n"
            "acc[i,j] += e[i,j]\n"
            "y[i,j] := e[i,j] * 2")
    acc = np.ones_like(X)
    explanation, ends = _explain(text, x=X, acc=acc.copy())
    assert ends[0].statement == 1 and ends[0].reason is Split.UPDATES
    assert "statement 2 starts a new kernel: it writes into an existing array" in \
        str(explanation)
    acc_out, y = ef.ein(text, x=X, acc=acc)
    np.testing.assert_allclose(y, np.exp(X) * 2, rtol=1e-5)
    np.testing.assert_allclose(acc, 1 + np.exp(X), rtol=1e-5)


@pytest.mark.parametrize("reason", list(Split))
def test_every_reason_reads_as_a_clause(reason):
    from einfuse.schedule.fusion_reasons import KernelBreak
    text = KernelBreak(4, reason).describe()
    assert text.startswith("statement 5 ") and text.endswith(reason.value)


def test_the_triton_row_groups_say_why_they_end():
    torch = pytest.importorskip("torch")
    from einfuse.backends.triton import backend as triton_backend
    if not triton_backend.available():
        pytest.skip("Triton is not installed")
    device = torch.device("cpu" if triton_backend.interpreted() else "cuda")
    text = ("m[i] := max[j](x[i,j])\n"
            "e[i,j] := exp(x[i,j] - m[i])\n"
            "p[i,j] := e[i,j] / sum[k](e[i,k])\n"
            "h[i,o] := sum[j](p[i,j] * w[j,o])")
    x = torch.from_numpy(X[:8, :16].copy()).to(device)
    w = torch.from_numpy(W[:16, :4].copy()).to(device)
    explanation = ef.explain(text, x=x, w=w, backend="triton")
    first = explanation.groups[0]
    assert first.row_kernel == "triton" and first.statements == (0, 1, 2)
    # the contraction's output runs over another index than the rows' columns
    assert first.ended_by.statement == 3 and first.ended_by.reason is Split.ROW_UNFIT
    assert "statement 4 starts a new kernel: it does not fit a row of registers" in \
        str(explanation)
