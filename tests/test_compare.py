"""Drift between datasets (`ingest.inspection._compare`), on real data converted by the real conversion.

Seattle's daily weather 2012-2015 (vega_datasets): random halves of it must not drift,
the same days with one feature changed must drift in that feature alone, and summer
against winter must drift where the seasons differ. The distances on constructed
statistics are checked against values worked out by hand.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from ingest import __main__ as cli
from ingest.inspection._compare import (
    CATEGORICAL_THRESHOLD,
    MISSING_THRESHOLD,
    NUMERIC_THRESHOLD,
    DriftReport,
    compare,
    jensen_shannon,
    numeric_histograms,
)
from ingest.metadata import _info
from ingest.statistics import FeatureStatistics, Statistics, ValueCount
from tests.conftest import convert_table, real_csv, run_convert, write_text

NUMBERS = ["precipitation", "temp_max", "temp_min", "wind"]


@pytest.fixture(scope="module")
def weather() -> pd.DataFrame:
    return pd.read_csv(real_csv("seattle-weather.csv"))


@pytest.fixture(scope="module")
def convert(tmp_path_factory):
    """Converts a DataFrame (as a CSV, the way the file itself would be) and returns the dataset's path."""
    root = tmp_path_factory.mktemp("compare")

    def run(frame: pd.DataFrame, name: str, *args) -> str:
        src = root / f"{name}.csv"
        frame.to_csv(src, index=False)
        run_convert("--source", "csv", "--input", src, "--output", root / name, *args)
        return str(root / name)

    return run


@pytest.fixture(scope="module")
def full(weather, convert) -> str:
    return convert(weather, "full")


@pytest.fixture(scope="module")
def halves(weather, convert) -> tuple:
    order = np.random.default_rng(0).permutation(len(weather))
    half = len(weather) // 2
    return convert(weather.iloc[order[:half]], "half_a"), convert(weather.iloc[order[half:]], "half_b")


@pytest.fixture(scope="module")
def windy(weather, convert) -> str:
    changed = weather.copy()
    changed["wind"] = changed["wind"] * 1.5
    return convert(changed, "windy")


def _months(weather, months) -> pd.DataFrame:
    return weather[pd.to_datetime(weather["date"]).dt.month.isin(months)]


@pytest.fixture(scope="module")
def seasons(weather, convert) -> tuple:
    return convert(_months(weather, [12, 1, 2]), "winter"), convert(_months(weather, [6, 7, 8]), "summer")


# --- real data --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hours(convert) -> tuple:
    """Seattle's hourly temperatures of 2010 with the keys a daily span carries: a day (24
    rows), the week before it, and January and February (744 and 672 rows)."""
    frame = pd.read_csv(real_csv("seattle-temps.csv"))
    when = pd.to_datetime(frame.pop("date"))
    frame["hour"], frame["month"], frame["weekday"] = when.dt.hour, when.dt.month, when.dt.day_of_week
    day = when.dt.normalize()
    one = pd.Timestamp("2010-03-10")
    week = (day >= one - pd.Timedelta(days=7)) & (day < one)
    return (
        convert(frame[week], "week_before"),
        convert(frame[day == one], "one_day"),
        convert(frame[when.dt.month == 1], "january"),
        convert(frame[when.dt.month == 2], "february"),
    )


def test_a_day_against_its_week_warns_that_it_is_too_small(hours, capsys):
    week, day, *_ = hours
    report = compare(week, day, thresholds={"month": 1, "weekday": 1})
    assert (report.baseline_records, report.current_records) == (168, 24)
    assert len(report.warnings) == 1
    assert re.match(
        r"too few records for these thresholds: 168 baseline and 24 current count as 21 .*"
        r"and below about \d+ sampling noise alone reaches the categorical threshold 0\.15: .* may be noise",
        report.warnings[0],
    )
    assert cli.main(["compare", week, day, "--threshold", "month=1", "--threshold", "weekday=1"]) in (0, 1)
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "records: 168 baseline, 24 current" and out[2].startswith("warning: too few records")


def test_a_month_against_the_next_is_large_enough_and_a_key_column_is_excluded(hours, halves):
    *_, january, february = hours
    report = compare(january, february)
    assert (report.baseline_records, report.current_records, report.warnings) == (744, 672, ())
    # The month is the span's key: always a different value, distance 1, until excluded.
    assert report.row("month").distance == 1 and "month" in report.drifted
    excluded = compare(january, february, thresholds={"month": 1})
    assert excluded.row("month").distance == 1 and "month" not in excluded.drifted
    assert compare(*halves).warnings == ()  # 730 days a side, as the defaults were measured


