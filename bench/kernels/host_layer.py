"""The host's time to issue one megatron-core decoder layer, forward and backward, against one
bare eager operation: megatron-core 0.16.1's own layers (``get_gpt_layer_local_spec``, the
path that runs without Transformer Engine; a dense Llama-style layer and an MoE layer with the
all-to-all dispatcher and 4 experts), built at tiny shapes on the CPU device with one thread
so that the kernels cost next to nothing and what is timed is Python, autograd and the
dispatcher: the ATen operations each pass issues (``TorchDispatchMode``), the median
microseconds of each pass, per operation and over the bare operation of ``configurator
profile``'s loop (:func:`configurator.profiler.host_ops.time_host_op_s`), and the backward's
host time over the forward's, which :data:`configurator.cost.host_ops.HOST_BACKWARD_FACTOR`
takes.

Then the MoE layer's forward operations by part, with expert parallelism over 1, 2 and 4
processes (gloo): the router, the all-to-all dispatcher by method (its preprocessing, the
exchanges and their sorts and permutations) and the experts, against
:data:`configurator.cost.host_ops.HOST_OPS_MOE_PARTS`, the counts the host time uses.

Run: ``python -m bench.kernels.host_layer [--repeats 200]`` (about 30 s; needs torch and
megatron-core, the test extras).
"""

from __future__ import annotations

import dataclasses
import statistics
import time

from bench.common import bench_parser, table_head
from configurator.core.units import US

#: Tiny shapes: a layer whose kernels take a few microseconds on a CPU core.
SHAPES = dict(num_layers=1, hidden_size=32, num_attention_heads=2, num_query_groups=2,
              kv_channels=16, ffn_hidden_size=32, seq_length=8, vocab_size=128)
#: The MoE layer's experts: 4 local experts, top-2, as megatron-core's ``SequentialMLP``.
MOE = dict(num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=16,
           moe_shared_expert_intermediate_size=None)


def first_layer(torch, name: str, **model) -> tuple:
    """``(layer, forward)``: megatron-core's first decoder layer of preset ``name`` at
    :data:`SHAPES` (``model`` overrides; the all-to-all dispatcher for an MoE layer), and a
    function running its forward on a fixed random input, returning a scalar to take the
    backward of."""
    from configurator.core.model_presets import MODEL_PRESETS
    from tests import megatron_reference as ref

    spec = dataclasses.replace(MODEL_PRESETS[name], **SHAPES, **model)
    ref.MOE_DISPATCHER = "alltoall"
    gpt = ref._build(spec, "none")
    layer = gpt.decoder.layers[0]
    s, h = spec.seq_length, spec.hidden_size
    x = torch.randn(s, 1, h, dtype=torch.bfloat16, requires_grad=True)
    mask = torch.triu(torch.ones(1, 1, s, s, dtype=torch.bool), diagonal=1)
    rope = gpt.rotary_pos_emb(s)

    def forward():
        out = layer(x, attention_mask=mask, rotary_pos_emb=rope)
        return (out[0] if isinstance(out, tuple) else out).float().sum()
    return layer, forward


