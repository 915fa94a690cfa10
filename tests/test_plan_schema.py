"""The plan schema is the one source of the plan's views; the rules, schedule and placement
seams; the plan document; unknown GPUs."""

import dataclasses
import itertools
import json

import numpy as np
import pytest

from configurator.cli import build_parser
from configurator.core.plan_batch import (COLUMN_FIELDS, PlanBatch, column_dtype,
                                         column_value)
from configurator.core.document import SCHEMA_VERSION, read_plan_document
from configurator.core.errors import InputError
from configurator.core.model import make_model
from configurator.core.model_presets import MODEL_PRESETS
from configurator.core.plan import (DERIVED_KEYS, OPTIONAL_PLAN_KEYS, PLAN_FIELDS, ParallelPlan,
                                    plan_from_dict)
from configurator.core.rules import RULES, check_plan, rules_mask
from configurator.core.schedule import bubble_stage_times, p2p_transfers
from configurator.core.version import __version__
from tests.conftest import run_cli
from topology.cluster_files import load_cluster
from topology.rank_order import RANK_ORDER, group_shape, group_stride, rank_groups

SMALL = make_model(name="small", num_layers=12, hidden_size=768, num_attention_heads=12,
                   num_query_groups=4, vocab_size=1024, seq_length=1024)


# -- one schema ---------------------------------------------------------------------------

def _subparser(name):
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices[name]


def test_estimate_options_come_from_the_schema():
    p = _subparser("estimate")
    by_flag = {s: a for a in p._actions for s in a.option_strings}
    for f in PLAN_FIELDS:
        if f.cli_flag is None:
            continue
        action = by_flag[f.cli_flag]
        assert action.dest == f.name
        assert action.help == f.help
        if f.choices:
            assert tuple(action.choices) == f.choices
        if f.type is bool:
            assert f"--no-{f.cli_flag[2:]}" in by_flag


def test_json_keys_and_candidate_columns_come_from_the_schema():
    d = ParallelPlan(tp=2, dp=4, micro_batch_size=2, global_batch_size=64).to_dict()
    assert list(d) == [f.name for f in PLAN_FIELDS] + list(DERIVED_KEYS)
    assert d["mbs"] == 2 and d["gbs"] == 64 and d["num_microbatches"] == 8
    assert {f.name for f in COLUMN_FIELDS} == {f.name for f in PLAN_FIELDS if f.per_candidate}
    c = PlanBatch.from_plan(ParallelPlan(tp=2, recompute="full", sequence_parallel=True))
    assert set(c.columns) == {f.name for f in COLUMN_FIELDS}
    assert c.plan(0).recompute == "full" and c.mbs[0] == c.micro_batch_size[0] == 1


def test_launch_flags_come_from_the_schema():
    from launchers.megatron_flags import FLAG_TABLE

    table_flags = [r.flag for r in FLAG_TABLE]
    for f in PLAN_FIELDS:
        for flag, _ in f.flags:
            assert table_flags.count(flag) == 1, flag


def test_plan_from_dict_round_trip_and_errors():
    p = ParallelPlan(tp=4, pp=2, dp=2, vp=3, micro_batch_size=2, global_batch_size=64,
                     recompute="selective", sequence_parallel=True,
                     distributed_optimizer=True, precision="fp8")
    assert plan_from_dict(json.loads(json.dumps(p.to_dict()))) == p
    bad = dict(p.to_dict(), tp="4")
    with pytest.raises(InputError, match=r"plan\.tp='4'"):
        plan_from_dict(bad)
    with pytest.raises(InputError, match=r"plan\.sequence_parallel"):
        plan_from_dict(dict(p.to_dict(), sequence_parallel="yes"))
    with pytest.raises(InputError, match=r"plan\.recompute"):
        plan_from_dict(dict(p.to_dict(), recompute="some"))
    with pytest.raises(InputError, match=r"unknown key"):
        plan_from_dict(dict(p.to_dict(), expert_parallel=2))
    older = {k: v for k, v in p.to_dict().items() if k not in OPTIONAL_PLAN_KEYS}
    assert plan_from_dict(older) == p      # documents from before expert/uneven fields
    missing = p.to_dict()
    del missing["precision"]
    with pytest.raises(InputError, match=r"plan\.precision.*missing"):
        plan_from_dict(missing)


