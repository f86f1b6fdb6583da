"""The telemetry table of ``delaycomm.report()``: its layout, from the one column schema of ``delaycomm._stats``."""

from delaycomm._stats import format_table


def _op(calls, nbytes, p50, delayed=0, errors=0):
    return {
        "calls": calls,
        "bytes": nbytes,
        "errors": errors,
        "delayed_calls": delayed,
        "latency": {
            "count": calls,
            "p50_us": p50,
            "p90_us": 2 * p50,
            "p99_us": 3 * p50,
            "p999_us": 4 * p50,
            "max_us": 10 * p50,
        },
        "delay": {"p50_us": 1234.5 if delayed else 0.0, "p99_us": 99999.25 if delayed else 0.0},
    }


def test_the_table_has_a_title_names_units_and_one_row_per_op_in_name_order():
    data = {
        "group": "0",
        "rank": 1,
        "world_size": 2,
        "ops": {"broadcast": _op(1, 8, 5.0, delayed=1, errors=2), "allreduce": _op(3, 24, 12.34)},
    }
    assert format_table(data).splitlines() == [
        "# delaycomm group '0' rank 1/2",
        "# op                           calls        bytes        p50        p90        p99       p"
        "999        max  delayed  delay p50  delay p99  errors",
        "#                                             (B)       (us)       (us)       (us)       ("
        "us)       (us)                (us)       (us)",
        "  allreduce                        3           24       12.3       24.7       37.0       4"
        "9.4      123.4        0        0.0        0.0       0",
        "  broadcast                        1            8        5.0       10.0       15.0       2"
        "0.0       50.0        1     1234.5    99999.2       2",
    ]


def test_a_long_cell_widens_its_whole_column():
    data = {
        "group": "g",
        "rank": 0,
        "world_size": 1,
        "ops": {"reduce_scatter_tensor_coalesced": _op(7, 10**13, 1.0), "allreduce": _op(1, 8, 1.0)},
    }
    lines = format_table(data).splitlines()
    header, rows = lines[1], lines[3:]
    for name in ("calls", "bytes", "p50", "errors"):  # every column still ends where its header ends
        end = header.index(name) + len(name)
        assert all(r[end - 1] != " " and (end == len(r) or r[end] == " ") for r in rows), (name, lines)


def test_slowdown_and_staleness_lines_follow_the_table():
    data = {
        "group": "0",
        "rank": 0,
        "world_size": 2,
        "ops": {},
        "slowdown": {"calls": 2, "blocked": {"mean_ms": 1.5, "count": 2, "p50_ms": 1.2, "max_ms": 1.8}},
        "staleness": {
            "steps": 10,
            "fresh": 8,
            "stale": 2,
            "dropped": 0,
            "stale_fresh_ratio": 0.25,
            "blocked_ms": 3.0,
            "staleness": {"p50": 0.0, "p99": 1.0, "max": 1},
            "step_source": "step_ms",
            "step_ms": 5.0,
        },
    }
    assert format_table(data).splitlines()[-3:] == [
        "# slowdown: blocked 2 times, 3.0 ms in all (p50 1.20 ms, max 1.80 ms)",
        "# staleness: steps 10 fresh 8 stale 2 dropped 0 stale:fresh 0.250 blocked 3.0 ms staleness p50 0.0 p99 1.0 "
        "max 1",
        "# staleness step: 5.000 ms (step_ms)",
    ]
