"""The bench harness: cases agree with einfuse, tables and charts are produced.
(No timing is asserted: this machine is shared and noisy.)"""

import time

import numpy as np
import pytest

import einfuse as ef
from einfuse.bench import PeerUnavailable, all_cases, markdown_table, run_case, text_table
from einfuse.bench.cases import Case, Peer, installed
from einfuse.bench.runner import Measurement, agreement, time_call
from einfuse.cli import main


@pytest.mark.parametrize("case", all_cases(quick=True), ids=lambda c: c.name)
def test_numpy_peers_compute_what_einfuse_computes(case):
    arrays = case.inputs(np.random.default_rng(0))
    numpy_peers = [p for p in case.peers if p.needs == "numpy" and p.skip_reason is None]
    if not numpy_peers:
        return
    want = case.einfuse_call(arrays, "numpy")() if case.einfuse_call is not None else \
        ef.ein(case.statement, backend="numpy", **arrays)
    for peer in numpy_peers:
        got = np.asarray(peer.make(arrays)())
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3 * np.abs(want).max())


def test_run_case_and_tables(tmp_path):
    case = next(c for c in all_cases(quick=True) if c.name.startswith("logsumexp"))
    results = run_case(case, backend="numpy", peers=["numpy"], budget_s=0.05,
                       progress=lambda message: None)
    names = [m.implementation for m in results]
    assert names[0] == "einfuse" and "numpy" in names
    assert all(m.median_s is None or m.median_s > 0 for m in results)
    table = text_table(results)
    assert "1 (baseline)" in table and "peer / einfuse" in table
    markdown = markdown_table(results, "# title\n")
    assert markdown.startswith("# title") and markdown.count("\n|") >= 3


@pytest.mark.skipif(not installed("torch"), reason="torch not installed")
def test_training_cases_time_forward_and_backward():
    from einfuse.bench.cases import training_cases
    case = training_cases(quick=True)[1]  # the linear layer
    results = run_case(case, budget_s=0.01, progress=lambda message: None)
    assert [m.implementation for m in results] == ["einfuse", "torch eager"]
    assert all(m.median_s and not m.note for m in results)  # the outputs agree