def test_plan_description_leaves_out_what_has_no_effect():
    """The estimate text and the script header describe a plan without the FP8 weight gather
    where it has no effect, outside FP8 or without the distributed optimizer (the launcher
    passes no ``--fp8-param-gather`` there either); with FP8 and that optimizer, where
    it decides what the weights take, it is shown on or off; a quiet field at its default is
    left out and shown once set."""
    from configurator.core.plan import describe_plan
    from launchers.megatron_flags import megatron_flags

    def words(**kw):
        return describe_plan(ParallelPlan(**dict(dict(tp=2, pp=1, dp=4, micro_batch_size=1,
                                                      global_batch_size=8,
                                                      distributed_optimizer=True), **kw)))

    assert not any(w.startswith("fp8_param_gather=") for w in words(precision="bf16"))
    # without the distributed optimizer Megatron gathers no FP8 weights either
    assert not any(w.startswith("fp8_param_gather=") for w in words(
        precision="fp8", distributed_optimizer=False))
    def flags(precision):
        return {f for _, group in megatron_flags(SMALL, ParallelPlan(
            tp=2, pp=1, dp=4, micro_batch_size=1, global_batch_size=8, precision=precision,
            distributed_optimizer=True))
            for f, _ in group}

    assert "--fp8-param-gather" not in flags("bf16") and "--fp8-param-gather" in flags("fp8")
    for precision in ("fp8", "mxfp8"):
        assert "fp8_param_gather=True" in words(precision=precision)
        assert "fp8_param_gather=False" in words(precision=precision, fp8_param_gather=False)
    assert not any(w.startswith("moe_permute_fusion=") for w in words())
    assert "moe_permute_fusion=True" in words(moe_permute_fusion=True)
    assert words()[-1] == "microbatches=2"


def test_whole_number_fields_hold_ints():
    """A float in a whole-number field is refused where the plan is made (a float vp would
    write ``--num-layers-per-virtual-pipeline-stage 4.0``, which Megatron's integer flag
    refuses); a NumPy integer (a PlanBatch column's) becomes a Python int, so the JSON and
    the scripts print ``2``; a boolean is not a number of GPUs."""
    with pytest.raises(InputError, match=r"^plan\.vp=3\.0: must be a whole number"):
        ParallelPlan(tp=2, pp=2, dp=2, vp=3.0, micro_batch_size=1, global_batch_size=8)
    with pytest.raises(InputError, match=r"^plan\.tp=True: must be a whole number"):
        ParallelPlan(tp=True, pp=1, dp=8, micro_batch_size=1, global_batch_size=8)
    with pytest.raises(InputError, match=r"^plan\.global_batch_size=np\.float64\(8\.0\)|"
                                         r"^plan\.global_batch_size=8\.0"):
        ParallelPlan(tp=1, pp=1, dp=8, micro_batch_size=1, global_batch_size=np.float64(8.0))
    p = ParallelPlan(tp=np.int64(2), pp=np.int32(2), dp=2, micro_batch_size=1,
                     global_batch_size=8)
    assert type(p.tp) is int and type(p.pp) is int and p.tp == 2 and p.pp == 2
    assert json.dumps(p.to_dict())       # no NumPy scalar left to refuse serialising


# -- one rule set ---------------------------------------------------------------------------

#: A legal base plan on 16 GPUs and, for each rule in RULES order, a change that breaks it.
BASE = dict(tp=2, pp=2, dp=2, cp=2, vp=2, micro_batch_size=1, global_batch_size=16,
            sequence_parallel=True, distributed_optimizer=True)