def layer_host_s(torch, name: str, repeats: int, **model) -> dict:
    """ATen operations and median host seconds of one forward and one backward of the first
    decoder layer of preset ``name`` at :data:`SHAPES` (``model`` overrides)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += 1
            return func(*args, **(kwargs or {}))

    _, forward = first_layer(torch, name, **model)

    for _ in range(10):
        forward().backward()
    counts = []
    for step in ("forward", "backward"):
        c = Count()
        if step == "forward":
            with c:
                loss = forward()
        else:
            loss = forward()
            with c:
                loss.backward()
        counts.append(c.n)
    fwd, bwd = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        loss = forward()
        t1 = time.perf_counter()
        loss.backward()
        bwd.append(time.perf_counter() - t1)
        fwd.append(t1 - t0)
    return dict(ops=counts, seconds=[statistics.median(fwd), statistics.median(bwd)])


#: The all-to-all dispatcher's methods megatron-core 0.16.1's ``MoELayer.forward`` calls, by
#: the part of :data:`configurator.cost.host_ops.HOST_OPS_MOE_PARTS` each belongs to (the
#: ``moe_preprocess`` graph scope captures ``dispatch_preprocess``).
DISPATCHER_PARTS = {"dispatch_preprocess": "preprocess", "token_dispatch": "dispatch",
                    "dispatch_postprocess": "dispatch", "combine_preprocess": "dispatch",
                    "token_combine": "dispatch", "combine_postprocess": "dispatch"}


def _moe_parts_worker(rank: int, world: int, port: int, experts: int, out) -> None:
    """One process of :func:`moe_parts`: forward ATen operations by part, put on ``out``
    by rank 0."""
    import os

    import torch
    import torch.distributed as dist
    from torch.utils._python_dispatch import TorchDispatchMode

    from tests import megatron_reference as ref

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    ref._patch_for_cpu()
    a2a = dist.all_to_all_single

    def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None,
                          **kw):
        # gloo's binding takes lists where megatron-core passes NumPy arrays
        as_list = (lambda v: None if v is None else [int(i) for i in v])
        return a2a(output, input, as_list(output_split_sizes), as_list(input_split_sizes),
                   **kw)
    dist.all_to_all_single = all_to_all_single
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from megatron.core import parallel_state
    parallel_state.initialize_model_parallel(1, 1, expert_model_parallel_size=world,
                                             expert_tensor_parallel_size=1)
    torch.manual_seed(0)
    layer, forward = first_layer(torch, "qwen3-30b-a3b", **dict(MOE, num_experts=experts))
    parts: list[str] = []
    counts: dict[str, int] = {}

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if parts:     # a read of a CPU tensor's element (``tolist``) launches nothing
                key = ("scalar reads" if func is torch.ops.aten._local_scalar_dense.default
                       else parts[-1])
                counts[key] = counts.get(key, 0) + 1
            return func(*args, **(kwargs or {}))

    def leave(module, args, output) -> None:     # a hook's return value would replace output
        parts.pop()

    for name, module in (("router", layer.mlp.router), ("experts", layer.mlp.experts)):
        module.register_forward_pre_hook(lambda m, a, name=name: parts.append(name))
        module.register_forward_hook(leave)
    dispatcher = layer.mlp.token_dispatcher
    for method, part in DISPATCHER_PARTS.items():
        def wrapped(*a, _f=getattr(dispatcher, method), _part=part, **k):
            parts.append(_part)
            try:
                return _f(*a, **k)
            finally:
                parts.pop()
        setattr(dispatcher, method, wrapped)
    for _ in range(3):
        forward().backward()
    counts.clear()
    with Count():
        forward()
    if rank == 0:
        out.put(dict(counts))
    dist.destroy_process_group()


def moe_parts(ep: int, experts: int) -> dict:
    """Forward ATen operations of megatron-core's MoE layer (Qwen3-30B-A3B's at
    :data:`SHAPES`, top-2, the all-to-all dispatcher) by part, ``{"router", "preprocess",
    "dispatch", "experts", "scalar reads"}`` (the parts as :data:`DISPATCHER_PARTS` maps the
    dispatcher's methods; reads of CPU tensors' elements apart, in whichever part), with
    ``experts`` experts over ``ep`` processes (gloo on the CPU). Raises what a process
    raised."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    mp.start_processes(_moe_parts_worker, args=(ep, port, experts, out), nprocs=ep,
                       start_method="spawn")
    return out.get()


def main(argv=None) -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--repeats", type=int, default=200, help="timed passes (default 200)")
    args = ap.parse_args(argv)
    import torch

    from configurator.profiler.host_ops import time_host_op_s
    from tests import megatron_reference as ref

    torch.set_num_threads(1)
    ref._patch_for_cpu()
    ref._init_distributed()
    bare = time_host_op_s(torch, torch.device("cpu"), warmup=3, repeats=50)
    print(f"bare eager operation with autograd: {bare / US:.2f} us "
          f"(torch {torch.__version__}, one CPU thread)\n")
    print(table_head(["layer", "pass", "ATen ops", "host us", "us / op", "x bare op",
                      "backward / forward"], ["---", "---", "---:", "---:", "---:", "---:",
                                              "---:"]))
    for label, name, model in (("dense (Llama 3 8B's)", "llama3-8b", {}),
                               ("MoE (Qwen3-30B-A3B's, 4 experts)", "qwen3-30b-a3b", MOE)):
        r = layer_host_s(torch, name, args.repeats, **model)
        ratio = r["seconds"][1] / r["seconds"][0]
        for i, step in enumerate(("forward", "backward")):
            t, n = r["seconds"][i], r["ops"][i]
            print(f"| {label} | {step} | {n} | {t / US:.0f} | {t / n / US:.1f} | "
                  f"{t / n / bare:.2f} | {f'{ratio:.2f}' if i else ''} |")
    from configurator.cost.host_ops import HOST_OPS_MOE_PARTS, HOST_OPS_PER_EXPERT

    print("\nMoE layer, forward operations by part (megatron-core's all-to-all dispatcher, "
          "4 local experts, SequentialMLP; configurator: HOST_OPS_MOE_PARTS, and "
          "HOST_OPS_PER_EXPERT per expert for Transformer Engine's grouped GEMMs; scalar "
          "reads: elements of CPU tensors read by tolist, apart):\n")
    keys = ("router", "preprocess", "dispatch", "experts")
    print(table_head(["expert parallel", *keys, "router + dispatcher", "scalar reads"],
                     ["---"] + ["---:"] * (len(keys) + 2)))
    for ep in (1, 2, 4):
        c = moe_parts(ep, 4 * ep)
        print(f"| {ep} | " + " | ".join(str(c.get(k, 0)) for k in keys)
              + f" | {sum(c.get(k, 0) for k in keys[:3])} | {c.get('scalar reads', 0)} |")
    ours = HOST_OPS_MOE_PARTS
    print("| configurator | " + " | ".join(str(ours[k]) for k in keys[:3])
          + f" | {4 * HOST_OPS_PER_EXPERT} | {sum(ours.values())} | - |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
