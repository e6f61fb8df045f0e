"""The conversion's own error type, shared by the launcher and the pipeline's stages."""

from __future__ import annotations

__all__ = ["ConversionError"]


class ConversionError(RuntimeError):
    """A conversion cannot go on; the message names the input or output and what to do."""
