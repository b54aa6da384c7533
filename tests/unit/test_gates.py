"""Gate checks say why they fail; every failure is collected; the verdict is decided once."""

from __future__ import annotations

import math

from certify import gates
from certify.verdict import Result, Status, decide
from manifests.recipe_model import load

RECIPE = load("tiny-llama", {})
HC = RECIPE.hardware_class("cpu", 2)
TWO = RECIPE.placements["two-middle"]
MONO = RECIPE.monolithic

GOOD = {
    "top1_agreement": 1.0,
    "kl_mean": 0.0,
    "kl_max": 0.0,
    "logits_nmse": 0.0,
    "greedy_match": 1.0,
    "boundary_nmse@6": 0.0,
}


def test_checks_pass_and_fail_with_a_reason() -> None:
    at_least = gates.AtLeast(name="top-1 agreement", metric="top1_agreement", limit=0.99)
    assert at_least.fails({"top1_agreement": 0.995}) is None
    assert at_least.fails({"top1_agreement": 0.9}) == "top-1 agreement 0.9 (limit >= 0.99)"
    at_most = gates.AtMost(name="KL mean", metric="kl_mean", limit=1e-9)
    assert at_most.fails({"kl_mean": 1e-9}) is None
    assert "KL mean 2.000e-08 (limit <= 1.000e-09)" == at_most.fails({"kl_mean": 2e-8})


def test_missing_or_nan_never_passes() -> None:
    check = gates.AtMost(name="logits NMSE", metric="logits_nmse", limit=1.0)
    assert check.fails({}) == "logits NMSE: logits_nmse was not measured"
    assert "NaN" in (check.fails({"logits_nmse": math.nan}) or "")
    ratio = gates.RatioAtLeast(name="staged/monolithic decode", metric="decode_tok_s", limit=0.5)
    assert "reference" in (ratio.fails({"decode_tok_s": 10.0}, None) or "")
    assert "NaN" in (ratio.fails({"decode_tok_s": 10.0}, {"decode_tok_s": 0.0}) or "")


def test_ratio_check() -> None:
    ratio = gates.RatioAtLeast(name="staged/monolithic decode", metric="decode_tok_s", limit=0.5)
    assert ratio.fails({"decode_tok_s": 60.0}, {"decode_tok_s": 100.0}) is None
    assert (
        ratio.fails({"decode_tok_s": 40.0}, {"decode_tok_s": 100.0})
        == "staged/monolithic decode 0.4 (limit >= 0.5)"
    )


def test_staging_parity_checks_cover_every_cut() -> None:
    names = [c.name for c in gates.staging_parity_checks(HC.staging_parity, RECIPE.placements["four-even"])]
    assert [n for n in names if n.startswith("boundary")] == [
        f"boundary NMSE at layer {c}" for c in (3, 6, 9)
    ]
    assert {"top-1 agreement", "KL mean", "KL max", "logits NMSE", "greedy continuation match"} <= set(names)


def test_speed_checks_ratio_only_for_staged() -> None:
    assert not any(isinstance(c, gates.RatioAtLeast) for c in gates.speed_checks(HC.speed, MONO))
    deep = RECIPE.placements["twelve-single"]
    ratio = [c for c in gates.speed_checks(HC.speed, deep) if isinstance(c, gates.RatioAtLeast)]
    assert ratio[0].limit == HC.speed.ratio_min(12)


def test_evaluate_collects_every_failure() -> None:
    bad = dict(GOOD, top1_agreement=0.5, **{"boundary_nmse@6": 1.0})
    checks = gates.staging_parity_checks(HC.staging_parity, TWO)
    result = gates.evaluate("staging-parity", "two-middle", checks, bad)
    assert result.status is Status.FAIL
    assert "top-1 agreement 0.5" in result.reason and "boundary NMSE at layer 6 1" in result.reason
    rows = result.details["rows"]
    assert sum(not r["ok"] for r in rows) == 2 and len(rows) == 6
    ok = gates.evaluate("staging-parity", "two-middle", checks, GOOD)
    assert ok.status is Status.PASS and ok.reason == ""


def test_decide_once() -> None:
    p = Result(name="a", status=Status.PASS)
    f1 = Result(name="b", status=Status.FAIL, reason="x too low")
    f2 = Result(name="c", status=Status.FAIL, reason="y too high")
    e = Result(name="d", status=Status.ERROR, reason="stage 1 died")
    assert decide([p]).passed
    v = decide([p, f1, f2])
    assert v.status is Status.FAIL and v.reasons == ("b: x too low", "c: y too high")
    assert decide([p, f1, e]).status is Status.ERROR
    assert decide([]).status is Status.ERROR
    assert Result.from_dict(f1.as_dict()) == f1


def test_shaped_seams_are_held_to_the_physical_bound_not_to_loopback() -> None:
    import dataclasses

    from manifests.recipe_model import Seam

    speed = dataclasses.replace(HC.speed, seam_bound_factor_max=3.0, bound_efficiency_min=0.3)
    wan = dataclasses.replace(TWO, seams=(Seam(delay_ms=20, rate_mbit=1000),))
    checks = gates.speed_checks(speed, wan)
    assert {c.metric for c in checks} == {"seam_ratio_max", "seam_ratio_min", "bound_efficiency"}
    ok = {"seam_ratio_max": 1.2, "seam_ratio_min": 1.01, "bound_efficiency": 0.8}
    assert gates.evaluate("speed", "wan", checks, ok).status is Status.PASS
    # A seam faster than physics allows was not shaped: that fails even though it looks "fast".
    unshaped = gates.evaluate("speed", "wan", checks, {**ok, "seam_ratio_min": 0.2})
    assert unshaped.status is Status.FAIL and "shaping applied" in unshaped.reason
    slow = gates.evaluate("speed", "wan", checks, {**ok, "seam_ratio_max": 7.0, "bound_efficiency": 0.1})
    assert slow.status is Status.FAIL and "physical bound" in slow.reason and "measured time" in slow.reason


def test_a_concurrent_session_unlike_one_alone_fails_the_speed_gate() -> None:
    assert not any(c.metric == "concurrency_diverging" for c in gates.speed_checks(HC.speed, TWO))
    checks = gates.speed_checks(HC.speed, MONO, concurrency=True)
    fast = {"decode_tok_s": 1e6, "prefill_tok_s": 1e6}
    same = gates.evaluate("speed", "mono", checks, {**fast, "concurrency_diverging": 0.0})
    assert same.status is Status.PASS
    mixed = gates.evaluate("speed", "mono", checks, {**fast, "concurrency_diverging": 1.0})
    assert mixed.status is Status.FAIL and "concurrent sessions unlike one alone" in mixed.reason
