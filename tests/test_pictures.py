"""Pictures of plans (spec v3 section 3, docs/pictures.md): every page parses, every SVG is
well-formed, and the numbers drawn are explain's numbers (read back from the SVG)."""

from __future__ import annotations

import html
import io
import json
import os

import numpy as np
import pytest

import einfuse as ef
from einfuse.bench.runner import Measurement
from einfuse.cli import main
from einfuse.errors import OptionError
from einfuse.pictures import Calibration, bench_page, cached, calibrate, cpu_model, store

from picture_checks import (ATTENTION, MLP, SOFTMAX, docs_examples, numbers, parse_page,
                            titles)

BANDWIDTH, FLOP_RATE = 2.5e10, 1.6e11


@pytest.fixture(autouse=True)
def calibration(tmp_path, monkeypatch):
    """A known calibration, cached where the pictures look (no measuring in tests)."""
    monkeypatch.setenv("EINFUSE_CALIBRATION_FILE", str(tmp_path / "calibration.json"))
    store(Calibration(BANDWIDTH, FLOP_RATE, cpu_model(), os.cpu_count(), "2026-01-02"))
    return tmp_path / "calibration.json"


def page_of(explanation, tmp_path, name="page.html"):
    path = tmp_path / name
    explanation.save(str(path))
    text = path.read_text()
    assert text.startswith("<!DOCTYPE html>")
    return text, parse_page(text)


def by_prefix(found, prefix):
    return [t for t in found if t.startswith(prefix)]


def test_statement_page_numbers(tmp_path):
    e = ef.explain("C[i,j] := A[i,k]*B[k,j]", shapes={"A": (30, 20), "B": (20, 10)})
    before = str(e)
    text, svgs = page_of(e, tmp_path)
    assert str(e) == before and "<svg" not in before
    kernel = numbers(by_prefix(titles(svgs, "dataflow"), "kernel 1:")[0])
    assert int(kernel["flops"]) == e.flops
    assert int(kernel["bytes_read"]) == e.bytes_read
    assert int(kernel["bytes_written"]) == e.bytes_written
    lanes = titles(svgs, "dataflow")
    for operand in e.inputs + [e.output]:
        assert any(t.startswith(f"{operand.name}: ") and f", {operand.nbytes} bytes;" in t
                   for t in lanes), operand
    point = numbers(by_prefix(titles(svgs, "roofline"), "kernel 1:")[0])
    assert int(point["flops"]) == e.flops
    assert int(point["bytes"]) == e.bytes_read + e.bytes_written
    roof = numbers(by_prefix(titles(svgs, "roofline"), "roof:")[0])
    assert float(roof["bandwidth_bytes_per_second"]) == BANDWIDTH
    assert float(roof["flops_per_second"]) == FLOP_RATE
    loops = titles(svgs, "loops")
    for level in e.loops:
        assert f"loop {level.index}: extent={level.extent}; " in " ".join(loops)
    assert e._repr_html_().startswith("<div class=\"einfuse-page\">")


def test_program_page_kernels_edges_and_where_they_live(tmp_path):
    e = ef.explain(SOFTMAX, shapes={"X": (512, 256)})
    text, svgs = page_of(e, tmp_path)
    flow = titles(svgs, "dataflow")
    kernel_titles = by_prefix(flow, "kernel ")
    assert len({t.split(":")[0] for t in kernel_titles}) == len(e.groups)
    for number, group in enumerate(e.groups, 1):
        title = numbers(by_prefix(flow, f"kernel {number}:")[0])
        assert int(title["flops"]) == sum(e.parts[s].flops for s in group.statements)
    for m in e.materialised:
        lane = by_prefix(flow, f"{m.name}: ")[0]
        assert f", {m.nbytes} bytes;" in lane
        if m.row_bytes is not None:
            assert "never in memory whole" in lane and f"{m.row_bytes} bytes per thread" in lane
        else:
            assert "materialised (in memory)" in lane
    x = by_prefix(flow, "X: ")[0]
    assert f", {512 * 256 * 4} bytes;" in x and "input" in x
    assert f"{e.flops:,}" in text and f"{e.bytes_read:,}" in text
    points = {p for p in by_prefix(titles(svgs, "roofline"), "kernel ") if "flops=" in p}
    assert sum(int(numbers(p)["flops"]) for p in points) == e.flops


