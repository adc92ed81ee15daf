"""How a TP all-reduce looks in an ATen graph, and the registry of a stack's own ops.

Three spellings reach the latent-gather matcher as one ``Reduce``:

* torch's own (``dist.all_reduce``, functional collectives, DTensor's
  ``Partial -> Replicate``): ``_c10d_functional.all_reduce(x, "sum", group)``
  followed by ``wait_tensor``;
* a stack's out-of-place op, e.g. ``torch.ops.vllm.all_reduce.default(x, "tp:0")``;
* a stack's in-place op, e.g. ``torch.ops.sglang.inplace_all_reduce(x, group)``,
  which functionalization turns into ``auto_functionalized[_v2](op, ...)`` and a
  ``getitem`` of the mutated value.

A stack registers its ops with ``register_all_reduce`` (re-exported as
``tpflare.register_all_reduce``); the signature is checked there, never inside a
compiled graph.  Its group names are the stack's own (``"tp:0"``), so the
registration says how to map them to a c10d process group.
"""
from __future__ import annotations

import dataclasses
import functools
import operator
import threading
from typing import Any, Callable, Mapping

import torch
from torch import fx

c10d = torch.ops._c10d_functional
hop = torch.ops.higher_order

_AUTO_FUNCTIONALIZED = tuple(
    op for op in (getattr(hop, "auto_functionalized", None), getattr(hop, "auto_functionalized_v2", None))
    if op is not None)


class RegistrationError(TypeError):
    """A stack op given to ``register_all_reduce`` does not have the expected form."""


@dataclasses.dataclass(frozen=True)
class StackAllReduce:
    """A stack's all-reduce op (sum over ``group_arg``'s group), as registered."""

    op: torch._ops.OpOverload
    group_arg: str
    inplace: bool
    resolve_group: Callable[[str], Any] | Mapping[str, Any] | None
    all_gather: torch._ops.OpOverload | None

    @property
    def name(self) -> str:
        return str(self.op)

    def c10d_group(self, stack_group: str) -> str:
        """The c10d group name behind the stack's group name (raises ValueError, naming both)."""
        from torch.distributed import ProcessGroup

        target: Any = stack_group
        if isinstance(self.resolve_group, Mapping):
            if stack_group not in self.resolve_group:
                raise ValueError(f"tpflare: {self.name} argument {self.group_arg}={stack_group!r}: no such "
                                 f"group in the registered mapping (keys: {sorted(self.resolve_group)})")
            target = self.resolve_group[stack_group]
        elif callable(self.resolve_group):
            try:
                target = self.resolve_group(stack_group)
            except Exception as e:
                raise ValueError(f"tpflare: {self.name} argument {self.group_arg}={stack_group!r}: the "
                                 f"registered resolve_group raised {type(e).__name__}: {e}") from e
        if isinstance(target, ProcessGroup):
            return target.group_name
        if isinstance(target, str):
            from tpflare.distributed import resolve_group

            try:
                resolve_group(target)
            except Exception as e:
                raise ValueError(f"tpflare: {self.name} argument {self.group_arg}={stack_group!r} maps to "
                                 f"{target!r}, which is not a c10d group name ({e}); register "
                                 "resolve_group= returning a ProcessGroup") from e
            return target
        raise ValueError(f"tpflare: {self.name} argument {self.group_arg}={stack_group!r}: resolve_group "
                         f"gave {type(target).__name__}, expected a ProcessGroup or a c10d group name")


_registry: dict[Any, StackAllReduce] = {}
_lock = threading.Lock()


def _overload(op: Any, what: str) -> torch._ops.OpOverload:
    if isinstance(op, torch._ops.OpOverloadPacket):
        op = op.default
    if not isinstance(op, torch._ops.OpOverload):
        raise RegistrationError(f"tpflare.register_all_reduce: {what} must be a torch op "
                                f"(torch.ops.<ns>.<name>[.default]), got {type(op).__name__}")
    return op


def _type(arg) -> str:
    return str(arg.type)