def test_random_halves_of_real_data_do_not_drift(halves):
    report = compare(*halves)
    assert report.drifted == ()
    assert {r.kind for r in report.rows} == {"numeric", "categorical"}
    for r in report.rows:  # not flagged, yet measured: the halves do differ
        assert 0 <= r.distance <= r.threshold, r
    assert max(report.row(f).distance for f in NUMBERS) > 0


def test_one_feature_scaled_drifts_alone(full, windy):
    report = compare(full, windy)
    assert report.drifted == ("wind",)
    wind = report.row("wind")
    assert (wind.kind, wind.metric) == ("numeric", "jensen_shannon")
    assert wind.distance > 2 * NUMERIC_THRESHOLD
    for f in NUMBERS[:3]:  # the same days, the same values
        assert report.row(f).distance == 0


def test_winter_against_summer_drifts_in_temperature_and_weather(weather, seasons):
    report = compare(*seasons)
    assert {"temp_max", "temp_min", "weather"} <= set(report.drifted)
    assert report.drifted[0] in ("temp_max", "temp_min")  # worst first: these barely overlap
    assert report.row("temp_max").distance > 0.8
    # The label distribution's largest change, from the rows themselves.
    winter = _months(weather, [12, 1, 2])["weather"].value_counts(normalize=True)
    summer = _months(weather, [6, 7, 8])["weather"].value_counts(normalize=True)
    expected = winter.sub(summer, fill_value=0).abs().max()
    row = report.row("weather")
    assert (row.kind, row.metric) == ("categorical", "l_infinity")
    assert row.distance == pytest.approx(expected)
    assert row.distance > 2 * CATEGORICAL_THRESHOLD


def test_a_change_in_missing_values_drifts(weather, full, convert):
    holed = weather.copy()
    blank = holed.sample(frac=0.3, random_state=0).index
    holed.loc[blank, "temp_min"] = np.nan
    report = compare(full, convert(holed, "holed"))
    assert report.drifted == ("temp_min",)
    row = report.row("temp_min")
    assert row.missing_baseline == 0
    assert row.missing_current == pytest.approx(len(blank) / len(weather))
    assert row.distance <= row.threshold  # the days left have the same temperatures
    assert re.search(r"missing share changed by 0\.30 > 0\.1", row.note)


def test_a_feature_threshold_overrides_the_default(full, windy, halves):
    assert compare(full, windy, thresholds={"wind": 0.5}).drifted == ()
    assert compare(full, windy, thresholds={"wind": 0.5}).row("wind").threshold == 0.5
    assert compare(*halves, thresholds={"temp_max": 0}).drifted == ("temp_max",)
    assert compare(full, windy, numeric_threshold=0.5).drifted == ()


def test_features_on_one_side_are_schema_drift(weather, full, convert):
    other = weather.drop(columns=["wind"]).assign(humidity=0.5)
    report = compare(full, convert(other, "other_columns"))
    assert set(report.drifted) == {"wind", "humidity"}
    assert {report.row("wind").note, report.row("humidity").note} == {
        "only in the baseline dataset",
        "only in the current dataset",
    }
    assert report.row("humidity").missing_baseline is None


def test_few_valued_int_features_compare_as_categories(tmp_path):
    rng = np.random.default_rng(0)

    def table(shares):
        return pa.table({"code": rng.choice([1, 2, 3], 2000, p=shares), "n": rng.integers(0, 100_000, 2000)})

    base = convert_table(tmp_path / "a", table([0.6, 0.3, 0.1]))
    cur = convert_table(tmp_path / "b", table([0.3, 0.3, 0.4]))
    report = compare(base, cur)
    assert report.row("code").kind == "categorical"
    assert report.row("code").distance == pytest.approx(0.3, abs=0.05)  # share of 3: 0.1 -> 0.4
    assert report.row("n").kind == "numeric"  # 100,000 values: too many to be categories
    assert report.drifted == ("code",)


