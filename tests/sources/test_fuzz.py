"""The readers fuzzed (docs/profile.md, "Where production latency comes from"): mutated nccl-tests logs (synthetic
and, where present, a real one), ``-J`` documents and Kineto traces each become a valid profile or a clear error
naming the source, never a traceback, a hang, or the builder's net for errors a reader did not foresee
(``build.READER_BUG``).

Bounded for the default run: a few dozen examples per input kind, no deadline (the machine is shared), each example
under an alarm so that a hang fails the test instead of stalling CI. ``DELAYCOMM_FUZZ_EXAMPLES=2000`` hunts longer
(random, not derandomized)."""

from __future__ import annotations

import contextlib
import json
import os
import signal

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from delaycomm import profile
from delaycomm.sources import build
from tests.sources.logs import run

MiB = 1 << 20
DATA = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data")
REAL = os.path.join(DATA, "nccl-tests", "02-h200-gke-allreduce-2r-2n.txt")
EXAMPLES = int(os.environ.get("DELAYCOMM_FUZZ_EXAMPLES", "40"))  # more for a longer hunt, e.g. 2000
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=EXAMPLES <= 40,  # the default run: the same examples every time
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

HUGE = "__an integer of 5000 digits__"  # written into the text after json.dumps (which refuses to print one)
# What a field may become: values that real mistakes and hostile inputs write.
TOKENS = st.sampled_from(
    ["8192.0", "-8192", "9" * 401, "9" * 5000, "1e300", "NaN", "inf", "-1", "0", "N/A", "", "#", "[1,0]<stdout>:",
     "size", "Infinity", "1.2.3", "x" * 300, "\x00", "\u2028", "Rank  3 Group  0 Pid 1 on h device 0 [0] GPU"]
)  # fmt: skip
JSON_VALUES = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(10**30), max_value=10**30),
        st.sampled_from([10**400, -(10**400), 2**63, -1, 0, HUGE]),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=20),
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=8,
)


@contextlib.contextmanager
def _alarm(seconds: int):
    def hang(*_):
        raise TimeoutError(f"the reader ran over {seconds} s on one input (a hang?)")

    old = signal.signal(signal.SIGALRM, hang)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _no_stats(paths):
    raise build.SourceError(f"delaycomm: profile: stats {paths}")  # a mutated input read as stats: a clear refusal


def _judge(path: str) -> None:
    """A valid profile, or a SourceError that names the source; anything else propagates and fails the test."""
    with _alarm(60):
        try:
            kind = build.kind_of(path)
            if kind == "stats":
                return  # the stats reader's own tests (tests/stats) cover it
            doc, _ = build.build_profile([path], build.Options(), _no_stats)
        except build.SourceError as e:
            message = str(e)
            assert message.startswith("delaycomm: profile: "), message
            assert build.READER_BUG not in message, message
            assert path in message or repr(path) in message, message
            return
    profile.check(doc)


def _mutate_lines(lines: list[str], data) -> list[str]:
    lines = list(lines)
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        i = data.draw(st.integers(0, len(lines) - 1), label="line")
        how = data.draw(st.sampled_from(["token", "delete", "duplicate", "truncate", "insert"]), label="how")
        if how == "token":
            tokens = lines[i].split() or [""]
            j = data.draw(st.integers(0, len(tokens) - 1), label="token")
            tokens[j] = data.draw(TOKENS, label="value")
            lines[i] = "  ".join(tokens)
        elif how == "delete":
            del lines[i]
        elif how == "duplicate":
            lines.insert(i, lines[i])
        elif how == "truncate":
            lines[i] = lines[i][: data.draw(st.integers(0, len(lines[i])), label="cut")]
            lines = lines[: i + 1]
        else:
            lines.insert(i, data.draw(st.text(max_size=60), label="text"))
        if not lines:
            lines = [""]
    return lines


@SETTINGS
@given(data=st.data())
def test_mutated_text_logs_read_or_are_refused_clearly(tmp_path, data):
    base = run("all_reduce", 4, [MiB, 2 * MiB, 4 * MiB]) + run("all_gather", 4, [MiB], starting=False)
    if os.path.exists(REAL) and data.draw(st.booleans(), label="real"):
        base = open(REAL, encoding="utf-8").read().splitlines()
    p = tmp_path / "log.txt"
    p.write_text("\n".join(_mutate_lines(base, data)) + "\n", encoding="utf-8", errors="surrogatepass")
    _judge(str(p))


