"""The names the canonical program gives the reductions it splits off an intermediate
(rewrite/canonical.py: ``h1``, ``h2`` ...) come from lang/fresh_names.FreshNames: a name
the program already uses, as a tensor or as an index, is never handed out again, and the
program's values are those of the statements as written."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.analysis.spec import spec_of
from einfuse.lang.split import split_program
from einfuse.rewrite.canonical import canonical_program
from oracle import brute_force


def canonical_form(source, outputs):
    specs = [spec_of(piece.text) for piece in split_program(source)]
    return canonical_program([(s.statement, s.rhs) for s in specs], outputs)


def values_of(source, arrays):
    """The statements run one by one by the brute-force oracle."""
    env = dict(arrays)
    for piece in split_program(source):
        spec = spec_of(piece.text)
        ranges = {}
        for node in spec.rhs.walk():        # each index's range from a plain subscript
            if hasattr(node, "tensor") and node.tensor in env:
                for axis, sub in enumerate(node.indices):
                    if sub.plain_index is not None:
                        ranges[sub.plain_index] = (0, env[node.tensor].shape[axis])
        env[spec.output] = brute_force(piece.text, ranges, env)
    return env


def made(form, source):
    """The statements' outputs the canonical program made (not written in ``source``)."""
    written = {spec_of(p.text).output for p in split_program(source)}
    return [t.split("[")[0] for t in form.texts if t.split("[")[0] not in written]


SPLIT = "m[i] := sum[j](X[i,j]) / sum[j](X[i,j] * X[i,j])\nY[i,j] := X[i,j] - m[i]"
TAKING_H1 = ("h1[i] := X[i,0] * 2\n"
             "m[i] := sum[j](X[i,j]) / sum[j](X[i,j] * X[i,j]) + h1[i]\n"
             "Y[i,j] := X[i,j] - m[i]")
TAKING_H1_H2_AS_INDICES = ("m[h1] := sum[h2](X[h1,h2]) / sum[h2](X[h1,h2] * X[h1,h2])\n"
                           "Y[h1,h2] := X[h1,h2] - m[h1]")


def test_the_split_reductions_are_numbered_from_h1():
    form = canonical_form(SPLIT, ("Y",))
    assert form.shared == ("m: 2 reductions as statements",)
    assert made(form, SPLIT) == ["h1", "h2"]


@pytest.mark.parametrize("source,names", [(TAKING_H1, ["h2", "h3"]),
                                          (TAKING_H1_H2_AS_INDICES, ["h3", "h4"])])
def test_a_name_the_program_uses_is_not_handed_out(source, names):
    form = canonical_form(source, ("Y",))
    assert form.shared == ("m: 2 reductions as statements",)
    assert made(form, source) == names
    assert len(set(form.texts)) == len(form.texts)


@pytest.mark.parametrize("backend", ["numpy", "c", "triton"])
@pytest.mark.parametrize("source", [SPLIT, TAKING_H1, TAKING_H1_H2_AS_INDICES])
def test_values_are_the_written_programs(source, backend):
    if backend == "triton":
        from einfuse.backends.triton import backend as triton_backend
        if not triton_backend.available():
            pytest.skip("triton is not installed")
    X = np.random.default_rng(3).standard_normal((5, 7))
    X[1, 2], X[3, 0] = np.inf, -0.0
    want = values_of(source, {"X": X})["Y"]
    got = ef.ein(source, X=X, backend=backend)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(got[~finite & ~np.isnan(want)],
                                  want[~finite & ~np.isnan(want)])
