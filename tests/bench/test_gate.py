"""The gate's rule on records with known times: ratios, the baseline floor of 1, the majority of repeats."""

import pytest

from delaycomm.bench.gate import GateError, compare

from .helpers import make_record

SIZES = (8, 4096, 1 << 20)


def run(ratios_by_size, raw_us=100.0, calls=5):
    """A record whose delaycomm/gloo p50 ratio in repeat i at size s is ratios_by_size[s][i]."""
    times = {}
    for size, ratios in ratios_by_size.items():
        times[("all_reduce", size, "gloo")] = [[raw_us] * calls for _ in ratios]
        times[("all_reduce", size, "delaycomm")] = [[raw_us * r] * calls for r in ratios]
    return make_record(times)


def test_identical_runs_pass():
    base = run({s: [1.02, 1.01, 1.03] for s in SIZES})
    result = compare(base, base, 1.10)
    assert result.ok and len(result.verdicts) == 3
    assert "gate: PASS" in result.format()


def test_a_slowdown_in_a_majority_of_repeats_fails_naming_sizes_and_ratios():
    base = run({s: [1.0, 1.0, 1.0] for s in SIZES})
    cur = run({8: [1.0, 1.0, 1.0], 4096: [1.5, 1.4, 1.0], 1 << 20: [1.0, 1.0, 1.0]})
    result = compare(cur, base, 1.10)
    assert not result.ok
    assert [v.size_bytes for v in result.failed] == [4096]
    text = result.format()
    assert "gate: FAIL" in text
    assert (
        "all_reduce 4 KiB delaycomm: ratio 1.400 > limit 1.100 (baseline 1.000; 2/3 repeats over: 1.500, 1.400, "
        "1.000)" in text
    )


def test_one_bad_repeat_does_not_fail():
    base = run({s: [1.0, 1.0, 1.0] for s in SIZES})
    cur = run({8: [3.0, 1.0, 1.0], 4096: [1.0, 1.0, 1.0], 1 << 20: [1.0, 1.0, 1.0]})
    assert compare(cur, base, 1.10).ok


def test_median_over_limit_needs_a_strict_majority_of_repeats():
    base = run({8: [1.0, 1.0, 1.0, 1.0]})
    # median of (1.0, 1.0, 2.0, 2.0) is 1.5 > 1.1, but only 2 of 4 repeats are over: not a majority.
    assert compare(run({8: [1.0, 1.0, 2.0, 2.0]}), base, 1.10).ok
    assert not compare(run({8: [1.0, 2.0, 2.0, 2.0]}), base, 1.10).ok


def test_a_uniformly_slower_machine_passes():
    base = run({s: [1.05, 1.04, 1.06] for s in SIZES}, raw_us=100.0)
    slower = run({s: [1.05, 1.04, 1.06] for s in SIZES}, raw_us=400.0)  # every time x4, both sides
    result = compare(slower, base, 1.10)
    assert result.ok


def test_baseline_ratio_below_one_is_taken_as_one():
    base = run({8: [0.80, 0.82, 0.81]})  # noise made delaycomm look faster than what it wraps
    cur = run({8: [1.05, 1.06, 1.04]})
    result = compare(cur, base, 1.10)
    assert result.ok
    assert result.verdicts[0].limit == pytest.approx(1.10)


def test_baseline_ratio_above_one_scales_the_limit():
    base = run({8: [1.2, 1.2, 1.2]})
    assert compare(run({8: [1.3, 1.3, 1.3]}), base, 1.10).ok  # limit 1.32
    assert not compare(run({8: [1.4, 1.4, 1.4]}), base, 1.10).ok


def test_sizes_missing_from_the_run_are_listed_not_failed():
    base = run({8: [1.0] * 3, 4096: [1.0] * 3})
    result = compare(run({8: [1.0] * 3}), base, 1.10)
    assert result.ok and result.missing == ("all_reduce 4 KiB delaycomm",)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda r: r.update(world_size=4), "world_size: baseline 2, this run 4"),
        (lambda r: r["settings"].update(dtype="float16"), "dtype: baseline 'float32', this run 'float16'"),
        (lambda r: r["settings"].update(device="cuda"), "device: baseline 'cpu', this run 'cuda'"),
    ],
)
def test_a_different_setup_is_an_error(change, message):
    base = run({8: [1.0] * 3})
    cur = run({8: [1.0] * 3})
    change(cur)
    with pytest.raises(GateError, match=message):
        compare(cur, base, 1.10)


