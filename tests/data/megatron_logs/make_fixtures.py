"""Write the Megatron-LM training-log fixtures of tests/test_megatron_log.py.

Not run by the tests. Usage (needs torch, six and regex, and a Megatron-LM core_v0.16.1
checkout)::

    python tests/data/megatron_logs/make_fixtures.py /path/to/Megatron-LM

The ``arguments`` block (and the lines validate_args prints before it) is Megatron-LM's
own output: its ``parse_args`` + ``validate_args`` (which ends in ``_print_args``) run in a
subprocess on the flags ``configurator launch`` writes for the plan. The lines after it are
written with the format strings of megatron/training/training.py ``training_log``,
megatron/training/utils.py ``report_memory``, megatron/training/tokenizer/tokenizer.py
(``padded vocab``) and theoretical_memory_usage.py; their figures are made up but
consistent: the throughput is Megatron's FLOP count over the iteration time.

``llama3-8b_tp2pp2_16xh100.log``: plain output, as ``torchrun`` writes it.
``qwen3-30b-a3b_ep8_mxfp8_16xb200.log``: ``srun -l`` output (every line prefixed with the
task number, ``0: ``), logged every 5 iterations.
"""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys
import textwrap
from datetime import datetime, timedelta

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

from configurator.core.model_presets import MODEL_PRESETS  # noqa: E402
from configurator.core.plan import ParallelPlan  # noqa: E402
from configurator.cost.flops import megatron_model_flops  # noqa: E402
from launchers.megatron_flags import TrainingArgs, flag_argv, megatron_flags  # noqa: E402
from megatron_argv import megatron_arguments_preamble  # noqa: E402


