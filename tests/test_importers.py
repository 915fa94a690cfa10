"""Importers: nccl-tests logs (inline fixtures and the real 17-node H100 sweep),
nvidia-smi topo -m output, directories, and the ``configurator topology import`` CLI."""

from __future__ import annotations

import csv
import json
import re
from itertools import combinations
from pathlib import Path

import pytest

from configurator.cli import main
from configurator.core.errors import InputError
from configurator.core.units import GB
from topology.importers import detect_format, host_from_filename, import_file, import_paths
from topology.importers.nccl_tests import parse_nccl_tests
from topology.linkfit import fit_alpha_beta
from topology.importers.nvidia_smi import PCIE_X16_Bps, parse_topo_matrix
from topology.topofile_io import load_topology, save_topology
from tests.conftest import REAL_CLUSTER

DATA = Path(__file__).resolve().parent / "data"
SWEEP = REAL_CLUSTER

# nccl-tests ≥ 2.13 layout (root and #wrong columns), as printed by 2.17.6.
NEW_SENDRECV = """\
# nccl-tests version 2.17.6 nccl-headers=22807 nccl-library=22807
# Collective test starting: sendrecv_perf
# nThread 1 nGpus 1 minBytes 33554432 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid 440651 on hostA device  0 [0000:1b:00] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid 381706 on hostB device  0 [0000:1b:00] NVIDIA H100 80GB HBM3
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)
    33554432       4194304    double     sum      -1  2513.89   13.35   13.35       0  2504.26   13.40   13.40    N/A
   134217728      16777216    double     sum      -1  9947.83   13.49   13.49       0  9927.85   13.52   13.52    N/A
    67108864       8388608    double     sum      -1  4986.68   13.46   13.46       0  4989.15   13.45   13.45    N/A
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 13.4454
#
# Collective test concluded: sendrecv_perf
"""

# Older layout (no root column, "error" instead of "#wrong"), one process driving 8 GPUs.
OLD_ALLREDUCE = """\
# nThread 1 nGpus 8 minBytes 33554432 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20 validation: 1
#
# Using devices
#   Rank  0 Pid  12345 on     dgx-01 device  0 [0x07] NVIDIA A100-SXM4-80GB
#   Rank  1 Pid  12345 on     dgx-01 device  1 [0x0f] NVIDIA A100-SXM4-80GB
#   Rank  2 Pid  12345 on     dgx-01 device  2 [0x47] NVIDIA A100-SXM4-80GB
#   Rank  3 Pid  12345 on     dgx-01 device  3 [0x4e] NVIDIA A100-SXM4-80GB
#   Rank  4 Pid  12345 on     dgx-01 device  4 [0x87] NVIDIA A100-SXM4-80GB
#   Rank  5 Pid  12345 on     dgx-01 device  5 [0x90] NVIDIA A100-SXM4-80GB
#   Rank  6 Pid  12345 on     dgx-01 device  6 [0xb7] NVIDIA A100-SXM4-80GB
#   Rank  7 Pid  12345 on     dgx-01 device  7 [0xbd] NVIDIA A100-SXM4-80GB
#
#                                                       out-of-place                       in-place
#       size         count      type   redop     time   algbw   busbw  error     time   algbw   busbw  error
#        (B)    (elements)                     (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
    33554432       8388608     float     sum    325.1  103.21  180.62  5e-07    324.4  103.43  181.00  5e-07
   134217728      33554432     float     sum   1021.2  131.43  230.01  5e-07   1019.8  131.61  230.33  5e-07
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 205.49
"""

