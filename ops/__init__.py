"""tpflare's torch.library custom ops (namespace ``tpflare``), each with a fake impl.

Importing this package registers every op; nothing else registers ops.
"""
from . import gather  # noqa: F401  column gather, reshard

__all__ = ["gather"]
