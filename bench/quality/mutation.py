"""Mutation score of the memory model and the cost model: small wrong formulas (an operator
swapped, a constant off by 10 %, a term dropped, a condition negated) that the tests must
catch.

Run: ``python -m bench.quality.mutation [--sample 200] [--seed 0] [--tests map|wide|all]
[--modules SUBSTRING ...] [--list]``. The mutation sites of ``memory_model/*.py`` and
``configurator/cost/*.py`` are enumerated from their syntax trees (:func:`sites`): ``+``↔``-``,
``*``↔``/``, ``//``→``/``; ``<``↔``<=``, ``>``↔``>=``, ``==``↔``!=``, ``is``↔``is not``,
``in``↔``not in``; a number operand (or a module constant) ×1.1; ``and``↔``or``; one term of
a sum or difference dropped; ``not``/``~`` removed, an ``if`` test negated, ``True``↔``False``.
``--sample`` of them are drawn with ``--seed``; each is written into one scratch copy of the
repository (the worktree is never touched) and the tests that exercise its module
(:data:`TEST_MAP`) run in a forked process (numpy and pytest preloaded; ``pytest -x -q -p
no:cacheprovider``) under a timeout of four times the unmutated run plus 10 s. With ``--tests
wide`` (the default) a mutant they leave alive then runs against the wider files
:data:`WIDE_TESTS` (goldens, the pricings' guard, published runs); ``--tests all`` runs the
whole suite instead. A mutant is killed when a test fails (a timeout counts as killed, shown
apart). Known equivalent mutants (:data:`EQUIVALENT`, each with why) are left out of the
score and listed. Prints a table per module, the score, every survivor and the equivalents.
"""

from __future__ import annotations

import ast
import copy
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import bench_parser, table_head

ROOT = Path(__file__).resolve().parents[2]
#: Folders whose modules are mutated (``__init__.py`` left out).
TARGETS = ("memory_model", "configurator/cost")

#: Exact-value tests of the formulas (independent derivations), run for every module.
FORMULA_TESTS = ["tests/test_formulas_exact.py"]
#: Tests run against each module's mutants: fast files that exercise it (seconds each).
TEST_MAP: dict[str, list[str]] = {
    "memory_model/activations.py": ["tests/test_memory_model.py", "tests/test_fp8_memory.py",
                                    "tests/test_formulas_memory.py",
                                    "tests/test_softmax_path.py"],
    "memory_model/estimate.py": ["tests/test_memory_model.py", "tests/test_fp8_memory.py",
                                 "tests/test_experts_and_splits.py",
                                 "tests/test_formulas_memory.py"],
    "memory_model/params.py": ["tests/test_memory_model.py", "tests/test_experts_and_splits.py",
                               "tests/test_formulas_memory.py"],
    "configurator/cost/communication.py": ["tests/test_timing.py",
                                           "tests/test_recipe_mechanisms.py",
                                           "tests/test_formulas_cost.py"],
    "configurator/cost/compute.py": ["tests/test_timing.py", "tests/test_recipe_mechanisms.py",
                                     "tests/test_formulas_cost.py", "tests/test_softmax_path.py"],
    "configurator/cost/expert_comm.py": ["tests/test_recipe_mechanisms.py",
                                         "tests/test_timing.py", "tests/test_formulas_cost.py"],
    "configurator/cost/flops.py": ["tests/test_timing.py", "tests/test_formulas_cost.py"],
    "configurator/cost/gemm.py": ["tests/test_gemm_model.py", "tests/test_timing.py",
                                  "tests/test_formulas_cost.py"],
    "configurator/cost/groundtruth.py": ["tests/test_published_runs_record.py",
                                         "tests/test_sc21_accuracy.py",
                                         "tests/test_formulas_cost.py"],
    "configurator/cost/host_ops.py": ["tests/test_eager_mlp_ops.py",
                                      "tests/test_formulas_cost.py"],
    "configurator/cost/iteration.py": ["tests/test_timing.py", "tests/test_recipe_mechanisms.py",
                                       "tests/test_experts_and_splits.py",
                                       "tests/test_formulas_cost.py",
                                       "tests/test_backward_overlap.py"],
    "configurator/cost/measured.py": ["tests/test_profile.py", "tests/test_formulas_cost.py"],
    "configurator/cost/moe_compute.py": ["tests/test_recipe_mechanisms.py",
                                         "tests/test_timing.py", "tests/test_formulas_cost.py"],
    "configurator/cost/placed.py": ["tests/test_measured_links.py",
                                    "tests/test_experts_and_splits.py",
                                 "tests/test_formulas_memory.py"],
    "configurator/cost/schedule_sim.py": ["tests/test_schedule_sim.py",
                                          "tests/test_formulas_memory.py"],
    "configurator/cost/training_time.py": ["tests/test_training_time.py",
                                           "tests/test_formulas_memory.py"],
}

#: The second stage: a mutant the module's own files leave alive runs against these wider
#: files of the suite (every mapped file, the goldens, the two pricings' guard, the published
#: runs), about 40 s unmutated; a failure there kills it too ("killed by the suite").
WIDE_TESTS = sorted({t for files in TEST_MAP.values() for t in files} | {
    "tests/test_golden.py", "tests/test_placed.py", "tests/test_host_local.py",
    "tests/test_published_runs_record.py", "tests/test_sc21_accuracy.py",
    "tests/test_signatures.py", "tests/test_plan_batch.py", "tests/test_moe_load_imbalance.py"})