OLD_SENDRECV = """\
# nThread 1 nGpus 1 minBytes 1048576 maxBytes 8388608 step: 2(factor) warmup iters: 5 iters: 20 validation: 1
#
# Using devices
#   Rank  0 Pid  111 on     node-a device  0 [0x07] NVIDIA A100-SXM4-80GB
#   Rank  1 Pid  222 on     node-b device  0 [0x07] NVIDIA A100-SXM4-80GB
#
#       size         count      type   redop     time   algbw   busbw  error     time   algbw   busbw  error
#        (B)    (elements)                     (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
     1048576        262144     float     sum    71.20   14.73   14.73  0e+00    70.95   14.78   14.78  0e+00
     8388608       2097152     float     sum    403.8   20.77   20.77  0e+00    402.9   20.82   20.82  0e+00
# Avg bus bandwidth    : 17.77
"""

NO_ROWS = NEW_SENDRECV.split("    33554432")[0]
FAILED = NO_ROWS + ("hostB: Test NCCL failure common.cu:1279 'remote process exited or there "
                    "was a network error / '\n .. hostB pid 381706: Test failure common.cu:1100\n")


# -- nccl-tests: inline fixtures --------------------------------------------------------------

# (size B, out-of-place µs, in-place µs) of NEW_SENDRECV, sizes ascending.
NEW_SENDRECV_TIMES = [(33554432, 2513.89, 2504.26), (67108864, 4986.68, 4989.15),
                      (134217728, 9947.83, 9927.85)]


def _times(rows):
    n = [size for size, *_ in rows for _ in (0, 1)]
    t = [us * 1e-6 for _, oop, ip in rows for us in (oop, ip)]
    return n, t


def test_new_layout_sendrecv_two_hosts():
    t = parse_nccl_tests(NEW_SENDRECV, "sr.log")
    assert t.hosts == ("hostA", "hostB") and t.gpus_per_host == 1
    assert {(l.src, l.dst) for l in t.links} == {("hostA", "hostB"), ("hostB", "hostA")}
    fit = fit_alpha_beta(*_times(NEW_SENDRECV_TIMES))
    for l in t.links:
        # α–β fit over the three sizes (rows out of order in the log), both time columns
        assert l.message_bytes == 134217728
        assert l.samples_Bps == tuple(x * GB for x in (13.35, 13.40, 13.46, 13.45, 13.49,
                                                       13.52))
        assert l.bandwidth_Bps == fit.bandwidth_Bps
        assert 13.45 * GB < l.bandwidth_Bps < 13.6 * GB     # the busbw column, asymptotically
        assert l.latency_s == fit.latency_s and 10e-6 < l.latency_s < 60e-6
        assert l.method == "nccl-tests sendrecv_perf busbw alpha-beta fit over 3 sizes"
        assert (l.src_gpu, l.gpus_per_host, l.rails_used, l.link_class) == (None, 1, 1,
                                                                             "network")
    assert not t.missing and not t.collectives and not t.warnings


def test_old_layout_is_parsed_by_header():
    t = parse_nccl_tests(OLD_ALLREDUCE, "all_reduce_perf_dgx01.log")
    (c,) = t.collectives
    # The time columns (325.1/324.4 µs, 1021.2/1019.8 µs), not algbw nor busbw: the old header
    # has no "root" column. Two sizes: the line through them. all_reduce over 8 ranks:
    # busbw = algbw * 2 * 7 / 8.
    t32, t128 = (325.1 + 324.4) / 2e6, (1021.2 + 1019.8) / 2e6
    beta_alg = (134217728 - 33554432) / (t128 - t32)
    assert c.busbw_Bps == pytest.approx(beta_alg * 1.75, rel=2e-3)
    assert c.latency_s == pytest.approx(t32 - 33554432 / beta_alg, rel=0.02)
    assert c.busbw_Bps > 230.01 * GB          # asymptotic β above the 128 MiB busbw
    assert c.message_bytes == 134217728
    assert (c.hosts, c.gpus_per_host, c.op) == (("dgx-01",), 8, "all_reduce")
    assert not t.links and not t.warnings
    s = parse_nccl_tests(OLD_SENDRECV, "sendrecv.log")
    beta = (8388608 - 1048576) / ((403.8 + 402.9 - 71.20 - 70.95) / 2e6)
    assert [l.bandwidth_Bps for l in s.links] == [pytest.approx(beta, rel=2e-3)] * 2
    assert {l.src for l in s.links} == {"node-a", "node-b"}
    assert any("below 32 MiB" in w for w in s.warnings)  # 8 MiB is latency-affected


