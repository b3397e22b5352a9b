"""ConfigError: the one exception type every config problem raises (a ValueError, so callers may catch either)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A bad config value; the message names the dotted key(s), the value and the fix."""
