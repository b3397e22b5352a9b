"""Weight transports, one per file, behind `WeightTransport` (base.py says which is which)."""

from verl_like.resharding.transports.base import WeightTransport

__all__ = ["WeightTransport"]
