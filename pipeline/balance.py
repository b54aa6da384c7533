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

What a stage reads is not what it holds: an MoE layer reads a few experts per token and holds them
all, so a cut balanced for speed can hand one host more weights than it has memory for.  The held
bytes (``held_bytes``, what the range-aware loader of patch 0001 keeps for a stage) can bound the
cut: ``balanced_stages(..., held=, limit=)`` considers only stages that fit.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from core.errors import ConfigurationError
from fetch.gguf_header import Header, TensorInfo

_BLOCK = re.compile(r"^blk\.(\d+)\.")


@dataclass(frozen=True, kw_only=True)
class StageBytes:
    """Bytes per layer, what the first and the last stage have beyond their layers, and what every
    stage has (tensors of no layer, neither input nor output): a stage's figure is their sum.  Either
    the bytes a decode step reads (``decode_cost``) or the bytes a stage holds (``held_bytes``)."""

    layers: tuple[int, ...]
    first: int
    last: int
    every: int = 0
    shared: int = 0  # in both first and last, held once by a stage that is both (a tied embedding)

    @property
    def total(self) -> int:
        """The figure of the whole model (one stage owning every layer)."""
        return self.stage(0, len(self.layers))

    def stage(self, start: int, end: int) -> int:
        """The figure of the stage owning layers [start, end)."""
        owns_input, owns_output = start == 0, end == len(self.layers)
        once = self.shared if owns_input and owns_output else 0
        return (
            sum(self.layers[start:end])
            + (self.first if owns_input else 0)
            + (self.last if owns_output else 0)
            + self.every
            - once
        )


def decode_cost(headers: Sequence[Header]) -> StageBytes:
    """The decode cost of a model from the headers of its files (one, or every file of a split set)."""
    n_layer, tensors = _layers_and_tensors(headers, "decode cost")
    expert_share = _expert_share(headers[0])
    layers = [0] * n_layer
    for t in tensors.values():
        block = _BLOCK.match(t.name)
        if block and int(block.group(1)) < n_layer:  # blocks past the last layer (MTP) are no stage's
            layers[int(block.group(1))] += round(t.nbytes * (expert_share if "_exps." in t.name else 1))
    embd = tensors.get("token_embd.weight")
    head = tensors.get("output.weight", embd)
    norm = tensors.get("output_norm.weight")
    return StageBytes(
        layers=tuple(layers),
        first=embd.nbytes // embd.shape[-1] if embd else 0,
        last=(head.nbytes if head else 0) + (norm.nbytes if norm else 0),
    )


def held_bytes(
    headers: Sequence[Header], *, mtp: bool = False, mtp_file: Sequence[Header] = ()
) -> StageBytes:
    """The bytes each stage keeps in memory, as the range-aware loader keeps them: a layer's tensors
    in full (every expert); the token embedding on the first stage; the output tensors (norm, head,
    and the tied embedding where there is no ``output.weight``) on the last, with the nextn blocks
    past the last layer where ``mtp`` loads them, or, where the block ships in an MTP-only set
    (``mtp_file``: its headers, loaded with ``--mtp-model`` as a model of its own), every tensor of
    that set.  A tensor of no layer that is neither is counted on every stage, the bound a host must
    plan for.  The KV cache and compute buffers come on top."""
    n_layer, tensors = _layers_and_tensors(headers, "held bytes")
    layers, first, last, every = [0] * n_layer, 0, 0, 0
    for t in tensors.values():
        block = _BLOCK.match(t.name)
        if block:
            if int(block.group(1)) < n_layer:
                layers[int(block.group(1))] += t.nbytes
            elif mtp:
                last += t.nbytes
        elif t.name.startswith("token_embd."):
            first += t.nbytes
        elif t.name.startswith("output"):
            last += t.nbytes
        else:
            every += t.nbytes
    # tied: the last stage loads the embedding as its head; a stage that is both holds it once
    embd = tensors.get("token_embd.weight")
    tied = embd.nbytes if embd is not None and "output.weight" not in tensors else 0
    last += sum(t.nbytes for h in mtp_file for t in h.tensors)
    return StageBytes(layers=tuple(layers), first=first, last=last + tied, every=every, shared=tied)


def _layers_and_tensors(headers: Sequence[Header], what: str) -> tuple[int, dict[str, TensorInfo]]:
    """The model's layer count, as llama counts the layers a stage may own, and every tensor of its
    files by name.  A set that carries its nextn (MTP) blocks counts them in ``block_count``
    (tiny-v4-mtp: 13 blocks, 12 layers); as llama's deepseek4 loader does, they are taken off where
    ``nextn_predict_layers`` says so and the first of them is there (``blk.N.nextn.eh_proj``)."""
    if not headers:
        raise ConfigurationError(f"{what}: no GGUF headers given")
    arch = headers[0]
    n_layer = arch.arch_value("block_count")
    if not isinstance(n_layer, int) or n_layer < 1:
        raise ConfigurationError(f"{arch.path}: no {arch.architecture}.block_count to cut the layers by")
    tensors = {t.name: t for h in headers for t in h.tensors}
    nextn = arch.arch_value("nextn_predict_layers")
    if isinstance(nextn, int) and 0 < nextn < n_layer:
        n_layer -= nextn if f"blk.{n_layer - nextn}.nextn.eh_proj.weight" in tensors else 0
    return n_layer, tensors


