"""What a composition-cache key is made of.

A race winner is only valid for the same site (op, shapes, dtypes, k), the same
process-group layout, the same decision knobs, the same hardware and software,
and the same *code* of the compositions and of the child plans they bound.
``site_key_fields`` builds that dict; ``tpflare.cache.make_key`` hashes it.

Every rank must build the same fields (the cache hit/miss state is agreed across
ranks before the race is skipped), so nothing rank-local (rank, pid, host, paths
of temp files) goes in.  The device is this rank's *current* device: ranks of
different GPU types get different keys, their hit states disagree, and they race.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import inspect
import types
from typing import Any, Mapping, Sequence

KEY_SCHEMA = 1  # bump when the meaning of a field changes


def _jsonable(obj: Any, where: str = "fields") -> Any:
    """Plain JSON data from shapes, dtypes, devices, tuples, torch.Size, ..."""
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return obj
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v, f"{where}[{k!r}]") for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):  # torch.Size is a tuple
        return [_jsonable(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    try:
        import torch

        if isinstance(obj, (torch.dtype, torch.device)):
            return str(obj)
        if isinstance(obj, torch.SymInt):
            raise TypeError(f"{where} is symbolic ({obj}); only static shapes are cached")
    except ImportError:
        pass
    raise TypeError(f"{where}: {type(obj).__name__} {obj!r} is not plain data a cache key can hold")


def _dist_version(*names: str) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def nccl_version() -> str | None:
    """NCCL version torch was built with ("2.28.9"), None on a build without it."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        v = torch.cuda.nccl.version()
    except Exception:
        return None
    return ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)


def version_fields() -> dict[str, str | None]:
    """torch / CUDA runtime / triton / NCCL / flashinfer / tpflare versions (None = absent).

    triton and flashinfer are looked up by their installed metadata, not imported
    (importing flashinfer costs seconds)."""
    import torch

    try:
        import tpflare

        tpflare_version = getattr(tpflare, "__version__", None)
    except ImportError:
        tpflare_version = None
    return {
        "torch": torch.__version__,
        "cuda": getattr(torch.version, "cuda", None),
        "triton": _dist_version("triton", "pytorch-triton"),
        "nccl": nccl_version(),
        "flashinfer": _dist_version("flashinfer-python", "flashinfer"),
        "tpflare": tpflare_version or _dist_version("tpflare"),
    }


def device_fields(device: Any = None) -> dict[str, Any]:
    """``{"type": "cuda", "name": ..., "capability": "9.0"}`` of ``device`` (default:
    the current CUDA device), or ``{"type": "cpu"}``."""
    import torch

    if device is None:
        if not torch.cuda.is_available():
            return {"type": "cpu"}
        device = torch.device("cuda", torch.cuda.current_device())
    device = torch.device(device)
    if device.type != "cuda":
        return {"type": device.type}
    major, minor = torch.cuda.get_device_capability(device)
    return {"type": "cuda", "name": torch.cuda.get_device_name(device),
            "capability": f"{major}.{minor}"}


def _source_bytes(obj: Any) -> bytes:
    if isinstance(obj, (str, bytes)):  # an identity the caller already has (a salt)
        return obj.encode() if isinstance(obj, str) else obj
    target = inspect.unwrap(obj) if callable(obj) else obj
    if isinstance(target, types.ModuleType):
        path = inspect.getsourcefile(target) or getattr(target, "__file__", None)
        if path:
            with open(path, "rb") as f:
                return f.read()
        raise TypeError(f"code_identity: module {target.__name__} has no source file")
    try:
        src = inspect.getsource(target)
    except (OSError, TypeError) as e:
        raise TypeError(
            f"code_identity: no source for {obj!r} ({e}); pass the Python module or "
            f"function that implements it, or a string identity") from None
    name = f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', '?')}"
    return name.encode() + b"\n" + src.encode()


# Every module whose code a selection composition runs (transport, ordering, the Triton paths,
# the block path's CUDA source and their shared helpers), by import name. ``selection_code`` hashes their files without
# importing them (``radix`` needs Triton). tests/test_select_identity.py walks the imports of
# these modules and fails if one they reach is missing here.
SELECTION_MODULES = (
    "tpflare.ops.select",
    "tpflare.ops.ordering",
    "tpflare.ops.select_kernel",
    "tpflare.ops.select_staged",
    "tpflare.ops.select_block",
    "tpflare.ops.select_finish",
    "tpflare.ops.select_compile",
    "tpflare.ops.radix",
    "tpflare.distributed",
    "tpflare.errors",
)


def module_source(name: str) -> bytes:
    """The source file of module ``name`` (found, not imported)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise TypeError(f"module_source: no Python source for {name}")
    with open(spec.origin, "rb") as f:
        return f.read()


def selection_code(modules: Sequence[str] = SELECTION_MODULES) -> tuple[bytes, ...]:
    """Identities (name and source) of the selection modules, for ``code_identity``."""
    return tuple(name.encode() + b"\n" + module_source(name) for name in modules)


def code_identity(*objs: Any) -> str:
    """A hash of the source of the given modules / functions / classes (strings
    and bytes are hashed as given).  Modules hash their whole file; a function
    hashes its own source only, so pass the modules its behaviour depends on.
    Order matters."""
    if not objs:
        raise TypeError("code_identity needs at least one module, function or string")
    h = hashlib.sha256()
    for obj in objs:
        data = _source_bytes(obj)
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()[:32]


def site_key_fields(
    op: str,
    shapes: Any,
    dtypes: Any,
    k: int,
    world: int,
    group_ranks: Sequence[int] | Sequence[Sequence[int]],
    knobs: Mapping[str, Any],
    compositions: Mapping[str, str],
    child_plans: Mapping[str, Any],
    *,
    device: Any = None,
    versions: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The whole key dict of one selection site.

    ``shapes`` / ``dtypes``: of the site's inputs (lists, tuples, torch.Size,
    torch.dtype, or dicts of them); ``group_ranks``: the group's global ranks in
    group-rank order (or a list of groups); ``knobs``: the decision knobs
    (``Settings.decision_dict()``); ``compositions``: name -> ``code_identity``
    of its compiled code; ``child_plans``: what each composition bound below
    it (e.g. the id-replication plan) — plain data.  ``device`` / ``versions``
    default to this process's (tests pass them to stay machine-independent)."""
    if not isinstance(op, str) or not op:
        raise TypeError(f"op must be a non-empty string, not {op!r}")
    if not compositions:
        raise ValueError("compositions must name at least one composition and its code identity")
    return {
        "schema": KEY_SCHEMA,
        "op": op,
        "shapes": _jsonable(shapes, "shapes"),
        "dtypes": _jsonable(dtypes, "dtypes"),
        "k": int(k),
        "world": int(world),
        "group_ranks": _jsonable(group_ranks, "group_ranks"),
        "knobs": _jsonable(dict(knobs), "knobs"),
        "compositions": _jsonable(dict(compositions), "compositions"),
        "child_plans": _jsonable(dict(child_plans), "child_plans"),
        "device": device_fields(device) if not isinstance(device, Mapping) else _jsonable(device),
        "versions": _jsonable(dict(versions)) if versions is not None else version_fields(),
    }
