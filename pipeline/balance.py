"""Placements cut by decode cost: contiguous stages whose slowest one is as fast as the cuts allow.

A pipeline decoding several sessions at once runs no faster than its slowest stage, and an even split
of the layers is not an even split of the work: the last stage also holds the output head.  On the
tiny model that head (vocab x n_embd) reads as many bytes per token as ten of its layers, so the even
4-stage split gives its last stage 60% of the bytes a token reads (the cut here: 51%).

The cost model is the bytes of weights one decode step reads, since a one-token pass is bound by
memory bandwidth, not arithmetic:
- a layer's tensors in full, except expert tensors (``*_exps``), of which a token reads only the
  ``expert_used_count`` experts the router picks out of ``expert_count``;
- the token embedding: one row, on the first stage;
- the output head (``output.weight``, or the token embedding again where the model ties them) and the
  output norm, on the last stage.
It is a model, not a measurement: what it leaves out (attention over the KV cache, the hand-offs) grows
with the context and the transport.  ``nox -s bench -- -k balanced_against`` measures the cut it makes
against the even one; ``dgr balance`` prints it for a recipe's model.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from core.errors import ConfigurationError
from fetch.gguf_header import Header

_BLOCK = re.compile(r"^blk\.(\d+)\.")


@dataclass(frozen=True, kw_only=True)
class DecodeCost:
    """Bytes one decode step reads: per layer, and on the first and last stage beyond their layers."""

    layers: tuple[int, ...]
    first: int
    last: int

    @property
    def total(self) -> int:
        """The bytes the whole model reads per token (one stage owning every layer)."""
        return self.stage(0, len(self.layers))

    def stage(self, start: int, end: int) -> int:
        """The bytes the stage owning layers [start, end) reads per token."""
        head = self.last if end == len(self.layers) else 0
        return sum(self.layers[start:end]) + (self.first if start == 0 else 0) + head


def decode_cost(headers: Sequence[Header]) -> DecodeCost:
    """The decode cost of a model from the headers of its files (one, or every file of a split set)."""
    if not headers:
        raise ConfigurationError("decode cost: no GGUF headers given")
    arch = headers[0]
    n_layer = arch.arch_value("block_count")
    if not isinstance(n_layer, int) or n_layer < 1:
        raise ConfigurationError(f"{arch.path}: no {arch.architecture}.block_count to cut the layers by")
    expert_share = _expert_share(arch)
    tensors = {t.name: t for h in headers for t in h.tensors}
    layers = [0] * n_layer
    for t in tensors.values():
        block = _BLOCK.match(t.name)
        if block and int(block.group(1)) < n_layer:  # blocks past n_layer (an MTP head) are no stage's
            layers[int(block.group(1))] += round(t.nbytes * (expert_share if "_exps." in t.name else 1))
    embd = tensors.get("token_embd.weight")
    head = tensors.get("output.weight", embd)
    norm = tensors.get("output_norm.weight")
    return DecodeCost(layers=tuple(layers),
                      first=embd.nbytes // embd.shape[-1] if embd else 0,
                      last=(head.nbytes if head else 0) + (norm.nbytes if norm else 0))


def _expert_share(header: Header) -> float:
    """The fraction of an expert tensor one token reads (1 for a dense model)."""
    used, count = header.arch_value("expert_used_count"), header.arch_value("expert_count")
    if isinstance(used, int) and isinstance(count, int) and 0 < used <= count:
        return used / count
    return 1.0


def balanced_stages(cost: DecodeCost, n_stages: int) -> list[tuple[int, int]]:
    """The contiguous cut into ``n_stages`` non-empty stages whose costliest stage costs least.

    Many cuts can share that least maximum (on the tiny model the head alone decides it), so among
    them this takes the one with the least sum of squared stage costs: the other stages as even as
    they can be, which is what spare cores and concurrent sessions use."""
    n_layer = len(cost.layers)
    if not 1 <= n_stages <= n_layer:
        raise ConfigurationError(f"cannot cut {n_layer} layers into {n_stages} non-empty stages")
    bottleneck = _least_bottleneck(cost, n_stages)
    return _evenest_under(cost, n_stages, bottleneck)


def _least_bottleneck(cost: DecodeCost, n_stages: int) -> int:
    """The least possible cost of the costliest stage (dynamic programming over prefixes)."""
    n_layer = len(cost.layers)
    inf = float("inf")
    # best[k][e]: least bottleneck of layers [0, e) cut into k stages
    best = [[inf] * (n_layer + 1) for _ in range(n_stages + 1)]
    best[0][0] = 0
    for k in range(1, n_stages + 1):
        for end in range(k, n_layer + 1):
            best[k][end] = min(max(best[k - 1][start], cost.stage(start, end)) for start in range(k - 1, end))
    return int(best[n_stages][n_layer])


def _evenest_under(cost: DecodeCost, n_stages: int, bottleneck: int) -> list[tuple[int, int]]:
    """The cut with the least sum of squared stage costs among those no stage of which exceeds
    ``bottleneck``."""
    n_layer = len(cost.layers)
    inf = float("inf")
    best = [[inf] * (n_layer + 1) for _ in range(n_stages + 1)]
    cut_at = [[0] * (n_layer + 1) for _ in range(n_stages + 1)]
    best[0][0] = 0
    for k in range(1, n_stages + 1):
        for end in range(k, n_layer + 1):
            for start in range(k - 1, end):
                c = cost.stage(start, end)
                if c <= bottleneck and best[k - 1][start] + c * c < best[k][end]:
                    best[k][end], cut_at[k][end] = best[k - 1][start] + c * c, start
    stages, end = [], n_layer
    for k in range(n_stages, 0, -1):
        stages.append((cut_at[k][end], end))
        end = cut_at[k][end]
    return stages[::-1]


def even_stages(n_layer: int, n_stages: int) -> list[tuple[int, int]]:
    """The cut by layer count alone, the earlier stages one layer longer where it does not divide: what
    a placement is without a cost model, for comparison."""
    if not 1 <= n_stages <= n_layer:
        raise ConfigurationError(f"cannot cut {n_layer} layers into {n_stages} non-empty stages")
    size, extra = divmod(n_layer, n_stages)
    ends = [(k + 1) * size + min(k + 1, extra) for k in range(n_stages)]
    return list(zip([0, *ends[:-1]], ends, strict=True))
