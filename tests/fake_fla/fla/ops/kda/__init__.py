# SPDX-License-Identifier: MIT
"""As fla's: chunk_kda, then its own backends (the FlashKDA one)."""

from .chunk import chunk_kda

__all__ = ["chunk_kda"]

from fla.ops.kda.backends import flash_kda  # noqa: F401
