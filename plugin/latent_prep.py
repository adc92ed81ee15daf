"""Latent-gather preparation: the ``inner_compile`` that decides, rewrites and compiles.

``compile_fx(gm, inputs, inner_compile=LatentGatherCompiler(...))`` hands this
object the AOT forward graph (ATen; DTensor desugared to local tensors; every
spelling of a TP all-reduce alike) with fake inputs.  Per graph, on every rank:

1. map the graph's inputs to the real tensors Dynamo gave the backend
   (checked position by position: shape, dtype; any doubt skips every site);
2. find and classify every site once (``tpflare.passes.latent_gather.find_sites``);
3. apply the gates (knob, dtype, width, replication of the hidden row, row
   source) and agree on them collectively with the ranks of the sites' groups:
   one decision per site, identical everywhere, one reason per skip; a site whose
   hidden row an earlier compile of the same Dynamo frame found not replicated is
   skipped again (``tpflare.latent_history``: the sticky skip); where a failed check meets a
   site an earlier compile of the frame rewrote, every rank logs one warning for it (the earlier
   graph keeps its rewrite: results depend on call history);
4. the rows gate (among the static gates, before the replication check): on a symbolic row
   count it becomes a shape guard (a graph below the gate recompiles and keeps the all-reduce);
5. build the row shards of exactly the rewritten sites (registered, the DTensor
   weight redistributed, or resharded once), append them as graph inputs,
   rewrite, and hand the graph to Inductor's own ``compile_fx_inner``;
6. return a callable that appends the row shards on every call and checks that
   no weight they depend on changed in place.

Every site is reported on every compile that reaches this compiler, Inductor's FX-graph cache
hit included (``tpflare.compile_fx`` turns AOTAutograd's cache off while the rewrite may apply;
with the knob off an AOTAutograd cache hit skips it and reports nothing).
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
from typing import Any, Callable, Sequence

import torch
from torch import fx

from . import latent_history, reporting, row_shards
from .config import Settings
from .distributed import agree, group_rank, group_ranks, group_size, is_distributed
from .errors import TpflareError


log = logging.getLogger("tpflare.latent_gather")

# What a rewritten site's plan entry carries for preparation only, not into its report record.
_NOT_REPORTED = ("registered", "dtensor", "upstream")

EARLIER_REWRITE = ("; but an earlier compile of this frame rewrote this site, and its graph gives other bits "
                   "(see the warning on tpflare.latent_gather)")

try:
    from torch._inductor.output_code import OutputCode
except ImportError:  # pragma: no cover
    OutputCode = object  # type: ignore[misc,assignment]


# --- real tensors behind the graph's inputs ---------------------------------------------------------
def _source_name(node: fx.Node) -> str:
    src = getattr(node, "_dynamo_source", None)
    name = getattr(src, "name", None) if src is not None else None
    if callable(name):
        name = name()
    return str(name) if name else node.name


def _flatten(value: Any, name: str, owner: Any, out: list) -> None:
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if is_traceable_wrapper_subclass(value):
        attrs, _ = value.__tensor_flatten__()
        for a in attrs:
            _flatten(getattr(value, a), f"{name}.{a}", value, out)
    else:
        out.append((value, owner, name))


def flat_real_inputs(dynamo_gm: fx.GraphModule, real_inputs: Sequence[Any]) -> list[tuple[Any, Any, str]]:
    """Dynamo's real inputs in the order AOTAutograd flattens them: (value, owning subclass, name)."""
    out: list = []
    for pname, p in list(dynamo_gm.named_parameters(remove_duplicate=False)) + \
            list(dynamo_gm.named_buffers(remove_duplicate=False)):
        _flatten(p, pname, None, out)
    names = [_source_name(n) for n in dynamo_gm.graph.find_nodes(op="placeholder")]
    for i, v in enumerate(real_inputs):
        _flatten(v, names[i] if i < len(names) else f"input {i}", None, out)
    return out


