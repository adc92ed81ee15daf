"""Is a tensor in an ATen graph replicated (the same bits on every rank of a group)?

The graph alone proves it where the value comes out of a replicating collective
(an all-reduce or all-gather over the group).  Otherwise the value is computed
from graph inputs by the ops upstream; it is replicated when

1. every rank computes it with the same ops and constants (``fingerprint``
   equal on every rank: rank-dependent constants, e.g. ``x + rank``, differ), and
2. the graph inputs it reads (``leaves``) hold the same values on every rank —
   which only the real tensors can tell (checked at preparation).

``upstream`` returns what the graph knows; ``tpflare.latent_prep`` settles the rest
collectively.  Random ops upstream are never replicated.
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import torch
from torch import fx

from . import collectives


@dataclasses.dataclass(frozen=True)
class Upstream:
    leaves: tuple[Any, ...]        # the placeholders' keys (``upstream``'s map) the value is computed from
    proven_groups: tuple[str, ...]  # replicating collectives it is computed from
    fingerprint: str               # ops and constants upstream (must agree across ranks)
    blocker: str | None = None     # why it can never be replicated


def _describe(a: Any, local: dict[fx.Node, int]) -> Any:
    if isinstance(a, fx.Node):
        return ("node", local.get(a, -1))
    if isinstance(a, (list, tuple)):
        return tuple(_describe(x, local) for x in a)
    if isinstance(a, dict):
        return tuple(sorted((k, _describe(v, local)) for k, v in a.items()))
    if isinstance(a, torch.SymInt):
        return ("sym", str(a))
    return repr(a)


def upstream(node: fx.Node, placeholders: dict[fx.Node, Any], order: dict[fx.Node, int] | None = None) -> Upstream:
    """Walk everything ``node`` is computed from, stopping at replicating collectives.

    ``placeholders`` maps each graph input to its key in the fingerprint and the leaves: one
    every rank gives the same input (its source name), or its position.

    ``order`` (node -> position in the graph) may be passed by a caller that walks
    from many sites of one graph, so the graph is enumerated once.
    """
    stacks = {spec.op: spec for spec in collectives.registered()}
    boundary: dict[fx.Node, str] = {}    # replicating collectives met, and their group
    seen: set[fx.Node] = set()
    stack = [node]
    region: list[fx.Node] = []
    leaves: set[Any] = set()
    groups: set[str] = set()
    blocker = None
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        g = collectives.replicating_group(n, stacks)
        if g is not None:
            groups.add(g)
            boundary[n] = g
            region.append(n)
            continue
        region.append(n)
        if n.op == "placeholder":
            leaves.add(placeholders[n])
            continue
        if n.op == "get_attr":
            blocker = blocker or f"a constant tensor ({n.target}) upstream, not checkable across ranks"
            continue
        target = n.target
        tags = getattr(target, "tags", ())
        if torch.Tag.nondeterministic_seeded in tags:
            blocker = blocker or f"random op {target} upstream"
        stack.extend(n.all_input_nodes)
    if order is None:
        order = {n: i for i, n in enumerate(node.graph.nodes)}
    region.sort(key=order.__getitem__)
    local = {n: i for i, n in enumerate(region)}
    h = hashlib.sha256()
    for n in region:
        if n.op == "placeholder":
            item: Any = ("input", placeholders[n])
        elif n in boundary:
            item = ("replicated", str(n.target), boundary[n])
        else:
            item = (n.op, str(n.target), _describe(n.args, local), _describe(n.kwargs, local))
        h.update(repr(item).encode())
    return Upstream(tuple(sorted(leaves, key=lambda k: (type(k).__name__, k))), tuple(sorted(groups)), h.hexdigest()[:24], blocker)


__all__ = ["Upstream", "upstream"]
