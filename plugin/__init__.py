"""tpflare: a torch.compile / Inductor plugin for tensor-parallel MoE inference.

    import tpflare
    model = torch.compile(model, backend="tpflare")

See README.md for the knobs (``tpflare.config`` / ``TPFLARE_*``).
"""
from __future__ import annotations

import logging

from .config import config, knobs_markdown  # noqa: F401
from .errors import (  # noqa: F401
    ConfigError, KnobMismatchError, PreparationError, StaleWeightError, TpflareError)
from . import ops  # noqa: F401  registers torch.ops.tpflare.*
from .reporting import clear as clear_report, format_report, records as report  # noqa: F401

logging.getLogger("tpflare").addHandler(logging.NullHandler())

__version__ = "0.1.0"

from .backend import register as _register_backend, tpflare_backend  # noqa: E402
from .row_shards import refresh_row_shards, register_row_shard  # noqa: E402,F401
from . import latent_history  # noqa: E402,F401  tpflare.latent_history.clear() for a stack's own reset
from .inductor import compile_fx  # noqa: E402,F401
from .passes.collectives import register_all_reduce, unregister_all_reduce  # noqa: E402,F401

_register_backend()
from .ops.select import select_topk, validate_candidates  # noqa: E402,F401
