"""The spelling audit's corpus (src/einfuse/bench/spelling_audit.py): spellings an
outside suite would write, beyond tests/test_spelling_families.py's.  Every spelling
gives its family's NumPy values on every backend; the spellings that are the same
computation have one canonical program (rewrite/canonical.normal_form), and where the
best spelling has a fast path (the softmax row kernel, online-softmax attention) the
others reach it."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.c import rows as c_rows
from einfuse.bench.spelling_audit import audit_families, rows_families
from test_spelling_families import normal

def family(prefix):
    return next(f for f in audit_families(quick=True) if f.name.startswith(prefix))


def float64(arrays):
    return {k: v.astype(np.float64) if v.dtype.kind == "f" else v for k, v in arrays.items()}


@pytest.mark.parametrize("index", range(len(audit_families(quick=True))),
                         ids=[f.name.split(" ")[0] + str(n)
                              for n, f in enumerate(audit_families(quick=True))])
def test_every_spelling_gives_the_numpy_values(backend, index):
    chosen = audit_families(quick=True)[index]
    arrays = float64(chosen.inputs(np.random.default_rng(index)))
    expected = chosen.reference(arrays)
    for name, text in chosen.spellings:
        given = {k: v for k, v in arrays.items() if f"{k}[" in text}
        got = np.asarray(ef.ein(text, **given, backend=backend))
        np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-11, err_msg=name)


# spellings (by name) that are one computation: one canonical program
SAME = {
    "softmax (more)": [("three statements", "max, then exp and sum inline",
                        "times the reciprocal", "reciprocal statement", "logsumexp statement",
                        "exp(x - max - log(sum))", "exp(-max + x)")],
    "log-softmax": [("x - logsumexp(x)", "logsumexp statement"),
                    ("x - max - log(sum(exp))", "max and log-sum statements")],
    "logsumexp": [("logsumexp", "max + log(sum(exp)) in one", "max statement, then log-sum",
                   "log-sum first, max added last")],
    "layernorm (more)": [("explicit sums", "times rsqrt", "rsqrt statement",
                          "centred statement", "(x-m)*(x-m)", "gain first",
                          "bias and gain first", "gain times the quotient in parentheses",
                          "(m-x)**2, epsilon first, gain between")],
    "RMSNorm": [("mean-square statement", "squared with **2", "times rsqrt")],
    "cross-entropy": [("gather", "max and log-sum statements")],
    "causal attention (more)": [("mask on the scores", "scale on q", "scale on k",
                                 "additive -inf mask", "mask out where j > i",
                                 "times the reciprocal of the sum", "normaliser statement")],
    "matmul": [("A[i,k] * B[k,j]", "explicit sum, other names")],
    "mean over H,W": [("sum over the count", "nested sums", "row sums statement"),
                      ("mean[h,w]", "nested means")],
    "squared distance": [("(a-b)**2", "(a-b)*(a-b)", "implicit sum", "difference statement")],
    "gaussian kernel": [("exp(-sum((a-b)**2) / s)", "distance statement")],
    "conv1d": [("x[c,i+a] * w[o,c,a]", "other index names")],
}


@pytest.mark.parametrize("prefix", sorted(SAME))
def test_one_computation_one_canonical_program(prefix):
    texts = dict(family(prefix).spellings)
    for group in SAME[prefix]:
        forms = {normal(texts[name]) for name in group}
        assert None not in forms and len(forms) == 1, group


def test_every_softmax_spelling_runs_the_row_kernel(row_patterns):
    chosen = family("softmax (more)")
    X = np.random.default_rng(5).standard_normal((63, 1000)).astype(np.float32)
    for name, text in chosen.spellings:
        row_patterns.clear()
        got = ef.compile(text)(X=X)
        assert row_patterns == [c_rows.RowPattern.SOFTMAX], name
        np.testing.assert_allclose(got, chosen.reference({"X": X.astype(np.float64)}),
                                   rtol=2e-6, atol=1e-7, err_msg=name)


def test_every_attention_spelling_runs_online_softmax():
    chosen = family("causal attention (more)")
    arrays = chosen.inputs(np.random.default_rng(6))
    for name, text in chosen.spellings:
        program = ef.compile(text)
        assert program.attention is not None, name
        assert program.attention.mask.value == "j <= i", name


def test_the_additive_mask_keeps_the_masks_meaning_on_special_scores():
    # Keeps.ADDITIVE_MASK in attention: a masked-out +inf score (here a +inf key
    # coordinate past the diagonal) contributes nothing, where the sum written would
    # give NaN for the whole row
    text = dict(family("causal attention (more)").spellings)["additive -inf mask"]
    rng = np.random.default_rng(7)
    Q, K, V = (rng.standard_normal((1, 2, 9, 8)) for _ in range(3))   # (D as the text's scale)
    K[0, 0, 8, :] = np.inf          # key 8: masked for every query but the last
    got = np.asarray(ef.ein(text, Q=Q, K=K, V=V))
    masked_reference = family("causal attention (more)").reference(
        {"Q": Q[:, :, :8], "K": K[:, :, :8], "V": V[:, :, :8]})
    np.testing.assert_allclose(got[0, 0, :8], masked_reference[0, 0], rtol=1e-10)


@pytest.mark.parametrize("prefix, name", [("conv1d", "sum over taps outside"),
                                          ("mean over H,W", "nested sums")])
def test_nested_sums_run_as_one_sum(prefix, name):
    # the nested spelling's canonical program is the flat sum's, up to the order of the
    # reduced indices
    texts = dict(family(prefix).spellings)
    flat = next(v for k, v in texts.items() if k != name and "sum" in v)
    assert normal(texts[name]).count("sum[") == normal(flat).count("sum[")


def test_the_layernorm_spellings_of_one_canonical_program_run_the_row_kernel(row_patterns):
    # (rows long enough for the row kernel to pay for itself)
    chosen = next(f for f in rows_families(63, 1000) if f.name.startswith("layernorm"))
    arrays = chosen.inputs(np.random.default_rng(9))
    for name in ("explicit sums", "times rsqrt", "rsqrt statement", "(x-m)*(x-m)",
                 "gain first", "bias and gain first",
                 "(m-x)**2, epsilon first, gain between"):
        text = dict(chosen.spellings)[name]
        row_patterns.clear()
        got = ef.compile(text)(**arrays)
        assert row_patterns == [c_rows.RowPattern.LAYERNORM], name
        np.testing.assert_allclose(got, chosen.reference(float64(arrays)), rtol=1e-4,
                                   atol=1e-5, err_msg=name)


def test_minus_log_softmax_at_the_label_runs_the_gather_spellings_row_kernel(row_patterns):
    # rewrite/gathered_reads.py: -Y[n, y[n]] of the log-softmax intermediate is read at the
    # label, so the program is the one-statement cross-entropy (its normal form differs
    # only as -(a - b) from b - a: the sign of a zero result)
    chosen = next(f for f in rows_families(63, 1000) if f.name.startswith("cross-entropy"))
    arrays = chosen.inputs(np.random.default_rng(10))
    texts = dict(chosen.spellings)
    patterns = {}
    for name in ("gather", "minus log-softmax at the label"):
        row_patterns.clear()
        program = ef.compile(texts[name])
        assert len(getattr(program, "statements", (program,))) == 1, name
        got = program(**arrays)
        patterns[name] = list(row_patterns)
        np.testing.assert_allclose(got, chosen.reference(float64(arrays)), rtol=1e-4,
                                   atol=1e-5, err_msg=name)
    assert patterns["gather"] and patterns["minus log-softmax at the label"] == \
        patterns["gather"]
