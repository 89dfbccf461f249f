"""The one lazy-attribute helper of the package: ``import jacap_lib`` / ``from jacap_lib import viz``
stay cheap, and a public name (or a sub-module) is imported on first use (PEP 562)."""
from __future__ import annotations

import importlib
import sys

__all__ = ["lazy_attributes"]


def lazy_attributes(package: str, names: dict, exported):
    """``(__getattr__, __dir__)`` for ``package``: ``names`` maps an attribute to the absolute module
    it comes from; when that module is ``package.<attribute>`` the attribute is the sub-module itself.
    A loaded attribute is cached in the package's namespace."""

    def __getattr__(name: str):
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        loaded = importlib.import_module(module)
        value = loaded if module == f"{package}.{name}" else getattr(loaded, name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__():
        return list(exported)

    return __getattr__, __dir__