def test_program_run_alone_has_a_kernel_per_statement(tmp_path):
    e = ef.explain("T[i] := sum[j](A[i,j])\nU[j] := sum[i](A[i,j]) + 1.0",
                   shapes={"A": (40, 30)})
    text, svgs = page_of(e, tmp_path)
    flow = titles(svgs, "dataflow")
    for number, group in enumerate(e.groups or [], 1):
        assert by_prefix(flow, f"kernel {number}:")


def test_attention_page_is_one_kernel_with_tiles(tmp_path):
    qkv = (1, 2, 64, 16)
    e = ef.explain(ATTENTION, shapes={"Q": qkv, "K": qkv, "V": qkv}, scale=0.25)
    assert e.attention is not None
    text, svgs = page_of(e, tmp_path)
    flow = titles(svgs, "dataflow")
    kernel = numbers(by_prefix(flow, "kernel 1:")[0])
    assert int(kernel["flops"]) == e.attention.flops
    assert int(kernel["bytes_read"]) == e.attention.bytes_read
    assert not by_prefix(flow, "kernel 2:")
    for name in ("S", "M", "P"):
        assert "never in memory" in by_prefix(flow, f"{name}: ")[0]
    assert any("online softmax" in t for t in titles(svgs, "loops"))


def test_mesh_page_collectives_and_alternatives(tmp_path):
    e = ef.explain(MLP, shapes={"x": (64, 128), "W1": (128, 256), "W2": (256, 128)},
                   mesh={"data": 2, "model": 4}, shard={"b": "data", "f": "model"})
    text, svgs = page_of(e, tmp_path)
    drawn = [numbers(t) for t in titles(svgs, "collective") if "bytes_sent=" in t]
    sent = {int(d["bytes_sent"]) for d in drawn}
    assert sent == {m.bytes_sent for m in e.collectives} and sent
    cards = sorted({t for t in titles(svgs, "alternative") if t.startswith("alternative ")})
    plans = e.alternatives()
    assert len({c.split(":")[0] for c in cards}) == len(plans)
    for plan in plans:
        label = str(plan.assignment) if plan.assignment.pairs else "nothing sharded"
        card = numbers(next(c for c in cards if c.startswith(f"alternative {label}:")))
        assert float(card["model_seconds"]) == pytest.approx(e.cost(plan).seconds, rel=1e-5)
        assert int(card["bytes_sent"]) == plan.bytes_sent
        assert int(card["local_flops"]) == plan.local_flops
    cheapest = [c for c in cards if "cheapest" in c]
    assert cheapest and all(str(e.cheapest.assignment) in c or
                            float(numbers(c)["model_seconds"]) ==
                            pytest.approx(e.cost(e.cheapest).seconds) for c in cheapest)
    assert sum("this plan" in c for c in cards) == 1
    # each array's block on each device: the local shape the plan gives
    blocks = [t for t in titles(svgs, "placement") if " holds " in t]
    assert len([t for t in blocks if " holds x block" in t]) == 8
    for name, placement in e.plan.inputs:
        local = placement.local_shape(e.plan.tensor(name).shape, e.plan.mesh)
        assert all(t.endswith(f"local shape {'x'.join(map(str, local))}")
                   for t in blocks if f" holds {name} block" in t)


def test_shard_auto_page_says_why(tmp_path):
    e = ef.explain(MLP, shapes={"x": (64, 128), "W1": (128, 256), "W2": (256, 128)},
                   mesh={"data": 2, "model": 4}, shard="auto")
    text, svgs = page_of(e, tmp_path)
    assert f"tried {e.choice.search.tried} assignments" in text
    this = next(c for c in titles(svgs, "alternative") if "this plan" in c)
    assert "cheapest" in this


def test_jit_page_draws_loops_as_loops(tmp_path):
    jax = pytest.importorskip("jax")
    jnp = jax.numpy

    def run(w, xs):
        def body(c, x):
            return jnp.tanh(c * jnp.exp(w) + x), None
        return jax.lax.scan(body, jnp.zeros(3), xs)[0]

    w, xs = jnp.ones(3), jnp.ones((20, 3))
    e = ef.explain(ef.jit(run), w, xs)
    assert isinstance(e, str) and str(e).startswith("ef.jit of run")
    text, svgs = page_of(e, tmp_path)
    found = titles(svgs, "loops")
    assert any(t.startswith("loop s") and "in 0..19" in t for t in found)
    assert any(t.startswith("hoisted: ") for t in found)    # exp(w): once, outside
    flow = titles(svgs, "dataflow")
    kernel = numbers(by_prefix(flow, "kernel 1:")[0])
    assert int(kernel["flops"]) == e.operations > 0
    assert int(kernel["bytes_read"]) == w.nbytes + xs.nbytes
    inputs = [a for a in e.flow_arrays if a.role == "input"]
    assert sorted(a.nbytes for a in inputs) == sorted([w.nbytes, xs.nbytes])
    for array in inputs:
        assert any(t.startswith(f"{array.name}: ") and f", {array.nbytes} bytes;" in t
                   for t in flow)