BREAKS = [dict(tp=3), dict(dp=3), dict(tp=8, cp=1, pp=1, vp=1),
          dict(tp=4, cp=1, pp=1, dp=4, vp=1), dict(pp=1, dp=4),
          dict(pp=8, tp=1, dp=1, vp=1), dict(vp=4), dict(ep=2), dict(ep=2), dict(etp=3),
          dict(etp=2), dict(moe=True, sequence_parallel=False), dict(moe=True, etp=2),
          dict(cp=8, tp=1, dp=1),
          dict(attention_backend="local"), dict(cp_comm_type="a2a"), dict(window=True),
          dict(global_batch_size=15),
          dict(global_batch_size=6),
          dict(recompute="selective", recompute_modules="mla_up_proj"),
          dict(recompute="selective", recompute_modules="layernorm", precision="fp8"),
          dict(overlap_moe_expert_parallel_comm=True),
          dict(moe=True, ep=2, overlap_moe_expert_parallel_comm=True, vp=1),
          dict(moe=True, ep=2, overlap_moe_expert_parallel_comm=True, recompute="full"),
          dict(mtp=True, ep=2, overlap_moe_expert_parallel_comm=True),
          dict(moe=True, moe_token_dispatcher_type="flex"),
          dict(moe_pad_expert_input_to_capacity=True),
          dict(moe_pad_expert_input_to_capacity=True, moe_expert_capacity_factor=1.0,
               moe_token_dispatcher_type="flex"),
          dict(cuda_graph_scope="attn"),
          dict(cuda_graph_impl="transformer_engine", recompute="full"),
          dict(moe=True, ep=2, overlap_moe_expert_parallel_comm=True,
               cuda_graph_impl="transformer_engine"),
          dict(exp_avg_dtype="bf16"),
          dict(use_precision_aware_optimizer=True, distributed_optimizer=False),
          dict(offload_modules="expert_fc1"),
          dict(cpu_offloading_num_layers=12), dict(cpu_offloading_num_layers=4, pp=2),
          dict(cpu_offloading_num_layers=4, recompute="full"),
          dict(cpu_offloading_num_layers=4, offload_modules="core_attn"),
          dict(cpu_offloading_num_layers=4, attention_backend="local"),
          dict(moe_fused_grouped_mlp=True),
          dict(fp8_dot_product_attention=True),
          dict(tp=1, dp=4),
          dict(megatron_fsdp=True, distributed_optimizer=False), dict(overlap_grad_reduce=False)]


def test_base_plan_is_legal_and_each_rule_can_fail():
    model = make_model(name="m", num_layers=12, hidden_size=768, num_attention_heads=12,
                       num_query_groups=6, vocab_size=1024, seq_length=1028)
    moe = make_model(name="moe", num_layers=12, hidden_size=768, num_attention_heads=12,
                     num_query_groups=6, vocab_size=1024, seq_length=1028, num_experts=4,
                     moe_ffn_hidden_size=512)
    windowed = make_model(name="w", num_layers=12, hidden_size=768, num_attention_heads=12,
                          num_query_groups=6, vocab_size=1024, seq_length=1028,
                          window_size=256)
    mtp = dataclasses.replace(moe, name="mtp", mtp_num_layers=2)
    check_plan(model, ParallelPlan(**BASE), 16)
    check_plan(moe, ParallelPlan(**BASE), 16)
    check_plan(windowed, ParallelPlan(**BASE, cp_comm_type="all_gather"), 16)
    assert len(BREAKS) == len(RULES)
    for rule, change in zip(RULES, BREAKS):
        change = dict(change)
        m = moe if change.pop("moe", False) else windowed if change.pop("window", False) \
            else mtp if change.pop("mtp", False) else model
        plan = ParallelPlan(**(BASE | change))
        values = {f.name: getattr(plan, f.name) for f in PLAN_FIELDS}
        assert not bool(rule.ok(m, values, 16)), (rule.name, change)
        with pytest.raises(InputError):
            check_plan(m, plan, 16)


