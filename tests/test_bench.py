"""The benchmark's bookkeeping (suites, FLOP counts, tables, result files); timing itself needs a GPU."""

import json

from flashtriton.bench import SUITES, Row, Shape, article_table, provider_table, write_results


def test_suites_match_their_definitions():
    article = SUITES["article"]()
    assert {(s.batch, s.heads_q, s.head_dim) for s in article} == {(4, 8, 64)}
    assert sorted({s.seqlen_q for s in article}) == [512, 1024, 2048, 4096]
    paper = SUITES["paper"]()
    assert len(paper) == 2 * 2 * 6
    assert all(s.batch * s.seqlen_q == 16384 and s.heads_q * s.head_dim == 2048 for s in paper)
    assert SUITES["cs336"]() == [Shape(1, 16, 16, 16384, 16384, 64, True)]


def test_flops_follow_the_papers_convention():
    shape = Shape(4, 8, 8, 4096, 4096, 64, False)
    assert shape.flops("fwd") == 4 * 4 * 8 * 4096 * 4096 * 64
    causal = Shape(4, 8, 8, 4096, 4096, 64, True)
    assert causal.flops("fwd") == shape.flops("fwd") / 2
    assert causal.flops("bwd") == 2.5 * causal.flops("fwd")
    assert causal.flops("fwd_bwd") == 3.5 * causal.flops("fwd")


def test_tables_and_result_files(tmp_path):
    rows = [Row("flashtriton", "article", 4, 8, 8, 1024, 1024, 64, "bf16", True, "fwd", 0.05, 100.0, 1e-3),
            Row("sdpa", "article", 4, 8, 8, 1024, 1024, 64, "bf16", True, "fwd", 0.04, 125.0, 1e-3)]
    assert "| 1024 | yes | 0.050 | 0.040 | 100 | 125 | 80% |" in article_table(rows)
    assert "| 4 | 8 | 1024 | 64 | yes | fwd | 100 | 125 | 0.80 |" in provider_table(rows)
    meta = {"gpu": "test", "torch": "x", "triton": "y", "commit": "z", "date": "d"}
    write_results(tmp_path, "article", rows, meta)
    data = json.loads((tmp_path / "article.json").read_text())
    assert data["meta"] == meta
    required = {"provider", "suite", "B", "Hq", "Hkv", "Nq", "Nk", "D", "dtype", "causal", "mode", "ms", "tflops"}
    assert all(required <= set(row) for row in data["rows"])
    assert (tmp_path / "article.md").exists()


def test_results_of_a_suite_timed_in_parts_merge(tmp_path):
    def row(provider, d, ms):
        return Row(provider, "paper", 4, 2048 // d, 2048 // d, 4096, 4096, d, "bf16", False, "fwd", ms, 1.0)
    meta = {"gpu": "test", "torch": "x", "triton": "y", "commit": "first", "date": "d"}
    write_results(tmp_path, "paper", [row("flashtriton", 64, 1.0), row("sdpa", 64, 2.0)], meta)
    later = dict(meta, commit="second")
    rows = write_results(tmp_path, "paper", [row("flashtriton", 64, 0.5), row("flashtriton", 128, 3.0)], later,
                         merge=True)
    data = json.loads((tmp_path / "paper.json").read_text())
    assert sorted((r["provider"], r["D"], r["ms"]) for r in data["rows"]) == [
        ("flashtriton", 64, 0.5), ("flashtriton", 128, 3.0), ("sdpa", 64, 2.0)]
    assert len(rows) == 3
    assert data["meta"]["commit"] == "second" and data["meta"]["merged"] == [dict(meta, rows=1)]
    write_results(tmp_path, "paper", [row("flashtriton", 64, 0.7)], dict(meta, commit="third"))  # no merge
    assert len(json.loads((tmp_path / "paper.json").read_text())["rows"]) == 1


def test_roofline_bookkeeping(tmp_path):
    from flashtriton.roofline import Ceilings, Point, minimal_bytes, write_report

    shape = Shape(4, 32, 32, 4096, 4096, 64, False)
    tensor = 4 * 32 * 4096 * 64 * 2
    assert minimal_bytes(shape, "fwd") == 4 * tensor + 4 * 32 * 4096 * 4
    assert minimal_bytes(shape, "bwd") == 8 * tensor + 2 * 4 * 32 * 4096 * 4
    meta = {"gpu": "test", "torch": "x", "triton": "y", "commit": "z", "date": "d"}
    points = [Point("flashtriton", "D64-N4096-full", "fwd", 400.0, shape.flops("fwd") / minimal_bytes(shape, "fwd"))]
    write_report(tmp_path, Ceilings(700.0, 4.2), points, {"D64": "ncu is not on the PATH"}, meta)
    text = (tmp_path / "roofline.md").read_text()
    assert "| flashtriton | D64-N4096-full | fwd | 400 | 57% |" in text and "ncu is not on the PATH" in text
    assert (tmp_path / "roofline.png").exists()
