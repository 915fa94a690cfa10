"""Plot of the search: predicted iteration time against peak memory of every feasible plan."""

from __future__ import annotations

import numpy as np

from configurator.core.plan import RECOMPUTE
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