def _set_somewhere(doc, data, value) -> None:
    """``value`` put at a path drawn through ``doc`` (a dict key or a list index at each level)."""
    node = doc
    for _ in range(data.draw(st.integers(1, 5), label="depth")):
        if isinstance(node, dict) and node:
            key = data.draw(st.sampled_from(sorted(node)), label="key")
            if not isinstance(node[key], (dict, list)) or not node[key] or data.draw(st.booleans(), label="stop"):
                node[key] = value
                return
            node = node[key]
        elif isinstance(node, list) and node:
            i = data.draw(st.integers(0, len(node) - 1), label="index")
            if not isinstance(node[i], (dict, list)) or not node[i] or data.draw(st.booleans(), label="stop"):
                node[i] = value
                return
            node = node[i]
        else:
            return


def _minus_j():
    def rec(size, t):
        bw = size / t / 1e3
        return {"size": size, "count": size // 4, "type": "float", "redop": "sum", "root": -1,
                "out_of_place": {"time": t, "alg_bw": bw, "bus_bw": bw * 1.5, "nwrong": 0},
                "in_place": {"time": t, "alg_bw": bw, "bus_bw": bw * 1.5, "nwrong": 0},
                "in_place_per_iter": {"min_us": t * 0.9, "max_us": t * 1.5, "p99_us": t * 1.4,
                                      "cv_pct": 3.0}}  # fmt: skip

    return {"version": 3, "args": ["all_reduce_perf", "-b", "1M"], "nccl_version": 22902,
            "config": {"iterations": 20, "devices": [{"rank": r, "pid": 10 + r, "hostname": "n0"} for r in range(4)]},
            "results": [rec(MiB, 40.0), rec(4 * MiB, 90.0)]}  # fmt: skip


def _trace():
    ev = []
    for i, (name, dims, kernel) in enumerate(
        [("nccl:all_reduce", [[1024]], "AllReduce_Sum_f32"), ("nccl:_all_gather_base", [[256]], "AllGather"),
         ("nccl:send 0->1", [[64]], "SendRecv"), ("nccl:all_reduce", [], "AllReduce_Sum_f32")]
    ):  # fmt: skip
        ts = 1000.0 * (i + 1)
        ev += [
            {"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": 100.0,
             "args": {"Input Dims": dims, "Input type": ["float"] * len(dims)}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": ts + 10,
             "dur": 5.0, "args": {"correlation": i}},
            {"ph": "X", "cat": "kernel", "name": f"ncclDevKernel_{kernel}(x)", "pid": 0, "tid": 7, "ts": ts + 20,
             "dur": 50.0 + i, "args": {"correlation": i, "External id": i}},
        ]  # fmt: skip
    ev += [
        {"ph": "X", "cat": "cpu_op", "name": "gloo:all_reduce", "pid": 1, "tid": 2, "ts": 9000.0, "dur": 30.0,
         "args": {"Input Dims": [[8, 8]], "Input type": ["float"]}},
        {"ph": "X", "cat": "kernel", "name": "ncclKernel_Broadcast_RING_LL_Sum_int8_t", "pid": 0, "tid": 7,
         "ts": 9500.0, "dur": 12.0, "args": {"Collective name": "broadcast", "In msg nelems": 64, "dtype": "Byte",
                                             "Group size": 2}},
    ]  # fmt: skip
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 2}, "traceEvents": ev}


@SETTINGS
@given(data=st.data())
def test_mutated_minus_j_documents_and_traces_read_or_are_refused_clearly(tmp_path, data):
    doc = _minus_j() if data.draw(st.booleans(), label="minus-j") else _trace()
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        _set_somewhere(doc, data, data.draw(JSON_VALUES, label="value"))
    text = json.dumps(doc).replace(json.dumps(HUGE), "9" * 5000)  # NaN, Infinity as Python writes them
    if data.draw(st.booleans(), label="cut"):
        text = text[: data.draw(st.integers(0, len(text)), label="at")]
    p = tmp_path / "doc.json"
    p.write_text(text)
    _judge(str(p))