def register_all_reduce(op: Any, *, group_arg: str = "group_name", inplace: bool | None = None,
                        resolve_group: Callable[[str], Any] | Mapping[str, Any] | None = None,
                        all_gather: Any = None) -> StackAllReduce:
    """Teach the latent gather a serving stack's own TP all-reduce op.

    ``op``: ``(Tensor x, ..., str <group_arg>, ...) -> Tensor`` (out-of-place: the
    sum over the group) or ``(Tensor(a!) x, ..., str <group_arg>) -> ()`` (in-place).
    ``inplace`` defaults to what the schema says and must agree with it.
    ``resolve_group``: the stack's group name -> a ``ProcessGroup`` or c10d group
    name (a mapping or a callable; None = the names are c10d group names).
    ``all_gather``: the stack's all-gather, ``(Tensor x, int dim, int world_size,
    str group_name) -> Tensor`` concatenating along ``dim`` in rank order (vLLM's
    form); when given, the rewrite gathers with it, else with c10d's.
    """
    op = _overload(op, "op")
    schema = op._schema
    args = list(schema.arguments)
    names = [a.name for a in args]
    if group_arg not in names:
        raise RegistrationError(f"tpflare.register_all_reduce({op}): no argument {group_arg!r} "
                                f"(arguments: {names}); pass group_arg= naming the group argument")
    group_type = _type(args[names.index(group_arg)])
    if group_type != "str":
        raise RegistrationError(f"tpflare.register_all_reduce({op}): argument {group_arg!r} is "
                                f"{group_type}, expected str (a group name)")
    if _type(args[0]) != "Tensor":
        raise RegistrationError(f"tpflare.register_all_reduce({op}): the first argument must be the "
                                f"Tensor to reduce, got {schema}")
    writes = args[0].alias_info is not None and args[0].alias_info.is_write
    returns = [_type(r) for r in schema.returns]
    if inplace is None:
        inplace = writes
    if inplace:
        if not writes:
            raise RegistrationError(f"tpflare.register_all_reduce({op}, inplace=True): the schema {schema} "
                                    "does not mutate its first argument (expected Tensor(a!))")
        if returns:
            raise RegistrationError(f"tpflare.register_all_reduce({op}, inplace=True): expected no "
                                    f"return value, the schema returns {returns}")
    else:
        if writes:
            raise RegistrationError(f"tpflare.register_all_reduce({op}, inplace=False): the schema "
                                    f"{schema} mutates its first argument; pass inplace=True")
        if returns != ["Tensor"]:
            raise RegistrationError(f"tpflare.register_all_reduce({op}): an out-of-place all-reduce "
                                    f"returns one Tensor, the schema returns {returns}")
    if resolve_group is not None and not (callable(resolve_group) or isinstance(resolve_group, Mapping)):
        raise RegistrationError(f"tpflare.register_all_reduce({op}): resolve_group must be a mapping or "
                                f"a callable (stack group name -> ProcessGroup), got {type(resolve_group).__name__}")
    if isinstance(resolve_group, Mapping):
        from torch.distributed import ProcessGroup

        bad = {k: type(v).__name__ for k, v in resolve_group.items()
               if not isinstance(k, str) or not isinstance(v, (ProcessGroup, str))}
        if bad:
            raise RegistrationError(f"tpflare.register_all_reduce({op}): resolve_group maps str -> "
                                    f"ProcessGroup (or c10d group name); bad entries: {bad}")
    ag = None
    if all_gather is not None:
        ag = _overload(all_gather, "all_gather")
        want = ["Tensor", "int", "int", "str"]
        got = [_type(a) for a in ag._schema.arguments]
        if got[:4] != want or any(a.default_value is None and not a.kwarg_only for a in ag._schema.arguments[4:]) \
                or [_type(r) for r in ag._schema.returns] != ["Tensor"]:
            raise RegistrationError(f"tpflare.register_all_reduce({op}, all_gather={ag}): expected "
                                    "all_gather(Tensor x, int dim, int world_size, str group_name) -> Tensor, "
                                    f"got {ag._schema}")
    spec = StackAllReduce(op, group_arg, bool(inplace), resolve_group, ag)
    with _lock:
        _registry[op] = spec
    return spec


def unregister_all_reduce(op: Any) -> None:
    with _lock:
        _registry.pop(_overload(op, "op"), None)


def registered() -> list[StackAllReduce]:
    with _lock:
        return list(_registry.values())


# --- reduces in a graph ----------------------------------------------------------------------------
@dataclasses.dataclass
class Reduce:
    """One all-reduce in an ATen graph: ``result`` holds the sum of ``partial`` over ``group``."""

    partial: fx.Node            # the tensor each rank contributes
    result: fx.Node             # the node whose value is the reduced tensor
    nodes: list[fx.Node]        # nodes that die with the reduce (result first)
    spelling: str               # "c10d" / "stack" / "stack-inplace"
    group: str | None = None    # c10d group name (None: unresolved, see ``skip``)
    stack_group: str = ""       # the name the graph carries
    stack: StackAllReduce | None = None
    skip: str | None = None


def _stack_arg(node: fx.Node, spec: StackAllReduce, name: str):
    names = [a.name for a in spec.op._schema.arguments]
    i = names.index(name)
    if name in node.kwargs:
        return node.kwargs[name]
    return node.args[i] if len(node.args) > i else spec.op._schema.arguments[i].default_value


def _resolve(r: Reduce) -> Reduce:
    try:
        r.group = r.stack.c10d_group(r.stack_group)
    except ValueError as e:
        raise ValueError(f"{e} (graph node {r.result.name})") from None
    return r


def _stacks() -> dict[Any, StackAllReduce]:
    return {s.op: s for s in registered()}


