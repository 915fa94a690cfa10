"""Property tests: importers never fail with anything but InputError, and what they return
is a well-formed (possibly partial) Topology."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from configurator.core.errors import InputError
from configurator.core.units import MiB
from topology.importers import MAX_FILE_BYTES, import_file, import_paths
from topology.importers.nccl_tests import parse_nccl_tests
from topology.importers.nvidia_smi import parse_topo_matrix
from topology.topofile import Topology
from topology.topofile_io import load_topology, topology_from_dict, topology_to_dict

from tests.test_importers import NEW_SENDRECV, OLD_ALLREDUCE, PCIE_BOX

DATA = Path(__file__).resolve().parent / "data"
H100 = (DATA / "nvidia-smi-topo_dgx-h100.txt").read_text()
SEEDS = [NEW_SENDRECV, OLD_ALLREDUCE, NEW_SENDRECV.replace("sendrecv", "alltoall") + NEW_SENDRECV]
FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def well_formed(t: Topology) -> None:
    hosts = set(t.hosts)
    for l in t.links:
        assert l.src in hosts and l.dst in hosts
        assert math.isfinite(l.bandwidth_Bps) and l.bandwidth_Bps > 0
        assert (l.src_gpu is None) == (l.dst_gpu is None)
    for c in t.collectives:
        assert set(c.hosts) <= hosts and c.busbw_Bps > 0 and c.gpus_per_host >= 1
    for m in t.missing:
        assert m.reason
    assert all(isinstance(w, str) and w for w in t.warnings)
    if not t.hosts:
        # a file naming no host measured nothing: import_paths refuses it (one line naming
        # the file) before anything could save it, and a topology file needs a host
        assert not t.links and not t.collectives
        return
    topology_from_dict(topology_to_dict(t))   # whatever came out can be saved and read back


@st.composite
def mangled(draw, seeds):
    """A seed text truncated, with lines shuffled/dropped/duplicated and garbage spliced in."""
    lines = draw(st.sampled_from(seeds)).splitlines(keepends=True)
    op = draw(st.sampled_from(["truncate", "shuffle", "garbage", "drop", "mix"]))
    if op in ("truncate", "mix"):
        cut = draw(st.integers(0, sum(map(len, lines))))
        lines = ["".join(lines)[:cut]]
        lines = lines[0].splitlines(keepends=True)
    if op in ("shuffle", "mix"):
        lines = draw(st.permutations(lines))
    if op == "drop" and lines:
        i = draw(st.integers(0, len(lines) - 1))
        lines = lines[:i] + lines[i + 1:] + lines[i:i + 1] * draw(st.integers(0, 3))
    if op in ("garbage", "mix"):
        junk = draw(st.text(min_size=1, max_size=80))
        pos = draw(st.integers(0, len(lines)))
        lines = lines[:pos] + [junk] + lines[pos:]
    return "".join(lines)


@FUZZ
@given(mangled(SEEDS))
def test_nccl_parser_never_raises(text):
    well_formed(parse_nccl_tests(text, "nccl_N2_G1_hostA_hostB.log"))


def test_a_gpu_name_too_long_to_save_is_left_out():
    """A Rank line whose device name runs into the header (a log with a lost line break)
    gives no GPU name rather than one the topology file refuses on reading back."""
    text = ("#  Rank  0 Group  0 Pid 440651 on hostA device  0 [0000:1b:00] 0# nThread 1 "
            "nGpus 1 minBytes 33554432 maxBytes 134217728 step: 2(factor) warmup iters: 5 "
            "iters: 20 agg iters: 1 validation: 1 graph: 0\n# Collective test starting: "
            "sendrecv_perf\n#\n# Using devices\n")
    topo = parse_nccl_tests(text, "nccl_N2_G1_hostA_hostB.log")
    assert topo.gpu_name is None and any("GPU name" in w for w in topo.warnings)
    well_formed(topo)


@FUZZ
@given(st.text(max_size=2000), st.text(max_size=40))
def test_nccl_parser_on_arbitrary_text(text, name):
    well_formed(parse_nccl_tests(text, name))


@FUZZ
@given(mangled([H100, PCIE_BOX]))
def test_topo_matrix_partial_or_input_error(text):
    try:
        t = parse_topo_matrix(text, "h")
    except InputError as err:
        assert "nvidia-smi" in str(err)
        return
    well_formed(t)


@FUZZ
@given(data=st.binary(max_size=3000) | mangled(SEEDS + [H100]).map(str.encode))
def test_import_file_on_any_bytes(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("fz") / "input.log"
    path.write_bytes(data)
    try:
        t = import_file(path)
    except InputError as err:
        assert str(err).startswith(("path=", "topology", "nvidia-smi"))
        return
    well_formed(t)


scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
json_like = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                         | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=20)


@FUZZ
@given(st.data())
def test_topology_from_mutated_dict(data):
    from tests.test_topofile import FULL
    d = topology_to_dict(FULL)
    section = data.draw(st.sampled_from(["top", "links", "collectives", "missing"]))
    target = d if section == "top" else d[section][0]
    key = data.draw(st.sampled_from(sorted(target) + ["extra"]))
    target[key] = data.draw(json_like)
    try:
        t = topology_from_dict(d)
    except InputError:
        return
    well_formed(t)


@FUZZ
@given(st.text(max_size=500))
def test_load_topology_on_arbitrary_text(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("lt") / "t.yaml"
    path.write_text(text, encoding="utf-8")
    try:
        well_formed(load_topology(path))
    except InputError:
        pass


def test_huge_inputs(tmp_path):
    # A valid log with 100 000 rows parses, and the largest size is taken.
    head, tail = NEW_SENDRECV.split("# Out of bounds")
    row = ("  {:>10d}       4194304    double     sum      -1  2513.89   13.35   13.35       0"
           "  2504.26   13.40   13.40    N/A\n")
    big = head + "".join(row.format(2**28 + i) for i in range(100_000)) + "# Out of bounds" + tail
    t = parse_nccl_tests(big, "big.log")
    assert t.links[0].message_bytes == 2**28 + 99_999
    # A file above the size limit is refused with a clear message, not read.
    huge = tmp_path / "huge.log"
    with open(huge, "wb") as fh:
        fh.truncate(MAX_FILE_BYTES + 1)
    with pytest.raises(InputError, match=f"larger than {MAX_FILE_BYTES // MiB} MiB"):
        import_file(huge)
    # ... and skipped with a warning inside a directory that also holds a good log.
    (tmp_path / "ok.log").write_text(NEW_SENDRECV)
    t = import_paths([tmp_path])
    assert len(t.links) == 2 and any("huge.log" in w for w in t.warnings)
