"""tests/bench/rpc_shapes.py: the splits both sides of the RPC bench use, and its plots."""

from __future__ import annotations

from pathlib import Path

from tests.bench import rpc_shapes


def test_even_splits_give_both_sides_the_same_first_stage() -> None:
    tiny = rpc_shapes.even_splits(12, (1, 2, 4))
    assert tiny[1].ours == [(0, 12)] and (tiny[1].servers, tiny[1].server_layers) == (0, 0)
    assert tiny[2].ours == [(0, 6), (6, 12)] and (tiny[2].servers, tiny[2].server_layers) == (1, 6)
    assert (tiny[4].servers, tiny[4].server_layers) == (3, 9)
    gemma = rpc_shapes.even_splits(18, (2, 4))
    assert gemma[2].ours == [(0, 9), (9, 18)] and gemma[2].server_layers == 9
    assert gemma[4].ours == [(0, 4), (4, 9), (9, 14), (14, 18)]
    assert gemma[4].server_layers == 18 - 4  # llama-bench keeps our first stage's layers


def test_a_plot_draws_both_sides_against_ways(tmp_path: Path) -> None:
    ours = {2: [[10.0, 12.0]], 4: [[8.0]]}
    theirs = {2: [[5.0]], 4: [[2.0, 3.0, 4.0]]}
    out = rpc_shapes.plot(tmp_path / "plots", "metro", "a title", ours, theirs)
    text = out.read_text()
    assert out.name == "metro.svg" and text.startswith("<svg") and "a title" in text
    assert "ours" in text and "llama.cpp RPC" in text
    assert "11.00 tok/s" in text and "3.00 tok/s" in text  # each side's median at each ways


def test_plots_go_where_dgr_bench_plots_says(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("DGR_BENCH_PLOTS", raising=False)
    assert rpc_shapes.plot_folder(tmp_path) == tmp_path
    monkeypatch.setenv("DGR_BENCH_PLOTS", str(tmp_path / "docs"))
    assert rpc_shapes.plot_folder(tmp_path) == tmp_path / "docs"


def test_the_link_classes_are_the_wan_recipes_without_jitter() -> None:
    from pipeline.shaper import Link

    assert rpc_shapes.links() == {
        "rack": Link.of(delay_ms=1, rate_mbit=10000),
        "metro": Link.of(delay_ms=20, rate_mbit=1000),
    }
