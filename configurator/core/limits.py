"""Documented ranges of every integer and number the tool accepts, and the caps that keep
any input bounded in time and memory.

Each entry is ``(lowest, highest)``, inclusive. They are wide enough for every model and
cluster built or planned today (a 2,048-layer, 256k-hidden model; a million-token sequence;
32,768 nodes of up to 128 GPUs, at most 262,144 GPUs in all), and small enough that the
search's enumeration and the cluster graph stay bounded. ``--help`` and the README state
them; :func:`configurator.core.validate.int_in_range` enforces them with one-line errors.
"""

from __future__ import annotations

INT_RANGES: dict[str, tuple[int, int]] = {
    # model (Megatron names)
    "num_layers": (1, 2048),
    "hidden_size": (1, 262_144),
    "num_attention_heads": (1, 16_384),
    "num_query_groups": (1, 16_384),
    "ffn_hidden_size": (1, 1_048_576),
    "vocab_size": (1, 16_777_216),
    "seq_length": (1, 16_777_216),
    "max_position_embeddings": (1, 2**31 - 1),
    "kv_channels": (1, 65_536),
    "rotary_base": (1, 2**40),
    "num_experts": (1, 65_536),
    "moe_router_topk": (1, 65_536),
    "moe_ffn_hidden_size": (1, 1_048_576),
    "moe_shared_expert_intermediate_size": (1, 1_048_576),
    "moe_layer_freq": (1, 2048),
    "q_lora_rank": (1, 262_144),
    "kv_lora_rank": (1, 262_144),
    "qk_head_dim": (1, 65_536),
    "qk_pos_emb_head_dim": (1, 65_536),
    "v_head_dim": (1, 65_536),
    "mtp_num_layers": (1, 64),
    "window_size": (1, 16_777_216),
    "attention_chunk_size": (1, 16_777_216),
    "window_attn_skip_freq": (1, 2048),
    # job and plan
    "gbs": (1, 16_777_216),
    "global_batch_size": (1, 16_777_216),
    "mbs": (1, 16_777_216),
    "micro_batch_size": (1, 16_777_216),
    "tp": (1, 262_144),
    "pp": (1, 2048),
    "cp": (1, 262_144),
    "vp": (1, 2048),
    "ep": (1, 65_536),
    "etp": (1, 262_144),
    "decoder_first_pipeline_num_layers": (0, 2048),
    "decoder_last_pipeline_num_layers": (0, 2048),
    "cpu_offloading_num_layers": (0, 2048),
    "dp": (1, 262_144),
    # plans shown: each is priced again on its exact schedule (a few milliseconds apiece),
    # so the table is bounded in time; plans.png and --json's counts cover the rest
    "top": (1, 1000),
    "seed": (0, 2**32 - 1),
    # iterations between checkpoints (a launch script's --save-interval)
    "save_interval": (1, 2**40),
    "placement_evaluations": (1, 10_000_000),
    # cluster
    "nodes": (1, 32_768),
    "gpus_per_node": (1, 128),
    # a GPU's index on its host (a run's gpu_order): below gpus_per_node's bound
    "gpu_order": (0, 127),
    "num_gpus": (1, 262_144),
    "gpu.num_sms": (1, 100_000),
}

#: Positive real figures at the edges (their units in the name).
FLOAT_RANGES: dict[str, tuple[float, float]] = {
    "intra_node_bandwidth_GBps": (1e-6, 1e6),
    "inter_node_bandwidth_GBps": (1e-6, 1e6),
    "intra_node_latency_us": (1e-6, 1e7),
    "inter_node_latency_us": (1e-6, 1e7),
    "gpu.memory_GiB": (1e-3, 1e6),
    "gpu.hbm_bandwidth_GBps": (1e-3, 1e7),
    "gpu.peak_tflops": (1e-3, 1e7),
    # placement search budget per plan, seconds
    "placement_time_s": (1e-3, 3600.0),
    # plan: tokens per expert as a multiple of the even share (0: dropless)
    "moe_expert_capacity_factor": (0.0, 1000.0),
    # time, cost and energy to train (configurator/cost/training_time.py)
    "gpu.rated_power_W": (1.0, 1e5),
    "train_tokens": (1.0, 1e18),
    "failure_rate_per_node_day": (1e-12, 1e3),
    "restart_overhead_s": (0.0, 1e7),
    "storage_GBps": (1e-6, 1e9),
    "gpu_hour_price": (1e-9, 1e9),
    "gpu_power_fraction": (1e-3, 1.0),
    "node_overhead_W": (0.0, 1e6),
    "pue": (1.0, 10.0),
    "deadline_days": (1e-6, 1e6),
}

#: Lowest efficiency (a fraction of a data-sheet rate: GEMM, HBM, attention, NVLink or
#: network) the tool accepts: 0.1 %, ten times below anything a kernel or a link runs at
#: on a working datacenter GPU (the published efficiencies behind the presets are 0.3 to
#: 0.95), and the lower bound of ``calibrate``'s fit. Lower figures are typos (``5e-324``,
#: a percent given as a fraction of a percent) and would price a step at ~1e300 s.
MIN_EFFICIENCY = 1e-3

#: Longest text of a value echoed in an error message (characters).
ECHO_CHARS = 80
#: Largest input file read (bytes).
MAX_FILE_BYTES = 64 * 2**20


def describe_ranges() -> str:
    """One line per range, for ``--help`` epilogues and the README."""
    return "; ".join(f"{k} {lo:,}..{hi:,}" for k, (lo, hi) in INT_RANGES.items())
