"""Jacap variants from the critique (note §14.3), each registered under a name beginning with 'jacap'.

``VARIANTS`` maps a registry name to a factory ``f(compression_ratio, **opts) -> press``;
:mod:`jacap_lib.presses.registry` merges it into the method registry.
"""
VARIANTS: dict = {}
