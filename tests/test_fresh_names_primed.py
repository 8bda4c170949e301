"""lang/fresh_names.FreshNames.primed: the windowed scatter form's second index for an
output index (``k'``) never captures a name in use."""

from einfuse.lang.fresh_names import FreshNames
from einfuse.analysis.spec import spec_of
from einfuse.plan.windowed_contraction import scatter_form, windowed_contraction


def test_primed_skips_taken_names_and_takes_its_own():
    names = FreshNames({"k", "k'", "l"})
    assert names.primed("k") == "k''"
    assert names.primed("k") == "k'''"
    assert names.primed("l") == "l'"
    assert {"k''", "k'''", "l'"} <= names.taken


def test_the_scatter_form_primes_each_output_index_once():
    found = windowed_contraction(
        spec_of("dx[b,c,k,l] := dy[b,o,k-p+1,l-q+1] * w[o,c,p,q]"), True)
    form = scatter_form(found)
    assert form is not None
    assert [(name, index) for name, index, _, _ in form.fresh] == [("k'", "k"), ("l'", "l")]
