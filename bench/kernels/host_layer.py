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

Run: ``python -m bench.kernels.host_layer [--repeats 200]`` (about 10 s; needs torch and
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


def layer_host_s(torch, name: str, repeats: int, **model) -> dict:
    """ATen operations and median host seconds of one forward and one backward of the first
    decoder layer of preset ``name`` at :data:`SHAPES` (``model`` overrides)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from configurator.core.model_presets import MODEL_PRESETS
    from tests import megatron_reference as ref

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += 1
            return func(*args, **(kwargs or {}))

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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