def test_vectorised_rules_equal_scalar_check():
    world, gbs = 16, 32
    rows = []
    for tp, pp, cp, vp, mbs, sp in itertools.product((1, 2, 3, 4), (1, 2, 3, 4), (1, 2),
                                                     (1, 2, 3), (1, 2, 4, 8), (False, True)):
        if world % (tp * pp * cp):
            continue
        rows.append(ParallelPlan(tp=tp, pp=pp, cp=cp, dp=world // (tp * pp * cp), vp=vp,
                                 micro_batch_size=mbs, global_batch_size=gbs,
                                 sequence_parallel=sp, distributed_optimizer=True))
        # pipeline layouts of SMALL's 8 layers: legal ones (3 stages a rank) and ones of the
        # wrong stage count, layer count or order
        for layout in ("Et*2|t*3|t*3L", "Et|tt|tt|t*3L", "Ett|tt|t*4L", "t*8EL", "Et*8L"):
            rows.append(dataclasses.replace(rows[-1], pipeline_model_parallel_layout=layout))
    cols = {f.name: np.array([column_value(f, getattr(p, f.name)) for p in rows],
                             dtype=column_dtype(f))
            for f in PLAN_FIELDS if f.per_candidate}
    cols |= {f.name: getattr(rows[0], f.name) for f in PLAN_FIELDS if not f.per_candidate}
    mask = rules_mask(SMALL, cols, world)
    for ok, p in zip(mask, rows):
        try:
            check_plan(SMALL, p, world)
            legal = True
        except InputError:
            legal = False
        assert bool(ok) == legal, p
    assert 0 < mask.sum() < len(rows)


# -- schedule and placement seams ---------------------------------------------------------

@pytest.mark.parametrize("pp,vp,m", [(1, 1, 8), (4, 1, 8), (4, 2, 8), (8, 4, 64)])
def test_schedule_closed_forms(pp, vp, m):
    assert float(bubble_stage_times(pp, vp)) == pytest.approx((pp - 1) / vp)
    # 1F1B: every send of the bottleneck end stage plus fill and drain; interleaved: only
    # the first microbatch's round trip (steady-state sends overlap compute)
    expected = 0 if pp == 1 else (m + 2 * (pp - 1) if vp == 1 else 2 * (pp * vp - 1))
    assert float(p2p_transfers(pp, vp, m)) == expected


@pytest.mark.parametrize("tp,cp,dp,pp", [(2, 2, 2, 2), (8, 1, 4, 2), (1, 4, 2, 3),
                                         (4, 2, 1, 4)])
def test_rank_groups_match_megatron_rank_generator(tp, cp, dp, pp):
    ps = pytest.importorskip("megatron.core.parallel_state")
    rg = ps.RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order="-".join(RANK_ORDER))
    sizes = {"tp": tp, "cp": cp, "dp": dp, "pp": pp}
    world = tp * cp * dp * pp
    for dims, token in ((("tp",), "tp"), (("cp",), "cp"), (("dp",), "dp"),
                        (("cp", "ep", "dp"), "dp-cp"), (("pp",), "pp")):
        ours = sorted(rank_groups(*group_shape(dims, sizes), world))
        assert ours == sorted(rg.get_ranks(token)), (dims, token)
    assert group_stride("pp", sizes) == tp * cp * dp


def test_cluster_maps_ranks_through_its_placement():
    c = load_cluster("dgx-h100-80gb", nodes=2)
    assert c.placement.gpu_of_rank(11) == (1, 3)
    # ranks 0 and 8 sit on different hosts (one rail), ranks 0 and 1 on one NVSwitch
    assert c.group_busbw(8, 2, 16)[0] == pytest.approx(50e9 * 46.5 / 50)
    assert c.group_busbw(1, 2, 16)[0] == pytest.approx(450e9 * 370 / 450)


# -- plan document and version ------------------------------------------------------------

def _search_out(tmp_path):
    out = tmp_path / "out"
    res = run_cli("search", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--nodes",
                  "1", "--gbs", "32", "--out", out)
    assert res.returncode == 0, res.stderr
    return out


