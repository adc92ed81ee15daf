"""The file-locked composition cache (race winners by key).  See docs/cache.md.

    from tpflare.cache import CompositionCache, make_key, site_key_fields
    cache = CompositionCache.from_settings(tpflare.config.resolve())
    fields = site_key_fields(...)
    key = make_key(fields)
    entry = cache.get(key) or race_and(cache.put(key, {...}))
"""
from .identity import code_identity, device_fields, site_key_fields, version_fields  # noqa: F401
from .store import CacheLockTimeout, CompositionCache, default_directory, make_key, new_entry  # noqa: F401

__all__ = [
    "CacheLockTimeout", "CompositionCache", "code_identity", "default_directory",
    "device_fields", "make_key", "new_entry", "site_key_fields", "version_fields",
]
