"""Seeded, stratified train/val/test splits."""

import numpy as np

from proto.errors import UserError

__all__ = ["parse_split_ratios", "stratified_split"]


def parse_split_ratios(text: str) -> tuple[float, float, float]:
    """Parse ``"0.6,0.2,0.2"``; the three ratios must be non-negative and sum to at most 1."""
    try:
        parts = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise UserError(f"--split: cannot parse {text!r}; expected three numbers like 0.6,0.2,0.2") from None
    if len(parts) != 3 or any(p < 0 for p in parts) or sum(parts) > 1 + 1e-9:
        raise UserError(f"--split: {text!r} must be three non-negative ratios summing to at most 1")
    return parts[0], parts[1], parts[2]


def stratified_split(labels: np.ndarray, ratios: tuple[float, float, float], seed: int
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split labeled nodes (label >= 0) class by class into sorted int64 train/val/test ids.

    Each class contributes ``round(ratio * class_size)`` nodes to train and to val (never more
    than the class holds) and ``round(ratio * class_size)`` to test, or all the rest when the
    ratios sum to 1; unlabeled nodes go nowhere.
    """
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    ids = np.flatnonzero(labels >= 0)
    ids = ids[rng.permutation(len(ids))]
    order = np.argsort(labels[ids], kind="stable")
    ids = ids[order]
    classes, starts, sizes = np.unique(labels[ids], return_index=True, return_counts=True)
    del classes
    parts: list[list[np.ndarray]] = [[], [], []]
    for start, size in zip(starts.tolist(), sizes.tolist()):
        group = ids[start:start + size]
        n_train = min(size, int(round(ratios[0] * size)))
        n_val = min(size - n_train, int(round(ratios[1] * size)))
        # ratios summing to 1 mean "everything": the rounding remainder goes to test
        full = abs(sum(ratios) - 1.0) < 1e-9
        n_test = size - n_train - n_val if full else min(size - n_train - n_val, int(round(ratios[2] * size)))
        bounds = (0, n_train, n_train + n_val, n_train + n_val + max(0, n_test))
        for k in range(3):
            parts[k].append(group[bounds[k]:bounds[k + 1]])
    result = tuple(np.sort(np.concatenate(p)).astype(np.int64) if p else np.empty(0, np.int64) for p in parts)
    return result[0], result[1], result[2]