def test_plan_document_says_what_the_plan_was_made_for(tmp_path):
    doc = json.loads((_search_out(tmp_path) / "plan.json").read_text())
    assert doc["schema_version"] == SCHEMA_VERSION
    assert doc["tool"] == {"name": "configurator", "version": __version__}
    assert doc["model"] == MODEL_PRESETS["llama3-8b"].to_dict()
    assert doc["cluster"] == {"name": "dgx-h100-80gb", "gpu": "h100-80gb",
                              "gpus_per_node": 8, "nodes": 1, "num_gpus": 8}
    assert (doc["seq_length"], doc["precision"], doc["global_batch_size"]) == (8192, "bf16", 32)
    read = read_plan_document(doc)
    assert read.plan.to_dict() == doc["plan"] == doc["estimate"]["config"]
    assert read.model == MODEL_PRESETS["llama3-8b"]


def test_launch_reads_new_and_legacy_documents(tmp_path):
    out = _search_out(tmp_path)
    doc = json.loads((out / "plan.json").read_text())
    legacy = {k: doc[k] for k in ("model", "cluster", "estimate")}
    (tmp_path / "legacy.json").write_text(json.dumps(legacy))
    for name, src in (("new", out / "plan.json"), ("legacy", tmp_path / "legacy.json")):
        res = run_cli("launch", "--plan", src, "--out", tmp_path / name)
        assert res.returncode == 0, res.stderr
    assert ((tmp_path / "new" / "launch_torchrun.sh").read_text()
            == (tmp_path / "legacy" / "launch_torchrun.sh").read_text()
            == (out / "launch_torchrun.sh").read_text())


@pytest.mark.parametrize("edit,needle", [
    (lambda d: d["plan"].update(tp="8"), "plan.plan.tp"),
    (lambda d: d["plan"].pop("pp"), "plan.plan.pp"),
    (lambda d: d.update(schema_version=99), "plan.schema_version"),
    (lambda d: d["plan"].update(tp=3), "tp(3) * pp"),
    (lambda d: d["cluster"].pop("gpus_per_node"), "plan.cluster.gpus_per_node"),
    (lambda d: d["estimate"].pop("mfu"), "plan.estimate.mfu"),
    (lambda d: d["estimate"].update(iteration_time_s="fast"), "plan.estimate.iteration_time_s"),
    (lambda d: d.update(model=[]), "plan.model"),
])
def test_launch_rejects_edited_documents_naming_the_field(tmp_path, edit, needle):
    out = _search_out(tmp_path)
    doc = json.loads((out / "plan.json").read_text())
    edit(doc)
    (tmp_path / "edited.json").write_text(json.dumps(doc))
    res = run_cli("launch", "--plan", tmp_path / "edited.json", "--out", tmp_path / "x")
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert needle in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr


# -- placement in the plan document -------------------------------------------------------

def _placed_doc(**placement_args):
    """A plan.json of SMALL_PLAN (tp2 pp2 dp2) on 2 nodes x 4 GPUs with a placement."""
    from configurator.core.document import placement_record, plan_document
    from tests.megatron_argv import SMALL as SMALL4, SMALL_PLAN

    args = dict(hosts=["cn-2", "cn-1"], gpu_order=[[3, 1, 2, 0], [0, 1, 2, 3]],
                excluded_hosts=["cn-3"], method="optimized", iteration_time_s=1.25,
                default_iteration_time_s=1.5, random_median_iteration_time_s=1.75)
    args.update(placement_args)
    estimate = {"iteration_time_s": 1.25, "model_tflops_per_gpu": 10.0, "mfu": 0.1,
                "peak_memory_bytes": 2**30}
    return json.loads(json.dumps(plan_document(
        model=SMALL4, cluster={"name": "c", "gpu": "h100-80gb", "gpus_per_node": 4,
                               "nodes": 2, "num_gpus": 8},
        plan=SMALL_PLAN, estimate=estimate, placement=placement_record(**args))))


