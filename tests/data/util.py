"""Helpers shared by the data tests."""

import numpy as np

WORDS = ("the quick brown fox jumps over the lazy dog and then some more words "
         "to make documents of different lengths").split()


def make_docs(num: int, seed: int = 0) -> list[str]:
  """``num`` documents of 5..80 words, each unique (it starts with its number)."""
  rng = np.random.default_rng(seed)
  return [f"doc{i} " + " ".join(rng.choice(WORDS, size=rng.integers(5, 80)))
          for i in range(num)]


def collect(it, num: int) -> list[dict[str, np.ndarray]]:
  return [next(it) for _ in range(num)]


def chunks_of(batches) -> np.ndarray:
  """(N, T+1) token chunks rebuilt from batches of inputs/targets."""
  rows = [np.concatenate([b["inputs"], b["targets"][:, -1:]], axis=1) for b in batches]
  return np.concatenate(rows) if rows else np.zeros((0, 0), np.int32)
