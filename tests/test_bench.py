"""The bench harness: cases agree with einfuse, tables and charts are produced.
(No timing is asserted: this machine is shared and noisy.)"""

import numpy as np
import pytest

import einfuse as ef
from einfuse.bench import all_cases, markdown_table, run_case, text_table
from einfuse.bench.cases import installed
from einfuse.bench.runner import Measurement
from einfuse.cli import main


@pytest.mark.parametrize("case", all_cases(quick=True), ids=lambda c: c.name)
def test_numpy_peers_compute_what_einfuse_computes(case):
    arrays = case.inputs(np.random.default_rng(0))
    want = ef.ein(case.statement, backend="numpy", **arrays)
    for peer in case.peers:
        if peer.needs == "numpy" and peer.skip_reason is None:
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


def test_cli_bench_runs_itself_with_passive_openmp_threads(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert main(["bench", "--quick", "--case", "logsumexp", "--peer", "numpy", "--budget",
                 "0.01", "--backend", "numpy", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "bench.md").exists()


def test_missing_peers_are_reported_not_run():
    rows = text_table([Measurement("c", "einfuse", 1.0, 3, 2.0),
                       Measurement("c", "pykeops", None, note="pykeops not installed")])
    assert "pykeops not installed" in rows and "-" in rows


@pytest.mark.skipif(not installed("matplotlib"), reason="matplotlib not installed")
def test_cli_bench_writes_markdown_and_chart(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "passive")  # else the command re-runs itself
    assert main(["bench", "--quick", "--case", "logsumexp", "--peer", "numpy",
                 "--budget", "0.05", "--backend", "numpy", "--out", str(tmp_path),
                 "--plot"]) == 0
    assert (tmp_path / "bench.md").read_text().startswith("# einfuse bench")
    assert (tmp_path / "bench.png").stat().st_size > 1000
    assert "logsumexp" in capsys.readouterr().out