def reduce_at(node: fx.Node, stacks: dict[Any, StackAllReduce]) -> Reduce | None:
    """``node`` as the collective of a sum all-reduce (any spelling), else None.

    A stack op's group is left unresolved (``group`` None); ``find_reduces`` resolves it.
    """
    if node.op != "call_function":
        return None
    if node.target == c10d.all_reduce.default:
        waits = [u for u in node.users if u.target == c10d.wait_tensor.default]
        if len(waits) != 1 or len(node.users) != 1:
            return None
        r = Reduce(node.args[0], waits[0], [waits[0], node], "c10d", str(node.args[2]), str(node.args[2]))
        if node.args[1] != "sum":
            r.skip = f"all_reduce op is {node.args[1]!r}, not sum"
        return r
    if node.target in stacks and not stacks[node.target].inplace:
        spec = stacks[node.target]
        return Reduce(node.args[0], node, [node], "stack", None, str(_stack_arg(node, spec, spec.group_arg)), spec)
    if node.target in _AUTO_FUNCTIONALIZED and node.args and node.args[0] in stacks:
        return _inplace_reduce(node, stacks[node.args[0]])
    return None


def find_reduces(graph: fx.Graph) -> list[Reduce]:
    """Every sum all-reduce the matcher knows, in graph order.

    Raises ValueError (naming the op and argument) when a registered stack op's
    group cannot be resolved: bad input fails at preparation, on every rank.
    """
    stacks = _stacks()
    out: list[Reduce] = []
    for node in graph.nodes:
        r = reduce_at(node, stacks)
        if r is not None:
            out.append(_resolve(r) if r.stack is not None and r.skip is None else r)
    return out


def _inplace_reduce(node: fx.Node, spec: StackAllReduce) -> Reduce | None:
    first = spec.op._schema.arguments[0].name
    kw = node.kwargs
    n_out = len(spec.op._schema.returns) or 1                # a ()-op still yields one None output
    if "_all_bases" in kw:                                   # auto_functionalized_v2
        bases = kw["_all_bases"]
        idx = kw.get(f"_{first}_base_index")
        partial = bases[idx] if isinstance(idx, int) else None
        is_view = any(k in kw for k in (f"_{first}_size", f"_{first}_stride", f"_{first}_storage_offset",
                                        f"_{first}_slice_dim"))
        out_index = n_out + (idx if isinstance(idx, int) else 0)
    else:                                                    # auto_functionalized (v1)
        partial, is_view = kw.get(first), False
        out_index = n_out
    getters = [u for u in node.users if u.target is operator.getitem and u.args[1] == out_index]
    if partial is None or len(getters) != 1 or len(node.users) != 1:
        return None
    r = Reduce(partial, getters[0], [getters[0], node], "stack-inplace", None,
               str(kw.get(spec.group_arg, "")), spec)
    if is_view:
        r.skip = f"{spec.name} reduces a view of a larger tensor in place"
    return r


@functools.lru_cache(maxsize=None)
def _tpflare_replicating() -> dict[Any, int]:
    """tpflare's own ops whose outputs are identical on every rank of their group, by contract
    (the selection compositions, the id replication, the column gather), and the position
    of their ``group_name`` argument."""
    ops = torch.ops.tpflare
    out = {}
    for name in ("select", "select_replicated", "select_owner", "replicate_ids", "column_gather"):
        if hasattr(ops, name):
            op = getattr(ops, name).default
            out[op] = [a.name for a in op._schema.arguments].index("group_name")
    return out


def replicating_group(node: fx.Node, stacks: dict[Any, StackAllReduce] | None = None) -> str | None:
    """The c10d group over which ``node``'s value is replicated by a collective, else None.

    The result of a sum all-reduce (any spelling ``reduce_at`` knows), of an all-gather,
    or of tpflare's selection ops (their ids and scores are replicated exactly).
    """
    if node.op != "call_function":
        return None
    src = node.args[0] if node.target in (operator.getitem, c10d.wait_tensor.default) and node.args else node
    if not isinstance(src, fx.Node):
        return None
    mine = _tpflare_replicating()
    if src.target in mine:
        i = mine[src.target]
        g = src.kwargs.get("group_name", src.args[i] if len(src.args) > i else None)
        return str(g) if isinstance(g, str) else None
    if node.target == c10d.wait_tensor.default and src.target == c10d.all_gather_into_tensor.default:
        return str(src.args[2])
    r = reduce_at(src, _stacks() if stacks is None else stacks)
    if r is None or r.result is not node or r.skip is not None:
        return None
    if r.group is None:
        try:
            _resolve(r)
        except ValueError:
            return None
    return r.group


def emit_all_gather(graph: fx.Graph, x: fx.Node, world: int, r: Reduce) -> fx.Node:
    """``[n, M]`` per rank -> ``[world*n, M]`` (rank-major), with the stack's op when it has one."""
    if r.stack is not None and r.stack.all_gather is not None:
        return graph.call_function(r.stack.all_gather, (x, 0, world, r.stack_group))
    ag = graph.call_function(c10d.all_gather_into_tensor.default, (x, world, r.group))
    return graph.call_function(c10d.wait_tensor.default, (ag,))


__all__ = ["register_all_reduce", "unregister_all_reduce", "registered", "Reduce", "reduce_at", "find_reduces",
           "replicating_group", "emit_all_gather", "RegistrationError", "StackAllReduce"]
