# SPDX-License-Identifier: MIT
"""flash-kda-bin: prebuilt Kimi Delta Attention forward kernels for recent NVIDIA GPUs.

``import flash_kda`` loads nothing: the native library is opened on first use, and a
GPU without native kernels falls back to fla's Triton kernels or to pure PyTorch. fla's
``chunk_kda`` routes here through its backend registry once fla is imported (``_fla_backend``;
fla is never imported here). ``flash_kda.testing`` (imported on its own) is how tests and
benchmarks reach internals.
"""

from . import _fla_backend, reference
from ._api import backend_for, compiled_archs, fwd
from ._sequences import checkpoint_layout
from ._sizes import get_workspace_size
from ._version import __version__

_fla_backend.install()

__all__ = [
    "fwd",
    "get_workspace_size",
    "checkpoint_layout",
    "compiled_archs",
    "backend_for",
    "reference",
    "__version__",
]