#: Slow tests (searches, fits, torch runs: seconds each) left out of the mutants' runs.
DESELECT = [
    "tests/test_fp8_memory.py::test_fp8_param_gather_plan_field_makes_the_recipe_fit",
    "tests/test_experts_and_splits.py::test_estimate_chooses_and_reports_a_split",
    "tests/test_experts_and_splits.py::test_search_restricted_to_ep_values",
    "tests/test_profile.py::test_estimate_and_search_use_the_profiled_layer_times",
    "tests/test_profile.py::test_fp8_profile_on_cpu_names_its_backend",
    "tests/test_profile.py::test_profile_tiny_model_on_cpu_round_trips",
    "tests/test_calibrate_fit.py::test_link_efficiency_is_fitted_where_the_runs_determine_it",
    "tests/test_calibrate_fit.py::test_calibrate_never_fits_an_efficiency_above_one_on_the_"
    "published_blackwell_runs",
    "tests/test_calibrate_fit.py::test_undetermined_parameters_name_the_run_that_would_"
    "determine_them",
    "tests/test_calibrate_fit.py::test_calibration_file_round_trips_intervals_and_applies_"
    "link_efficiencies",
    "tests/test_measured_links.py::test_thousands_of_hosts_stay_sparse",
    "tests/test_eager_mlp_ops.py::test_megatron_core_bias_moves_the_priced_bytes_on_the_cpu",
    "tests/test_formulas_memory.py::test_parameter_tensor_counts_match_megatron_core_layers",
]

_MEMO_ONLY = ("the test only decides when the memo of simulated makespans is emptied before "
              "the new rows are simulated; every row is then read from it, simulated alike")
_WALKS = ("the size only picks the op-by-op walk over the level-by-level one, which do the "
          "same float operations per op in the same order")
_CACHE = ("it only decides which rank finishes the cache keeps or drops (or whether it is "
          "read-only); its key holds the whole inputs, so a hit returns what the walk computes")
_MINLENGTH = ("bincount's length is the largest level plus one whatever a smaller minlength "
              "asks (never negative: a backward follows its forward, so that level is >= 1)")
_SLICES = ("the size only decides whether replicas are walked in slices of MAX_CELLS cells, "
           "each replica's walk the same floats either way (record, the other operand, "
           "is not mutated here)")
