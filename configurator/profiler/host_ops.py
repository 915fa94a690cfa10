"""The host's time to issue one eager PyTorch operation, measured on the local machine.

A layer whose kernels are shorter than issuing them runs at the host's pace
(:func:`configurator.cost.host_ops.host_layer_s`); the time per operation is a property of the
host CPU and its software stack, not of the GPU. :func:`time_host_op_s` measures it the way
a training step pays it: a chain of elementwise operations on a tensor that records
autograd history, each dispatched by Python through the autograd and dispatcher layers, on
tensors small enough that the kernels (or, on the CPU, the arithmetic) take no time next to
the dispatch. On a GPU the kernels run asynchronously, so the timed loop is the issue time
alone (:data:`HOST_LOOP_OPS` launches stay well inside CUDA's launch queue); the backward
pass runs after the timer stops.

torch is passed in by the caller (:func:`configurator.profiler.timing.import_torch`).
"""

from __future__ import annotations

import statistics
import time

#: Operations issued in one timed loop (half multiplications, half additions).
HOST_LOOP_OPS = 256
#: Elements of the tensor the loop works on: a kernel this small takes no time.
HOST_LOOP_ELEMENTS = 8


def time_host_op_s(torch, device, *, warmup: int, repeats: int) -> float:
    """Median seconds to issue one eager operation with autograd recording on ``device``
    (a ``torch.device``) over ``repeats`` timed loops of :data:`HOST_LOOP_OPS` operations,
    after ``warmup`` (at least one) untimed loops."""
    cuda = device.type == "cuda"
    x = torch.ones(HOST_LOOP_ELEMENTS, device=device, requires_grad=True)

    def chain():
        y = x
        for _ in range(HOST_LOOP_OPS // 2):
            y = y * 1.0001
            y = y + 0.0001
        return y

    def settle(y):
        y.sum().backward()
        x.grad = None
        if cuda:
            torch.cuda.synchronize(device)

    for _ in range(max(1, warmup)):
        settle(chain())
    per_op = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        y = chain()
        per_op.append((time.perf_counter() - t0) / HOST_LOOP_OPS)
        settle(y)
    return statistics.median(per_op)
