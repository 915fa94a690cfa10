"""The plan field ``pipeline_model_parallel_layout`` (Megatron
``--pipeline-model-parallel-layout``): which decoder layers each virtual pipeline stage
builds, written as ``E``/``t``/``m``/``L`` runs per stage. Parsing and checking follow
megatron/core/transformer/pipeline_parallel_layer_layout.py; a layout prices exactly as the
field-based split that builds the same stages; estimate derives vp from it and, for a model
no field-based split divides (DeepSeek-V3's 61 layers on 16 virtual stages), picks one."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from configurator.core.plan_batch import PlanBatch
from configurator.core.errors import InputError
from configurator.core.layers import (LAYOUT_MAX_EXPANDED, LayoutError, format_layout,
                                      layout_problem, layout_text, parse_layout,
                                      virtual_stage_layers)
from configurator.core.model_presets import MODEL_PRESETS
from configurator.core.plan import ParallelPlan, plan_from_dict
from configurator.core.rules import check_plan, plan_for_world
from configurator.cost.groundtruth import bridge_layout
from configurator.cost.iteration import iteration_time
from configurator.search.rank import best_layer_split
from configurator.search.engine import peak_memory
from configurator.search.space import layout_splits
from launchers import render_slurm_script, render_torchrun_script
from launchers.megatron_flags import flag_argv, megatron_flags
from tests.conftest import run_cli
from tests.test_megatron_log import DENSE_TEXT, one, with_args
from topology.cluster_files import load_cluster

DSV3 = MODEL_PRESETS["deepseek-v3"]
LLAMA8 = MODEL_PRESETS["llama3-8b"]


def test_parse_unrolls_as_megatron_does():
    """The examples of Megatron's ``parse_str_to_list`` docstring and ``--help``: commas are
    cosmetic, ``(…)*n`` repeats stages, ``x*n`` layers, an empty stage stays."""
    assert parse_layout("Ettt|(tt|)*29,m|L") == ("Ettt",) + ("tt",) * 29 + ("m", "L")
    assert parse_layout("E|(t|)*3,m|m||L") == ("E", "t", "t", "t", "m", "m", "", "L")
    assert parse_layout("Et*4|(t*4|)*14tmL") == ("Etttt",) + ("tttt",) * 14 + ("tmL",)


@pytest.mark.parametrize("text, words", [
    ("Et;L", "character ';'"), ("E t L", "character ' '"),
    ("E((t|)*2)*2L", "left after unrolling"), ("E(t|)*9999999999L", "more than"),
    ("(t|)*60000|L", "more than")])
def test_parse_refuses_what_megatron_cannot_read_and_bounds_the_expansion(text, words):
    t0 = time.perf_counter()
    with pytest.raises(LayoutError, match=words.replace("(", r"\(")):
        parse_layout(text)
    assert time.perf_counter() - t0 < 1.0        # refused before the repeat is built
    assert LAYOUT_MAX_EXPANDED == 100_000


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=40), st.integers(0, 3))
def test_format_reads_back_to_the_same_stages(counts, mtp):
    text = format_layout(counts, mtp)
    stages = parse_layout(text)
    assert [s.count("t") for s in stages] == counts
    flat = "".join(stages)
    assert flat.startswith("E") and flat.endswith("m" * mtp + "L") and flat.count("E") == 1


def test_format_writes_megatron_bridges_layouts():
    """Megatron-Bridge's DeepSeek-V3 layouts, as its recipes spell them."""
    assert format_layout([4] * 15 + [1], 1) == "Et*4|(t*4|)*14tmL"
    assert format_layout([1] + [2] * 30 + [0], 1) == "Et|(tt|)*30mL"
    assert bridge_layout(DSV3, 16) == "Et*4|(t*4|)*14tmL"
    assert bridge_layout(DSV3, 32) == "Et|(tt|)*30mL"
    assert bridge_layout(DSV3, 12) == "" and bridge_layout(LLAMA8, 16) == ""


@pytest.mark.parametrize("layout, pp, vp, words", [
    ("Et*4|(t*4|)*14tmL", 4, 4, None),
    ("Et*4|(t*4|)*14tmL", 3, 1, "must be divisible by pp (3)"),
    ("Et*4|(t*4|)*14tmL", 4, 2, "make vp 4, not 2"),
    ("t*4E|(t*4|)*14tmL", 4, 4, "'E' must open the first stage"),
    ("Et*4|(t*4|)*14tmLL", 4, 4, "'L' must close the last stage"),
    ("Et*4|(t*4|)*14ttmL", 4, 4, "62 decoder layers"),
    ("Et*4|(t*4|)*14tL", 4, 4, "0 MTP layers"),
    ("Et*4|(t*4|)*13t*3m|ttL", 4, 4, "in the loss's stage"),
    ("Et*4|(t*4|)*14mtL", 4, 4, "must follow every decoder layer")])
