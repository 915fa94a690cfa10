"""The measured-topology data model: file round trip, validation, merging, applying."""

from __future__ import annotations

import json

import pytest

from configurator.core.errors import InputError
from configurator.core.units import GB, US
from topology.cluster_files import load_cluster
from topology.topofile import CollectiveMeasurement, LinkMeasurement, MissingMeasurement, Topology, apply_topology, combine, merge_topologies
from topology.topofile_io import load_topology, save_topology, topology_to_dict


def link(src="a", dst="b", bw_GBps=10.0, **kw):
    base = dict(src=src, dst=dst, src_gpu=None, dst_gpu=None, bandwidth_Bps=bw_GBps * GB,
                latency_s=None, link_class="network", message_bytes=1 << 25,
                method="nccl-tests sendrecv_perf busbw", timestamp=None)
    base.update(kw)
    return LinkMeasurement(**base)


def topo(*links, hosts=("a", "b"), **kw):
    return Topology(hosts=hosts, gpus_per_host=8, links=tuple(links), **kw)


def assert_same(t1: Topology, t2: Topology):
    """Equal up to float rounding of the GB/s and µs conversions."""
    assert t1.hosts == t2.hosts and t1.gpus_per_host == t2.gpus_per_host
    assert t1.merge_policy == t2.merge_policy and t1.missing == t2.missing
    assert t1.warnings == t2.warnings and len(t1.links) == len(t2.links)
    for a, b in zip(t1.links, t2.links):
        assert a.bandwidth_Bps == pytest.approx(b.bandwidth_Bps, rel=1e-12)
        assert a.samples_Bps == pytest.approx(b.samples_Bps, rel=1e-12)
        if a.latency_s is None:
            assert b.latency_s is None
        else:
            assert a.latency_s == pytest.approx(b.latency_s, rel=1e-12)
        for f in ("src", "dst", "src_gpu", "dst_gpu", "link_class", "message_bytes", "method",
                  "timestamp", "gpus_per_host", "rails_used"):
            assert getattr(a, f) == getattr(b, f), f
    for a, b in zip(t1.collectives, t2.collectives):
        assert a.busbw_Bps == pytest.approx(b.busbw_Bps, rel=1e-12)
        assert (a.hosts, a.op, a.gpus_per_host, a.method) == (b.hosts, b.op, b.gpus_per_host,
                                                              b.method)


FULL = topo(
    link(latency_s=7.5 * US, timestamp="2025-11-03T10:00:00+00:00",
         samples_Bps=(10 * GB, 10.5 * GB), gpus_per_host=4, rails_used=1),
    link("b", "a", 9.75),
    link("a", "a", 370.0, src_gpu=0, dst_gpu=3, link_class="nvlink"),
    collectives=(CollectiveMeasurement(hosts=("a", "b"), gpus_per_host=8, op="alltoall",
                                       busbw_Bps=23.1 * GB, message_bytes=1 << 34,
                                       method="nccl-tests alltoall_perf busbw",
                                       timestamp=None),),
    missing=(MissingMeasurement(src="a", dst="b", reason="x.log: sendrecv_perf G=8: failed"),),
    merge_policy="p10", warnings=("w1",))


@pytest.mark.parametrize("name", ["t.json", "t.yaml"])
def test_round_trip(tmp_path, name):
    path = tmp_path / name
    save_topology(FULL, path)
    back = load_topology(path)
    assert_same(FULL, back)
    text = path.read_text()
    assert "bandwidth_GBps" in text and "latency_us" in text  # units at the edge
    if name.endswith(".json"):
        data = json.loads(text)
        assert data["links"][0]["bandwidth_GBps"] == pytest.approx(10.0)
        assert data["links"][0]["latency_us"] == pytest.approx(7.5)


def test_save_refuses_overwrite(tmp_path):
    path = tmp_path / "t.json"
    path.write_text("mine")
    with pytest.raises(InputError, match="--force"):
        save_topology(FULL, path)
    assert path.read_text() == "mine"
    save_topology(FULL, path, force=True)
    assert load_topology(path).hosts == ("a", "b")