#: Known equivalent mutants: ``(file, text on the line, mutation, why equivalent)``. A
#: sampled site matches when its file and mutation are these and its source line contains
#: the text; it is left out of the score.
EQUIVALENT: list[tuple[str, str, str, str]] = [
    ("memory_model/params.py", "tp.size > 64", "constant 64 ×1.1",
     "the size only picks the table lookup over the division; both give the same integers"),
    ("memory_model/params.py", "tp.size > 64", "`>` → `>=`",
     "the size only picks the table lookup over the division; both give the same integers"),
    ("memory_model/params.py", "if 0 < hi <= 4096", "constant 4096 ×1.1",
     "the bound only limits the lookup table's length; the integers are the same"),
    ("memory_model/params.py", "int(tp.min()) > 0", "`>` → `>=`",
     "tp is at least 1, so the test holds either way"),
    ("memory_model/params.py", "mult = VOCAB_DIVISIBLE_BY * np.arange(1, hi + 1, dtype=tp.dtype)",
     "constant 1 ×1.1",
     "an integer arange: a start of 1.1 is cast to the same 1, 2, ..., and an end of hi + 1.1 "
     "adds at most one entry, past every tp looked up"),
    ("memory_model/params.py", "if 0 < hi <= 4096 and int(tp.min()) > 0:", "`and` → `or`",
     "tp is at least 1, so min > 0 holds and `or` only takes the table for a tp above 4,096 "
     "too: the same integers from a longer table"),
    ("configurator/cost/placed.py", "first % G + G * backward", "`+` → `-`",
     "the key indexes arrays of 2·G entries (lowest, code): first % G − G lands, by NumPy's "
     "negative indexing, on the same entry G + first % G does"),
    ("configurator/cost/placed.py", "first % G + G * backward", "drop term `G * backward`",
     "on a uniform cluster (the only one keyed) of more GPUs than a host, a send from the "
     "last stage round to the first always leaves its host, and so does a forward send "
     "from the same residue (the last stage holds a host's last S places, r + S >= G); "
     "backward likewise (the first stage's residues are below S): the direction never "
     "changes which pairs share a host, only which entry of the 2·G key they take"),
    ("configurator/cost/iteration.py", 'live = cls["count"] > 0', "`>` → `>=`",
     "the classes of count 0 are stage_class_arrays' padding, copies of class 0 (whose own "
     "entry has a count): taking them too changes neither the pacing stage's time nor the "
     "sum, where their count multiplies by 0"),
    ("memory_model/estimate.py", "return np.where(cp > 1, 2.0 * full * (cp - 1) / cp, 0.0)",
     "`>` → `>=`", "at cp 1 the gathered share (cp − 1)/cp is 0: both branches give 0"),
    ("configurator/cost/placed.py", "if plain_1f1b and pp > 1:", "`>` → `>=`",
     "at pp 1 the sends are zeros (terms_many prices them only where pp > 1) and the slices "
     "`:pp - 1` and `1:` of one stage are empty: folding them in changes nothing"),
    ("configurator/cost/expert_comm.py", "return np.where(n > 1, flex, 0.0)", "constant 1 ×1.1",
     "ep is an integer: n > 1.1 holds where n > 1 does"),
    ("configurator/cost/communication.py", "if G > 1 else", "constant 1 ×1.1",
     "GPUs per NVLink domain are an integer: G > 1.1 holds where G > 1 does"),
    ("configurator/cost/schedule_sim.py", "return SimResult(t1 + (m - m1) // k", "`//` → `/`",
     "m − m1 = m − m mod k − 2k is a multiple of k: the quotient is exact either way"),
    ("configurator/cost/schedule_sim.py", "_levels: tuple = field(repr=False", "`False` → `True`",
     "the field's repr flag changes only the object's repr"),
    ("configurator/cost/schedule_sim.py", "if len(sizes) > 1:", "constant 1 ×1.1",
     "a set's length is an integer: > 1.1 holds where > 1 does"),
    ("configurator/cost/schedule_sim.py",
     "D * (dur_src.shape[1] + lat_src.shape[1]) <= _RANK_ENDS_KEY_FLOATS", "`+` → `-`",
     "the size only decides which inputs the rank-finish cache keeps; its key holds the "
     "whole inputs, so a hit returns what the walk computes"),
    ("configurator/cost/placed.py", "if rep is None and self.table.host_level:",
     "`is` → `is not`",
     "it only swaps host_ring_figures, the representatives' figures and ring_figures, which "
     "give the same numbers (tests/test_measured_links.py checks host_ring_figures against "
     "ring_figures)"),
    # memory_model, configurator/cost/{placed,schedule_sim,training_time}.py
    ("memory_model/activations.py", "= 0.0 * xh", "`*` → `/`",
     "0·xh and 0/xh are the same zeros of xh's shape (xh = s·b·h > 0)"),
    ("memory_model/params.py", "if tp.ndim == 1 and tp.size > 64", "`==` → `!=`",
     "the shape only picks the table lookup over the division for an integer column; "
     "np.take keeps any shape and both give the same integers"),
    ("memory_model/params.py", "if tp.ndim == 1 and tp.size > 64", "constant 1 ×1.1",
     "it only sends every column to the division, which gives the table's integers"),
    ("memory_model/params.py", "np.where(pp > 1, embedding_parameters", "constant 1 ×1.1",
     "pp is an integer: pp > 1.1 holds where pp > 1 does"),
    ("memory_model/params.py", "(np.asarray(pp) > 1)", "constant 1 ×1.1",
     "pp is an integer: pp > 1.1 holds where pp > 1 does"),
    ("memory_model/params.py", "untie_embeddings_and_output_weights | (pp > 1)",
     "constant 1 ×1.1", "pp is an integer: pp > 1.1 holds where pp > 1 does"),
    ("memory_model/estimate.py", "return np.where(cp > 1, 2.0 * full", "constant 1 ×1.1",
     "cp is an integer: cp > 1.1 holds where cp > 1 does"),
    ("configurator/cost/placed.py", "rep, inv = by_residue(a, b < a)", "`<` → `<=`",
     "a send joins the GPUs of two pipeline stages, two ranks on two GPUs: b = a never "
     "occurs, so b < a and b <= a agree"),
    ("configurator/cost/placed.py", "if plain_1f1b and pp > 1:", "constant 1 ×1.1",
     "pp is an integer: pp > 1.1 holds where pp > 1 does"),
    ("configurator/cost/placed.py", "if pp > 1:", "constant 1 ×1.1",
     "pp is an integer: pp > 1.1 holds where pp > 1 does"),
    ("configurator/cost/placed.py", "if cp > 1:", "`>` → `>=`",
     "at cp = 1 the context ring's single-send figures and members per domain feed only "
     "configurator.cost.iteration.cp_layer_s, which is 0 there (np.where(cp > 1, ...))"),
    ("configurator/cost/placed.py", "if cp > 1:", "constant 1 ×1.1",
     "cp is an integer: cp > 1.1 holds where cp > 1 does"),
    ("configurator/cost/iteration.py", "return np.where(cp > 1, fwd, 0.0), np.where(cp > 1, bwd",
     "constant 1 ×1.1", "cp is an integer: cp > 1.1 holds where cp > 1 does"),
    ("configurator/cost/placed.py", "if not self.uniform or first.size <= G:", "`<=` → `<`",
     "at a size of G rows it only picks the residue path over the row-by-row one on a "
     "uniform cluster, where both give every row its own figures (tests/"
     "test_formulas_memory.py checks the residue path against links looked up pair by pair)"),
    ("configurator/cost/schedule_sim.py", "end = np.zeros((n + 1, D))", "drop term `1`",
     "ops are numbered by level and op n − 1 is in the last level, which reads its "
     "predecessors before it writes: row n − 1 doubles as the sentinel and is still 0 "
     "whenever read, and end[:n] is the same array"),
    ("configurator/cost/schedule_sim.py", "t1 = simulate(f, b, pf, pb, m1, tail_s=tl, _exact=True)",
     "`True` → `False`",
     "m1 = 2k + m mod k has no smaller extrapolation base (_extrapolation_base gives m1 "
     "itself), so without _exact the call simulates m1 microbatches all the same"),
    ("configurator/cost/placed.py", "if (len(memo) + len(keys)) * uniq.itemsize",
     "`*` → `/`", _MEMO_ONLY),
    ("configurator/cost/placed.py", "if (len(memo) + len(keys)) * uniq.itemsize",
     "`>` → `>=`", _MEMO_ONLY),
    ("configurator/cost/placed.py", "if (len(memo) + len(keys)) * uniq.itemsize",
     "negate the `if` test", _MEMO_ONLY),
    ("configurator/cost/placed.py", "if (len(memo) + len(keys)) * uniq.itemsize",
     "`+` → `-`", _MEMO_ONLY),
    ("configurator/cost/placed.py", "if (len(memo) + len(keys)) * uniq.itemsize",
     "drop term `len(keys)`", _MEMO_ONLY),
    ("configurator/cost/placed.py", "if (len(memo) + len(keys)) * uniq.itemsize",
     "drop term `len(memo)`", _MEMO_ONLY),
    ("configurator/cost/schedule_sim.py", "SCALAR_OPS_PER_LEVEL = 14",
     "constant 14 ×1.1", _WALKS),
    ("configurator/cost/schedule_sim.py", "if D * order.n_ops <= SCALAR_OPS_PER_LEVEL",
     "`*` → `/`", _WALKS),
    ("configurator/cost/schedule_sim.py", "if D * order.n_ops <= SCALAR_OPS_PER_LEVEL",
     "`<=` → `<`", _WALKS),
    ("configurator/cost/schedule_sim.py", "if D * order.n_ops <= SCALAR_OPS_PER_LEVEL",
     "negate the `if` test", _WALKS),
    ("configurator/cost/schedule_sim.py", "_RANK_ENDS_ENTRIES = 64",
     "constant 64 ×1.1", _CACHE),
    ("configurator/cost/schedule_sim.py", "D * (dur_src.shape[1] + lat_src.shape[1])",
     "`*` → `/`", _CACHE),
    ("configurator/cost/schedule_sim.py", "D * (dur_src.shape[1] + lat_src.shape[1])",
     "`<=` → `<`", _CACHE),
    ("configurator/cost/schedule_sim.py", "D * (dur_src.shape[1] + lat_src.shape[1])",
     "drop term `dur_src.shape[1]`", _CACHE),
    ("configurator/cost/schedule_sim.py", "D * (dur_src.shape[1] + lat_src.shape[1])",
     "drop term `lat_src.shape[1]`", _CACHE),
    ("configurator/cost/schedule_sim.py", "if key is not None:",
     "`is not` → `is`", _CACHE),
    ("configurator/cost/schedule_sim.py", "if key is not None:",
     "negate the `if` test", _CACHE),
    ("configurator/cost/schedule_sim.py", "ends.setflags(write=False)",
     "`False` → `True`", _CACHE),
    ("configurator/cost/schedule_sim.py", "if len(_RANK_ENDS) > _RANK_ENDS_ENTRIES:",
     "`>` → `>=`", _CACHE),
    ("configurator/cost/schedule_sim.py", "if len(_RANK_ENDS) > _RANK_ENDS_ENTRIES:",
     "negate the `if` test", _CACHE),
    ("configurator/cost/schedule_sim.py", "_RANK_ENDS.popitem(last=False)",
     "`False` → `True`", _CACHE),
    ("configurator/cost/schedule_sim.py", "progressed = False", "`False` → `True`",
     "it only disarms the deadlock check, which cannot fire: schedule_order builds "
     "Megatron's 1F1B and interleaved orders alone (pp, vp, m validated), and they never "
     "deadlock, so every sweep progresses"),
    ("configurator/cost/schedule_sim.py", "np.bincount(level, minlength=int(level.max()) + 1)",
     "`+` → `-`", _MINLENGTH),
    ("configurator/cost/schedule_sim.py", "np.bincount(level, minlength=int(level.max()) + 1)",
     "drop term `1`", _MINLENGTH),
    ("configurator/cost/schedule_sim.py", "np.bincount(level, minlength=int(level.max()) + 1)",
     "drop term `int(level.max())`", _MINLENGTH),
    ("configurator/cost/schedule_sim.py", "_lists: tuple = field(repr=False",
     "`False` → `True`", "the field's repr flag changes only the object's repr"),
    ("configurator/cost/schedule_sim.py", "D * 2 * pp * vp * m > MAX_CELLS",
     "`*` → `/`", _SLICES),
    ("configurator/cost/schedule_sim.py", "D * 2 * pp * vp * m > MAX_CELLS",
     "`>` → `>=`", _SLICES),
    ("configurator/cost/schedule_sim.py", "D * 2 * pp * vp * m > MAX_CELLS",
     "constant 2 ×1.1", _SLICES),
    ("configurator/cost/schedule_sim.py", "D * 2 * pp * vp * m > MAX_CELLS",
     "constant 1 ×1.1", _SLICES),
    ("configurator/cost/schedule_sim.py", ".shape[0] > 1 else", "constant 1 ×1.1",
     "an array's length is an integer: > 1.1 holds where > 1 does"),
    ("configurator/cost/schedule_sim.py", "has_next = st_a < n_stages - 1", "constant 1 ×1.1",
     "st_a holds whole stage numbers: st < n_stages − 1.1 holds exactly where "
     "st < n_stages − 1 does"),
    ("configurator/cost/training_time.py",
     "daly_interval_s=daly_interval_s(stall, mtbf) if stall > 0 else 0.0", "`>` → `>=`",
     "the save stall is positive (a checkpoint of positive bytes over a finite GPU-host "
     "link, save_stall_s), so the guard holds either way"),
    ("configurator/cost/training_time.py",
     "young_interval_s=young_interval_s(stall, mtbf) if stall > 0 else 0.0", "`>` → `>=`",
     "the save stall is positive (a checkpoint of positive bytes over a finite GPU-host "
     "link, save_stall_s), so the guard holds either way"),
    ("configurator/cost/training_time.py", "if rate_per_s * tau > 20:", "`>` → `>=`",
     "the cut is an approximate one (about e^20 attempts a segment): at lambda*tau = 20 "
     "exactly the simulation is as impractical as above it, and no caller reaches it"),
    ("configurator/cost/training_time.py", "if save_s <= 0:", "`<=` → `<`",
     "with a free save (w = 0) the exact ETTR falls as the interval grows (expm1(x)/x "
     "rises), so the ternary search that follows returns lo too"),
    ("configurator/cost/training_time.py", "while b - a > 3:", "constant 3 ×1.1",
     "b − a is an integer: b − a > 3.3 holds where b − a > 3 does"),
    # configurator/cost: compute, expert_comm, flops, gemm, host_ops, moe_compute,
    # communication, measured, iteration, groundtruth
    ("configurator/cost/compute.py", "c.sequence_parallel & (c.tp > 1)], axis=1)", "`>` → `>=`",
     "the key only groups plans for the profile's lookup, which counts sequence parallelism "
     "only with tp > 1 itself (LayerProfile.lookup): every plan gets the same entry"),
    ("configurator/cost/compute.py", "c.sequence_parallel & (c.tp > 1)], axis=1)",
     "constant 1 ×1.1", "tp is an integer: tp > 1.1 holds where tp > 1 does"),
    ("configurator/cost/gemm.py", '"mxfp8": 2 * 1 / 32}', "`*` → `/`",
     "2 / 1 / 32 = 2 * 1 / 32"),
    ("configurator/cost/groundtruth.py", "sequence_parallel=tp > 1", "constant 1 ×1.1",
     "tp is an integer: tp > 1.1 holds where tp > 1 does"),
    ("configurator/cost/groundtruth.py", "tp_comm_overlap=tp > 1", "constant 1 ×1.1",
     "tp is an integer: tp > 1.1 holds where tp > 1 does"),
    ("configurator/cost/groundtruth.py", "distributed_optimizer=dp * cp > 1", "constant 1 ×1.1",
     "dp·cp is an integer: dp·cp > 1.1 holds where dp·cp > 1 does"),
    ("configurator/cost/iteration.py", "big_tensors = np.take_along_axis(np.broadcast_to("
     "tensors, live.shape) * 1.0", "`*` → `/`",
     "x · 1.0 and x / 1.0 are the same floats (the product only makes a writable float copy "
     "of the broadcast view)"),
    ("configurator/cost/iteration.py", "np.broadcast_to(expert, live.shape) * 1.0", "`*` → `/`",
     "x · 1.0 and x / 1.0 are the same floats (the product only makes a float copy of the "
     "broadcast view)"),
    ("configurator/cost/groundtruth.py", "if fsdp and fsdp != n // (tp * pp):", "`*` → `/`",
     "the shipped Megatron-Bridge table's one FSDP row has pp 1, where n // (tp * pp) and "
     "n // (tp / pp) agree (the tables are the tool's own files; a row with pp > 1 and FSDP "
     "would need a test)"),
    ("configurator/cost/groundtruth.py", "if fsdp and fsdp != n // (tp * pp):", "`//` → `/`",
     "read only for a row with FSDP, and the shipped Megatron-Bridge table's one FSDP row has "
     "n a multiple of tp·pp (pp 1): n // (tp·pp) and n / (tp·pp) are equal numbers"),
    ("configurator/cost/groundtruth.py", 'layout = "" if (model.num_layers + 2) % (pp * vp)',
     "`+` → `-`", "bridge_layout gives a layout only for DeepSeek-V3 (61 layers) on 4, 8, 16 "
     "or 32 stages, which divide neither 63 nor 59: \"\" either way elsewhere"),
    ("configurator/cost/groundtruth.py", 'layout = "" if (model.num_layers + 2) % (pp * vp)',
     "drop term `2`", "bridge_layout gives a layout only for DeepSeek-V3 (61 layers) on 4, 8, "
     "16 or 32 stages, which divide neither 63 nor 61: \"\" either way elsewhere"),
    ("configurator/cost/compute.py",
     "tokens_routed=0.0 * T, tokens_in=0.0 * T, moe_experts_fwd=0.0 * T", "`*` → `/`",
     "T (a microbatch's tokens on the rank) is positive: 0 / T = 0 · T"),
    ("configurator/cost/compute.py", "return 0.0 * T", "`*` → `/`",
     "T (a microbatch's tokens on the rank) is positive: 0 / T = 0 · T"),
    ("configurator/cost/host_ops.py", "HOST_OPS_MOE_PARTS = {part: HOST_OPS_MOE // 3",
     "`//` → `/`",
     "HOST_OPS_MOE (90) is a multiple of 3: each part is 30 operations either way (30.0 "
     "where the division is true, which every use multiplies into seconds)"),
    ("configurator/cost/host_ops.py", "return 0.0 * experts", "`*` → `/`",
     "the expert operations (the MLP's own and some per local expert) are positive: "
     "0 / experts = 0 · experts"),
    ("configurator/cost/moe_compute.py", "bias_f = bias_b = 0.0 * R", "`*` → `/`",
     "R (routed copies: k·X·etp times a capacity share > 0) is positive: 0 / R = 0 · R"),
    ("configurator/cost/moe_compute.py", "clamp_f, clamp_b = (0.0 * R, 0.0 * R) if fused",
     "`*` → `/`",
     "R (routed copies: k·X·etp times a capacity share > 0) is positive: 0 / R = 0 · R"),
    ("configurator/cost/host_ops.py", "return 0.0 * elements, 0.0 * elements", "`*` → `/`",
     "the clamped elements (tokens × fc1 width) are positive: 0 / elements = 0 · elements"),
    ("configurator/cost/groundtruth.py", 'layout = "" if (model.num_layers + 2) % (pp * vp)',
     "constant 2 ×1.1", "bridge_layout gives a layout only for DeepSeek-V3 (61 layers) on 4, "
     "8, 16 or 32 stages, which divide neither 63 nor 63.2: \"\" either way elsewhere"),
    ("configurator/cost/groundtruth.py", "same_plan: bool = True", "`True` → `False`",
     "the default is never used: the one caller (bridge_rows) passes same_plan"),
    # found by draw 2050
    ("configurator/cost/groundtruth.py",
     'if fields.get("cpu_offloading_num_layers") and pp > 1:', "constant 1 ×1.1",
     "a row's pp is an integer: pp > 1.1 holds where pp > 1 does"),
    # found by the final draws (seeds 2029, 2030)
    ("configurator/cost/schedule_sim.py", "e = [0.0] * (n + 1)", "drop term `1`",
     "the scalar walk writes op i's end after reading its predecessors' (indices below i, or "
     "the sentinel -1): without the extra entry e[-1] is op n − 1's end, written last, after "
     "every read, and still 0 when op n − 1 reads it; e[:n] is the same list"),
    ("memory_model/activations.py", "every = every + (_qkv_input_bytes(model, precision)",
     "drop term `every`",
     "the first module's bytes are added to every = 0·xh, zeros that broadcast to the "
     "term's own shape: 0 + x and x are the same array"),
    ("memory_model/activations.py", "moe = moe + 2 * xh_rep", "drop term `moe`",
     "the first MoE module's bytes are added to moe = 0·xh, zeros that broadcast to the "
     "term's own shape (xh_rep is xh over the tp of each plan): 0 + x and x are the same "
     "array"),
    ("configurator/cost/host_ops.py",
     "return bool(c.moe_expert_capacity_factor > 0 and c.moe_pad_expert_input_to_capacity)",
     "`>` → `>=`", "the rules allow padding only with a factor > 0 (rules.py), so both "
     "tests read the padding flag"),
    # found by seed 2039
    ("configurator/cost/schedule_sim.py", "data_pred_t[b_ids[has_next]] = b_ids[has_next] + 1",
     "constant 1 ×1.1",
     "an int64 array: b + 1.1 is stored as b + 1 (NumPy truncates a float assigned into it)"),
    ("configurator/cost/schedule_sim.py", "elif q >= 0 and end[q] + lat[i] == start[i]:",
     "`and` → `or`",
     "an op starts at the later of its rank predecessor's end and its data predecessor's end "
     "plus the latency (0 for none): reached when the rank predecessor does not bind, a data "
     "predecessor (q ≥ 0) binds, and without one (q = −1) end[−1] + 0 is the last op's end, "
     "after the start of every op without predecessors (0)"),
    ("configurator/cost/training_time.py", "if x < 1e-12:", "`<` → `<=`",
     "at x = 1e-12 exactly both branches give Δt/(Δt + w) within 1e-12 (expm1(x)/x = 1 + x/2)"),
    ("memory_model/activations.py", "if plans.stores_scores else False),", "`False` → `True`",
     "softmax_fp32 is read only where the plan stores scores (layer_terms' "
     "`if stores_scores:`), and no caller replaces stores_scores after from_plans"),
    # found by seed 2040
    ("configurator/cost/schedule_sim.py", "if t1 > t0:", "`>` → `>=`",
     "where the two are equal, taking either gives the same start"),
    # found by seed 2041
    ("configurator/cost/expert_comm.py", "DEEPEP_MAX_NVL_PEERS = 8", "constant 8 ×1.1",
     "read only as g > DEEPEP_MAX_NVL_PEERS with g a whole number of ranks: g > 8.8 holds "
     "where g > 8 does"),
    ("configurator/cost/iteration.py",
     "tied = (not model.untie_embeddings_and_output_weights) & (c.pp > 1)", "constant 1 ×1.1",
     "pp is an integer: pp > 1.1 holds where pp > 1 does"),
    # found by seed 2043
    ("configurator/cost/groundtruth.py",
     "if k not in latest or _release_key(r.release) > _release_key(latest[k]):", "`>` → `>=`",
     "equal keys are the same release: the shipped table's releases (25.09 … 26.08) have "
     "distinct keys, so a tie keeps the same release string either way"),
    # found by seed 2051
    ("memory_model/params.py", "if 0 < hi <= 4096 and int(tp.min()) > 0:",
     "negate the `if` test",
     "the table of every tp up to the largest is a shortcut: the general formula below it "
     "gives the same padded vocabularies"),
    # found by seed 2060
    ("configurator/cost/expert_comm.py",
     "middle = (seg(one, m_b / 2) + seg(one, m_b / 2 + m_f) if delay", "negate the `if` test",
     "the experts' backward is priced at twice their forward (m_b = 2·m_f), so the delayed "
     "pairing's segments {m_b/2, m_b/2 + m_f} are the plain one's {m_f, m_b}: the same sum"),
]

