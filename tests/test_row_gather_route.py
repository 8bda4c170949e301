"""The row gather's route is the schedule's (schedule/row_gather.row_gather_decision,
once per signature): COPY_ROWS with the copy it decided, which backends/c/gather_rows.py
runs as given, or LOOP_NEST with the reason (the generic prepared kernel).  Values
against np.take and tests/oracle.py's brute-force loops for each route."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.c import build as c_build
from einfuse.backends.c import gather_rows as c_gather_rows
from einfuse.schedule import row_gather
from einfuse.schedule.row_gather import RowGatherRoute
from oracle import brute_force

pytestmark = pytest.mark.skipif(c_build.find_compiler() is None, reason="no C compiler")
STATEMENT = "E[b,d] := W[idx[b], d]"


@pytest.fixture
def decided(monkeypatch):
    """Each decision the backend was handed, and each row copy it ran."""
    seen = {"decisions": [], "copies": []}
    decide, copy = c_gather_rows.row_gather_decision, c_gather_rows.copy_runner

    def deciding(call):
        seen["decisions"].append(decide(call))
        return seen["decisions"][-1]

    def copying(plan, flagged):
        seen["copies"].append(plan)
        return copy(plan, flagged)
    monkeypatch.setattr(c_gather_rows, "row_gather_decision", deciding)
    monkeypatch.setattr(c_gather_rows, "copy_runner", copying)
    return seen


def _oracle(W, idx, d=None):
    d = d or range(W.shape[1])
    return brute_force(STATEMENT, {"b": (0, len(idx)), "d": (d.start, d.stop)},
                       {"W": np.asarray(W, np.float64), "idx": idx})


def _repeat(arrays, statement=STATEMENT, **options):
    kernel = ef.compile(statement, backend="c", **options)
    return [kernel(**arrays) for _ in range(3)]


def test_the_copy_decided_is_the_copy_run(decided):
    rng = np.random.default_rng(0)
    W = rng.standard_normal((40, 6)).astype(np.float32)
    idx = rng.integers(0, 40, 9)
    for got in _repeat({"W": W, "idx": idx}):
        np.testing.assert_array_equal(got, np.take(W, idx, axis=0))
    np.testing.assert_array_equal(got, _oracle(W, idx))
    [decision] = decided["decisions"]          # once per signature
    assert decision.route is RowGatherRoute.COPY_ROWS and decision.reason is None
    assert decided["copies"] == [decision.copy]
    copy = decision.copy
    assert (copy.table, copy.index, copy.shape, copy.dtype) == \
        ("W", "idx", (9, 6), np.dtype(np.float32))
    assert (copy.rows, copy.width, copy.row_stride, copy.table_rows, copy.threads) == \
        (9, 24, 24, 40, 1)


@pytest.mark.parametrize("make, reason", [
    (lambda W: np.asfortranarray(W), "rows that are not contiguous"),
    (lambda W: W[:, ::2], "rows that are not contiguous"),
])
def test_rows_not_contiguous_take_the_loop_nest(make, reason, decided):
    rng = np.random.default_rng(1)
    W = make(rng.standard_normal((30, 8)))
    idx = rng.integers(0, 30, 11)
    for got in _repeat({"W": W, "idx": idx}):
        np.testing.assert_array_equal(got, W[idx])
    [decision] = decided["decisions"]
    assert decision.route is RowGatherRoute.LOOP_NEST and decision.reason == reason
    assert decided["copies"] == []


def test_a_forced_fallback_runs_the_loop_nest(decided, monkeypatch):
    # the decision, not the data, picks the kernel: LOOP_NEST where the copy would do
    forced = row_gather.RowGatherDecision(RowGatherRoute.LOOP_NEST, reason="forced")
    monkeypatch.setattr(c_gather_rows, "row_gather_decision", lambda call: forced)
    rng = np.random.default_rng(2)
    W = rng.standard_normal((25, 5))
    idx = rng.integers(0, 25, 7)
    for got in _repeat({"W": W, "idx": idx}):
        np.testing.assert_array_equal(got, _oracle(W, idx))
    assert decided["copies"] == []


def test_threads_from_the_decision(decided, monkeypatch):
    monkeypatch.setattr(row_gather, "COPY_PARALLEL_BYTES", 1024)
    rng = np.random.default_rng(3)
    W = rng.standard_normal((100, 16))
    idx = rng.integers(0, 100, 300)
    for threads, want in ((None, None), (2, 2)):
        decided["decisions"].clear()
        for got in _repeat({"W": W, "idx": idx}, threads=threads):
            np.testing.assert_array_equal(got, W[idx])
        assert decided["decisions"][-1].copy.threads == want


@pytest.mark.parametrize("arrays, options, reason", [
    ({"W": np.zeros((4, 3), np.float32), "idx": np.zeros(0, np.int64)}, {},
     "nothing to copy"),
    ({"W": np.ones((4, 3)), "idx": np.array([0, 3])}, {"dtype": "float32"},
     "a float32 result from a float64 table"),
    ({"W": np.arange(12.0).reshape(4, 3), "idx": np.array([0, 3, 1])},
     {"ranges": {"d": range(1, 3)}}, "a window of the rows"),
])
def test_the_fallbacks_and_their_reasons(arrays, options, reason, decided):
    for got in _repeat(arrays, **options):
        want = _oracle(arrays["W"], arrays["idx"], options.get("ranges", {}).get("d")) \
            if arrays["idx"].size else np.zeros((0, 3))
        np.testing.assert_array_equal(got, want.astype(got.dtype))
    assert decided["copies"] == []
    assert [(d.route, d.reason) for d in decided["decisions"]] == \
        [(RowGatherRoute.LOOP_NEST, reason)]