def test_categories_new_in_the_current_dataset_are_listed(tmp_path, capsys):
    rng = np.random.default_rng(0)
    base = convert_table(tmp_path / "a", pa.table({"color": rng.choice(["red", "green"], 2000)}))
    colors = rng.choice(["red", "green", "blue", "teal"], 2000, p=[0.4, 0.3, 0.2, 0.1])
    cur = convert_table(tmp_path / "b", pa.table({"color": colors}))
    row = compare(base, cur).row("color")
    assert row.new_values == ("blue", "teal")  # most frequent first
    blue, teal = (f"{100 * np.mean(colors == c):.1f}%" for c in ("blue", "teal"))
    assert f"2 new in the current dataset: 'blue' {blue}, 'teal' {teal}" in row.note, row.note
    assert compare(cur, base).row("color").new_values == ()  # values gone are not new
    assert cli.main(["compare", base, cur]) == 1
    assert "2 new in the current dataset: 'blue'" in capsys.readouterr().out


def test_a_changed_dtype_is_schema_drift_with_its_distance(tmp_path):
    values = np.arange(1000)
    base = convert_table(tmp_path / "a", pa.table({"x": values}))
    cur = convert_table(tmp_path / "b", pa.table({"x": values.astype(np.float64)}))
    row = compare(base, cur).row("x")
    assert (row.kind, row.drifted, row.note) == ("numeric", True, "schema: dtype int64 -> float32")
    assert row.distance == pytest.approx(0, abs=1e-9)  # the same values


def test_statistics_and_dataset_info_compare_like_paths(full, windy):
    by_path = compare(full, windy)
    info = _info.load_info(windy)
    assert compare(_info.load_info(full), info).rows == by_path.rows
    assert compare(_info.load_info(full).statistics, info.statistics).drifted == ("wind",)


# --- errors -----------------------------------------------------------------------------


def test_an_unknown_feature_in_thresholds_is_named_with_the_features(full):
    with pytest.raises(
        ValueError, match=r"\['wnd'\] that neither dataset has; features: \['date', .*\]; 'wnd': did you mean 'wind'\?$"
    ):
        compare(full, full, thresholds={"wnd": 0.2})


@pytest.mark.parametrize("bad", [-0.1, 1.5, "0.1", True])
def test_a_threshold_outside_0_1_is_refused(full, bad):
    with pytest.raises(ValueError, match=r"missing_threshold must be a number in \[0, 1\]"):
        compare(full, full, missing_threshold=bad)


def test_a_missing_split_lists_the_splits(full):
    with pytest.raises(ValueError, match=r"no statistics for split 'eval'; splits: \['train'\]"):
        compare(full, full, split="eval")


def test_a_dataset_without_statistics_says_to_reconvert(full, tmp_path):
    src = write_text(tmp_path / "a.csv", "x\n1\n2\n")
    run_convert("--source", "csv", "--input", src, "--output", tmp_path / "ds", "--no_statistics")
    with pytest.raises(ValueError, match=r"current .* has no statistics.*Reconvert it without --no_statistics"):
        compare(full, str(tmp_path / "ds"))


def test_an_input_of_another_type_names_the_valid_ones(full):
    with pytest.raises(TypeError, match=r"baseline must be a dataset path, .* got int"):
        compare(3, full)


# --- the distances on statistics made by hand --------------------------------------------


def _numbers(quantiles, *, nan: int = 0, count: int = 1000) -> FeatureStatistics:
    q = tuple(float(v) for v in quantiles)
    return FeatureStatistics(count=count, missing=0, min=q[0], max=q[-1], quantiles=q, zeros=0, nan=nan, inf=0)


def _stats(**features) -> Statistics:
    return Statistics(overall=features, splits={"train": features})


def test_js_of_identical_distributions_is_0_and_of_disjoint_ones_1():
    a = _numbers(np.linspace(0, 1, 101))
    assert jensen_shannon(*numeric_histograms(a, a)) == 0
    assert jensen_shannon(*numeric_histograms(a, _numbers(np.linspace(5, 6, 101)))) == 1
    constant = _numbers([3.0] * 101)
    assert jensen_shannon(*numeric_histograms(constant, constant)) == 0
    assert jensen_shannon(*numeric_histograms(constant, _numbers([4.0] * 101))) == 1


