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
# -- shapes= ---------------------------------------------------------------------------------

BAD_SHAPES = [4, "ab", None, (-1, 6), (4.5, 6), (10 ** 30, 6), (2 ** 40, 2 ** 40), ("a", 6)]


@pytest.mark.parametrize("shape", BAD_SHAPES, ids=repr)
@pytest.mark.parametrize("text", ["Y[i,k] := X[i,k] * 2", TWO])
def test_a_malformed_shape_in_shapes_is_a_shape_error_naming_the_array(text, shape):
    """Each of these raised a raw TypeError, ValueError or OverflowError from building the
    placeholder array (statement and program alike)."""
    shapes = {"X": shape, "W": (6, 3)} if "W" in text else {"X": shape}
    with pytest.raises(ef.EinfuseError, match="X"):
        ef.explain(text, shapes=shapes)


@pytest.mark.parametrize("source", [False, True])
def test_a_valid_shape_larger_than_memory_is_explained(source):
    """Explaining a 4 TiB output raised a raw MemoryError: the note on whether the C
    kernel is built (and source=True) laid the kernel out on a real output array."""
    explanation = ef.explain("Y[i,k] := X[i,k] * 2", shapes={"X": (2 ** 20, 2 ** 20)},
                             source=source)
    assert explanation.flops == 2 ** 40
    assert explanation.bytes_written == 4 * 2 ** 40
    program = ef.explain("H[i,k] := X[i,k] * 2\nY[i,k] := H[i,k] + 1",
                         shapes={"X": (2 ** 20, 2 ** 20)}, source=source)
    assert program.flops == 2 * 2 ** 40


# -- programs: one framework per call ------------------------------------------------------

def test_a_program_whose_statements_read_arrays_of_two_frameworks_is_an_error():
    """Mixing frameworks in one call is an error (notation.md), and explain said so; but
    a program whose statements each read one framework returned a torch tensor and a
    NumPy array."""
    torch = pytest.importorskip("torch")
    program = ef.compile("A[i] := X[i] * 2\nB[i] := Z[i] * 3")
    with pytest.raises(ef.EinfuseError, match="different frameworks") as caught:
        program(X=torch.ones(2), Z=np.ones(2))
    assert "X" in str(caught.value) and "Z" in str(caught.value)
    with pytest.raises(ef.EinfuseError, match="different frameworks"):
        ef.explain("A[i] := X[i] * 2\nB[i] := Z[i] * 3", X=torch.ones(2), Z=np.ones(2))


def test_mixed_frameworks_in_a_program_name_the_inputs_not_an_intermediate():
    """The error named the intermediate H (a jax array), which the caller never passed."""
    torch = pytest.importorskip("torch")
    jnp = pytest.importorskip("jax.numpy")
    with pytest.raises(ef.EinfuseError, match="different frameworks") as caught:
        ef.ein("H[i] := X[i] * 2\nY[i] := H[i] / Z[i]", X=jnp.ones(3), Z=torch.ones(3))
    message = str(caught.value).splitlines()[0]
    assert "X is a jax array" in message and "H" not in message


# -- explain(program, source=True) ---------------------------------------------------------

def test_source_true_on_a_program_shows_each_unfused_statements_source():
    """source=True was accepted and silently ignored for a program."""
    X, W = _inputs()
    explanation = ef.explain(TWO, X=X, W=W, source=True, backend="c")
    for part, statement in zip(explanation.parts, TWO.split("\n")):
        kernel = ef.compile(statement, backend="c")
        arrays = dict(X=X, W=W) if "X" in statement else dict(H=X @ W)
        assert part.source == kernel.source(**arrays)
    assert "Generated source" in str(explanation)


def test_source_true_on_a_fused_program_says_where_the_source_is_not_shown():
    X = np.random.default_rng(0).standard_normal((256, 64)).astype(np.float32)
    softmax = "m[i] := max[j](X[i,j])\ne[i,j] := exp(X[i,j] - m[i])\n" \
              "P[i,j] := e[i,j] / sum[k](e[i,k])"
    explanation = ef.explain(softmax, X=X, source=True)
    fused = [g for g in explanation.groups if len(g.statements) > 1]
    assert fused, "the test needs a fused group"
    for number in fused[0].statements:
        assert explanation.parts[number].source is None
        assert any("source=True" in note for note in explanation.parts[number].notes)


