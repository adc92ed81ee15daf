"""tpflare's torch.library custom ops (namespace ``tpflare``), each with a fake impl.

Importing this package registers every op; nothing else registers ops.
"""
from . import gather  # noqa: F401  column gather, reshard
from . import ordering, select  # noqa: F401

__all__ = ["gather"]
