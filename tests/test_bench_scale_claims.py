"""bench.scale's claim rows: the ratio of block medians, its spread and the 15 % verdict."""

from bench.scale import CLAIM_RATIO, claim_verdict
from bench.scale_claims import summary


def test_the_verdict_reads_the_median_ratio_of_the_pairs_not_one_slow_pair() -> None:
    figures = summary([0.95, 1.02, 1.08, 1.10, 3.90], big=[1.0, 1.1, 1.2], small=[1.0, 1.0, 1.1])

    assert figures["ratio_median"] == 1.08
    assert figures["ratio_min"] == 0.95 and figures["ratio_max"] == 3.90
    ok, text = claim_verdict(figures)
    assert ok
    assert text.startswith("ratio 1.08 (IQR ")


def test_a_median_ratio_past_fifteen_percent_is_missed() -> None:
    figures = summary([1.10, 1.16, 1.17, 1.30], big=[2.0], small=[1.0])

    assert figures["ratio_median"] > CLAIM_RATIO
    ok, text = claim_verdict(figures)
    assert not ok
    assert text.endswith("MISSED")


def test_each_side_reports_its_own_pooled_percentiles() -> None:
    figures = summary([1.0, 1.0], big=[5.0, 1.0, 3.0, 2.0, 4.0], small=[0.5] * 19 + [9.0])

    assert (figures["big_p50_ms"], figures["big_p95_ms"]) == (3.0, 5.0)
    assert (figures["small_p50_ms"], figures["small_p95_ms"]) == (0.5, 9.0)