def test_log_without_data_rows_gives_missing_not_exception():
    t = parse_nccl_tests(NO_ROWS, "nccl_N2_G1_hostA_hostB.log")
    assert not t.links
    (m,) = t.missing
    assert (m.src, m.dst) == ("hostA", "hostB") and "no data rows" in m.reason
    assert "sendrecv_perf" in m.reason and "nccl_N2_G1_hostA_hostB.log" in m.reason
    assert len(t.warnings) == 1


def test_failed_log_reason_and_filename_fallback():
    t = parse_nccl_tests(FAILED, "x.log")
    assert "remote process exited" in t.missing[0].reason
    # no Rank lines at all: hosts and GPU count come from the file name
    bare = "# nccl-tests version 2.17.6\n# Collective test starting: alltoall_perf\n"
    t = parse_nccl_tests(bare, "nccl_N2_G4_n1_n2.log")
    assert t.hosts == ("n1", "n2") and t.gpus_per_host == 4
    assert t.missing[0].src == "n1" and "G=4" in t.missing[0].reason


def test_wrong_elements_warn_and_garbage_lines_counted():
    bad = NEW_SENDRECV.replace("13.49       0  9927.85", "13.49       7  9927.85")
    bad = bad.replace("# Out of bounds", "garbage in the table\n# Out of bounds")
    t = parse_nccl_tests(bad, "w.log")
    assert len(t.links) == 2
    assert any("#wrong = 7" in w for w in t.warnings)
    assert any("malformed" in w for w in t.warnings)


def test_two_sections_in_one_log():
    alltoall = NEW_SENDRECV.replace("sendrecv_perf", "alltoall_perf")
    t = parse_nccl_tests(alltoall + "\n" + FAILED, "two.log")
    assert [c.op for c in t.collectives] == ["alltoall"]
    assert len(t.missing) == 1 and "sendrecv_perf" in t.missing[0].reason


def _log(rows, test="sendrecv_perf", hosts=("hostA", "hostB")):
    """An nccl-tests 2.17 log of ``rows`` = [(size B, out-of-place µs, in-place µs)], one rank
    per host (busbw = algbw * bus factor; sendrecv 1, alltoall over 2 ranks 1/2)."""
    factor = 0.5 if test == "alltoall_perf" else 1.0
    lines = ["# nccl-tests version 2.17.6 nccl-headers=22807 nccl-library=22807",
             f"# Collective test starting: {test}",
             "# nThread 1 nGpus 1 minBytes 33554432 maxBytes 17179869184 step: 2(factor)",
             "#"] + [f"#  Rank  {i} Group  0 Pid {100 + i} on {h} device  0 [0000:1b:00] NVIDIA "
                     "H100 80GB HBM3" for i, h in enumerate(hosts)] + [
             "#       size         count      type   redop    root     time   algbw   busbw  "
             "#wrong     time   algbw   busbw  #wrong"]
    for size, oop, ip in rows:
        cols = []
        for us in (oop, ip):
            alg = size / (us * 1e-6) / 1e9
            cols += [f"{us:.6g}", f"{alg:.2f}", f"{alg * factor:.2f}", "0"]
        lines.append(f"{size:>12d} {size // 8:>12d} double sum -1 " + " ".join(cols))
    return "\n".join(lines + ["# Avg bus bandwidth    : 1.0", "#"]) + "\n"