def test_yaml_unquoted_timestamp_is_accepted(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("hosts: [a, b]\nlinks:\n- {src: a, dst: b, src_gpu: null, dst_gpu: null, "
                    "bandwidth_GBps: 12.5, latency_us: null, link_class: network, "
                    "message_bytes: 1024, method: probe, timestamp: 2025-11-03T10:00:00}\n")
    t = load_topology(path)
    assert t.links[0].bandwidth_Bps == 12.5e9
    assert t.links[0].timestamp.startswith("2025-11-03T10:00:00")


def _bad(data: dict, tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InputError) as err:
        load_topology(path)
    return str(err.value)


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d["links"][0].update(bandwidth_GBps=-1), "links[0].bandwidth_GBps"),
    (lambda d: d["links"][0].update(src="zz"), "links[0].src"),
    (lambda d: d["links"][0].update(src_gpu=1), "links[0].src_gpu"),
    (lambda d: d["links"][0].update(colour="red"), "links[0].colour"),
    (lambda d: d.update(format="other"), "format"),
    (lambda d: d.update(merge_policy="p101"), "merge"),
    (lambda d: d["collectives"][0].update(gpus_per_host=float("inf")), "gpus_per_host"),
    (lambda d: d["links"][0].update(message_bytes=1.5), "message_bytes"),
    (lambda d: d["links"][0].update(bandwidth_GBps=10 ** 400), "bandwidth_GBps"),
    (lambda d: d.update(hosts=["a", "a"]), "hosts"),
])
def test_bad_fields_name_the_field(tmp_path, mutate, field):
    data = topology_to_dict(FULL)
    mutate(data)
    assert field in _bad(data, tmp_path)


def test_unreadable_files(tmp_path):
    for content, rule in ((b"\xff\xfe\x00garbage", "UTF-8"), (b"{not json", "malformed"),
                          (b"[" * 100000, "malformed"), (b"- a\n- b\n", "mapping")):
        p = tmp_path / "x.yaml"
        p.write_bytes(content)
        with pytest.raises(InputError, match=rule):
            load_topology(p)
    with pytest.raises(InputError, match="cannot read"):
        load_topology(tmp_path / "absent.json")


# -- merging ---------------------------------------------------------------------------------

def test_combine_policies():
    values = [10.0, 20.0, 30.0, 40.0]
    assert combine(values, "min") == 10.0
    assert combine(values, "median") == 25.0
    assert combine(values, "p10") == pytest.approx(13.0)   # linear: 10 + 0.3 * 10
    assert combine(values, "p100") == 40.0
    for bad in ("max", "p", "p-1", "p101", "P10", 10):
        with pytest.raises(InputError, match="pNN"):
            combine(values, bad)


@pytest.mark.parametrize("policy, expect_GBps", [("min", 10.0), ("median", 25.0),
                                                  ("p10", 13.0)])
def test_merge_duplicate_links(policy, expect_GBps):
    parts = [topo(link(bw_GBps=b, latency_s=l * US)) for b, l in
             ((40, 5), (10, 9), (30, 6), (20, 7))]
    merged = merge_topologies(parts, policy)
    assert merged.merge_policy == policy
    (l,) = merged.links
    assert l.bandwidth_Bps == pytest.approx(expect_GBps * GB)
    assert sorted(l.samples_Bps) == [10 * GB, 20 * GB, 30 * GB, 40 * GB]
    if policy == "min":   # pessimistic both ways: lowest bandwidth, highest latency
        assert l.latency_s == pytest.approx(9 * US)


def test_merge_keeps_distinct_links_and_unions():
    t1 = topo(link(gpus_per_host=1), link("b", "a", 12), missing=(
        MissingMeasurement(src="a", dst="b", reason="r"),), warnings=("w",))
    t2 = topo(link(bw_GBps=5, gpus_per_host=8), link("b", "a", 3), hosts=("b", "a", "c"),
              missing=(MissingMeasurement(src="a", dst="b", reason="r"),), warnings=("w", "v"))
    m = merge_topologies([t1, t2])
    assert m.hosts == ("a", "b", "c")
    # a→b with 1 GPU and with 8 GPUs per host are different experiments: kept apart
    ab = sorted((l.gpus_per_host or 0, l.bandwidth_Bps) for l in m.links if l.src == "a")
    assert ab == [(1, 10 * GB), (8, 5 * GB)]
    ba = [l.bandwidth_Bps for l in m.links if l.src == "b"]
    assert ba == [3 * GB]
    assert len(m.missing) == 1 and m.warnings == ("w", "v")


