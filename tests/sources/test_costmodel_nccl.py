"""The cost model's NVLSTree, one-node tree and the cluster's NCCL_ALGO/NCCL_PROTO (docs/costmodel.md): NCCL's
structure and constants, its choices with them, and the re-targeted profile's record of algorithms no table ran."""

from __future__ import annotations

import json
import os

import pytest

from delaycomm import costmodel as cm
from delaycomm.__main__ import main
from delaycomm.costmodel import nccl
from delaycomm.sources import build
from tests.sources.logs import run, write

T = cm.Topology
TRUE = {"lat_intra": 4e-6, "lat_inter": 10e-6, "bw_intra": 400e9, "bw_net": 45e9}
DATA = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "nccl-tests")
PAIR = [os.path.join(DATA, f) for f in ("15-h100-cluster01-5coll-8r-1n.txt", "16-h100-cluster01-5coll-10r-10n.txt")]
needs_pair = pytest.mark.skipif(not all(os.path.exists(p) for p in PAIR), reason="no ../shared/data tables 15, 16")


def with_nvls(tuning=None, **terms) -> cm.CostModel:
    t = dict(TRUE, bw_nvls=480e9, lat_nvls=30e-6, **terms)
    fit = cm.CollectiveFit("all_reduce", **t, rows=0, rms_relative_error=0.0)
    return cm.CostModel({"all_reduce": fit}, tuning or nccl.Tuning())


def test_nvls_tree_is_priced_with_nccls_bandwidths_latencies_and_cap():
    m, s, ar = with_nvls(), 1 << 30, "all_reduce"
    intra = 0.85 * 15 / 16 * 2 * 480e9  # nvlsEfficiency (Hopper), (nCh - 1) / nCh, all_reduce pipelines two
    # More than two nodes: the node's 8 NICs (8 x 45 GB/s) bind; one NVLS hop and 2 log2(N) network hops at 20.9 us,
    # scaled as the fitted network step (10 of NCCL's 14 us).
    lat = 30e-6 + 2 * 3 * 20.9 / 14 * 10e-6
    bus = 2 * 63 / 64
    assert m.seconds(ar, s, T(64, 8), algorithm="nvls_tree") == pytest.approx(lat + s * bus / min(intra, 360e9))
    # Two nodes: the NICs' bandwidth doubled (NCCL's "2 node case"), so NVLS within the node binds.
    assert m.seconds(ar, s, T(16, 2), algorithm="nvls_tree") == pytest.approx(
        30e-6 + 2 * 20.9 / 14 * 10e-6 + s * 2 * 15 / 16 / min(intra, 720e9)
    )
    # The per-channel cap (perChMaxNVLSTreeBws, Hopper: 16 x 45.5 GB/s beyond two nodes) binds a fast network.
    fast = with_nvls(bw_net=200e9)
    assert fast.busbw(ar, 1 << 36, T(64, 8), algorithm="nvls_tree") == pytest.approx(16 * 45.5e9, rel=1e-3)
    # NCCL's choice between nodes: NVLSTree wins the bandwidth-bound sizes over ring (360 GB/s) and tree (0.92 x).
    assert m.choice(ar, s, T(64, 8)) == ("nvls_tree", "Simple")
    assert m.choice(ar, 8, T(64, 8))[0] == "tree"
    # On one node NVLS itself, never NVLSTree (NCCL disables it there).
    assert m.choice(ar, s, T(8, 1)) == ("nvls", "Simple")
    with pytest.raises(cm.ModelError, match="has no nvls_tree"):
        m.seconds(ar, s, T(8, 1), algorithm="nvls_tree")


@pytest.mark.parametrize(
    ("text", "allreduce", "allgather"),
    [
        ("Ring", {"ring"}, {"ring"}),
        ("^NVLSTree,nvls", {"ring", "tree"}, {"ring", "tree"}),
        ("ring,collnetdirect;allreduce:tree,collnetdirect", {"tree"}, {"ring"}),  # NCCL's own example
        ("allreduce:^tree", {"ring", "nvls", "nvls_tree"}, {"ring", "tree", "nvls", "nvls_tree"}),
    ],
)
def test_nccl_algo_is_read_as_nccls_parselist_reads_it(text, allreduce, allgather):
    enabled = nccl.parse_tuning_list(text, "NCCL_ALGO", nccl.NCCL_ALGOS)
    assert enabled["all_reduce"] == allreduce and enabled["all_gather"] == allgather


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("Rings", r"NCCL_ALGO 'Rings': no 'rings' \(expected names from: tree, ring"),
        ("ring;tree", "every entry but the first must name a function"),
        ("allred:ring", r"no function 'allred' \(expected one of: broadcast"),
        ("allreduce:", "no ''"),
    ],
)
def test_a_bad_nccl_algo_names_the_variable_and_what_it_expected(text, message):
    with pytest.raises(ValueError, match=message):
        nccl.Tuning(algo=text)


