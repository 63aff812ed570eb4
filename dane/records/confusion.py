"""The test confusion matrix a classification run leaves in its run directory: JSON and PNG."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

JSON_FILE = "confusion.json"
PNG_FILE = "confusion.png"


def write_confusion(run_dir: str | Path, counts: np.ndarray, title: str = "") -> None:
    """``counts[i, j]`` = test rows of true class i predicted as j; rows are true classes."""
    counts = np.rint(np.asarray(counts, dtype=np.float64)).astype(np.int64)
    total = int(counts.sum())
    record = {
        "classes": list(range(len(counts))),
        "matrix": counts.tolist(),
        "test_rows": total,
        "accuracy": float(np.trace(counts) / total) if total else float("nan"),
        "per_class_recall": [float(c / r) if r else None for c, r in zip(np.diag(counts), counts.sum(1))],
    }
    run_dir = Path(run_dir)
    (run_dir / JSON_FILE).write_text(json.dumps(record) + "\n")
    plot_confusion(counts, run_dir / PNG_FILE, title)


def plot_confusion(counts: np.ndarray, path: Path, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = len(counts)
    fig, ax = plt.subplots(figsize=(0.45 * k + 2.5, 0.45 * k + 2))
    ax.imshow(counts, cmap="Blues")
    for i in range(k):
        for j in range(k):
            if counts[i, j]:
                color = "white" if counts[i, j] > counts.max() / 2 else "black"
                ax.text(j, i, str(counts[i, j]), ha="center", va="center", fontsize=7, color=color)
    ax.set_xticks(range(k))
    ax.set_yticks(range(k))
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    ax.set_title(title or "test confusion matrix", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