#: Modules preloaded before forking (below the mutated layers: the import contracts keep
#: configurator.core and topology from importing memory_model or configurator.cost).
PRELOAD = ("numpy", "pytest", "yaml", "configurator.core.plan_batch",
           "configurator.core.model_presets", "configurator.core.plan",
           "topology.cluster_files", "topology.collectives")

_SWAP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
         ast.FloorDiv: ast.Div}
_CMP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
        ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn,
        ast.NotIn: ast.In}
_SYM = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//",
        ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=",
        ast.Is: "is", ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in",
        ast.And: "and", ast.Or: "or"}


@dataclass(frozen=True)
class Site:
    """One mutation: ``path`` (relative), the source span ``start``–``end`` (line, byte
    column) it replaces by ``replacement``, and what it does (``mutation``)."""

    path: str
    start: tuple[int, int]
    end: tuple[int, int]
    replacement: str
    mutation: str

    @property
    def line(self) -> int:
        return self.start[0]


def _short(node: ast.AST, width: int = 40) -> str:
    text = ast.unparse(node)
    return text if len(text) <= width else text[:width - 1] + "…"


def _mutants(node: ast.AST, parent: ast.AST | None, module_level: bool):
    """``(new node or source text, mutation)`` pairs of one node."""
    if isinstance(node, ast.BinOp) and type(node.op) in _SWAP:
        new = copy.copy(node)
        new.op = _SWAP[type(node.op)]()
        yield new, f"`{_SYM[type(node.op)]}` → `{_SYM[type(new.op)]}`"
        if isinstance(node.op, (ast.Add, ast.Sub)):
            yield node.left, f"drop term `{_short(node.right)}`"
            if isinstance(node.op, ast.Add):
                yield node.right, f"drop term `{_short(node.left)}`"
    elif isinstance(node, ast.AugAssign) and type(node.op) in _SWAP:
        return  # statements are not spliced as expressions; none in the targets
    elif isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _CMP:
        new = copy.copy(node)
        new.ops = [_CMP[type(node.ops[0])]()]
        yield new, f"`{_SYM[type(node.ops[0])]}` → `{_SYM[type(new.ops[0])]}`"
    elif isinstance(node, ast.BoolOp):
        new = copy.copy(node)
        new.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        yield new, f"`{_SYM[type(node.op)]}` → `{_SYM[type(new.op)]}`"
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.Invert)):
        yield node.operand, f"remove `{'not' if isinstance(node.op, ast.Not) else '~'}`"
    elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
        if not isinstance(parent, (ast.Subscript, ast.Slice)):
            yield ast.Constant(not node.value), f"`{node.value}` → `{not node.value}`"
    elif isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and node.value:
        if isinstance(parent, (ast.BinOp, ast.Compare)) or module_level:
            new = ast.Constant(node.value * 1.1)
            yield new, f"constant {node.value!r} ×1.1"