def test_named_expression_page(tmp_path):
    i, j = ef.dims("i j")
    A = ef.wrap(np.random.default_rng(0).random((32, 16)).astype(np.float32))
    e = ef.explain(A[i, j].softmax(j))
    text, svgs = page_of(e, tmp_path)
    assert "Names in the program" in text
    assert titles(svgs, "dataflow")


def test_without_shapes_the_page_says_so(tmp_path):
    e = ef.explain("C[i] := sum[j](A[i,j])")
    text, svgs = page_of(e, tmp_path)
    assert "Pass arrays or shapes=" in text
    assert not titles(svgs, "roofline")


def test_save_to_an_unwritable_path_is_an_option_error(tmp_path):
    e = ef.explain("C[i] := sum[j](A[i,j])", shapes={"A": (3, 4)})
    target = tmp_path / "missing" / "plan.html"
    with pytest.raises(OptionError, match="missing"):
        e.save(str(target))
    assert not target.exists()


def test_cli_explain_html(tmp_path, capsys):
    path = tmp_path / "plan.html"
    assert main(["explain", "C[i,j] := A[i,k]*B[k,j]", "--shape", "A=30x20",
                 "--shape", "B=20x10", "--html", str(path)]) == 0
    shown = capsys.readouterr().out
    assert "<svg" not in shown and "Cost" in shown
    parse_page(path.read_text())


def test_cli_explain_measure(capsys):
    assert main(["explain", "C[i] := sum[j](A[i,j])", "--shape", "A=30x20",
                 "--measure"]) == 0
    assert "Measured (measure=True)" in capsys.readouterr().out


def test_cli_calibrate_show_uses_the_cache(capsys):
    assert main(["calibrate", "--show"]) == 0
    assert "25.0 GB/s" in capsys.readouterr().out


def test_quick_calibration_measures_and_caches(calibration):
    os.remove(calibration)
    progress = io.StringIO()
    measured = calibrate(quick=True, progress=progress)
    assert "calibrating" in progress.getvalue()
    assert measured.bytes_per_second > 0 and measured.flops_per_second > 0
    assert cached() == measured


def test_first_need_calibrates_with_a_progress_line(calibration, monkeypatch, capsys,
                                                    tmp_path):
    os.remove(calibration)
    monkeypatch.setenv("EINFUSE_CALIBRATE", "quick")
    page_of(ef.explain("C[i] := sum[j](A[i,j])", shapes={"A": (30, 40)}), tmp_path)
    assert "calibrating this machine" in capsys.readouterr().err
    assert cached() is not None


def test_a_calibration_of_another_cpu_is_not_used(calibration):
    data = json.loads(calibration.read_text())
    data["cpu"] = "some other CPU"
    calibration.write_text(json.dumps(data))
    assert cached() is None


def test_bench_page_numbers(tmp_path):
    results = [Measurement("dist", "einfuse", 0.002), Measurement("dist", "numpy", 0.006),
               Measurement("dist", "torch", None, note="not installed")]
    from einfuse.bench.report import rows
    page = bench_page(results, rows(results), "test machine")
    svgs = parse_page(page.document())
    bars = [numbers(t) for t in titles(svgs, "bench") if "median_seconds=" in t]
    assert {float(b["median_seconds"]) for b in bars} == {0.002, 0.006}
    assert {float(b["ratio"]) for b in bars} == {1.0, 3.0}
    assert "test machine" in page.document()


def test_docs_examples_parse(tmp_path):
    for name, explanation in docs_examples().items():
        parse_page(page_of(explanation, tmp_path, f"{name}.html")[0])


def test_measured_time_is_drawn_on_the_roofline(tmp_path):
    e = ef.explain(SOFTMAX, shapes={"X": (256, 128)}, measure=True)
    assert e.measured.seconds > 0 and "Measured (measure=True" in str(e)
    assert "Measured" not in str(ef.explain(SOFTMAX, shapes={"X": (256, 128)}))
    text, svgs = page_of(e, tmp_path)
    found = {t for t in titles(svgs, "roofline") if "measured: seconds=" in t}
    assert len(found) == 1
    assert float(numbers(found.pop())["seconds"]) == pytest.approx(e.measured.seconds,
                                                                   rel=1e-5)