def test_js_keeps_a_point_mass_whole():
    # 80% zeros and the rest uniform on (0, 1]: percentiles 0..80 are 0, then 0.05, ..., 1.
    mostly_zero = _numbers([0.0] * 81 + [k / 20 for k in range(1, 21)])
    # 20% zeros, the rest uniform on (0, 1].
    some_zero = _numbers([0.0] * 21 + [k / 80 for k in range(1, 81)])
    base, cur = numeric_histograms(mostly_zero, some_zero)
    assert base[0] == pytest.approx(0.8) and cur[0] == pytest.approx(0.2)  # the zero bin
    # The densities past zero are in a constant ratio (0.2 : 0.8), so the divergence is
    # that of two coins: (0.8, 0.2) against (0.2, 0.8), each against (0.5, 0.5).
    coin = 0.8 * math.log2(0.8 / 0.5) + 0.2 * math.log2(0.2 / 0.5)
    assert jensen_shannon(base, cur) == pytest.approx(coin)
    assert jensen_shannon(*numeric_histograms(mostly_zero, mostly_zero)) == 0


def test_js_does_not_change_when_both_sides_are_rescaled():
    rng = np.random.default_rng(1)
    a, b = np.sort(rng.normal(0, 1, 101)), np.sort(rng.normal(0.5, 1.3, 101))
    js = jensen_shannon(*numeric_histograms(_numbers(a), _numbers(b)))
    assert 0.01 < js < 1
    assert jensen_shannon(*numeric_histograms(_numbers(3 * a - 7), _numbers(3 * b - 7))) == pytest.approx(js)
    # Bins of equal pooled shares follow any monotone change; only the straight lines
    # drawn between percentiles bend with it.
    assert jensen_shannon(*numeric_histograms(_numbers(np.exp(a)), _numbers(np.exp(b)))) == pytest.approx(js, abs=0.005)


def test_values_turning_nan_drift():
    finite = _numbers(np.linspace(0, 1, 101))
    all_nan = FeatureStatistics(count=1000, missing=0, nan=1000, zeros=0, inf=0)
    assert jensen_shannon(*numeric_histograms(finite, all_nan)) == 1
    half_nan = _numbers(np.linspace(0, 1, 101), nan=500)
    # Half the values moved to the NaN bin, the other half kept their shares: a coin again.
    coin = 0.5 * (math.log2(1 / 0.75) + 0.5 * math.log2(0.5 / 0.75) + 0.5 * math.log2(0.5 / 0.25))
    assert jensen_shannon(*numeric_histograms(finite, half_nan)) == pytest.approx(coin)


def test_infinities_of_the_other_sign_drift(convert):
    # Converted from CSV text, as a file would hold them: every +inf against every -inf.
    up = convert(pd.DataFrame({"x": ["inf"] * 20, "k": range(20)}), "all_up")
    down = convert(pd.DataFrame({"x": ["-inf"] * 20, "k": range(20)}), "all_down")
    report = compare(up, down)
    assert report.row("x").distance == 1 and report.drifted == ("x",)
    assert _info.load_info(down).statistics.feature("x").min == -math.inf
    # Half of each sign against all +inf: the coin of test_values_turning_nan_drift.
    both = FeatureStatistics(count=1000, missing=0, zeros=0, nan=0, inf=1000, neg_inf=500)
    up_only = FeatureStatistics(count=1000, missing=0, zeros=0, nan=0, inf=1000, neg_inf=0)
    coin = 0.5 * (math.log2(1 / 0.75) + 0.5 * math.log2(0.5 / 0.75) + 0.5 * math.log2(0.5 / 0.25))
    assert jensen_shannon(*numeric_histograms(up_only, both)) == pytest.approx(coin)
    assert jensen_shannon(*numeric_histograms(both, both)) == 0


def test_categories_compare_by_the_largest_change_of_a_share():
    def text(counts: dict, *, distinct=None) -> FeatureStatistics:
        top = tuple(ValueCount(v, c) for v, c in counts.items())
        distinct = len(counts) if distinct is None else distinct
        return FeatureStatistics(count=100, missing=0, distinct=distinct, distinct_exact=True, top=top, top_exact=True)

    report = compare(_stats(city=text({"a": 50, "b": 30, "c": 20})), _stats(city=text({"a": 40, "b": 30, "d": 30})))
    row = report.row("city")
    assert (row.kind, row.metric, row.distance) == ("categorical", "l_infinity", pytest.approx(0.3))  # d: 0 -> 0.3
    assert row.note == "1 new in the current dataset: 'd' 30.0%" and row.new_values == ("d",)
    truncated = compare(_stats(city=text({"a": 50}, distinct=20)), _stats(city=text({"b": 50}, distinct=20)))
    # The baseline's 19 values left out may hold 'b': it is not called new.
    assert truncated.row("city").note == "over the 1 most frequent values recorded"
    assert truncated.row("city").new_values == ()