def test_nothing_in_common_is_an_error():
    with pytest.raises(GateError, match="no \\(collective, size, backend\\) in common"):
        compare(run({8: [1.0] * 3}), run({4096: [1.0] * 3}), 1.10)


def test_a_run_without_raw_backend_is_an_error():
    only = make_record({("all_reduce", 8, "delaycomm"): [[1.0]]}, backends=("delaycomm",))
    with pytest.raises(GateError, match="this run has no raw backend"):
        compare(only, run({8: [1.0]}), 1.10)


def test_max_slowdown_below_one_is_an_error():
    base = run({8: [1.0] * 3})
    with pytest.raises(GateError, match="--max-slowdown must be >= 1"):
        compare(base, base, 0.9)


def test_a_failure_that_does_not_reproduce_in_the_confirmation_run_passes():
    base = run({8: [1.0] * 3, 4096: [1.0] * 3})
    first = compare(run({8: [2.0] * 3, 4096: [2.0] * 3}), base, 1.10)
    assert [v.size_bytes for v in first.to_confirm] == [8, 4096]
    again = compare(run({8: [2.0] * 3, 4096: [1.0] * 3}), base, 1.10)  # 4 KiB was noise
    final = first.confirmed_by(again)
    assert [v.size_bytes for v in final.failed] == [8]
    text = final.format()
    assert "4 KiB delaycomm                     1.000    1.100    2.000   3/3   ok (not confirmed)" in text
    assert "confirmation run 1: ratio 1.000, 0/3 repeats over (did not reproduce)" in text
    assert "all_reduce 8 B delaycomm: ratio 2.000 > limit 1.100" in text and "gate: FAIL" in text
    # a second confirmation run only measures what still fails, and must fail again too
    assert [v.size_bytes for v in final.to_confirm] == [8]
    final2 = final.confirmed_by(compare(run({8: [1.0] * 3}), base, 1.10))
    assert final2.ok and "confirmation run 2: ratio 1.000" in final2.format()


def test_cli_confirms_failing_sizes_in_a_new_run_of_only_those_sizes(tmp_path, monkeypatch, capsys):
    from delaycomm.bench import cli
    from delaycomm.bench.results import save

    base_path = tmp_path / "base.json"
    save(run({8: [1.0] * 3, 4096: [1.0] * 3}), str(base_path))
    runs = [run({8: [2.0] * 3, 4096: [2.0] * 3}), run({8: [2.0] * 3, 4096: [1.0] * 3})]
    asked = []

    def fake_measure(settings, nproc):
        asked.append((settings.collectives, settings.sizes, nproc))
        return runs[len(asked) - 1]

    monkeypatch.setattr(cli, "_measure", fake_measure)
    status = cli.main(["-b", "8", "-e", "4K", "-f", "512", "--compare", str(base_path), "--progress", "off"])
    assert status == 1
    assert asked == [(("all_reduce",), (8, 4096), 2), (("all_reduce",), (8, 4096), 2)]
    out = capsys.readouterr().out
    assert "confirmation run 1 of 1 on those sizes" in out and "at 1 of 2 sizes" in out
    asked.clear()
    runs[:] = [run({8: [2.0] * 3, 4096: [1.0] * 3}), run({8: [1.0] * 3})]
    assert cli.main(["-b", "8", "-e", "4K", "-f", "512", "--compare", str(base_path), "--progress", "off"]) == 0
    assert asked[1] == (("all_reduce",), (8,), 2)  # only the failing size is measured again
    asked.clear()
    runs[:] = [run({8: [2.0] * 3, 4096: [1.0] * 3})]
    assert cli.main(["-b", "8", "-e", "4K", "-f", "512", "--compare", str(base_path), "--confirm", "0"]) == 1
    assert len(asked) == 1  # --confirm 0: the first verdict stands