def _expert_share(header: Header) -> float:
    """The fraction of an expert tensor one token reads (1 for a dense model)."""
    used, count = header.arch_value("expert_used_count"), header.arch_value("expert_count")
    if isinstance(used, int) and isinstance(count, int) and 0 < used <= count:
        return used / count
    return 1.0


def balanced_stages(
    cost: StageBytes, n_stages: int, *, held: StageBytes | None = None, limit: int | None = None
) -> list[tuple[int, int]]:
    """The contiguous cut into ``n_stages`` non-empty stages whose costliest stage costs least.

    Many cuts can share that least maximum (on the tiny model the head alone decides it), so among
    them this takes the one with the least sum of squared stage costs: the other stages as even as
    they can be, which is what spare cores and concurrent sessions use.  With ``limit``, only stages
    whose ``held`` bytes are at most ``limit`` are considered (each host's memory for weights); a
    ConfigurationError names the least any cut needs when none fits."""
    n_layer = len(cost.layers)
    if not 1 <= n_stages <= n_layer:
        raise ConfigurationError(f"cannot cut {n_layer} layers into {n_stages} non-empty stages")
    fits = _fitting(n_stages, held, limit)
    bottleneck = _least_bottleneck(cost, n_stages, fits)
    return _evenest_under(cost, n_stages, bottleneck, fits)


Fits = Callable[[int, int], bool]  # may the stage owning layers [start, end) be one of the cut's?


def _fitting(n_stages: int, held: StageBytes | None, limit: int | None) -> Fits:
    """Which stages a cut may have: all, or those holding at most ``limit`` (refused when no cut fits)."""
    if limit is None:
        return lambda start, end: True
    if held is None:
        raise ConfigurationError("a limit on the bytes a stage holds needs the held bytes")
    least = _least_bottleneck(held, n_stages, lambda start, end: True)
    if least > limit:
        raise ConfigurationError(
            f"no cut of {len(held.layers)} layers into {n_stages} stages has each stage "
            f"hold at most {_size(limit)}: the least any cut needs is {_size(least)}"
        )
    return lambda start, end: held.stage(start, end) <= limit


def megabytes(nbytes: int) -> str:
    """Bytes as ``dgr balance`` prints them: decimal MB, as ``--fit`` reads ``MB``."""
    return f"{nbytes / 1e6:.1f} MB"


def _size(nbytes: int) -> str:
    """``megabytes``, but small figures (a test's toy model) exactly."""
    return megabytes(nbytes) if nbytes >= 100_000 else f"{nbytes} bytes"


def _least_bottleneck(cost: StageBytes, n_stages: int, fits: Fits) -> int:
    """The least possible cost of the costliest stage among cuts of stages that fit (dynamic
    programming over prefixes)."""
    n_layer = len(cost.layers)
    inf = float("inf")
    # best[k][e]: least bottleneck of layers [0, e) cut into k stages
    best = [[inf] * (n_layer + 1) for _ in range(n_stages + 1)]
    best[0][0] = 0
    for k in range(1, n_stages + 1):
        for end in range(k, n_layer + 1):
            best[k][end] = min(
                (
                    max(best[k - 1][start], cost.stage(start, end))
                    for start in range(k - 1, end)
                    if fits(start, end)
                ),
                default=inf,
            )
    return int(best[n_stages][n_layer])


def _evenest_under(cost: StageBytes, n_stages: int, bottleneck: int, fits: Fits) -> list[tuple[int, int]]:
    """The cut with the least sum of squared stage costs among those whose stages fit and none of
    which exceeds ``bottleneck``."""
    n_layer = len(cost.layers)
    inf = float("inf")
    best = [[inf] * (n_layer + 1) for _ in range(n_stages + 1)]
    cut_at = [[0] * (n_layer + 1) for _ in range(n_stages + 1)]
    best[0][0] = 0
    for k in range(1, n_stages + 1):
        for end in range(k, n_layer + 1):
            for start in range(k - 1, end):
                c = cost.stage(start, end)
                if c <= bottleneck and fits(start, end) and best[k - 1][start] + c * c < best[k][end]:
                    best[k][end], cut_at[k][end] = best[k - 1][start] + c * c, start
    stages: list[tuple[int, int]] = []
    end = n_layer
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