def test_unmeasured_pairs():
    t = topo(link(), hosts=("a", "b", "c"), missing=(
        MissingMeasurement(src="a", dst="b", reason="G=1 failed"),
        MissingMeasurement(src="c", dst="a", reason="no data")))
    assert t.unmeasured_pairs() == [("a", "c")]
    assert t.measured_pairs() == {frozenset(("a", "b"))}


# -- applying to a cluster ---------------------------------------------------------------------

def h100(nodes=2):
    return load_cluster("dgx-h100-80gb", nodes)


def test_apply_changes_measured_pair_only():
    base = h100(3)
    nominal_inter = base.link(0, 8)
    nominal_intra = base.link(0, 1)
    t = topo(link("a", "b", 10.0, gpus_per_host=8),              # 8 rails at once: 1.25 / rail
             link("a", "b", 20.0, gpus_per_host=8, src_gpu=2, dst_gpu=2),
             link("b", "a", 6.0, gpus_per_host=4, rails_used=1),  # one rail per direction
             link("a", "a", 200.0, src_gpu=0, dst_gpu=1, link_class="nvlink"),
             hosts=("a", "b", "c"))
    c = apply_topology(base, t)
    assert c is not base and c.hosts == ["a", "b", "c"]
    assert c.link(0, 8)[0] == pytest.approx(1.25 * GB)        # a/gpu0 → b/gpu0 via host edge
    assert c.link(5, 13)[0] == pytest.approx(1.25 * GB)       # every rail
    assert c.link(2, 10)[0] == pytest.approx(20 * GB)         # the rail's own edge wins
    assert c.link(8, 0)[0] == pytest.approx(6 * GB)
    assert c.link(0, 1) == (200 * GB, nominal_intra[1])       # measured NVLink pair
    assert c.link(0, 2) == nominal_intra                      # others nominal
    # a ↔ c unmeasured: the median of the measured host pairs (1.25 and 6 GB/s per rail)
    assert c.link(0, 16)[0] == pytest.approx((1.25 + 6) / 2 * GB)
    assert c.graph.edges["a", "c"]["imputed"] and c.graph.edges["c", "a"]["imputed"]
    assert nominal_inter[0] > 6 * GB
    assert c.link(0, 8)[1] == pytest.approx(nominal_inter[1])  # no measured latency
    assert base.link(0, 8) == nominal_inter and not base.has_measured_links
    assert c.has_measured_links


def test_apply_uses_topology_hosts_and_policy():
    t = topo(link("x", "y", 10.0, gpus_per_host=1), link("x", "y", 4.0, gpus_per_host=4,
                                                          rails_used=1),
             hosts=("x", "y", "z"))
    c = apply_topology(h100(2), t)          # topology names more hosts than the cluster
    assert c.hosts == ["x", "y", "z"]
    assert c.link(0, 8)[0] == pytest.approx(4 * GB)                     # min of 10 and 4
    assert apply_topology(h100(2), t, "median").link(0, 8)[0] == pytest.approx(7 * GB)
    c4 = apply_topology(h100(4), t)
    assert c4.hosts[:3] == ["x", "y", "z"] and len(c4.hosts) == 4


def test_apply_measured_latency_replaces_path_latency():
    c = apply_topology(h100(), topo(link(latency_s=20 * US, gpus_per_host=1)))
    assert c.link(0, 8)[1] == pytest.approx(20 * US)


def test_apply_scales_nominal_records_and_checks_gpu_index():
    base = h100(1)
    nominal = link("a", "a", 450.0, src_gpu=0, dst_gpu=1, link_class="nvlink",
                   method="nvidia-smi topo -m (nominal)")
    c = apply_topology(base, Topology(hosts=("a",), gpus_per_host=8, links=(nominal,)))
    assert c.link(0, 1)[0] == pytest.approx(base.link(0, 1)[0])  # 450 × 370/450 efficiency
    bad = link("a", "a", 450.0, src_gpu=0, dst_gpu=9, link_class="nvlink")
    with pytest.raises(InputError, match="dst_gpu"):
        apply_topology(base, Topology(hosts=("a",), gpus_per_host=10, links=(bad,)))