def test_layout_rules(layout, pp, vp, words):
    problem = layout_problem(layout, 61, 1, pp, vp)
    assert (problem is None) if words is None else (words in problem), problem


def _price(model, plan, cluster="dgx-h100-80gb"):
    c = PlanBatch.from_plan(plan)
    cl = load_cluster(cluster) if isinstance(cluster, str) else cluster
    return (float(iteration_time(model, cl, c)["iteration_time_s"][0]),
            float(peak_memory(model, c, non_tn_fp8_gemm=cl.gpu.non_tn_fp8_gemm)[0]))


@pytest.mark.parametrize("fields, layout", [
    # uneven 6 / 8 / 8 / 10 over pp 4
    (dict(pp=4, vp=1, decoder_first_pipeline_num_layers=6,
          decoder_last_pipeline_num_layers=10), "Et*6|t*8|t*8|t*10L"),
    # uneven with vp 2: rank 0 three layers a chunk, rank 3 one, the middle six; stages in
    # virtual-stage order j·pp + r
    (dict(pp=4, vp=2, decoder_first_pipeline_num_layers=6,
          decoder_last_pipeline_num_layers=2), "Et*3|t*6|t*6|t|t*3|t*6|t*6|tL"),
    # 32 + embedding + loss = 34 slots over pp 2 x vp 17: empty first and last stages
    (dict(pp=2, vp=17, account_for_embedding_in_pipeline_split=True,
          account_for_loss_in_pipeline_split=True), "E|(t|)*32L")])
