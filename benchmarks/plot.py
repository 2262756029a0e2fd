# SPDX-License-Identifier: MIT
"""Plot time against heads at T = 8192 and T = 32768 (one sequence) from a results JSON of
bench_fwd.py --plot: the automatic path, the exact path (CUDA-graph replays), FlashKDA and fla
Triton where measured, and the hardware floor. Reads the JSON only; writes a PNG.

    python benchmarks/plot.py benchmarks/results/h200.json benchmarks/results/h200-heads.png
"""

import json
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def series(results, T):
    rows = sorted((r for r in results if re.fullmatch(rf"T{T}-N1-H\d+", r["shape"])), key=lambda r: r["heads"])
    return [r["heads"] for r in rows], rows


def main(src, dst):
    with open(src) as f:
        data = json.load(f)
    env = data["environment"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=False)
    for ax, T in zip(axes, (8192, 32768)):
        heads, rows = series(data["results"], T)
        ax.plot(heads, [r["auto_graph_ms"] for r in rows], "o-", label="automatic path")
        ax.plot(heads, [r["exact_graph_ms"] for r in rows], "s--", label="exact path (bit-exact)")
        for key, label in (("flashkda_graph_ms", "FlashKDA"), ("fla_graph_ms", "fla Triton")):
            measured = [(h, r[key]) for h, r in zip(heads, rows) if r.get(key) is not None]
            if measured:
                ax.plot(*zip(*measured), "^-.", label=label)
        ax.plot(heads, [r["floor_ms"] for r in rows], ":", color="gray", label="hardware floor")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(heads)
        ax.set_xticklabels([str(h) for h in heads])
        ax.set_xlabel("heads H (one sequence)")
        ax.set_ylabel("ms (CUDA-graph replay, median)")
        ax.set_title(f"T = {T}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle(f"flash_kda forward on {env['gpu']} (git {env['git']})")
    fig.tight_layout()
    fig.savefig(dst, dpi=120)


if __name__ == "__main__":
    main(*sys.argv[1:3])
