"""A search's inputs resolved once: the cluster (preset or file) read once, its ``training``
section carried on the resolved job to the time to train, and the request's own settings
checked in one place, the first bad one named."""

from __future__ import annotations

import pytest
import yaml

from configurator.app.inputs import JobInputs, resolve
from configurator.app.plan_jobs import SearchRequest, run_search
from configurator.app.training_jobs import TrainingRequest
from configurator.core import validate as v
from configurator.core.errors import InputError
from topology.calibration import with_measurements
from topology.cluster_files import CLUSTER_PRESETS, load_cluster, read_cluster

TRAINING = {"failure_rate_per_node_day": 0.02, "gpu_hour_price": 3, "pue": 1.2}


@pytest.fixture
def cluster_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(dict(CLUSTER_PRESETS["dgx-h100-80gb"], training=TRAINING)))
    return str(path)


def test_the_resolved_job_carries_the_checked_training_section(cluster_file):
    job = resolve(JobInputs(model="llama3-8b", cluster=cluster_file, nodes=2))
    assert job.training == {"failure_rate_per_node_day": 0.02, "gpu_hour_price": 3.0,
                            "pue": 1.2}
    assert all(type(val) is float for val in job.training.values())
    assert job.cluster.num_nodes == 2 and job.profile is None
    assert resolve(JobInputs(model="llama3-8b", cluster="dgx-h100-80gb")).training == {}


def test_read_cluster_builds_what_load_cluster_builds(cluster_file):
    for ref in ("dgx-h100-80gb", "DGX-A100-80GB", cluster_file):
        cluster, _ = read_cluster(ref, 3)
        assert cluster.to_dict() == load_cluster(ref, 3).to_dict()
    with pytest.raises(InputError) as err:
        read_cluster("no-such-cluster")
    assert err.value.field == "cluster"


def test_a_search_reads_the_cluster_file_once(cluster_file, monkeypatch):
    reads = []
    real = v.load_mapping_file

    def counted(field, path):
        reads.append(field)
        return real(field, path)

    monkeypatch.setattr(v, "load_mapping_file", counted)
    req = SearchRequest(inputs=JobInputs(model="llama3-8b", cluster=cluster_file, nodes=1),
                        global_batch_size=64, top=1,
                        training=TrainingRequest(train_tokens="1T"))
    t = run_search(req).result.plans[0].training
    assert reads.count("cluster") == 1
    assert t.cost == pytest.approx(3.0 * t.gpu_hours)     # the file's gpu_hour_price


@pytest.mark.parametrize("settings, field", [
    (dict(global_batch_size=0, top=0), "gbs"),
    (dict(top=0, max_memory_fraction=2.0), "top"),
    (dict(max_memory_fraction=0.0, placement_time_s=-1.0), "max_memory_fraction"),
    (dict(placement_time_s=-1.0, seed=-1), "placement_time_s"),
    (dict(placement_evaluations=0, seed=-1), "placement_evaluations"),
    (dict(seed=-1), "seed"),
])
def test_the_request_check_names_the_first_bad_setting(settings, field):
    req = SearchRequest(inputs=JobInputs(model="llama3-8b", cluster="dgx-h100-80gb"),
                        **{"global_batch_size": 64, **settings})
    with pytest.raises(InputError) as err:
        req.check()
    assert err.value.field == field
    if field == "max_memory_fraction":
        assert str(err.value) == "max_memory_fraction=0.0: must be in (0, 1]"


def test_the_table_is_bounded_to_a_thousand_plans():
    """Each plan shown is priced again on its exact schedule (milliseconds apiece), so
    ``top`` stops at 1,000: a request for 3,496 once took 16 s (fuzzed, reported as a hang)."""
    def request(top):
        return SearchRequest(inputs=JobInputs(model="llama3-8b", cluster="dgx-h100-80gb"),
                             global_batch_size=64, top=top)
    request(1000).check()
    with pytest.raises(InputError) as err:
        request(1001).check()
    assert err.value.field == "top"
    assert str(err.value) == "top=1001: must be an integer in 1..1,000"


def test_a_good_request_passes_its_check():
    SearchRequest(inputs=JobInputs(model="llama3-8b", cluster="dgx-h100-80gb"),
                  global_batch_size=64, max_memory_fraction=1.0).check()


def test_nothing_measured_leaves_the_cluster_as_it_is():
    cluster = load_cluster("dgx-h100-80gb", 1)
    assert with_measurements(cluster, None, None, "bf16") is cluster


def test_the_uncalibrated_cluster_is_the_one_before_profile_and_calibration(tmp_path):
    cal = tmp_path / "cal.yaml"
    cal.write_text("format: configurator-calibration/1\ngpus:\n  h100-80gb:\n    bf16:\n"
                   "      gemm: 0.5\n      host_op_us: 5.0\n")
    preset = load_cluster("dgx-h100-80gb", 1)
    job = resolve(JobInputs(model="llama3-8b", cluster="dgx-h100-80gb", nodes=1,
                            calibration=str(cal)))
    assert job.cluster.gpu.efficiency.gemm == 0.5
    assert job.uncalibrated_cluster.gpu.efficiency == preset.gpu.efficiency
    assert job.uncalibrated_cluster.to_dict() == preset.to_dict()