def test_a_layout_prices_as_the_field_split_that_builds_the_same_stages(fields, layout):
    base = dict(tp=1, cp=1, micro_batch_size=1, global_batch_size=64,
                distributed_optimizer=True)
    split = ParallelPlan(**base, dp=8 // fields["pp"] * 2, **fields)
    laid = dataclasses.replace(
        split, decoder_first_pipeline_num_layers=0, decoder_last_pipeline_num_layers=0,
        account_for_embedding_in_pipeline_split=False,
        account_for_loss_in_pipeline_split=False, pipeline_model_parallel_layout=layout)
    check_plan(LLAMA8, split, split.world_size)
    check_plan(LLAMA8, laid, laid.world_size)
    assert virtual_stage_layers(32, *split.layer_split) == virtual_stage_layers(
        32, *laid.layer_split)
    assert _price(LLAMA8, laid) == _price(LLAMA8, split)


def test_a_heavier_stage_slows_the_plan_and_raises_its_memory():
    """Moving two layers onto the last stage (it also runs the loss) lengthens the pace and
    puts more weights on that rank."""
    even = ParallelPlan(tp=1, pp=4, dp=4, micro_batch_size=1, global_batch_size=64,
                        distributed_optimizer=True,
                        pipeline_model_parallel_layout="Et*8|t*8|t*8|t*8L")
    heavy = dataclasses.replace(even, pipeline_model_parallel_layout="Et*7|t*7|t*8|t*10L")
    (t_even, _), (t_heavy, _) = _price(LLAMA8, even), _price(LLAMA8, heavy)
    assert t_heavy > t_even * 1.05


def test_plan_rules_name_the_field_and_the_rule():
    plan = ParallelPlan(tp=1, pp=4, vp=4, dp=64, ep=64, micro_batch_size=1,
                        global_batch_size=4096, distributed_optimizer=True,
                        pipeline_model_parallel_layout="Et*4|(t*4|)*14tmL")
    check_plan(DSV3, plan, 256)
    for change, words in (
            (dict(vp=2), "make vp 4, not 2"),
            (dict(decoder_first_pipeline_num_layers=4), "does not combine"),
            (dict(pipeline_model_parallel_layout="Et*4|(t*4|)*14tL"), "0 MTP layers")):
        with pytest.raises(InputError) as err:
            check_plan(DSV3, dataclasses.replace(plan, **change), 256)
        assert err.value.field == "pipeline_model_parallel_layout" and words in err.value.rule


def test_vp_is_derived_from_the_layout_when_not_given():
    fields = dict(tp=1, pp=2, micro_batch_size=1, global_batch_size=4096, ep=32,
                  pipeline_model_parallel_layout="Et*4|(t*4|)*14tmL")
    assert plan_for_world(fields, 256).vp == 8
    assert plan_for_world(dict(fields, vp=4), 256).vp == 4      # given: checked, not changed


def test_estimate_picks_a_layout_where_no_field_split_exists():
    """61 layers over pp 4 x vp 4: no even, uneven or accounted split; estimate picks the
    fastest fitting layout of :func:`layout_splits` (end stages up to 4 layers lighter)."""
    options = layout_splits(DSV3, 4, 4)
    assert "Et*4|(t*4|)*14tmL" in options and len(options) == 4
    assert layout_splits(LLAMA8, 2, 1) == []
    cluster = load_cluster("gb200-nvl72", nodes=64)
    plan = plan_for_world(dict(tp=1, pp=4, vp=4, ep=64, micro_batch_size=1,
                               global_batch_size=4096, precision="mxfp8"), 256)
    chosen = best_layer_split(DSV3, cluster, plan)
    assert chosen.pipeline_model_parallel_layout in options
    priced = [_price(DSV3, dataclasses.replace(plan, pipeline_model_parallel_layout=x),
                     cluster) for x in options]
    fitting = [t for t, mem in priced if mem <= cluster.gpu.memory_bytes]
    assert fitting and _price(DSV3, chosen, cluster)[0] == pytest.approx(min(fitting))
    check_plan(DSV3, chosen, 256)


def test_launch_flags_carry_the_layout_and_no_vp_flag():
    plan = ParallelPlan(tp=1, pp=4, vp=4, dp=64, ep=64, micro_batch_size=1,
                        global_batch_size=4096, distributed_optimizer=True,
                        pipeline_model_parallel_layout="Et*4|(t*4|)*14tmL")
    argv = flag_argv(megatron_flags(DSV3, plan))
    i = argv.index("--pipeline-model-parallel-layout")
    assert argv[i + 1] == "Et*4|(t*4|)*14tmL"
    assert "--num-virtual-stages-per-pipeline-rank" not in argv
    assert "--num-layers-per-virtual-pipeline-stage" not in argv
    assert not {"--decoder-first-pipeline-num-layers",
                "--account-for-embedding-in-pipeline-split"} & set(argv)
    doc = plan.to_dict()
    assert plan_from_dict(doc) == plan and doc["layout"] == "Et*4|(t*4|)*14tmL"
    old = {k: v for k, v in doc.items() if k not in ("layout", "pipeline_model_parallel_layout")}
    assert plan_from_dict(old).pipeline_model_parallel_layout == ""


def test_cli_estimate_scripts_and_errors(tmp_path):
    args = ["--model", "deepseek-v3", "--cluster", "gb300-nvl72", "--nodes", "64",
            "--gbs", "4096", "--tp", "1", "--pp", "2", "--ep", "32", "--mbs", "1",
            "--precision", "mxfp8"]
    res = run_cli("estimate", *args, "--pipeline-model-parallel-layout",
                  "Et*4|(t*4|)*14tmL", "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["config"]["vp"] == 8 and doc["config"]["layout"] == "Et*4|(t*4|)*14tmL"
    res = run_cli("estimate", *args, "--vp", "8")        # no layout given: one is chosen
    assert res.returncode == 0 and "layer split chosen: layout E" in res.stdout, res.stderr
    for bad, words in (("Et*4|(t*4|)*14tmL;rm", "character ';'"),
                       ("Et*4|(t*4|)*14tL", "0 MTP layers"),
                       ("E(t|)*99999999999L", "more than 100,000")):
        res = run_cli("estimate", *args, "--pipeline-model-parallel-layout", bad)
        assert res.returncode == 2, res.stderr
        line = res.stderr.strip()
        assert "\n" not in line and "--pipeline-model-parallel-layout=" in line and words in line
    plan = ParallelPlan(**{k: doc["config"][k] for k in (
        "tp", "pp", "vp", "dp", "ep", "micro_batch_size", "global_batch_size", "precision",
        "distributed_optimizer", "pipeline_model_parallel_layout")})
    for render, name in ((render_torchrun_script, "t.sh"), (render_slurm_script, "s.sbatch")):
        text = render(DSV3, plan, nodes=64, gpus_per_node=4)
        assert "'Et*4|(t*4|)*14tmL'" in text            # one quoted word
        (tmp_path / name).write_text(text)
        assert subprocess.run(["bash", "-n", str(tmp_path / name)]).returncode == 0


def test_megatron_log_and_run_files_read_the_layout(tmp_path):
    text = with_args(DENSE_TEXT, virtual_pipeline_model_parallel_size="2",
                     pipeline_model_parallel_layout="Et*8|t*8|t*8|t*8L")
    run = one(text)
    assert run.plan.pipeline_model_parallel_layout == "Et*8|t*8|t*8|t*8L"
    assert run.plan.vp == 2
    csv = tmp_path / "runs.csv"
    csv.write_text("model,cluster,num_gpus,tp,pp,mbs,gbs,precision,layout,ep,"
                   "iteration_time_s\n"
                   "deepseek-v3,gb300-nvl72,256,1,2,1,4096,mxfp8,Et*4|(t*4|)*14tmL,32,10\n")
    res = run_cli("validate", csv, "--json")
    assert res.returncode == 0, res.stderr
    (row,) = json.loads(res.stdout)["runs"]
    assert row["predicted_iteration_time_s"] > 0


@pytest.mark.skipif(not os.environ.get("MEGATRON_LM_SRC"),
                    reason="needs MEGATRON_LM_SRC (a Megatron-LM core_v0.16.1 checkout)")
def test_parse_agrees_with_megatrons_parser():
    """Megatron's own ``parse_str_to_list`` on the same strings (its module imports only the
    standard library and megatron.core.parallel_state, stubbed here)."""
    src = os.environ["MEGATRON_LM_SRC"]
    strings = ["Et*4|(t*4|)*14tmL", "Et|(tt|)*30mL", "E|(t|)*3,m|m||L", "Ettt|(tt|)*29,m|L",
               format_layout([3, 0, 5, 5, 2], 2), "(t|)*3E,L"]
    code = f"""
import importlib.util, json, sys, types
for name in ("megatron", "megatron.core", "megatron.core.transformer"):
    sys.modules[name] = types.ModuleType(name)
sys.modules["megatron.core"].parallel_state = types.ModuleType("ps")
spec = importlib.util.spec_from_file_location("megatron.core.transformer.enums",
    "{src}/megatron/core/transformer/enums.py")
enums = importlib.util.module_from_spec(spec); spec.loader.exec_module(enums)
sys.modules["megatron.core.transformer.enums"] = enums
spec = importlib.util.spec_from_file_location("lay",
    "{src}/megatron/core/transformer/pipeline_parallel_layer_layout.py")
lay = importlib.util.module_from_spec(spec); spec.loader.exec_module(lay)
names = {{"embedding": "E", "loss": "L", "decoder": "t", "mtp": "m"}}
out = [["".join(names[x.name] for x in st) for st in
        lay.PipelineParallelLayerLayout.parse_str_to_list(s)] for s in {strings!r}]
print(json.dumps(out))
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(res.stdout) == [list(parse_layout(s)) for s in strings]
    assert np.all([len(parse_layout(s)) > 0 for s in strings])


def test_search_reaches_the_layouts_megatron_bridge_runs_deepseek_v3_with():
    """61 layers split over no pp·vp > 2 of Bridge's DeepSeek-V3 plans by the fields; with
    layouts the search ranks pp 4 x vp 4 and pp 2 x vp 8, and the layouts it finds there
    include the one Bridge's recipes use (16 stages, ``Et*4|(t*4|)*14tmL``). Every ranked
    plan passes the plan rules."""
    from configurator.search.rank import search
    from configurator.search.space import SearchSpace, enumerate_plans
    cluster = load_cluster("gb300-nvl72", nodes=64)
    space = SearchSpace(tp=(1,), cp=(1,), ep=(32, 64), mbs=(1,), recompute=("none",),
                        pp=(2, 4))
    cand = enumerate_plans(DSV3, 256, 4096, space=space, precision="mxfp8")
    reached = {(int(p), int(v), layout_text(x)) for p, v, x in zip(cand.pp, cand.vp,
                                                                     cand.layout)}
    assert (4, 4, "Et*4|(t*4|)*14tmL") in reached and (2, 8, "Et*4|(t*4|)*14tmL") in reached
    # by the fields, vp > 1 only where 61 + 1 accounted slot = 62 = 2 x 31
    assert {(p, v) for p, v, x in reached if v > 1 and not x} == {(2, 31)}
    result = search(DSV3, cluster, 4096, space=space, top_k=5, precision="mxfp8")
    for e in result.plans:
        check_plan(DSV3, e.plan, 256)
    best = result.plans[0].plan
    assert best.vp > 1 and best.pipeline_model_parallel_layout