def test_a_feature_without_values_on_one_side_drifts_by_its_missing_share():
    gone = FeatureStatistics(count=0, missing=100)
    text = FeatureStatistics(
        count=100, missing=0, distinct=1, distinct_exact=True, top=(ValueCount("a", 100),), top_exact=True
    )
    for present in (text, _numbers(np.linspace(0, 1, 101), count=100)):
        row = compare(_stats(f=present), _stats(f=gone)).row("f")
        assert row.kind in ("categorical", "numeric") and row.distance is None
        assert (row.missing_baseline, row.missing_current, row.drifted) == (0, 1, True)
        assert row.note == "no values in the current dataset; missing share changed by 1.00 > 0.1"


# --- the report ---------------------------------------------------------------------------


def test_the_report_prints_an_aligned_table_worst_first(full, windy):
    report = compare(full, windy)
    assert isinstance(report, DriftReport)
    lines = str(report).splitlines()
    assert re.match(r".*windy \(current\) against .*full \(baseline\), split 'train': 6 features, 1 drifted", lines[0])
    assert lines[1] == "records: 1,461 baseline, 1,461 current"  # every day of 2012-2015
    header, first = lines[3], lines[4]
    assert header.split()[:5] == ["feature", "kind", "metric", "distance", "threshold"]
    assert first.split()[:5] == ["wind", "numeric", "jensen_shannon", f"{report.row('wind').distance:.4f}", "0.07"]
    assert "DRIFT" in first and not any("DRIFT" in line for line in lines[5:])
    end = header.index("threshold") + len("threshold")  # numbers right-aligned under their heading
    assert all(line[end - 4 : end] == "0.15" or line[end - 4 : end] == "0.07" for line in lines[4:])
    assert MISSING_THRESHOLD == 0.1 and "missing share threshold 0.1" in lines[0]


def test_plot_writes_a_png_of_the_worst_features(seasons, tmp_path):
    from PIL import Image

    out = tmp_path / "drift.png"
    assert compare(*seasons).plot(str(out)) == 6
    with Image.open(out) as image:
        assert image.format == "PNG" and image.width > 800


# --- the command line ---------------------------------------------------------------------


def test_cli_exits_0_without_drift(halves, capsys):
    assert cli.main(["compare", *halves]) == 0
    out = capsys.readouterr().out
    assert "0 drifted" in out and "drift in" not in out


