"""The composition cache key covers every module the selection code runs (CPU, in CI).

The import closure of the selection ops is walked from their source (``ast``, nothing
imported, so Triton-only modules count too): a tpflare module the selection code can reach
but ``SELECTION_MODULES`` leaves out would let an edit to it serve stale race winners.
"""
from __future__ import annotations

import ast

import pytest
import torch

from tpflare.cache import identity
from tpflare.cache.identity import SELECTION_MODULES, code_identity, module_source, selection_code

# reachable from the selection ops but deliberately not hashed: why
NOT_CODE = {"tpflare.config": "knob values are in the key (Settings.decision_dict), not its source"}
ROOTS = ("tpflare.ops.select",)


def _imports(name: str) -> set[str]:
    """The tpflare modules that module ``name`` imports (anywhere in it, relative or absolute)."""
    tree = ast.parse(module_source(name))
    pkg = name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(name.split(".")[: -node.level])
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module or ""
            cands = [mod] + [f"{mod}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            cands = [a.name for a in node.names]
        else:
            continue
        for c in cands:
            if c.startswith("tpflare.") and c not in (pkg, "tpflare.ops"):
                try:
                    module_source(c)
                except (TypeError, ModuleNotFoundError):
                    continue  # a name imported from a module, not a module
                out.add(c)
    return out


def _closure(roots) -> set[str]:
    seen, todo = set(), list(roots)
    while todo:
        m = todo.pop()
        if m in seen or m in NOT_CODE:
            continue
        seen.add(m)
        todo.extend(_imports(m))
    return seen


def test_every_reachable_selection_module_is_in_the_key():
    reach = _closure(ROOTS)
    # the walk itself must see the modules it is meant to see (else this test asserts nothing)
    assert {"tpflare.ops.select_kernel", "tpflare.ops.select_staged", "tpflare.ops.radix"} <= reach
    missing = reach - set(SELECTION_MODULES)
    assert not missing, f"selection modules missing from the cache key: {sorted(missing)}"
    stale = set(SELECTION_MODULES) - reach
    assert not stale, f"SELECTION_MODULES names modules the selection code no longer reaches: {sorted(stale)}"


@pytest.mark.parametrize("name", SELECTION_MODULES)
def test_an_edit_to_any_selection_module_changes_the_key(name, monkeypatch):
    base = code_identity(*selection_code())
    real = identity.module_source
    monkeypatch.setattr(identity, "module_source",
                        lambda m: real(m) + (b"\n# edited\n" if m == name else b""))
    assert code_identity(*selection_code()) != base


def test_race_compositions_hash_the_selection_modules_and_carry_the_kernel(monkeypatch):
    import tpflare
    from tpflare import race

    monkeypatch.setattr(race, "group_size", lambda g: 2)
    monkeypatch.setattr(race, "group_ranks", lambda g: [0, 1])

    comps = race.compositions(tpflare.config.resolve(), kernel="triton")
    for cm in comps:
        assert code_identity(*cm.code) == code_identity(*selection_code())
        assert cm.extra_args[-1] == "triton"
    # the key's child plans carry the kernel: a graph raced with one kernel is not served for the other
    fields = [race._site_key(2, 8, 4, "0", False, torch.device("cpu"), race.compositions(
        tpflare.config.resolve(), kernel=kn), tpflare.config.resolve()) for kn in ("torch", "triton")]
    assert fields[0]["child_plans"] != fields[1]["child_plans"]
    assert fields[0]["compositions"] == fields[1]["compositions"]