def test_the_clusters_nccl_algo_and_proto_restrict_the_choice_and_survive_the_models_json(tmp_path):
    s, ar = 1 << 30, "all_reduce"
    ring = with_nvls(nccl.Tuning(algo="Ring"))
    assert ring.choice(ar, s, T(64, 8))[0] == "ring" and ring.choice(ar, 8, T(64, 8))[0] == "ring"
    assert ring.seconds(ar, s, T(64, 8)) == with_nvls().seconds(ar, s, T(64, 8), algorithm="ring")
    simple = with_nvls(nccl.Tuning(algo="^NVLSTree", proto="Simple"))
    assert {simple.choice(ar, b, T(64, 8))[1] for b in (8, 1 << 20, s)} == {"Simple"}
    with pytest.raises(cm.ModelError, match=r"NCCL_ALGO=allreduce:nvls leaves all_reduce at 64 ranks"):
        with_nvls(nccl.Tuning(algo="allreduce:nvls")).seconds(ar, s, T(64, 8))
    path = tmp_path / "model.json"
    path.write_text(json.dumps(simple.as_dict()))
    back = cm.load(str(path))
    assert back.tuning == simple.tuning and back.choice(ar, s, T(64, 8)) == simple.choice(ar, s, T(64, 8))
    doc = simple.as_dict() | {"nccl_algo": "treee"}
    path.write_text(json.dumps(doc))
    with pytest.raises(cm.ModelError, match=r"model.json.*NCCL_ALGO 'treee': no 'treee'"):
        cm.load(str(path))


@needs_pair
def test_retargeting_the_h100_tables_to_80_ranks_follows_ncclss_choice_and_says_what_no_table_ran():
    doc, report = build.build_profile(PAIR, build.Options(ranks=80, nodes=10), None)
    notes = {n["bytes"]: n for n in doc["metadata"]["retargeted"]["classes"]["allreduce"]}
    # Table 15 shows NVLink SHARP on a node, so NCCL would run NVLSTree between nodes for the large calls; tree and
    # NVLSTree ran in no table (15 is one node, 16 one GPU per node), and the profile says so.
    assert notes[1 << 30]["algorithm"] == "nvls_tree" and notes[8]["algorithm"] == "tree"
    assert not any(n["observed_algorithm"] for n in notes.values())
    assert any(line.startswith("warning: allreduce:") and "no source table ran" in line for line in report)
    gather = doc["metadata"]["retargeted"]["classes"]["_allgather_base"]
    assert all(n["algorithm"] == "ring" and n["observed_algorithm"] for n in gather)
    # The cluster's NCCL_ALGO=Ring: every all_reduce class a ring, as table 16's rows ran; the model records it.
    ring, report = build.build_profile(PAIR, build.Options(ranks=80, nodes=10, nccl_algo="Ring"), None)
    notes = ring["metadata"]["retargeted"]["classes"]["allreduce"]
    assert {n["algorithm"] for n in notes} == {"ring"} and all(n["observed_algorithm"] for n in notes)
    assert ring["metadata"]["costmodel"]["nccl_algo"] == "Ring" and not any("warning" in x for x in report)
    assert ring["ops"]["allreduce"] != doc["ops"]["allreduce"]


def test_the_profile_command_checks_the_nccl_flags(tmp_path, capsys):
    log = write(tmp_path, "ar.log", run("all_reduce", 16, [1 << 20, 1 << 30], nodes=2))
    out = str(tmp_path / "p.json")
    assert main(["profile", log, "--ranks", "32", "--nodes", "4", "--nccl-algo", "Rings", "-o", out]) == 2
    assert "error: delaycomm: profile: --nccl-algo: NCCL_ALGO 'Rings': no 'rings'" in capsys.readouterr().err
    assert main(["profile", log, "--nccl-proto", "Simple", "-o", out]) == 2
    assert "--nccl-algo/--nccl-proto choose the model's algorithms: they need --ranks N" in capsys.readouterr().err
    assert main(["profile", log, "--ranks", "16", "--nodes", "2", "--nccl-proto", "Simple", "-o", out]) == 0
    doc = json.loads(open(out).read())
    assert {n["protocol"] for n in doc["metadata"]["retargeted"]["classes"]["allreduce"]} == {"Simple"}