def test_source_true_on_a_program_without_arrays_says_to_pass_them():
    explanation = ef.explain(TWO, source=True)
    assert any("generated source" in note for note in explanation.notes)


# -- explain reports the dtype the call returns ----------------------------------------------

def _dtype_name(array) -> str:
    return str(array.dtype).replace("torch.", "")


def _bf16_inputs():
    torch = pytest.importorskip("torch")
    X, W = _inputs()
    return dict(X=torch.tensor(X).bfloat16(), W=torch.tensor(W).bfloat16())


def _jax_int_inputs():
    jnp = pytest.importorskip("jax.numpy")
    X, W = _inputs()
    return dict(X=jnp.asarray(X * 10, dtype=jnp.int32), W=jnp.asarray(W, dtype=jnp.float32))


@pytest.mark.parametrize("make", [_bf16_inputs, _jax_int_inputs])
@pytest.mark.parametrize("options", [{}, {"backend": "numpy"}])
def test_explain_reports_the_result_dtype_the_statement_returns(make, options):
    """bfloat16 tensors were reported as a float32 result (they are computed in float32
    and returned as bfloat16); JAX arrays as float64 where JAX without x64 returns
    float32 (int32 times float32 promotes to float64 in NumPy)."""
    inputs = make()
    statement = "Y[i,o] := sum[k](X[i,k]*W[k,o])"
    result = ef.ein(statement, **inputs, **options)
    explanation = ef.explain(statement, **inputs, **options)
    assert explanation.result_dtype == _dtype_name(result)
    itemsize = 2 if explanation.result_dtype == "bfloat16" else \
        np.dtype(explanation.result_dtype).itemsize
    assert explanation.bytes_written == int(np.prod(result.shape)) * itemsize


def test_explain_reports_the_dtype_the_call_returns_with_dtype_under_jax():
    jnp = pytest.importorskip("jax.numpy")
    X, W = _inputs()
    inputs = dict(X=jnp.asarray(X), W=jnp.asarray(W))
    statement = "Y[i,o] := sum[k](X[i,k]*W[k,o])"
    result = ef.ein(statement, **inputs, dtype=np.float64)
    assert ef.explain(statement, **inputs, dtype=np.float64).result_dtype == \
        _dtype_name(result)


@pytest.mark.parametrize("make", [_bf16_inputs, _jax_int_inputs])
def test_a_programs_explanation_follows_the_dtypes_its_intermediates_have(make):
    """A program's intermediates were placeholders of the NumPy dtype: a bfloat16
    program's H read as float32, so the next statement was explained (and H listed) as
    float32; a JAX program's int32 x float32 intermediate as float64."""
    inputs = make()
    text = "H[i,o] := sum[k](X[i,k]*W[k,o])\nY[i,o] := H[i,o] * 2\nZ[i] := sum[o](H[i,o])"
    Y, Z = ef.ein(text, **inputs)
    explanation = ef.explain(text, **inputs)
    assert [p.result_dtype for p in explanation.parts[1:]] == [_dtype_name(Y),
                                                                _dtype_name(Z)]
    (H,) = [m for m in explanation.materialised if m.name == "H"]
    assert H.dtype == _dtype_name(Y)


# -- explain(program, shapes=) ---------------------------------------------------------------

def test_shapes_for_an_input_that_an_index_intermediate_is_computed_from():
    """``idx`` feeds ``J``, which gathers; shapes= made idx a float32 placeholder, so J was
    float32 and explain raised 'J is used as an index array but has dtype float32' for a
    program that runs."""
    text = "J[b] := idx[b] + 1\nE[b,d] := T[J[b], d]"
    T = np.arange(15.0).reshape(5, 3)
    idx = np.array([0, 1, 3, 2])
    np.testing.assert_array_equal(ef.ein(text, T=T, idx=idx), T[idx + 1])
    explanation = ef.explain(text, shapes={"T": (5, 3), "idx": (4,)})
    assert [m.shape for m in explanation.materialised] == [(4,)]
    assert explanation.parts[1].flops is not None