def _test_mutants(node: ast.AST):
    """Negated tests of ``if`` statements and conditional expressions."""
    if isinstance(node, (ast.If, ast.IfExp)):
        yield node.test, ast.UnaryOp(ast.Not(), node.test), "negate the `if` test"


def sites(path: str) -> list[Site]:
    """Every mutation site of the module ``path`` (relative to the repository root), in
    source order. Skipped: f-strings, docstrings, annotations and subscripts' numbers."""
    src = (ROOT / path).read_text()
    tree = ast.parse(src)
    out: list[Site] = []
    skip: set[int] = set()
    parents: dict[int, ast.AST] = {}
    module_consts: set[int] = set()
    for stmt in tree.body:
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
            module_consts.update(id(n) for n in ast.walk(stmt.value))
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
        if isinstance(node, ast.JoinedStr) or (
                isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns):
            skip.update(id(n) for n in ast.walk(node if isinstance(node, ast.JoinedStr)
                                                  else node.returns))
        if isinstance(node, ast.arg) and node.annotation is not None:
            skip.update(id(n) for n in ast.walk(node.annotation))
        if isinstance(node, ast.AnnAssign):
            skip.update(id(n) for n in ast.walk(node.annotation))

    def add(target: ast.AST, new, mutation: str):
        text = new if isinstance(new, str) else ast.unparse(new)
        out.append(Site(path, (target.lineno, target.col_offset),
                        (target.end_lineno, target.end_col_offset), f"({text})", mutation))

    for node in ast.walk(tree):
        if id(node) in skip or not hasattr(node, "lineno"):
            continue
        parent = parents.get(id(node))
        for new, mutation in _mutants(node, parent, id(node) in module_consts):
            add(node, new, mutation)
        for target, new, mutation in _test_mutants(node):
            if id(target) not in skip:
                add(target, new, mutation)
    return sorted(out, key=lambda s: (s.start, s.end, s.mutation))