def test_plan_document_placement_round_trip():
    from configurator.core.document import PlacementRecord

    doc = _placed_doc()
    assert doc["schema_version"] == SCHEMA_VERSION == 1
    assert doc["placement"] == {"hosts": ["cn-2", "cn-1"],
                                "gpu_order": [[3, 1, 2, 0], [0, 1, 2, 3]],
                                "excluded_hosts": ["cn-3"], "iteration_time_s": 1.25,
                                "default_iteration_time_s": 1.5,
                                "random_median_iteration_time_s": 1.75,
                                "method": "optimized"}
    pl = read_plan_document(doc).placement
    assert pl == PlacementRecord(hosts=("cn-2", "cn-1"),
                                 gpu_order=((3, 1, 2, 0), (0, 1, 2, 3)),
                                 excluded_hosts=("cn-3",), iteration_time_s=1.25,
                                 default_iteration_time_s=1.5,
                                 random_median_iteration_time_s=1.75, method="optimized")
    assert [pl.rank_location(r) for r in (0, 3, 4, 5)] == [("cn-2", 3), ("cn-2", 0),
                                                           ("cn-1", 0), ("cn-1", 1)]
    assert pl.describe() == ("optimized, 2 hosts, excluded cn-3; predicted 1.250 s per "
                             "iteration (default placement 1.500 s, random median 1.750 s)")
    minimal = dict(doc, placement={"hosts": ["a", "b"], "gpu_order": [[0, 1, 2, 3]] * 2})
    pl = read_plan_document(minimal).placement
    assert (pl.excluded_hosts, pl.method, pl.iteration_time_s) == ((), "default", None)
    assert pl.describe() == "default, 2 hosts, no host excluded"
    for absent in (dict(doc, placement=None), {k: v for k, v in doc.items() if k != "placement"}):
        assert read_plan_document(absent).placement is None


def _set(path, value):
    def edit(d):
        obj = d["placement"]
        for k in path[:-1]:
            obj = obj[k]
        obj[path[-1]] = value
    return edit