def test_outlier_at_largest_size_is_left_out_of_the_fit():
    # 6.6 GB/s from 32 MiB to 8 GiB, then 0.97 GB/s at 16 GiB (the real-log pattern).
    sizes = [(32 << 20) << i for i in range(10)]
    rows = [(n, 40 + n / 6.6e9 * 1e6, 41 + n / 6.6e9 * 1e6) for n in sizes[:-1]]
    rows.append((sizes[-1], sizes[-1] / 0.97e9 * 1e6, sizes[-1] / 0.99e9 * 1e6))
    t = parse_nccl_tests(_log(rows), "outlier.log")
    for l in t.links:
        assert l.bandwidth_Bps == pytest.approx(6.6 * GB, rel=0.02)      # was 0.97 GB/s
        assert l.message_bytes == 8 << 30                               # largest size kept
        assert min(l.samples_Bps) == 0.97 * GB                          # every size's busbw
    (w,) = t.warnings
    assert "2 of 20 timings off the alpha-beta fit (16 GiB) left out as outliers" in w
    assert "at the largest size 17179869184 B busbw 0.97 GB/s vs fitted 6.6" in w


def test_alltoall_collective_gets_bus_beta_and_latency():
    sizes = [(32 << 20) << i for i in range(6)]
    rows = [(n, 30 + n / 26e9 * 1e6, 30 + n / 26e9 * 1e6) for n in sizes]    # algbw 26 GB/s
    (c,) = parse_nccl_tests(_log(rows, "alltoall_perf"), "a2a.log").collectives
    assert c.op == "alltoall" and c.busbw_Bps == pytest.approx(13 * GB, rel=1e-4)  # (k-1)/k
    assert c.latency_s == pytest.approx(30e-6, rel=0.05)
    assert c.method == "nccl-tests alltoall_perf busbw alpha-beta fit over 6 sizes"


def test_collective_latency_in_topology_file(tmp_path):
    rows = [((32 << 20) << i, 30 + ((32 << 20) << i) / 26e9 * 1e6, 0) for i in range(4)]
    t = parse_nccl_tests(_log([(n, a, a) for n, a, _ in rows], "alltoall_perf"), "a.log")
    save_topology(t, tmp_path / "t.json")
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["version"] == 1
    assert data["collectives"][0]["latency_us"] == pytest.approx(30, rel=0.05)
    back = load_topology(tmp_path / "t.json")
    assert back.collectives[0].latency_s == pytest.approx(t.collectives[0].latency_s)
    # older files (no latency_us) and null still load
    for value in (None, "absent"):
        d = json.loads((tmp_path / "t.json").read_text())
        if value is None:
            d["collectives"][0]["latency_us"] = None
        else:
            del d["collectives"][0]["latency_us"]
        (tmp_path / "old.json").write_text(json.dumps(d))
        assert load_topology(tmp_path / "old.json").collectives[0].latency_s is None
    d["collectives"][0]["latency_us"] = -1
    (tmp_path / "bad.json").write_text(json.dumps(d))
    with pytest.raises(InputError, match=r"collectives\[0\]\.latency_us"):
        load_topology(tmp_path / "bad.json")


# -- nccl-tests: the real 17-node H100 sweep ---------------------------------------------------