def _hint(d: Any) -> Any:
    if isinstance(d, torch.SymInt):
        return d.node.hint
    return d


def match_inputs(fakes: Sequence[Any], flat: list) -> str | None:
    """Why ``flat`` (real) does not line up with the graph's fake inputs; None when it does."""
    if len(fakes) != len(flat):
        return f"the graph has {len(fakes)} inputs, the model {len(flat)}"
    for i, (f, (v, _o, name)) in enumerate(zip(fakes, flat)):
        if isinstance(f, torch.Tensor):
            if (not isinstance(v, torch.Tensor) or v.dtype != f.dtype or v.dim() != f.dim()
                    or any(_hint(a) != b for a, b in zip(f.shape, v.shape))):
                return f"graph input {i} is {tuple(f.shape)} {f.dtype}, {name} is not"
    return None


def _digest(t: torch.Tensor) -> str:
    c = t.detach().contiguous().cpu()  # one device-to-host copy; the hash reads its bytes in place
    return (hashlib.blake2b(c.reshape(-1).view(torch.uint8).numpy(), digest_size=16).hexdigest()
            + f"/{tuple(c.shape)}/{c.dtype}")


def _leaf_state(value: Any, owner: Any, trust: bool) -> tuple:
    """What a rank says about one graph input upstream of a hidden row."""
    if isinstance(value, torch.Tensor):
        placements = getattr(owner, "placements", None)
        if placements is not None and all(p.is_replicate() for p in placements):
            return ("dtensor-replicate",)
        return ("trusted",) if trust else ("bits", _digest(value))
    if isinstance(value, (int, float, bool, torch.SymInt)):
        return ("value", repr(value))
    return ("object", type(value).__name__)


# --- the call-time wrapper --------------------------------------------------------------------------
class RowBinding:
    """Flat input ``col_index`` (a column shard) is served by row shard ``rows`` (appended)."""

    def __init__(self, col_index: int, col: torch.Tensor, rows: torch.Tensor, name: str, group: str,
                 world: int, layout: str, may_reshard: bool) -> None:
        self.col_index, self.rows, self.name = col_index, rows, name
        self.group, self.world, self.layout, self.may_reshard = group, world, layout, may_reshard
        import weakref

        self._col = weakref.ref(col)

    def rows_for(self, col: torch.Tensor) -> torch.Tensor:
        """The row shard of the column weight this call passes.  Dynamo may serve one graph
        to another module instance (weights are inputs, not guards): its row shard is
        looked up, or resharded now (a collective every rank makes at the same call)."""
        if col is self._col():
            return self.rows
        entry = row_shards.lookup(col)
        if entry is not None and entry.layout == self.layout and entry.rows.shape == self.rows.shape \
                and entry.rows.dtype == col.dtype:
            return entry.rows
        if not self.may_reshard:
            raise TpflareError(
                f"tpflare latent gather: a compiled graph is called with another weight at {self.name} "
                "that has no registered row shard (and TPFLARE_LATENT_GATHER_RESHARD=never); call "
                "tpflare.register_row_shard for it")
        return row_shards.resharded(col, self.name, self.world, self.group, self.layout)[0]


class RowShardCall(OutputCode):  # type: ignore[misc]
    """Inductor's compiled forward with the row shards appended to every call (boxed)."""

    _boxed_call = True

    def __init__(self, inner: Any, bindings: list[RowBinding]) -> None:
        super().__init__()
        self.inner, self.bindings = inner, bindings
        self._inner_boxed = getattr(inner, "_boxed_call", False)  # decided once, not every call

    def __call__(self, args: list) -> Any:
        cols = [args[b.col_index] for b in self.bindings]
        rows = [b.rows_for(c) for b, c in zip(self.bindings, cols)]
        row_shards.check_fresh(cols)
        if not isinstance(args, list):
            args = list(args)
        args.extend(rows)
        if self._inner_boxed:
            return self.inner(args)
        return self.inner(*args)

    def post_compile(self, *a: Any, **k: Any) -> None:
        return self.inner.post_compile(*a, **k)

    def prepare_for_serialization(self) -> None:
        raise TpflareError("a latent-gather compiled graph holds live row shards and is not serialisable")

    def set_triton_bundle(self, bundle: Any) -> None:
        self.inner.set_triton_bundle(bundle)

    def __getattr__(self, name: str) -> Any:
        if name in ("inner", "bindings"):
            raise AttributeError(name)
        return getattr(self.inner, name)


