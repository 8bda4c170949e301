"""Review of ``ef.explain`` (statements and programs) and of programs' calls: the bugs
found, each as the test that failed before its fix."""

import numpy as np
import pytest

import einfuse as ef

TWO = "H[i,o] := sum[k](X[i,k]*W[k,o])\nY[i,o] := relu(H[i,o])"


def _inputs():
    rng = np.random.default_rng(7)
    return rng.standard_normal((4, 6)), rng.standard_normal((6, 3))


# -- outputs= --------------------------------------------------------------------------------

@pytest.mark.parametrize("outputs", [3, 2.5, object()])
def test_outputs_that_is_not_a_name_or_a_sequence_of_names_is_an_option_error(outputs):
    """``outputs=3`` raised a raw TypeError ('int' object is not iterable)."""
    with pytest.raises(ef.EinfuseError, match="outputs="):
        ef.compile(TWO, outputs=outputs)
    X, W = _inputs()
    with pytest.raises(ef.EinfuseError, match="outputs="):
        ef.explain(TWO, X=X, W=W, outputs=outputs)


def test_outputs_as_a_set_is_refused_its_order_would_be_the_hash_order():
    """A set was accepted and the results came back in the set's iteration order, which
    changes with PYTHONHASHSEED: ``H, Y = prog(...)`` could silently swap them."""
    with pytest.raises(ef.EinfuseError, match="order"):
        ef.compile(TWO, outputs={"Y", "H"})


def test_outputs_naming_a_non_string_is_an_error_naming_it():
    with pytest.raises(ef.EinfuseError, match="outputs="):
        ef.compile(TWO, outputs=("Y", 3))


def test_outputs_as_a_list_or_tuple_still_chooses_and_orders():
    X, W = _inputs()
    H, Y = ef.compile(TWO, outputs=["H", "Y"])(X=X, W=W)
    np.testing.assert_allclose(H, X @ W)
    np.testing.assert_allclose(Y, np.maximum(X @ W, 0))


def test_outputs_holding_a_list_is_an_option_error_not_an_unhashable_type():
    with pytest.raises(ef.EinfuseError, match="outputs="):
        ef.compile(TWO, outputs=(["Y"],))