@pytest.mark.parametrize("edit,needle", [
    (_set(["hosts", 1], "cn-2"), "plan.placement.hosts[1]='cn-2': repeats"),
    (_set(["hosts", 0], "a b"), "plan.placement.hosts[0]='a b': must be a host name"),
    (_set(["hosts", 0], "$(touch x)"), "plan.placement.hosts[0]="),
    (_set(["hosts", 0], "-n"), "plan.placement.hosts[0]='-n'"),
    (_set(["hosts", 0], "a\nb"), "plan.placement.hosts[0]="),
    (_set(["hosts", 0], 7), "plan.placement.hosts[0]=7"),
    (_set(["hosts"], ["cn-1"]), "must name exactly nodes=2 hosts"),
    (_set(["hosts"], "cn-1,cn-2"), "plan.placement.hosts='cn-1,cn-2': must be a list"),
    (_set(["gpu_order", 1], [0, 1, 2, 2]), "plan.placement.gpu_order[1]=[0, 1, 2, 2]: must be "
                                          "a permutation of 0..3"),
    (_set(["gpu_order", 1], [1, 2, 3, 4]), "plan.placement.gpu_order[1]"),
    (_set(["gpu_order", 0], [0, 1]), "plan.placement.gpu_order[0]=[0, 1]"),
    (_set(["gpu_order", 0, 1], True), "plan.placement.gpu_order[0][1]=True"),
    (_set(["gpu_order", 0, 1], 1.0), "plan.placement.gpu_order[0][1]=1.0"),
    (_set(["gpu_order"], [[0, 1, 2, 3]]), "plan.placement.gpu_order"),
    (_set(["excluded_hosts"], ["cn-1"]), "plan.placement.excluded_hosts[0]='cn-1': is "
                                         "hosts[1]"),
    (_set(["excluded_hosts"], ["x", "x"]), "plan.placement.excluded_hosts[1]='x': repeats"),
    (_set(["excluded_hosts", 0], "x;y"), "plan.placement.excluded_hosts[0]='x;y'"),
    (_set(["iteration_time_s"], -1), "plan.placement.iteration_time_s=-1: must be a finite"),
    (_set(["default_iteration_time_s"], "fast"), "plan.placement.default_iteration_time_s"),
    (_set(["random_median_iteration_time_s"], True),
     "plan.placement.random_median_iteration_time_s=True"),
    (_set(["method"], "best"), "plan.placement.method='best': must be one of default, "
                               "optimized, file"),
    (_set(["speedup"], 2), "plan.placement.speedup=2: unknown key"),
    (lambda d: d["placement"].pop("gpu_order"), "plan.placement.gpu_order=None: missing"),
    (lambda d: d.update(placement=["cn-1", "cn-2"]), "plan.placement='list': must be a mapping"),
])
def test_placement_errors_name_the_field(edit, needle):
    doc = _placed_doc()
    edit(doc)
    with pytest.raises(InputError) as err:
        read_plan_document(doc)
    assert needle in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_placement_nan_figure_and_builders_refuse_bad_input():
    from configurator.core.document import placement_record, plan_document
    from tests.megatron_argv import SMALL as SMALL4, SMALL_PLAN

    doc = _placed_doc()
    doc["placement"]["iteration_time_s"] = float("nan")
    with pytest.raises(InputError, match=r"plan\.placement\.iteration_time_s=nan"):
        read_plan_document(json.loads(json.dumps(doc)))
    with pytest.raises(InputError, match=r"placement\.hosts\[1\]"):
        placement_record(["a", "a"], [[0], [0]])
    with pytest.raises(InputError, match=r"placement\.gpu_order"):
        placement_record(["a", "b"], [[0, 1], [0]])
    with pytest.raises(InputError, match=r"placement\.method"):
        placement_record(["a"], [[0]], method="random")
    record = placement_record(["a"], [[1, 0]])
    with pytest.raises(InputError, match=r"placement\.hosts.*nodes=2"):   # 1 host, 2 nodes
        plan_document(model=SMALL4, cluster={"nodes": 2, "gpus_per_node": 4}, plan=SMALL_PLAN,
                      estimate={}, placement=record)


def test_launch_enforces_and_reports_the_placement(tmp_path):
    doc = _placed_doc()
    (tmp_path / "plan.json").write_text(json.dumps(doc))
    res = run_cli("launch", "--plan", tmp_path / "plan.json", "--out", tmp_path / "o",
                  "--nodes", "2")
    assert res.returncode == 0, res.stderr
    placement = [ln for ln in res.stdout.splitlines() if ln.startswith("placement:")]
    assert placement == [(
        "placement: optimized, 2 hosts, excluded cn-3; predicted 1.250 s per iteration "
        "(default placement 1.500 s, random median 1.750 s)")]
    tr = (tmp_path / "o" / "launch_torchrun.sh").read_text()
    sb = (tmp_path / "o" / "launch_slurm.sbatch").read_text()
    assert "cn-2|cn-2.*) NODE_RANK=0 ;;" in tr and "0) export CUDA_VISIBLE_DEVICES=3,1,2,0" in tr
    assert "MASTER_ADDR=${MASTER_ADDR:-cn-2}" in tr
    assert "#SBATCH --nodelist=cn-2,cn-1\n#SBATCH --exclude=cn-3\n" in sb
    res = run_cli("launch", "--plan", tmp_path / "plan.json", "--out", tmp_path / "o3",
                  "--nodes", "3")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "made for 2 nodes" in res.stderr and "configurator search --nodes 3" in res.stderr
    assert not (tmp_path / "o3").exists()
    doc["placement"]["hosts"][1] = "cn-2"
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    res = run_cli("launch", "--plan", tmp_path / "bad.json", "--out", tmp_path / "o2")
    assert res.returncode == 2 and "plan.placement.hosts[1]='cn-2'" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "o2").exists()
    del doc["placement"]
    (tmp_path / "plain.json").write_text(json.dumps(doc))
    res = run_cli("launch", "--plan", tmp_path / "plain.json", "--out", tmp_path / "o4")
    assert res.returncode == 0 and res.stdout.splitlines()[1].startswith(
        "placement: none recorded"), res.stdout
    # then how to start the job: MASTER_ADDR and a node rank on each of the 2 nodes
    assert "MASTER_ADDR=<node_rank 0's address>" in res.stdout and "NODE_RANK 0..1" in res.stdout