@contextlib.contextmanager
def _real_tensors():
    """Preparation runs real collectives on real tensors: outside compile_fx's fake mode,
    dispatch modes and Python dispatcher (a DTensor redistribute under them never completes)."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes(), torch._C._DisablePythonDispatcher():
        yield


def _rows_gate(s, min_rows: int) -> str | None:
    """Rows gate; on a symbolic row count the answer becomes a guard (never a silent skip
    that then serves every size): a graph compiled below the gate recompiles above it."""
    rows = s.rows()
    try:
        ok = bool(rows >= min_rows)      # SymInt: installs a guard on the hint's side
    except Exception as e:               # unbacked sizes: no hint to guard on
        return f"rows: {rows} rows cannot be compared with {min_rows} ({type(e).__name__})"
    if ok:
        return None
    how = " (guarded: larger batches recompile)" if isinstance(rows, torch.SymInt) else ""
    return f"rows: {rows} rows < {min_rows} (TPFLARE_LATENT_GATHER_MIN_ROWS){how}"


def _differing_leaves(i: int, rec: dict, everyone: list, ranks: list) -> list[tuple[Any, list[int]]]:
    """Graph inputs upstream of site ``i``'s hidden row whose state (bits) some rank sees otherwise:
    (the input's key, _input_keys, and the ranks that disagree with this one)."""
    out = []
    for leaf, state in rec["leaves"].items():
        differ = [r for r, o in zip(ranks, everyone) if o[i]["leaves"].get(leaf) != state]
        if differ:
            out.append((leaf, differ))
    return out


def _sticky_reason(i: int, everyone: list, ranks: list) -> str | None:
    """The sticky skip, from every rank's flag (one rank that has it is enough: the ranks' own
    histories are not trusted to match); the same words on every rank."""
    for r, o in zip(ranks, everyone):
        name = o[i].get("sticky")
        if name:
            where = "" if all(p[i].get("sticky") for p in everyone) else f" (on rank {r})"
            return (f"hidden row not replicated: an earlier compile of this frame found graph input {name} "
                    f"differing across ranks{where}; kept the all-reduce so results do not depend on "
                    "call history")
    return None


def _any_rank(i: int, everyone: list, flag: str) -> bool:
    """Whether some rank's record of site ``i`` has ``flag`` (one rank is enough: the ranks' own
    histories are not trusted to match, and every rank reads the same records)."""
    return any(o[i].get(flag) for o in everyone)


def _warn_earlier_rewrite(site: str, weight: str, inputs: list[str], frame: str) -> None:
    """Say loudly that a frame's results now depend on call history: an earlier graph of the frame
    rewrote a site whose hidden row this compile's check found not replicated."""
    log.warning(
        "tpflare latent gather: graph input %s at the site of %s (site %s, %s) differs across ranks, but an "
        "earlier compile of this frame rewrote that site after checking replicated inputs. That graph "
        "cannot be un-rewritten and stays in Dynamo's cache, so results now depend on call history: the "
        "same replicated input gets the gather's bits from the earlier graph and the all-reduce's bits "
        "from this one (an input the earlier graph served gets this one's from now on wherever this "
        "graph's guards accept it: Dynamo tries the newest graph first), and a non-replicated input the "
        "earlier graph still serves (its guards accept it, no newer graph's do) gets a result that "
        "differs from eager's. The hidden row must be replicated on every call (fix the caller), or set "
        "TPFLARE_LATENT_GATHER=0 for this model. (Logged once per frame and site.)",
        ", ".join(inputs), weight, site, frame)


# --- the inner compiler -----------------------------------------------------------------------------
def _group_info(g: str) -> tuple[int, int]:
    return group_rank(g), group_size(g)


class LatentGatherCompiler:
    """``inner_compile`` for ``compile_fx``: latent-gather sites decided and rewritten, then Inductor."""

    def __init__(self, settings: Settings, dynamo_gm: fx.GraphModule, real_inputs: Sequence[Any],
                 graph_id: str, inner: Callable[..., Any] | None = None) -> None:
        from torch._inductor.compile_fx import compile_fx_inner

        self.settings, self.graph_id = settings, graph_id
        self.inner = inner or compile_fx_inner
        self._flat: list | None = flat_real_inputs(dynamo_gm, real_inputs)
        self._frame = latent_history.current_frame()   # read now: inside Dynamo's compile of the frame
        self._warned: set[str] = set()   # weights this compile warned about (two sites can share one)

    def release(self) -> None:
        """Drop the references to the real inputs (activations) once compile_fx returned."""
        self._flat = None

    def __call__(self, gm: fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any) -> Any:
        if self._flat is None or not is_distributed():
            return self.inner(gm, example_inputs, **kwargs)
        from tpflare.passes.latent_gather import find_sites

        is_inference = kwargs.get("is_inference", True)
        sites = find_sites(gm.graph, _group_info, specialize=self.settings.latent_gather and is_inference)
        if not sites:
            return self.inner(gm, example_inputs, **kwargs)
        placeholders = list(gm.graph.find_nodes(op="placeholder"))
        fakes = [p.meta.get("val") for p in placeholders]
        bindings: list[RowBinding] = []
        with _real_tensors():
            plan = self._decide(gm, sites, placeholders, fakes, is_inference)
            if plan:
                example_inputs, kwargs = self._rewrite(gm, example_inputs, kwargs, plan, placeholders, bindings)
        compiled = self.inner(gm, example_inputs, **kwargs)
        if not plan:
            return compiled
        self._remember_rewrites(plan)
        return RowShardCall(compiled, bindings)

    def _remember_rewrites(self, plan) -> None:
        """Tell ``latent_history`` which sites this compile rewrote (once its graph compiled), so a
        later compile of the frame whose check fails at one of them can say so."""
        for _s, info in plan:
            latent_history.remember_rewrite(self._frame, info["weight_name"], info["upstream"])

    # one local summary per site, agreed over the sites' groups ------------------------------------
    def _local(self, gm, sites, placeholders, fakes, is_inference) -> list[dict[str, Any]]:
        from tpflare.passes.replication import upstream

        st = self.settings
        index = {p: i for i, p in enumerate(placeholders)}
        keys = self._input_keys(index)
        mapping_problem = match_inputs(fakes, self._flat)
        allowed = {d.strip() for d in st.latent_gather_dtypes.split(",") if d.strip()}
        states: dict[int, tuple] = {}        # one hash per graph input, however many sites read it
        order = {n: i for i, n in enumerate(gm.graph.nodes)}
        mode = self._mode_gate(st, is_inference)  # the graph-wide gates
        out = []
        for s in sites:
            rec: dict[str, Any] = dict(name=s.name, group=s.group, sig=(s.reduce.spelling, s.group, s.n,
                                       s.k_shard, s.layout, s.bias is not None, str(s.dtype)))
            if s.skip and s.symbolic and mode:  # sizes are specialised only where the rewrite may run
                rec["skip"] = mode
            else:
                rec["skip"] = s.skip or mode or self._static_gate(s, st, allowed, mapping_problem)
            if rec["skip"] is None:
                rec.update(self._replication(s, upstream, keys, order, st, states))
                rec.update(self._row_source(s, index))
                rec["rows_hint"] = str(_hint(s.rows()))
                inputs = list(rec["leaf_names"].values())      # source names, stable across recompiles
                rec["sticky"] = latent_history.found_earlier(self._frame, rec["weight_name"], inputs)
                rec["rewrote_earlier"] = latent_history.rewrote_earlier(self._frame, rec["weight_name"], inputs)
                rec["rewrite_warned"] = latent_history.warned(self._frame, rec["weight_name"])
            out.append(rec)
        return out

    @staticmethod
    def _mode_gate(st, is_inference) -> str | None:
        """Why no site of this graph may be rewritten, whatever its shape (the knob, training)."""
        if not st.latent_gather:
            return "knob off (TPFLARE_LATENT_GATHER=0)"
        if not is_inference:
            return "graph needs gradients (training graph): the rewrite is for inference"
        return None

    @staticmethod
    def _static_gate(s, st, allowed, mapping_problem) -> str | None:
        """Why this site may not be rewritten (the graph-wide gates passed)."""
        dtype = str(s.dtype).replace("torch.", "")
        if dtype not in allowed:
            why = (" (FP32: the traffic still halves but the exactness gain is gone; "
                   "add float32 to opt in)") if dtype == "float32" else ""
            return f"dtype {dtype} not in TPFLARE_LATENT_GATHER_DTYPES={st.latent_gather_dtypes}{why}"
        if s.n % (st.latent_gather_align * s.world):
            return f"width: N={s.n} is not a multiple of align*W={st.latent_gather_align}*{s.world}"
        if mapping_problem:
            return f"cannot map the graph's inputs to the model's tensors ({mapping_problem})"
        return _rows_gate(s, st.latent_gather_min_rows)

    def _input_keys(self, index: dict) -> tuple[dict, dict]:
        """Each graph input's key in the replication proof (placeholder -> key) and back (key ->
        flat index): its Dynamo source (``L['x']``, a parameter's name), not its position, in the
        fingerprint and the leaves the ranks compare, since Dynamo may number one program's
        inputs differently on two ranks (symbolic sizes under ``dynamic=True``); by position where
        two inputs share a name."""
        names = [self._flat[i][2] for i in range(len(self._flat))]
        unique = len(set(names)) == len(names)
        key = {p: (names[i] if unique else i) for p, i in index.items()}
        return key, {key[p]: i for p, i in index.items()}

    def _replication(self, s, upstream, keys, order, st, memo: dict[Any, tuple]) -> dict[str, Any]:
        """What this rank knows about whether ``x_full`` (and a bias/W's bias) is replicated
        (``keys``: ``_input_keys``)."""
        key, flat_of = keys
        ups = [upstream(v, key, order) for v in (s.x_full, s.bias) if v is not None]
        blocker = next((u.blocker for u in ups if u.blocker), None)
        site_ranks = set(group_ranks(s.group))
        for u in ups:
            for g in u.proven_groups:
                try:
                    covers = site_ranks <= set(group_ranks(g))
                except Exception:
                    covers = False
                if not covers:
                    blocker = blocker or f"computed from a collective over group {g!r}, which does not span {s.group!r}"
        trust = st.latent_gather_replication == "trust"
        leaves = sorted({leaf for u in ups for leaf in u.leaves}, key=lambda k: (type(k).__name__, k))
        for leaf in leaves:
            if leaf not in memo:
                i = flat_of[leaf]
                memo[leaf] = _leaf_state(self._flat[i][0], self._flat[i][1], trust)
        states = {leaf: memo[leaf] for leaf in leaves}
        return dict(blocker=blocker, fingerprint=[u.fingerprint for u in ups], leaves=states,
                    leaf_names={leaf: self._flat[flat_of[leaf]][2] for leaf in leaves},
                    proof=("collective" if not leaves else
                           "dtensor" if all(v[0] == "dtensor-replicate" for v in states.values()) else
                           "trusted" if trust else "checked"))

    def _row_source(self, s, index) -> dict[str, Any]:
        col, owner, name = self._flat[index[s.weight]]
        entry = row_shards.lookup(col)
        registered = bool(entry is not None and entry.origin == "registered" and entry.layout == s.layout)
        placements = tuple(getattr(owner, "placements", ()) or ())
        want = 1 if s.layout == "out_in" else 0
        dtensor = bool(placements and len(placements) == 1 and placements[0].is_shard(want)
                       and getattr(owner.device_mesh, "ndim", 0) == 1
                       and owner.device_mesh.get_group().group_name == s.group)
        return dict(registered=registered, dtensor=dtensor, weight_name=name)

    def _decide(self, gm, sites, placeholders, fakes, is_inference) -> list[tuple[Any, dict]]:
        local = lambda: self._local(gm, sites, placeholders, fakes, is_inference)  # noqa: E731
        groups = sorted({s.group for s in sites if s.world > 1 and s.group is not None})
        if self.settings.latent_gather and groups:
            ranks = sorted({r for g in groups for r in group_ranks(g)})
            everyone = agree(f"latent gather sites of {self.graph_id}", local, ranks=ranks,
                             timeout_s=self.settings.prep_timeout)
            me = everyone[ranks.index(torch.distributed.get_rank())]
        else:
            me = local()
            everyone, ranks = [me], [0]
        plan = []
        for i, (s, rec) in enumerate(zip(sites, me)):
            base = dict(site=f"{self.graph_id}:{s.name}", group=s.group, spelling=s.reduce.spelling)
            if s.n:
                base.update(N=s.n, K=s.k, W=s.world, layout=s.layout, bias=s.bias is not None)
            reason, differing = self._agreed_reason(i, rec, everyone, ranks)
            if differing:      # the only reason that depends on the call's values: sticky for the frame
                suffix, marks = self._not_replicated(i, rec, differing, everyone, base["site"])
                reason, base = reason + suffix, dict(base, **marks)
            if reason is None:
                rec = dict(rec, registered=all(o[i]["registered"] for o in everyone),
                           dtensor=all(o[i]["dtensor"] for o in everyone))
                if not rec["registered"] and self.settings.latent_gather_reshard != "auto":
                    reason = "no registered row shard and TPFLARE_LATENT_GATHER_RESHARD=never"
            if reason:
                reporting.record("latent_gather", "skipped", reason=reason, **base)
                continue
            plan.append((s, dict(base, upstream=list(rec["leaf_names"].values()),
                                 **{k: rec[k] for k in ("registered", "dtensor", "weight_name", "proof")})))
        return plan

    def _not_replicated(self, i: int, rec: dict, differing: list[str], everyone: list,
                        site: str) -> tuple[str, dict[str, Any]]:
        """A check found site ``i``'s hidden row not replicated (graph inputs ``differing``): remember
        it for the frame's later compiles.  Where an earlier compile rewrote the site (some rank says
        so), warn once per frame and site (unless some rank did already) and return the skip reason's
        suffix and the record's mark (``earlier_rewrite=True``); else ``("", {})``.  Every rank reads
        the same records, so every rank says the same."""
        weight = rec["weight_name"]
        latent_history.remember(self._frame, weight, differing)
        if not _any_rank(i, everyone, "rewrote_earlier"):
            return "", {}
        if not _any_rank(i, everyone, "rewrite_warned") and weight not in self._warned:
            _warn_earlier_rewrite(site, weight, differing, self._frame.key)
            latent_history.mark_warned(self._frame, weight)
            self._warned.add(weight)
        return EARLIER_REWRITE, {"earlier_rewrite": True}

    @staticmethod
    def _agreed_reason(i: int, rec: dict, everyone: list, ranks: list) -> tuple[str | None, list[str]]:
        """Why site ``i`` is skipped (None: it is not), from every rank's record; and the source
        names of the graph inputs whose bits differ across ranks, when that is the reason."""
        if any(len(o) != len(everyone[0]) or o[i]["sig"] != rec["sig"] for o in everyone):
            return "ranks compiled different sites here (every rank must compile the same model)", []
        if rec["skip"]:
            return rec["skip"], []
        for r, o in zip(ranks, everyone):
            if o[i]["skip"]:
                return f"{o[i]['skip']} (on rank {r})", []
        blocker = next((o[i]["blocker"] for o in everyone if o[i]["blocker"]), None)
        if blocker:
            return f"hidden row not replicated: {blocker}", []
        if any(o[i]["fingerprint"] != rec["fingerprint"] for o in everyone):
            return ("hidden row not replicated: ranks compute it with different ops or constants "
                    "(rank-dependent code upstream)"), []
        differing = _differing_leaves(i, rec, everyone, ranks)
        names = [rec["leaf_names"][leaf] for leaf, _ in differing]
        sticky = _sticky_reason(i, everyone, ranks)
        if sticky:
            return sticky, names
        if differing:
            return (f"hidden row not replicated: graph input {names[0]} differs across ranks "
                    f"(ranks {differing[0][1]} disagree with this one)"), names
        if any(o[i]["rows_hint"] != rec["rows_hint"] for o in everyone):
            return "ranks compiled different row counts", []
        return None, []

    # the rewrite -------------------------------------------------------------------------------------
    def _rewrite(self, gm, example_inputs, kwargs, plan, placeholders, bindings: list[RowBinding]) -> tuple:
        """Rewrite ``gm`` in place; returns the inputs and kwargs to compile it with."""
        from torch._guards import detect_fake_mode

        from tpflare.passes.latent_gather import rewrite

        fake_mode = detect_fake_mode(list(example_inputs))
        index = {p: i for i, p in enumerate(placeholders)}
        keys = self._input_keys(index)
        rows_nodes: dict[int, fx.Node] = {}
        new_fakes: list[Any] = []
        last = placeholders[-1]
        replaced: dict[fx.Node, fx.Node] = {}
        for s, info in plan:
            ci = index[s.weight]
            if ci not in rows_nodes:
                rows, origin, added = self._rows(s, ci, info)
                with gm.graph.inserting_after(last):
                    node = gm.graph.placeholder(f"tpflare_rows_{ci}")
                last = node
                node.meta["val"] = fake_mode.from_tensor(rows, static_shapes=True)
                rows_nodes[ci] = node
                new_fakes.append(node.meta["val"])
                col = self._flat[ci][0]
                bindings.append(RowBinding(ci, col, rows, info["weight_name"], s.group, s.world, s.layout,
                                           self.settings.latent_gather_reshard == "auto"))
                info.update(row_shard=origin, memory_added_bytes=added)
            else:
                info.update(row_shard="shared", memory_added_bytes=0)
            done = rewrite(gm.graph, s, rows_nodes[ci], fake_mode, self.settings.latent_gather_channel_rows,
                           replaced)
            rec = {k: v for k, v in info.items() if k not in _NOT_REPORTED}
            reporting.record("latent_gather", "rewritten", **rec, **done)
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
        n0 = len(example_inputs)
        kwargs = dict(kwargs)
        kwargs["static_input_idxs"] = list(kwargs.get("static_input_idxs") or []) + \
            list(range(n0, n0 + len(new_fakes)))
        return list(example_inputs) + new_fakes, kwargs

    def _rows(self, s, ci: int, info: dict) -> tuple[torch.Tensor, str, int]:
        col, owner, name = self._flat[ci]
        entry = row_shards.lookup(col)
        if info["registered"] and entry is not None:
            rows = entry.rows
            expect = (s.n // s.world, s.k)
            if tuple(rows.shape) != expect:
                raise ValueError(f"{entry.name} for {name}: shape {tuple(rows.shape)} (as [out, in]), "
                                 f"expected {expect}")
            return rows, "registered", 0
        rows, added = row_shards.resharded(col, name, s.world, s.group, s.layout,
                                           owner if info["dtensor"] else None)
        return rows, ("dtensor" if info["dtensor"] else "resharded"), added


__all__ = ["LatentGatherCompiler", "RowShardCall", "RowBinding", "flat_real_inputs", "match_inputs"]