def _summary_rows():
    with open(SWEEP / "summary.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def _pair(file_name):
    return tuple(re.match(r"nccl_N2_G\d+_(.+)_(.+)\.log$", file_name).groups())


@pytest.fixture(scope="module")
def sweep():
    return import_paths([SWEEP / "logs"])


def test_sweep_hosts_links_and_pairs(sweep):
    hosts = [f"cnode2-{i:03d}" for i in range(1, 18)]
    assert list(sweep.hosts) == hosts and sweep.gpus_per_host == 8
    # Oracle: the source repository's own digest, summary.csv (sendrecv rows with a figure).
    rows = _summary_rows()
    good = [(r["file"], int(r["G"])) for r in rows
            if r["test"] == "sendrecv_perf" and r["peak_busbw_GBs"]]
    got = {(l.src, l.dst, l.gpus_per_host) for l in sweep.links}
    want = set()
    for f, g in good:
        a, b = _pair(f)
        want |= {(a, b, g), (b, a, g)}
    assert got == want and len(sweep.links) == 2 * len(good)
    measured = {frozenset(_pair(f)) for f, _ in good}
    assert sweep.measured_pairs() == measured
    unmeasured = {frozenset(p) for p in combinations(hosts, 2)} - measured
    assert {frozenset(p) for p in sweep.unmeasured_pairs()} == unmeasured
    # the README's three pairs without sendrecv rows are among them
    for p in (("cnode2-002", "cnode2-008"), ("cnode2-003", "cnode2-008"),
              ("cnode2-008", "cnode2-009")):
        assert p in sweep.unmeasured_pairs()
    alltoall = [r for r in rows if r["test"] == "alltoall_perf" and r["peak_busbw_GBs"]]
    assert len(sweep.collectives) == len(alltoall)


def test_sweep_figures_are_within_each_logs_range(sweep):
    peak = {(r["file"], r["test"]): float(r["peak_busbw_GBs"]) for r in _summary_rows()
            if r["peak_busbw_GBs"]}
    by_key = {}
    for f, t in peak:
        if t == "sendrecv_perf":
            g = int(re.match(r"nccl_N2_G(\d+)_", f).group(1))
            by_key[_pair(f) + (g,)] = peak[(f, t)]
    for l in sweep.links:
        key = (l.src, l.dst, l.gpus_per_host)
        p = by_key.get(key) or by_key[(l.dst, l.src, l.gpus_per_host)]
        # β is the asymptotic rate of the fit: at most a few % above the best size's busbw
        assert min(l.samples_Bps) <= l.bandwidth_Bps <= 1.05 * p * GB
        assert len(l.samples_Bps) == 20                 # 10 sizes, out-of-place and in-place
        assert 32 << 20 <= l.message_bytes <= 17179869184 and l.rails_used == 1
        assert l.method == "nccl-tests sendrecv_perf busbw alpha-beta fit over 10 sizes"
    # cnode2-001 ↔ 002, G=1: clean sweep; its last row reads busbw 13.59 / 13.61
    ab = [l for l in sweep.links if (l.src, l.dst, l.gpus_per_host) ==
          ("cnode2-001", "cnode2-002", 1)]
    assert ab[0].samples_Bps[-2:] == (13.59 * GB, 13.61 * GB)
    assert ab[0].samples_Bps[:2] == (13.35 * GB, 13.40 * GB)
    assert ab[0].bandwidth_Bps == pytest.approx(13.6 * GB, rel=0.005)
    assert ab[0].message_bytes == 17179869184 and 20e-6 < ab[0].latency_s < 80e-6


def test_sweep_outlier_link_gets_beta_of_its_other_sizes():
    # nccl_N2_G1_cnode2-001_cnode2-004.log, sendrecv: busbw 6.57-6.77 GB/s from 32 to 256 MiB,
    # 7.82/8.43 at 512 MiB, then it collapses to 0.97/0.99 GB/s at 16 GiB. The old figure (the
    # largest size) was 0.97 GB/s; the fit keeps the consistent sizes and leaves the rest out.
    path = SWEEP / "logs" / "nccl_N2_G1_cnode2-001_cnode2-004.log"
    if not path.is_file():
        pytest.skip(f"real-cluster log not found at {path}")
    t = parse_nccl_tests(path.read_text(), path.name)
    links = [l for l in t.links if l.method.startswith("nccl-tests sendrecv_perf")]
    assert len(links) == 2
    for l in links:
        assert min(l.samples_Bps) == 0.97 * GB and len(l.samples_Bps) == 20
        small = sorted(l.samples_Bps[:8])                 # 32 .. 256 MiB, both columns
        assert l.bandwidth_Bps == pytest.approx(small[4], rel=0.05)
        assert 6.5 * GB < l.bandwidth_Bps < 8.5 * GB      # was 0.97 GB/s
        assert l.message_bytes < 17179869184
        assert l.latency_s is None                        # half the sweep left out
    warn = [w for w in t.warnings if "sendrecv_perf" in w and "left out as outliers" in w]
    assert len(warn) == 1 and "16 GiB" in warn[0] and "0.97 GB/s" in warn[0]


def test_sweep_fit_versus_largest_size(sweep):
    # Clean sweeps keep their figure (within 1 % of the largest size's busbw); the ones that
    # collapse at large sizes get the rate of their other sizes, well above the collapse.
    changed = [l for l in sweep.links
               if abs(l.bandwidth_Bps / min(l.samples_Bps[-2:]) - 1) > 0.10]
    steady = [l for l in sweep.links if l not in changed]
    assert all(abs(l.bandwidth_Bps / min(l.samples_Bps[-2:]) - 1) < 0.015 for l in steady)
    assert 20 <= len(changed) // 2 <= 60
    for l in changed:
        assert min(l.samples_Bps[-2:]) < 1.2 * GB < 6 * GB < l.bandwidth_Bps
    with_latency = [l for l in steady if l.latency_s is not None]
    assert len(with_latency) > 0.9 * len(steady)
    assert all(5e-6 < l.latency_s < 200e-6 for l in with_latency)


def test_sweep_collectives_get_latency(sweep):
    colls = {(c.hosts, c.gpus_per_host): c for c in sweep.collectives}
    c = colls[(("cnode2-001", "cnode2-002"), 1)]
    # alltoall over 2 ranks: busbw = algbw / 2; the log's busbw reads 13.08 .. 13.60 GB/s
    assert c.op == "alltoall" and c.busbw_Bps == pytest.approx(13.55 * GB, rel=0.01)
    assert 20e-6 < c.latency_s < 60e-6
    c8 = colls[(("cnode2-001", "cnode2-002"), 8)]      # 16 ranks: busbw = algbw * 15 / 16
    assert c8.busbw_Bps == pytest.approx(23.6 * GB, rel=0.01)
    assert sum(c.latency_s is not None for c in sweep.collectives) > 0.7 * len(colls)


def test_sweep_failures_become_missing(sweep):
    text = (SWEEP / "failures.txt").read_text()
    failed = re.findall(r"^\s+- (nccl_\S+\.log): (\w+_perf)", text, re.M)
    assert len(failed) == 34
    reasons = [m.reason for m in sweep.missing]
    for f, test in failed:
        assert any(r.startswith(f"{f}: {test}") for r in reasons), (f, test)
        assert any(f in w and test in w for w in sweep.warnings)


def test_sweep_cli_summary(sweep, tmp_path, capsys):
    out = tmp_path / "topo.json"
    assert main(["topology", "import", str(SWEEP), "-o", str(out), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["hosts"] == 17 and s["links"] == len(sweep.links)
    assert len(s["unmeasured_pairs"]) == len(sweep.unmeasured_pairs())
    back = load_topology(out)
    assert back.hosts == sweep.hosts and len(back.missing) == len(sweep.missing)
    assert any("skipped" in w and "summary.csv" in w for w in back.warnings)


# -- nvidia-smi topo -m ------------------------------------------------------------------------

@pytest.mark.parametrize("name, host, nv, GBps", [
    ("nvidia-smi-topo_dgx-a100.txt", "dgx-a100", 12, 300.0),
    ("nvidia-smi-topo_dgx-h100.txt", "dgx-h100", 18, 450.0)])
def test_nvidia_smi_fixtures(name, host, nv, GBps):
    text = (DATA / name).read_text()
    assert detect_format(text) == "nvidia-smi"
    t = import_file(DATA / name)
    assert t.hosts == (host,) and t.gpus_per_host == 8 and not t.warnings
    pairs = {(l.src_gpu, l.dst_gpu) for l in t.links}
    assert pairs == {(i, j) for i in range(8) for j in range(8) if i != j}
    for l in t.links:
        assert (l.src, l.dst, l.link_class, l.method) == (host, host, "nvlink",
                                                          "nvidia-smi topo -m (nominal)")
        assert l.bandwidth_Bps == nv * 25 * GB == GBps * GB
        assert l.nominal


PCIE_BOX = """\
\x1b[4mGPU0\tGPU1\tGPU2\tGPU3\tmlx5_0\tCPU Affinity\tNUMA Affinity\x1b[0m
GPU0\t X \tPIX\tPHB\tSYS\tPIX\t0-15\t0
GPU1\tPIX\t X \tPXB\tSYS\tPIX\t0-15\t0
GPU2\tPHB\tPXB\t X \tNODE\tPHB\t0-15\t0
GPU3\tSYS\tSYS\tNODE\t X \tSYS\t16-31\t1
mlx5_0\tPIX\tPIX\tPHB\tSYS\t X \t\t

Legend:

  X    = Self
  NV#  = Connection traversing a bonded set of # NVLinks
"""


def test_nvidia_smi_pcie_classes_old_header():
    t = parse_topo_matrix(PCIE_BOX, "box")
    cls = {(l.src_gpu, l.dst_gpu): l.link_class for l in t.links}
    assert cls[(0, 1)] == "pcie-pix" and cls[(1, 2)] == "pcie-pxb"
    assert cls[(0, 2)] == "pcie-phb" and cls[(2, 3)] == "pcie-node"
    assert cls[(0, 3)] == cls[(3, 1)] == "pcie-sys" and len(cls) == 12
    # no NVLink ≥ 18 in sight: PCIe Gen4 x16, 16 GT/s × 16 lanes × 128/130 / 8 bits
    (bw,) = {l.bandwidth_Bps for l in t.links}
    assert bw == pytest.approx(31.5077e9, rel=1e-4)
    gen5 = parse_topo_matrix(PCIE_BOX, "box", pcie_gen=5)
    assert {l.bandwidth_Bps for l in gen5.links} == {PCIE_X16_Bps[5]}
    with pytest.raises(InputError, match="pcie_gen"):
        parse_topo_matrix(PCIE_BOX, "box", pcie_gen=2)


def test_nvidia_smi_inconsistent_cells_warn():
    text = PCIE_BOX.replace("GPU1\tPIX\t X \tPXB", "GPU1\tPIX\t X \tQQQ")
    t = parse_topo_matrix(text, "box")
    assert any("QQQ" in w for w in t.warnings)
    assert any("GPU2→GPU1 is PXB but GPU1→GPU2 is QQQ" in w for w in t.warnings)
    assert (1, 2) not in {(l.src_gpu, l.dst_gpu) for l in t.links}
    with pytest.raises(InputError, match="no 'nvidia-smi topo -m' matrix"):
        parse_topo_matrix("hello\n", "box")


def test_host_from_filename():
    assert host_from_filename("nvidia-smi-topo_dgx-a100.txt") == "dgx-a100"
    assert host_from_filename("topo_node7.txt") == "node7"
    assert host_from_filename("/x/gpu-node-3.txt") == "gpu-node-3"
    assert host_from_filename("nvidia-smi-topo-m_node7.txt") == "node7"
    assert host_from_filename("m-01.txt") == "m-01"           # a host's own name, kept
    assert host_from_filename("m_host.txt") == "m_host"


# -- import_paths ------------------------------------------------------------------------------

def test_import_paths_mixed_directory(tmp_path):
    (tmp_path / "nccl_N2_G1_hostA_hostB.log").write_text(NEW_SENDRECV)
    (tmp_path / "topo_hostA.txt").write_text((DATA / "nvidia-smi-topo_dgx-h100.txt").read_text())
    (tmp_path / "README.md").write_text("# notes\n")
    fast = parse_nccl_tests(NEW_SENDRECV, "f.log").links[0].bandwidth_Bps
    slow = NEW_SENDRECV
    for _, oop, ip in NEW_SENDRECV_TIMES:                    # every time doubled: half the rate
        slow = slow.replace(f"{oop:.2f}", f"{2 * oop:.2f}").replace(f"{ip:.2f}", f"{2 * ip:.2f}")
    probe = parse_nccl_tests(slow, "p.log")
    (half,) = {l.bandwidth_Bps for l in probe.links}
    assert half == pytest.approx(fast / 2, rel=1e-3)
    save_topology(probe, tmp_path / "sub.json")
    t = import_paths([tmp_path], policy="min")
    assert t.hosts == ("hostA", "hostB") and t.gpus_per_host == 8
    ab = [l for l in t.links if (l.src, l.dst) == ("hostA", "hostB")]
    assert len(ab) == 1 and ab[0].bandwidth_Bps == pytest.approx(half, rel=1e-12)   # the min
    assert len([l for l in t.links if l.src == l.dst]) == 56
    assert any("skipped 1 file" in w and "README.md" in w for w in t.warnings)
    med = import_paths([tmp_path], policy="median")
    assert [l.bandwidth_Bps for l in med.links if (l.src, l.dst) == ("hostA", "hostB")] == \
        [pytest.approx((fast + half) / 2)]


def test_import_paths_fills_unmeasured_pairs(tmp_path):
    (tmp_path / "ab.log").write_text(NEW_SENDRECV)
    (tmp_path / "bc.log").write_text(NEW_SENDRECV.replace("hostA", "hostC"))
    t = import_paths([tmp_path])
    assert t.unmeasured_pairs() == [("hostA", "hostC")]
    assert "no inter-node link measurement" in t.missing[0].reason


def test_import_paths_errors(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        import_paths([tmp_path / "absent"])
    junk = tmp_path / "junk.txt"
    junk.write_text("nothing to see\n")
    with pytest.raises(InputError, match="not an nccl-tests log"):
        import_paths([junk])
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("x")
    with pytest.raises(InputError, match="holds no"):
        import_paths([empty])
    with pytest.raises(InputError, match="merge"):
        import_paths([junk], policy="mean")


# -- CLI ---------------------------------------------------------------------------------------

def test_cli_import_and_refuse_overwrite(tmp_path, capsys):
    log = tmp_path / "nccl_N2_G1_hostA_hostB.log"
    log.write_text(NEW_SENDRECV)
    out = tmp_path / "topo.yaml"
    assert main(["topology", "import", str(log), "-o", str(out)]) == 0
    line = capsys.readouterr().out.strip()
    assert "2 hosts" in line and "2 links" in line and "0 missing" in line
    assert len(line.splitlines()) == 1
    before = out.read_text()
    fitted = parse_nccl_tests(NEW_SENDRECV, "x.log").links[0].bandwidth_Bps
    assert load_topology(out).links[0].bandwidth_Bps == pytest.approx(fitted, rel=1e-12)
    assert main(["topology", "import", str(log), "-o", str(out)]) == 2
    assert "--force" in capsys.readouterr().err and out.read_text() == before
    assert main(["topology", "import", str(log), "-o", str(out), "--force",
                 "--merge", "p10"]) == 0
    assert load_topology(out).merge_policy == "p10"


def test_cli_bad_inputs_exit_2(tmp_path, capsys):
    out = tmp_path / "t.json"
    assert main(["topology", "import", str(tmp_path / "nope.log"), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such file" in err and "Traceback" not in err
    assert main(["topology", "import", str(DATA), "-o", str(out), "--merge", "max"]) == 2
    assert "merge" in capsys.readouterr().err and not out.exists()