def test_launch_help_documents_nodes():
    res = run_cli("launch", "--help")
    assert res.returncode == 0
    assert "another plan" in res.stdout and "search --nodes" in res.stdout


def test_version_flag():
    res = run_cli("--version")
    assert res.returncode == 0 and res.stdout.strip() == f"configurator {__version__}"


# -- GPUs and their efficiencies ----------------------------------------------------------

def _cluster_yaml(tmp_path, gpu: str) -> str:
    f = tmp_path / "c.yaml"
    f.write_text(f"gpu: {gpu}\ngpus_per_node: 8\nnodes: 2\nintra_node_bandwidth_GBps: 300\n"
                 "inter_node_bandwidth_GBps: 25\nintra_node_latency_us: 3\n"
                 "inter_node_latency_us: 6\n")
    return str(f)


def test_unknown_gpu_name_is_an_error_not_h100_figures(tmp_path):
    res = run_cli("search", "--model", "gpt-1.7b", "--cluster",
                  _cluster_yaml(tmp_path, "A100-40GB"), "--gbs", "64")
    assert res.returncode == 2, res.stderr
    assert "gpu='A100-40GB'" in res.stderr and "num_sms" in res.stderr


def test_custom_gpu_needs_its_own_figures(tmp_path):
    figures = ("{name: A100-40GB, peak_tflops: {bf16: 312, fp16: 312}, memory_GiB: 40, "
               "hbm_bandwidth_GBps: 1555}")
    res = run_cli("search", "--model", "gpt-1.7b", "--cluster", _cluster_yaml(tmp_path, figures),
                  "--gbs", "64")
    assert res.returncode == 2 and "gpu.num_sms" in res.stderr, res.stderr


def test_custom_gpu_figures_are_used(tmp_path):
    def cluster(gemm, sms):
        gpu = ("{name: A100-40GB, peak_tflops: {bf16: 312, fp16: 312}, memory_GiB: 40, "
               f"hbm_bandwidth_GBps: 1555, num_sms: {sms}, efficiency: {{gemm: {gemm}, "
               "hbm: 0.8, flash_attention: 0.5, source: 'lab measurement'}}")
        return load_cluster(_cluster_yaml(tmp_path, gpu))
    from configurator.search.evaluate import evaluate_plan

    plan = ParallelPlan(tp=2, dp=8, micro_batch_size=4, global_batch_size=64)
    model = MODEL_PRESETS["gpt-1.7b"]
    base = evaluate_plan(model, cluster(0.6, 108), plan)
    assert evaluate_plan(model, cluster(0.3, 108), plan).time_breakdown_s["compute"] > (
        1.5 * base.time_breakdown_s["compute"])
    assert evaluate_plan(model, cluster(0.6, 100), plan).iteration_time_s != base.iteration_time_s
    assert base.memory_capacity_bytes == 40 * 2**30
    with pytest.raises(InputError, match="gpu.efficiency.gemm"):
        cluster(1.5, 108)


def test_every_preset_gpu_has_efficiencies_with_sources():
    from topology.gpus import GPU_PRESETS

    for gpu in GPU_PRESETS.values():
        eff = dataclasses.asdict(gpu.efficiency)
        low = ("gemm_fp8", "gemm_mxfp8")
        assert all(v is not None for k, v in eff.items() if k not in low), gpu.name
        for key in low:
            prec = key.removeprefix("gemm_")
            assert (eff[key] is None) == (prec not in gpu.peak_flops_per_s), gpu.name
        assert gpu.efficiency.source and gpu.num_sms > 0