def apply(src: bytes, site: Site) -> bytes:
    """``src`` with ``site``'s span replaced (columns are UTF-8 byte offsets, as ast's)."""
    lines = src.splitlines(keepends=True)
    offset = [0]
    for line in lines:
        offset.append(offset[-1] + len(line))
    a = offset[site.start[0] - 1] + site.start[1]
    b = offset[site.end[0] - 1] + site.end[1]
    return src[:a] + site.replacement.encode() + src[b:]


def target_modules() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for t in TARGETS for p in (ROOT / t).glob("*.py")
                  if p.name != "__init__.py")


def source_line(site: Site) -> str:
    return (ROOT / site.path).read_text().splitlines()[site.line - 1].strip()


def equivalent_reason(site: Site) -> str | None:
    line = source_line(site)
    for path, text, mutation, why in EQUIVALENT:
        if site.path == path and site.mutation == mutation and text in line:
            return why
    return None


class Runner:
    """Runs test files against a scratch copy of the repository in forked processes."""

    def __init__(self, scratch: Path):
        self.scratch = scratch
        self.log = scratch.parent / (scratch.name + ".log")
        root = str(ROOT)
        loaded = [m for m in sys.modules
                  if m.split(".")[0] in ("configurator", "memory_model", "topology", "tests")]
        assert not loaded, f"imported before the scratch copy: {loaded}"
        sys.path[:] = [str(scratch)] + [p for p in sys.path if p not in ("", root)]
        os.environ["PYTHONPATH"] = str(scratch)
        os.environ["PYTHONWARNINGS"] = "ignore"
        os.environ.pop("PYTEST_ADDOPTS", None)
        os.chdir(scratch)
        for name in PRELOAD:
            try:
                __import__(name)
            except ImportError:
                pass

    def run(self, tests: list[str], timeout_s: float) -> tuple[str, float]:
        """``("pass" | "fail" | "timeout", seconds)`` of ``pytest -x -q`` on ``tests``; the
        run's output is left in :attr:`log`."""
        t0 = time.monotonic()
        pid = os.fork()
        if pid == 0:   # the child: its own process group, output to the log
            code = 99
            try:
                os.setpgid(0, 0)
                out = os.open(self.log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                os.dup2(out, 1)
                os.dup2(out, 2)
                import pytest
                code = int(pytest.main(["-x", "-q", "-p", "no:cacheprovider", *tests]))
            finally:
                os._exit(code)
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                code = os.waitstatus_to_exitcode(status)
                return ("pass" if code == 0 else "fail"), time.monotonic() - t0
            if time.monotonic() - t0 > timeout_s:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                os.waitpid(pid, 0)
                return "timeout", time.monotonic() - t0
            time.sleep(0.02)


def _scratch_copy(dest: Path, ref: str | None = None) -> None:
    """The working tree (or the commit ``ref``, its tracked files) copied to ``dest``."""
    dest.mkdir()
    if ref:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
        return
    ignore = shutil.ignore_patterns(".git", "__pycache__", "*.pyc", ".venv", "*.egg-info")
    for item in ROOT.iterdir():
        if item.name in (".git", ".venv") or item.name.startswith("."):
            continue
        if item.is_dir():
            shutil.copytree(item, dest / item.name, ignore=ignore)
        else:
            shutil.copy2(item, dest / item.name)


def _drop_pyc(path: Path) -> None:
    for pyc in (path.parent / "__pycache__").glob(path.stem + ".*.pyc"):
        pyc.unlink()


def main(argv=None) -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--sample", type=int, default=200, help="mutants drawn (default 200)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the draw (default 0)")
    ap.add_argument("--tests", choices=("map", "wide", "all"), default="wide",
                    help="the module's test files (TEST_MAP); wide (default): then the "
                         "survivors against WIDE_TESTS; all: the whole suite")
    ap.add_argument("--modules", nargs="*", default=[],
                    help="only modules whose path contains one of these")
    ap.add_argument("--ref", default=None,
                    help="test the tests of this commit (its tracked files) instead of the "
                         "working tree's; its target modules must be the working tree's")
    ap.add_argument("--rerun", default=None, metavar="REPORT",
                    help="run only the survivors a previous report of this bench lists "
                         "(its `- file:line mutation` lines), e.g. after adding tests")
    ap.add_argument("--list", action="store_true", help="print the sites per module and stop")
    args = ap.parse_args(argv)
    t_start = time.monotonic()
    modules = [m for m in target_modules()
               if not args.modules or any(s in m for s in args.modules)]
    by_module = {m: sites(m) for m in modules}
    all_sites = [s for m in modules for s in by_module[m]]
    if args.list:
        print(table_head(["module", "sites"]))
        for m in modules:
            print(f"| {m} | {len(by_module[m])} |")
        print(f"| all | {len(all_sites)} |")
        return 0
    if args.rerun:
        wanted = set(re.findall(r"^- (\S+?):(\d+) (.+?)  ←", Path(args.rerun).read_text(),
                                flags=re.M))
        drawn = [s for s in all_sites if (s.path, str(s.line), s.mutation) in wanted]
    else:
        drawn = random.Random(args.seed).sample(all_sites, min(args.sample, len(all_sites)))
    drawn.sort(key=lambda s: (s.path, s.start, s.mutation))
    equivalent = {s: why for s in drawn if (why := equivalent_reason(s))}

    def with_deselect(files: list[str]) -> list[str]:
        files = [t for t in files if (scratch / t).exists()]
        return files + [a for d in DESELECT if d.split("::")[0] in files
                        for a in ("--deselect", d)]

    def tests_of(m: str) -> list[str]:
        if args.tests == "all":
            return ["tests"]
        return with_deselect(FORMULA_TESTS + TEST_MAP[m])


    with tempfile.TemporaryDirectory(prefix="mutation-") as tmp:
        scratch = Path(tmp) / "repo"
        _scratch_copy(scratch, args.ref)
        changed = [m for m in modules if (scratch / m).read_bytes() != (ROOT / m).read_bytes()]
        if changed:
            print(f"--ref {args.ref}: these modules differ from the working tree's, whose "
                  f"sites are drawn: {', '.join(changed)}", file=sys.stderr)
            return 2
        runner = Runner(scratch)
        wide = with_deselect(FORMULA_TESTS + WIDE_TESTS) if args.tests == "wide" else []
        timeouts: dict[str, float] = {}
        broken: set[str] = set()
        for m in sorted({s.path for s in drawn}):
            outcome, secs = runner.run(tests_of(m), 3600.0)
            timeouts[m] = 4 * secs + 10
            if outcome != "pass":
                broken.add(m)
                tail = runner.log.read_text()[-2000:]
                print(f"{m}: its tests fail unmutated; its mutants are skipped\n{tail}",
                      file=sys.stderr)
        wide_timeout = 0.0
        if wide:
            outcome, secs = runner.run(wide, 3600.0)
            wide_timeout = 4 * secs + 10
            if outcome != "pass":
                print(f"the wide tests fail unmutated:\n{runner.log.read_text()[-2000:]}",
                      file=sys.stderr)
                return 2
        result: dict[Site, str] = {}
        second: set[Site] = set()
        for i, site in enumerate(drawn):
            if site in equivalent or site.path in broken:
                continue
            path = scratch / site.path
            original = path.read_bytes()
            try:
                path.write_bytes(apply(original, site))
                _drop_pyc(path)
                outcome, _ = runner.run(tests_of(site.path), timeouts[site.path])
                if outcome == "pass" and wide:
                    outcome, _ = runner.run(wide, wide_timeout)
                    if outcome != "pass":
                        second.add(site)
            finally:
                path.write_bytes(original)
                _drop_pyc(path)
            result[site] = {"fail": "killed", "pass": "survived"}[outcome] \
                if outcome != "timeout" else "timed out"
            print(f"[{i + 1}/{len(drawn)}] {result[site]}: {site.path}:{site.line} "
                  f"{site.mutation}", file=sys.stderr, flush=True)

    print(table_head(["module", "sites", "sampled", "equivalent", "killed", "timed out",
                      "survived", "score"]))
    total = dict(sites=0, sampled=0, equivalent=0, killed=0, timed=0, survived=0)
    for m in modules:
        row = dict(sites=len(by_module[m]),
                   sampled=sum(s.path == m and s.path not in broken for s in drawn),
                   equivalent=sum(s.path == m for s in equivalent),
                   killed=sum(s.path == m and r == "killed" for s, r in result.items()),
                   timed=sum(s.path == m and r == "timed out" for s, r in result.items()),
                   survived=sum(s.path == m and r == "survived" for s, r in result.items()))
        for k in total:
            total[k] += row[k]
        print(f"| {m} | {_row(row)} |")
    print(f"| **all** | {_row(total)} |")
    print(f"\nmutation score: {_score(total)} of {total['sampled'] - total['equivalent']} "
          f"non-equivalent mutants killed (seed {args.seed}, tests: {args.tests}); "
          f"{time.monotonic() - t_start:.0f} s")
    if args.tests == "wide":
        print(f"killed in the second stage (WIDE_TESTS, after the module's own files): "
              f"{len(second)}")
    if broken:
        print(f"\nskipped (tests fail unmutated): {', '.join(sorted(broken))}")
    survivors = [s for s, r in result.items() if r == "survived"]
    print(f"\nsurvivors ({len(survivors)}):")
    for s in survivors:
        print(f"- {s.path}:{s.line} {s.mutation}  ←  `{source_line(s)}`")
    print(f"\nknown equivalent mutants ({len(EQUIVALENT)} listed, {len(equivalent)} drawn):")
    for path, text, mutation, why in EQUIVALENT:
        print(f"- {path} `{text}` {mutation}: {why}")
    return 0


def _row(r: dict) -> str:
    return (f"{r['sites']} | {r['sampled']} | {r['equivalent']} | {r['killed']} | "
            f"{r['timed']} | {r['survived']} | {_score(r)}")


def _score(r: dict) -> str:
    n = r["sampled"] - r["equivalent"]
    if n <= 0:
        return "-"
    return f"{100 * (r['killed'] + r['timed']) / n:.1f} %"


if __name__ == "__main__":
    sys.exit(main())