def megatron_arguments(src: str, argv: list[str], world: int, arch: int) -> list[str]:
    """What Megatron's validate_args prints for ``argv`` on ``world`` ranks."""
    code = megatron_arguments_preamble(src) + textwrap.dedent(f"""
        A.get_device_arch_version = lambda: {arch}
        torch.cuda.get_device_capability = lambda *a: ({arch}, 0)
        os.environ.update(WORLD_SIZE="{world}", RANK="0", CUDA_DEVICE_MAX_CONNECTIONS="1")
        sys.argv = ["pretrain_gpt.py"] + {argv!r}
        A.validate_args(A.parse_args())
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, check=True)
    assert "end of arguments" in res.stdout, res.stderr[-2000:]
    return res.stdout.splitlines()


def iteration_line(now, it, iters, gbs, ms, tflops, lr, loss, grad_norm):
    # megatron/training/training.py training_log (core_v0.16.1), log_throughput on
    s = f" [{now.strftime('%Y-%m-%d %H:%M:%S.%f')}]"
    s += ' iteration {:8d}/{:8d} |'.format(it, iters)
    s += ' consumed samples: {:12d} |'.format(it * gbs)
    s += ' elapsed time per iteration (ms): {:.1f} |'.format(ms)
    s += f' throughput per GPU (TFLOP/s/GPU): {tflops:.1f} |'
    s += f' learning rate: {lr:.6E} |'
    s += f' global batch size: {gbs:5d} |'
    s += ' {}: {:.6E} |'.format('lm loss', loss)
    s += f' loss scale: {1.0:.1f} |'
    s += f' grad norm: {grad_norm:.3f} |'
    s += ' number of skipped iterations: {:3d} |'.format(0)
    s += ' number of nan iterations: {:3d} |'.format(0)
    return s


def memory_line(rank, it, alloc, max_alloc, reserved, max_reserved):
    # megatron/training/utils.py report_memory
    string = f'(after {it} iterations)' + ' memory (MB)'
    string += f" | allocated: {alloc:.2f}"
    string += f" | max allocated: {max_alloc:.2f}"
    string += f" | reserved: {reserved:.2f}"
    string += f" | max reserved: {max_reserved:.2f}"
    return "[Rank {}] {}".format(rank, string)


def write_log(path, *, src, model, plan, iters, log_interval, arch, steady_ms, first_ms,
              memory_ranks, last_rank, prefix, extra_argv=()):
    rng = random.Random(7)
    world = plan.world_size
    argv = flag_argv(megatron_flags(model, plan, training=TrainingArgs(
        train_iters=iters, log_interval=log_interval)))
    argv += ["--no-rope-fusion", "--log-throughput", *extra_argv]
    head = megatron_arguments(src, argv, world, arch)
    flops = megatron_model_flops(model, plan.global_batch_size)
    t = datetime(2025, 11, 3, 10, 14, 7, 512043)
    out = [(0, "W1103 10:13:58.201000 2291 torch/distributed/run.py:792] *****"),
           (0, "INFO:megatron.core.utils:fused_indices_to_multihot has reached end of life.")]
    out += [(0, ln) for ln in head]
    out += [(0, "INFO:megatron.core.num_microbatches_calculator:setting number of "
                f"microbatches to constant {plan.num_microbatches}"),
            (0, "> building NullTokenizer tokenizer ..."),
            (0, " > padded vocab (size: {}) with {} dummy tokens (new size: {})".format(
                model.vocab_size, 0, model.vocab_size)),
            (0, "> initializing torch distributed ..."),
            (0, "> initialized tensor model parallel with size {}".format(plan.tp)),
            (0, "> initialized pipeline model parallel with size {}".format(plan.pp)),
            (0, "> setting random seeds to 1234 ..."),
            (0, "time to initialize megatron (seconds): 21.387"),
            (0, f"[after megatron is initialized] datetime: {t:%Y-%m-%d %H:%M:%S} "),
            (0, "building GPT model ..."),
            (0, " > number of parameters on (tensor, pipeline) model parallel rank (0, 0): "
                "2012209152"),
            (0, "[after model, optimizer, and learning rate scheduler are built] datetime: "
                f"{t + timedelta(seconds=9):%Y-%m-%d %H:%M:%S} "),
            (0, "done with setup ..."),
            (0, "training ..."),
            (0, "[before the start of training step] datetime: "
                f"{t + timedelta(seconds=14):%Y-%m-%d %H:%M:%S} ")]
    t += timedelta(seconds=14)
    logged = [1] + list(range(log_interval, iters + 1, log_interval))
    logged = sorted(set(logged))
    prev = 0
    mem_reported = 0
    for it in logged:
        if it == 1:
            ms = first_ms
        elif prev == 1:
            # the first iteration's report does not reset the interval timer
            # (training_log: should_reset = not is_first_iteration): the next line
            # averages over iterations 1..it
            ms = (first_ms + steady_ms * 1.08 * (it - 1)) / it
        else:
            ms = steady_ms * (1 + rng.uniform(-0.015, 0.015))
        t += timedelta(milliseconds=ms * (it - prev if prev != 1 else it - 1))
        lr = 3e-4 * min(1.0, it / 10) if it <= 10 else 3e-5 + 0.5 * (3e-4 - 3e-5) * (
            1 + math.cos(math.pi * (it - 10) / (iters - 10)))
        loss = 11.9 - 4.2 * (1 - math.exp(-it / 15)) + rng.uniform(-0.05, 0.05)
        out.append((last_rank, iteration_line(t, it, iters, plan.global_batch_size, ms,
                                              flops / (ms / 1000 * 1e12 * world), lr, loss,
                                              4.0 * math.exp(-it / 20) + 0.6)))
        if mem_reported < 2:
            if mem_reported == 0:
                out.append((0, "Theoretical memory footprints: weight and optimizer="
                               "23311.42 MB, activation=21504.05 MB, total=44815.47 MB\n"))
            for rank, (alloc, peak, res) in memory_ranks.items():
                grow = 1.0 if mem_reported else 0.93
                out.append((rank, memory_line(rank, it, alloc, peak * grow, res * grow,
                                              res * grow + 1024.0)))
            mem_reported += 1
        prev = it
    out.append((0, f"[after training is done] datetime: {t:%Y-%m-%d %H:%M:%S} "))
    with open(path, "w") as fh:
        for rank, line in out:
            for piece in line.split("\n"):
                fh.write((f"{rank}: " if prefix else "") + piece + "\n")


def main(src: str) -> None:
    write_log(os.path.join(HERE, "llama3-8b_tp2pp2_16xh100.log"), src=src,
              model=MODEL_PRESETS["llama3-8b"],
              plan=ParallelPlan(tp=2, pp=2, dp=4, micro_batch_size=1, global_batch_size=64,
                                recompute="selective", sequence_parallel=True,
                                distributed_optimizer=True),
              iters=20, log_interval=1, arch=9, steady_ms=4731.0, first_ms=13942.6,
              memory_ranks={0: (31877.91, 58012.44, 61262.0), 1: (31877.91, 58011.93, 61262.0),
                            8: (29950.27, 47303.18, 50302.0), 9: (29950.27, 47302.66, 50302.0)},
              last_rank=15, prefix=False)
    write_log(os.path.join(HERE, "qwen3-30b-a3b_ep8_mxfp8_16xb200.log"), src=src,
              model=MODEL_PRESETS["qwen3-30b-a3b"],
              plan=ParallelPlan(tp=1, pp=2, dp=8, ep=8, etp=1, micro_batch_size=1,
                                global_batch_size=256, recompute="none", precision="mxfp8",
                                distributed_optimizer=True),
              iters=50, log_interval=5, arch=10, steady_ms=9120.0, first_ms=41230.5,
              memory_ranks={0: (52011.37, 121988.12, 131422.0),
                            8: (50370.91, 109731.55, 118784.0)},
              last_rank=15, prefix=True)


if __name__ == "__main__":
    main(sys.argv[1])