def test_cli_bench_runs_in_this_process_without_openmp_settings(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert main(["bench", "--quick", "--case", "logsumexp", "--peer", "numpy", "--budget",
                 "0.01", "--backend", "numpy", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "bench.md").exists()


def test_missing_peers_are_reported_not_run():
    rows = text_table([Measurement("c", "einfuse", 1.0, 3, 2.0),
                       Measurement("c", "pykeops", None, note="pykeops not installed")])
    assert "pykeops not installed" in rows and "-" in rows


@pytest.mark.skipif(not installed("matplotlib"), reason="matplotlib not installed")
def test_cli_bench_writes_markdown_and_chart(tmp_path, capsys):
    assert main(["bench", "--quick", "--case", "logsumexp", "--peer", "numpy",
                 "--budget", "0.05", "--backend", "numpy", "--out", str(tmp_path),
                 "--plot"]) == 0
    assert (tmp_path / "bench.md").read_text().startswith("# einfuse bench")
    assert (tmp_path / "bench.png").stat().st_size > 1000
    assert "logsumexp" in capsys.readouterr().out


def test_agreement_reports_what_it_cannot_match():
    """A peer whose result has another shape, or cannot be compared at all, is a note,
    never silence (an exception inside the comparison used to read as agreement)."""
    reference = np.arange(1.0, 7.0).reshape(2, 3)
    assert agreement(reference, reference.ravel()) == ""   # the same values, flattened
    assert agreement(reference, np.ones((3, 3))) == "shape (3, 3) differs from einfuse's (2, 3)"
    assert agreement(reference, np.ones(5)).startswith("shape (5,)")
    assert agreement(reference, np.array(list("abcdef"))).startswith("could not compare: ")
    assert agreement(reference, reference * 1.01).startswith("differs from einfuse by 1.0e-02")
    assert agreement(reference, reference * 1.01, tolerance=2e-2) == ""
    assert "differs" in agreement(reference, np.full((2, 3), np.nan))
    assert agreement([reference, reference], reference) == "returns 1 values, einfuse 2"


@pytest.mark.skipif(not installed("torch"), reason="torch not installed")
def test_agreement_converts_bfloat16_tensors():
    import torch
    reference = np.arange(1.0, 7.0).reshape(2, 3)
    half = torch.tensor(reference, dtype=torch.bfloat16)   # .numpy() refuses bfloat16
    assert agreement(reference, half) == ""
    assert agreement(reference, half[:1]) == "shape (1, 3) differs from einfuse's (2, 3)"
    assert agreement(reference, half * 1.5).startswith("differs from einfuse by 5.0e-01")


def test_time_call_syncs_after_every_call_inside_the_timed_region():
    events = []

    def sync():
        events.append("sync")
        time.sleep(0.005)
    median, runs, first = time_call(lambda: events.append("call"), min_runs=3, max_runs=3,
                                    budget_s=0.0, sync=sync)
    assert runs == 3 and events == ["call", "sync"] * 4   # the warm-up call is synced too
    assert median >= 0.005 and first >= 0.005


def test_run_case_hooks_sync_tolerance_unavailable_peers_and_between_peers():
    def inputs(rng):
        return {"x": rng.standard_normal(64).astype(np.float32)}

    def unavailable(arrays):
        raise PeerUnavailable("no GPU build here")
    case = Case("double", "y[i] := x[i] * 2", inputs, [
        Peer("good", lambda a: (lambda: a["x"] * 2)),
        Peer("off by 1%", lambda a: (lambda: a["x"] * 2.02)),
        Peer("wrong shape", lambda a: (lambda: np.concatenate([a["x"], a["x"]]) * 2)),
        Peer("unavailable", unavailable),
        Peer("broken", lambda a: (lambda: 1 / 0)),
        Peer("absent", None, "no_such_module_for_einfuse"),
        Peer("too big", None, skip_reason="would allocate 99 GiB")])
    synced, released = [], []
    results = run_case(case, backend="numpy", budget_s=0.01, progress=lambda m: None,
                       sync=lambda: synced.append(1), tolerance=5e-2,
                       between_peers=lambda: released.append(1))
    notes = {m.implementation: (m.median_s is not None, m.note) for m in results}
    assert notes == {
        "einfuse": (True, ""), "good": (True, ""), "off by 1%": (True, ""),
        "wrong shape": (True, "shape (128,) differs from einfuse's (64,)"),
        "unavailable": (False, "no GPU build here"),
        "broken": (False, "failed: ZeroDivisionError: division by zero"),
        "absent": (False, "no_such_module_for_einfuse not installed"),
        "too big": (False, "would allocate 99 GiB")}
    assert len(synced) == sum(m.runs + 1 for m in results if m.median_s is not None)
    assert len(released) == 6   # after einfuse and after each peer that was tried
    default = run_case(case, backend="numpy", peers=["off"], budget_s=0.01,
                       progress=lambda m: None)   # CPU defaults: tolerance 1e-3
    assert default[1].note.startswith("differs from einfuse by 1.0e-02")


def test_cli_bench_says_when_no_case_matches(capsys):
    assert main(["bench", "--case", "no-such-case", "--backend", "numpy"]) == 1
    assert "no benchmark case matches --case" in capsys.readouterr().err


def test_the_first_call_says_whether_it_compiled(tmp_path, monkeypatch):
    from einfuse.backends.c import build as c_build
    if c_build.find_compiler() is None:
        pytest.skip("no C compiler")
    case = next(c for c in all_cases(quick=True) if c.name.startswith("logsumexp"))
    monkeypatch.setenv("EINFUSE_CACHE_DIR", str(tmp_path))     # an empty cache
    c_build._loaded.clear()
    c_build._by_source.clear()
    first = run_case(case, backend="c", peers=[], budget_s=0.01, progress=lambda m: None)
    again = run_case(case, backend="c", peers=[], budget_s=0.01, progress=lambda m: None)
    assert first[0].compiled >= 1 and again[0].compiled == 0
    assert "compiled" in text_table(first) and "from the cache" in text_table(again)


def test_a_slow_compile_is_said_once(tmp_path, monkeypatch, caplog):
    from einfuse.backends.c import build as c_build
    if c_build.find_compiler() is None:
        pytest.skip("no C compiler")
    monkeypatch.setenv("EINFUSE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(c_build, "SLOW_COMPILE_S", 0.0)      # every compile is "slow"
    monkeypatch.setattr(c_build, "_slow_said", False)
    with caplog.at_level("WARNING", logger="einfuse"):
        for n in (3, 4):     # two statements: two compiles, one message
            ef.ein(f"y[i] := sum[j](exp(X[i,j] * {n}))", X=np.ones((2, 2)), backend="c")
    said = [r for r in caplog.records if "compiling a kernel took" in r.getMessage()]
    assert len(said) == 1 and str(tmp_path) in said[0].getMessage()
