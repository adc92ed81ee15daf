"""The ``tpflare`` torch.compile backend: ``tpflare.compile_fx`` with Inductor's mode/options.

    model = torch.compile(model, backend="tpflare")
    model = torch.compile(model, backend="tpflare", mode="reduce-overhead")   # CUDA graphs

Everything tpflare does per graph is in ``tpflare.inductor.compile_fx`` (the same
entry a stack with its own backend calls).
"""
from __future__ import annotations

from typing import Any, Sequence

from torch import fx

from .inductor import compile_fx


def _inductor_patches(mode: str | None, options: dict | None) -> dict[str, Any]:
    """``torch.compile(..., mode=, options=)`` as Inductor config patches (as Inductor does)."""
    patches: dict[str, Any] = {}
    if mode and mode != "default":
        from torch._inductor import list_mode_options

        patches.update(list_mode_options(mode))
    patches.update(options or {})
    return patches


def tpflare_backend(gm: fx.GraphModule, example_inputs: Sequence[Any], *, mode: str | None = None,
                    options: dict | None = None):
    """torch.compile backend: tpflare's graph preparation, then Inductor."""
    return compile_fx(gm, example_inputs, config_patches=_inductor_patches(mode, options) or None)


def _reset() -> None:
    """Called by ``torch._dynamo.reset()`` (Dynamo resets the backends it compiled with): forget
    what earlier compiles found, as a fresh process would (``tpflare.latent_history``)."""
    from . import latent_history

    latent_history.clear()


tpflare_backend.reset = _reset  # type: ignore[attr-defined]


def register() -> None:
    """Register the backend name with Dynamo (idempotent; also an entry point)."""
    from torch._dynamo.backends.registry import _BACKENDS, register_backend

    if "tpflare" not in _BACKENDS or _BACKENDS.get("tpflare") is None:
        register_backend(name="tpflare")(tpflare_backend)


__all__ = ["tpflare_backend", "register"]
