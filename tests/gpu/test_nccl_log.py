"""The parser of NCCL's INFO lines (tests/gpu/nccl_log.py) against NCCL's own formats. Runs without a GPU."""

from tests.gpu.nccl_log import nccl_lines


def test_reads_the_settings_nccl_says_it_took_from_the_environment():
    text = (
        "gpu1:123:123 [0] NCCL INFO cudaDriverVersion 13000\n"
        "gpu1:123:123 [0] NCCL INFO NCCL version 2.28.9+cuda13.0\n"
        "gpu1:123:140 [0] NCCL INFO NCCL_BUFFSIZE set by environment to 2097152.\n"
        "gpu1:123:140 [0] NCCL INFO NCCL_ALGO set by environment to allreduce:tree\n"
        "gpu1:123:140 [0] NCCL INFO NCCL_BUFFSIZE set by environment to 4194304.\n"
        "gpu1:123:140 [0] NCCL INFO Channel 00/32 : 0\n"
    )
    got = nccl_lines(text)
    assert got["set_by_environment"] == {"NCCL_BUFFSIZE": ["2097152", "4194304"], "NCCL_ALGO": ["allreduce:tree"]}
    assert got["version"] == "2.28.9+cuda13.0"
    assert len(got["lines"]) == 3


def test_nothing_found_in_other_output():
    got = nccl_lines("step 1 loss 0.5\nNCCL WARN something else\n")
    assert got == {"set_by_environment": {}, "lines": [], "version": None}
