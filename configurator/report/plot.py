"""Plot of the search: predicted iteration time against peak memory of every feasible plan."""

from __future__ import annotations

import numpy as np

from configurator.core.plan_values import RECOMPUTE
from configurator.core.units import GiB


def plot_search(path: str, *, peak_memory_bytes: np.ndarray, iteration_time_s: np.ndarray,
                recompute: np.ndarray, capacity_bytes: float, title: str) -> None:
    """Scatter (peak memory GiB, iteration time s) coloured by recompute; the best plan and
    the memory capacity are marked. Writes a PNG to ``path`` (matplotlib, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    for code, name in reversed(list(enumerate(RECOMPUTE))):
        sel = recompute == code
        if sel.any():
            ax.scatter(peak_memory_bytes[sel] / GiB, iteration_time_s[sel], s=6, alpha=0.5,
                       label=f"recompute {name}")
    best = int(np.argmin(iteration_time_s))
    ax.scatter([peak_memory_bytes[best] / GiB], [iteration_time_s[best]], marker="*", s=200,
               color="black", label="best plan", zorder=3)
    ax.axvline(capacity_bytes / GiB, color="red", linestyle="--", label="GPU memory")
    ax.set_xlabel("peak memory of the worst pipeline stage (GiB)")
    ax.set_ylabel("predicted iteration time (s)")
    ax.set_yscale("log")
    ax.set_title(title, fontsize=10, parse_math=False)   # model names may hold "$"
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def scaling_png(rows: list[dict], *, title: str) -> bytes:
    """PNG of a node-count sweep (rows of ``run_scaling``): tokens/s (left axis) and
    tokens/s per GPU (right axis) against nodes; counts without a plan are left out."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r.get("tokens_per_s")]
    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    nodes = [r["nodes"] for r in ok]
    ax.plot(nodes, [r["tokens_per_s"] for r in ok], "o-", color="tab:blue",
            label="tokens/s (all GPUs)")
    ax.set_xlabel("nodes")
    ax.set_ylabel("tokens/s", color="tab:blue")
    ax2 = ax.twinx()
    ax2.plot(nodes, [r["tokens_per_s_per_gpu"] for r in ok], "s--", color="tab:orange",
             label="tokens/s per GPU")
    ax2.set_ylabel("tokens/s per GPU", color="tab:orange")
    if ok:
        best = max(ok, key=lambda r: r["tokens_per_s"])
        ax.scatter([best["nodes"]], [best["tokens_per_s"]], marker="*", s=250, color="black",
                   zorder=3, label="highest tokens/s")
    ax.set_title(title, fontsize=10, parse_math=False)
    ax.grid(True, alpha=0.3)
    handles = ax.get_legend_handles_labels()
    handles2 = ax2.get_legend_handles_labels()
    ax.legend(handles[0] + handles2[0], handles[1] + handles2[1], fontsize=9,
              loc="lower right")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def training_scaling_png(rows: list[dict], *, title: str) -> bytes:
    """PNG of a priced node-count sweep (``--train-tokens``): days to train (left axis) and
    cost, or GPU-hours without a price (right axis), against nodes; counts without a plan
    are left out."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r.get("training")]
    priced = bool(ok) and all(r["training"]["cost"] is not None for r in ok)
    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    nodes = [r["nodes"] for r in ok]
    ax.plot(nodes, [r["training"]["days"] for r in ok], "o-", color="tab:blue",
            label="days to train")
    ax.set_xlabel("nodes")
    ax.set_ylabel("days to train", color="tab:blue")
    ax2 = ax.twinx()
    what = "cost" if priced else "gpu_hours"
    ax2.plot(nodes, [r["training"][what] for r in ok], "s--", color="tab:red",
             label="cost" if priced else "GPU-hours")
    ax2.set_ylabel("cost" if priced else "GPU-hours", color="tab:red")
    ax.set_title(title, fontsize=10, parse_math=False)
    ax.grid(True, alpha=0.3)
    handles = ax.get_legend_handles_labels()
    handles2 = ax2.get_legend_handles_labels()
    ax.legend(handles[0] + handles2[0], handles[1] + handles2[1], fontsize=9,
              loc="upper center")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()
