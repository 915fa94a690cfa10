"""The plan batch (configurator.core.plan_batch): its attributes come from the plan schema,
its derived terms are the plan_terms functions', a plan survives the round trip, and pipeline
layout codes do not depend on what a process saw first."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from configurator.core import plan_terms
from configurator.core.layers import layout_code, layout_text
from configurator.core.plan import PLAN_FIELDS, ParallelPlan
from configurator.core.plan_batch import COLUMN_FIELDS, PlanBatch


def test_every_plan_field_is_a_documented_attribute():
    for f in PLAN_FIELDS:
        for name in filter(None, (f.name, f.alias)):
            prop = getattr(PlanBatch, name)
            assert isinstance(prop, property) and f.help in prop.__doc__, name
        assert f.name in PlanBatch.__annotations__


def test_a_plan_round_trips_and_derived_terms_are_plan_terms():
    plan = ParallelPlan(tp=4, pp=2, dp=2, cp=2, vp=2, micro_batch_size=2, global_batch_size=64,
                        recompute="selective", recompute_modules="core_attn,mlp",
                        precision="fp8", distributed_optimizer=True, fp8_param_gather=True,
                        grad_reduce_in_bf16=True)
    b = PlanBatch.from_plan(plan)
    assert len(b) == 1 and b.plan(0) == plan
    assert b.tp.tolist() == [4] and b.mbs.tolist() == [2] and b.precision == "fp8"
    assert b.num_microbatches.tolist() == [64 // (2 * 2)]
    assert b.recompute_code.tolist() == [int(plan_terms.recompute_code("selective",
                                                                       "core_attn,mlp"))]
    assert b.main_grad_bytes == plan_terms.main_grad_bytes("fp8", True) == 2.0
    assert bool(b.fp8_weights_gathered[0])
    assert b.optimizer_bytes_per_parameter == plan_terms.optimizer_state_bytes(plan) == 12.0


def test_of_builds_columns_from_values_and_defaults():
    b = PlanBatch.of(tp=[1, 2, 4], pp=2, recompute=["none", "full", "selective"], gbs=16,
                     dp=[1, 2, 4])
    assert len(b) == 3
    assert b.pp.tolist() == [2, 2, 2]
    assert b.num_microbatches.tolist() == [16, 8, 4]
    assert [b.plan(i).recompute for i in range(3)] == ["none", "full", "selective"]
    defaults = {f.name: f.default for f in COLUMN_FIELDS}
    assert b.plan(0).ep == defaults["ep"] and b.global_batch_size == 16
    with pytest.raises(ValueError, match="unknown plan field"):
        PlanBatch.of(tensor_parallel=2)
    with pytest.raises(ValueError, match="different lengths"):
        PlanBatch.of(tp=[1, 2], pp=[1, 2, 4])


def test_layout_codes_are_the_same_whatever_a_process_saw_first():
    layouts = ["Et|(tt|)*30L", "E|t*31|L", ""]
    codes = [layout_code(x) for x in layouts]
    assert codes[2] == 0 and len(set(codes)) == 3
    assert [layout_text(c) for c in codes] == layouts
    other = subprocess.run(
        [sys.executable, "-c",
         "from configurator.core.layers import layout_code as c; c('tt|L'); c('E|tL');"
         f"print([c(x) for x in {layouts!r}])"],
        capture_output=True, text=True, check=True)
    assert other.stdout.strip() == str(codes)
    column = PlanBatch.of(layout=layouts[:2], pp=2).columns["pipeline_model_parallel_layout"]
    assert column.tolist() == codes[:2] and column.dtype == np.int64
