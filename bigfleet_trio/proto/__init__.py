"""Generated BigFleet v1alpha1 wire code (betterproto 2.0.0b7).

Regenerate with ``scripts/gen-proto``.

Import messages from :mod:`bigfleet_trio.proto.bigfleet.v1alpha1`; ``pb`` is a short alias.
"""

from .bigfleet import v1alpha1 as pb

__all__ = ["pb"]