def test_measure_uses_the_arrays_given_and_gathers_stay_inside():
    A = np.ones((20, 8), np.float32)
    e = ef.explain("C[i] := sum[j](A[i,j])", A, measure=True)
    assert e.measured.seconds > 0 and "the arrays given" in e.measured.note
    g = ef.explain("C[i] := sum[j](W[idx[i], j]) * s", shapes={"W": (100, 5), "idx": (30,)},
                   measure=True)
    assert g.measured.seconds > 0 and "zero-filled" in g.measured.note


def test_measure_of_a_huge_shape_allocates_nothing():
    e = ef.explain("C[i] := sum[j](A[i,j])", shapes={"A": (1 << 20, 1 << 12)}, measure=True)
    assert e.measured.seconds is None and "would take" in e.measured.note


@pytest.mark.parametrize("options", [dict(measure="yes"),
                                     dict(measure=True, mesh={"d": 2})])
def test_measure_option_errors(options):
    with pytest.raises(OptionError, match="measure"):
        ef.explain("C[i] := A[i]", shapes={"A": (4,)}, **options)


def test_einsum_einops_and_torch_pages(tmp_path):
    torch = pytest.importorskip("torch")
    A, B = np.ones((20, 30), np.float32), np.ones((30, 10), np.float32)
    einsum = ef.explain("ij,jk->ik", A, B)
    text, svgs = page_of(einsum, tmp_path, "einsum.html")
    assert "einsum &#x27;ij,jk-&gt;ik&#x27;" in text or "einsum 'ij,jk-&gt;ik'" in text
    assert titles(svgs, "dataflow")
    reduced = ef.explain("b h w c -> b c", shapes={"x": (2, 3, 4, 5)}, reduction="sum")
    text, svgs = page_of(reduced, tmp_path, "einops.html")
    assert titles(svgs, "dataflow")
    reshape = ef.explain("b h w c -> b (h w) c", np.ones((2, 3, 4, 5), np.float32))
    assert reshape.inner is None          # a reshape alone: no kernel, the text only
    text = reshape.page().document()
    assert "no kernel runs" in text and "<svg" not in text
    t = torch.ones(64, 32)
    e = ef.explain("C[i] := sum[j](A[i,j])", A=t)
    text, svgs = page_of(e, tmp_path, "torch.html")
    lane = next(x for x in titles(svgs, "dataflow") if x.startswith("A: "))
    assert f", {t.nbytes} bytes;" in lane


def test_compiled_loop_nest_drawn_with_its_kinds(tmp_path):
    e = ef.explain("M[i] := max[j](X[i,j])", shapes={"X": (256, 1024)})
    loops = [line for line in e.compiled_loop_nest if hasattr(line, "kind")]
    assert loops and all("  " + line in str(e).splitlines() for line in e.compiled_loop_nest)
    text, svgs = page_of(e, tmp_path)
    drawn = {t for t in titles(svgs, "compiled") if t.startswith("compiled loop: ")}
    kinds = sorted(numbers(t)["kind"] for t in drawn)
    assert len(drawn) == len(loops)
    assert kinds == sorted(line.kind for line in loops)
    assert "threads" in kinds and "vector" in kinds


def test_cli_bench_html(tmp_path, monkeypatch, capsys):
    import einfuse.bench as bench
    from einfuse.bench.cases import Case
    case = Case("dist small", "D[i,j] := (w[k,i] - x[k,j])**2", inputs=lambda rng: {})
    timed = [Measurement(case.name, "einfuse", 0.004), Measurement(case.name, "numpy", 0.01)]
    monkeypatch.setattr(bench, "all_cases", lambda quick: [case])
    monkeypatch.setattr(bench, "run_case", lambda *args, **kwargs: list(timed))
    path = tmp_path / "bench.html"
    assert main(["bench", "--html", str(path)]) == 0
    svgs = parse_page(path.read_text())
    bars = {t for t in titles(svgs, "bench") if "median_seconds=" in t}
    assert {float(numbers(t)["median_seconds"]) for t in bars} == {0.004, 0.01}
    assert html.escape(cpu_model()) in path.read_text()
    missing = tmp_path / "nowhere" / "bench.html"
    assert main(["bench", "--html", str(missing)]) == 1
    assert "does not exist or is not writable" in capsys.readouterr().err
    assert not missing.exists()