def test_cli_exits_1_and_names_the_drifted_features(full, windy, tmp_path, capsys):
    png = tmp_path / "out.png"
    assert cli.main(["compare", full, windy, "--plot", str(png)]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == "drift in 1 feature(s): wind"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert cli.main(["compare", full, windy, "--threshold", "wind=0.5"]) == 0
    assert cli.main(["compare", full, windy, "--numeric-threshold", "0.5"]) == 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["--threshold", "wind"], r"error: --threshold expects FEATURE=VALUE .*got 'wind'"),
        (["--threshold", "wnd=0.2"], r"error: thresholds name feature\(s\) \['wnd'\] that neither dataset has"),
        (["--split", "eval"], r"error: baseline .* has no statistics for split 'eval'; splits: \['train'\]"),
        (["--missing_threshold", "2"], r"error: missing_threshold must be a number in \[0, 1\]"),
    ],
)
def test_cli_exits_2_with_one_error_line(full, capsys, args, message):
    assert cli.main(["compare", full, full, *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.splitlines()) == 1 and re.match(message, captured.err)


@pytest.mark.parametrize(
    "flag, nearest",
    [("--thresold", "--threshold"), ("--numeric_treshold", "--numeric_threshold"), ("--plto", "--plot")],
)
def test_cli_names_the_nearest_flag_of_a_misspelt_one(capsys, flag, nearest):
    with pytest.raises(SystemExit) as exit:  # before any dataset is read: none is there
        cli.main(["compare", "nowhere/a", "nowhere/b", flag, "0.2"])
    assert exit.value.code == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert re.match(rf"ingest compare: error: unknown flag {flag} \(did you mean {nearest}\?\); its flags: ", last)
    assert "--split, --current_split, --threshold," in last


def test_cli_on_an_empty_split_says_so_and_exits_2(weather, convert, capsys):
    path = convert(weather.head(6), "empty_eval", "--splits", "train=0.999,eval=0.001")
    assert _info.load_info(path).split("eval").records == 0  # what the test is about
    for args in (["--current_split", "eval"], ["--split", "eval", "--current_split", "train"]):
        assert cli.main(["compare", path, path, *args]) == 2
        captured = capsys.readouterr()
        assert "drift" not in captured.out.lower()
        assert re.fullmatch(
            r"error: (current|baseline) split 'eval' of \S+ is empty \(0 records\): there is nothing to compare\. "
            r"Splits with records: train \(6\); pick one .*\n",
            captured.err,
        )
    with pytest.raises(ValueError, match=r"current split 'eval' of .* is empty \(0 records\)"):
        compare(path, path, current_split="eval")


def test_cli_exits_2_for_a_dataset_that_is_not_there(full, tmp_path, capsys):
    assert cli.main(["compare", full, str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith(f"error: no dataset at {tmp_path / 'nothing'}")


# --- the defaults, over many draws -----------------------------------------------------------


@pytest.mark.slow
def test_defaults_hold_over_many_random_halves(weather, convert):
    """The noise the defaults were set above (docs/drift.md), drawn again: 20 pairs of halves."""
    worst = {}
    for seed in range(1, 21):
        order = np.random.default_rng(seed).permutation(len(weather))
        half = len(weather) // 2
        a = convert(weather.iloc[order[:half]], f"a{seed}")
        b = convert(weather.iloc[order[half:]], f"b{seed}")
        report = compare(a, b)
        assert report.drifted == (), (seed, str(report))
        for r in report.rows:
            worst[r.feature] = max(worst.get(r.feature, 0), r.distance)
    assert max(worst[f] for f in NUMBERS) < NUMERIC_THRESHOLD / 2  # measured: 0.016 over 200 seeds
    assert worst["weather"] < CATEGORICAL_THRESHOLD  # measured: 0.077


def test_lists_of_spans_and_splits_compare(full, halves, convert, weather, capsys):
    # Two halves read as one are the whole: their merged statistics do not drift from it.
    report = compare(list(halves), full)
    assert report.drifted == () and max(report.row(f).distance for f in NUMBERS) < 0.01
    assert "half_a" in report.baseline and "half_b" in report.baseline
    # A glob of spans on the command line.
    assert cli.main(["compare", str(halves[0]).replace("half_a", "half_*"), full]) == 0
    # One dataset's eval split against its train split.
    both = convert(weather, "split", "--splits", "train=0.5,eval=0.5")
    report = compare(both, both, current_split="eval")
    assert report.drifted == () and "split 'eval' against split 'train'" in str(report)
    assert cli.main(["compare", both, both, "--current_split", "eval"]) == 0
    assert "split 'eval' against split 'train'" in capsys.readouterr().out


def test_cli_prints_the_file_the_plot_went_to(seasons, tmp_path, capsys):
    # No extension: matplotlib writes PATH.png, and that is the path printed.
    assert cli.main(["compare", *seasons, "--plot", str(tmp_path / "drift")]) == 1
    assert re.search(rf"wrote {re.escape(str(tmp_path / 'drift.png'))} \(\d features\)", capsys.readouterr().out)
    assert (tmp_path / "drift.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    "plot, message",
    [
        (
            "x.txt",
            r"--plot \S*x\.txt: cannot write a \.txt file; the plot is written as PNG, SVG, PDF by the .* \S*x\.png",
        ),
        (".", r"--plot \S+ is a directory: give a file to write, e\.g\. \S+drift\.png"),
    ],
    ids=["extension", "directory"],
)
def test_cli_refuses_a_plot_format_or_directory_before_comparing(seasons, tmp_path, capsys, plot, message):
    plot = str(tmp_path / plot)
    for command in (["compare", *seasons], ["describe", seasons[0]]):
        assert cli.main([*command, "--plot", plot]) in (1, 2)
        out = capsys.readouterr()
        assert out.out == ""  # before the tables: no comparison, no description
        assert re.fullmatch(f"error: {message}\n", out.err), out.err
    assert cli.main(["compare", *seasons, "--plot", plot]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_cli_refuses_a_plot_it_cannot_write_before_comparing(full, windy, tmp_path, capsys):
    assert cli.main(["compare", full, windy, "--plot", str(tmp_path / "missing" / "d.png")]) == 2
    out = capsys.readouterr()
    assert "DRIFT" not in out.out and out.err.strip().startswith("error: --plot") and "does not exist" in out.err
