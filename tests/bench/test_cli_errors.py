"""Bad input: every flag error exits 2 naming the flag and what is accepted, before any rank starts."""

import pytest

from delaycomm.bench import units
from delaycomm.bench.cli import main


def _error(capsys, *argv):
    with pytest.raises(SystemExit) as e:
        main(list(argv))
    assert e.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["-C", "all_reduse"],
            "argument -C/--collective: unknown collective 'all_reduse'; expected a comma-separated "
            "list of: all_reduce, all_gather, reduce_scatter, broadcast, all_to_all",
        ),
        (["-C", "all_reduce,gather"], "unknown collective 'gather'"),
        (["-d", "float8"], "argument -d/--datatype: unknown dtype 'float8'; expected one of: float32, float64"),
        (["-b", "8MB"], "argument -b/--minbytes: '8MB' is not a size; expected a whole number of bytes"),
        (["-e", "1.5M"], "argument -e/--maxbytes: '1.5M' is not a size"),
        (["-e", "0"], "argument -e/--maxbytes: '0' is out of range; expected a size in [1 B, 16 GiB]"),
        (["-b", "1M", "-e", "4K"], "argument -b/--minbytes: 1048576 B is larger than -e/--maxbytes 4096 B"),
        (["-f", "1"], "argument -f/--stepfactor: 1 is too small; expected an integer >= 2"),
        (["-n", "many"], "argument -n/--iters: 'many' is not an integer; expected an integer >= 1"),
        (["-o", "mean"], "argument -o/--op: invalid choice: 'mean'"),
        (["-o", "avg", "--device", "cpu"], "argument -o/--op: avg is not supported by gloo"),
        (
            ["--backends", "delaycomm,mpi"],
            "argument --backends: unknown backend 'mpi'; expected a comma-separated list of: delaycomm, gloo, nccl",
        ),
        (["--backends", "gloo,gloo"], "argument --backends: 'gloo,gloo' names a backend twice"),
        (["--backends", "delaycomm,nccl", "--device", "cpu"], "argument --backends: nccl needs --device cuda"),
        (["--root", "2", "--nproc", "2"], "argument --root: 2 is not a rank of a 2-rank run"),
        (["--plot", "out.txt"], "argument --plot: 'out.txt': expected a file name ending in .png, .svg, .pdf"),
        (["--plot", "/no/such/dir/p.png"], "argument --plot: '/no/such/dir/p.png': directory '/no/such/dir' does not"),
        (["--max-slowdown", "0.9"], "argument --max-slowdown: 0.9 is out of range; expected a finite number >= 1"),
        (["--nccl-algo", "fastest"], "argument --nccl-algo: delaycomm: invalid value 'fastest' for option 'nccl_algo'"),
        (["--backends", "gloo", "--nccl-algo", "ring"], "argument --nccl-algo: needs delaycomm in --backends"),
        (["--backends", "gloo", "--compare", "__BASE__"], "argument --compare: the gate compares delaycomm with a raw"),
        (["--delay", "bogus:5"], "argument --delay: "),
        (
            ["--delay-fraction", "2"],
            "argument --delay-fraction: delaycomm: invalid value 2.0 for option 'delay_fraction'",
        ),
    ],
)
def test_bad_flag_exits_2_naming_it(capsys, tmp_path, argv, message):
    if "__BASE__" in argv:
        from delaycomm.bench.results import save

        from .helpers import make_record

        base = tmp_path / "base.json"
        save(make_record({("all_reduce", 8, "delaycomm"): [[1.0]], ("all_reduce", 8, "gloo"): [[1.0]]}), str(base))
        argv = [str(base) if a == "__BASE__" else a for a in argv]
    assert message in _error(capsys, *argv)


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"format": ', "not valid JSON"),
        ('{"format": "delaycomm-bench/1", "rows": []}', "not a delaycomm bench result: 'settings.backends'"),
        ("42", "expected a JSON object, got int"),
    ],
)
def test_corrupt_baseline_is_a_clear_error(capsys, tmp_path, content, message):
    base = tmp_path / "baseline.json"
    base.write_text(content)
    err = _error(capsys, "--compare", str(base))
    assert f"argument --compare: {base}: " in err and message in err
    err = _error(capsys, "--from-json", str(base))
    assert f"argument --from-json: {base}: " in err


def test_missing_baseline(capsys, tmp_path):
    err = _error(capsys, "--compare", str(tmp_path / "none.json"))
    assert "none.json: no such file" in err


@pytest.mark.parametrize(
    "text, nbytes",
    [
        ("8", 8),
        ("512B", 512),
        ("4K", 4096),
        ("4KiB", 4096),
        ("64M", 64 << 20),
        ("1g", 1 << 30),
        (" 2 M ", 2 << 20),
    ],
)
def test_parse_size(text, nbytes):
    assert units.parse_size(text) == nbytes


def test_size_sweep():
    assert units.size_sweep(8, 64, 2) == [8, 16, 32, 64]
    assert units.size_sweep(8, 100, 4) == [8, 32, 100]  # the maximum is always measured
    assert units.size_sweep(1024, 4096, 2, step=1024) == [1024, 2048, 3072, 4096]
    assert units.size_sweep(8, 8, 2) == [8]
    assert len(units.size_sweep(8, 64 << 20, 2)) == 24
    with pytest.raises(ValueError, match="the minimum size 16 B is larger than the maximum 8 B"):
        units.size_sweep(16, 8)


def test_format_size():
    assert [units.format_size(n) for n in (8, 1024, 1536, 64 << 20, 1 << 30)] == [
        "8 B",
        "1 KiB",
        "1.5 KiB",
        "64 MiB",
        "1 GiB",
    ]
