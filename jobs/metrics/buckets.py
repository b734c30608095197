"""The fixed bucket bounds of the wait and run time histograms, in seconds.

Stored per rollup row as one count per bucket (not cumulative), the last
count past the largest bound, so rows add up element by element. Changing
the bounds changes what old rows mean: a new set needs new columns.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

BOUNDS: tuple[float, ...] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
)
SLOTS = len(BOUNDS) + 1


def empty() -> list[int]:
    return [0] * SLOTS


def slot(seconds: float) -> int:
    """The bucket an observation falls in: the first bound it does not exceed (``le``)."""
    return bisect_left(BOUNDS, seconds)


def added(a: Sequence[int] | None, b: Sequence[int] | None) -> list[int]:
    """Two count arrays summed slot by slot (a missing or short array counts as zeros)."""
    out = empty()
    for counts in (a or (), b or ()):
        for i, n in enumerate(counts[:SLOTS]):
            out[i] += int(n)
    return out


def cumulative(counts: Sequence[int] | None) -> list[tuple[str, int]]:
    """``(le, cumulative count)`` pairs as Prometheus histograms expose them, ``+Inf`` last."""
    running, out = 0, []
    padded = added(counts, None)
    for bound, n in zip((*BOUNDS, float("inf")), padded, strict=True):
        running += n
        out.append(("+Inf" if bound == float("inf") else _le(bound), running))
    return out


def _le(bound: float) -> str:
    return repr(float(bound))
