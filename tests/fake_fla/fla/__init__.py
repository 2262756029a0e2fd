# SPDX-License-Identifier: MIT
"""A stand-in for the parts of fla (flash-linear-attention 0.6.0) that flash_kda's backend
touches, for tests on machines without fla: its backend registry (``fla.backends``) and a
dispatched ``fla.ops.kda.chunk.chunk_kda`` whose own implementation only records its calls.
Put ``tests/fake_fla`` first on ``sys.path`` (tests/test_fla_backend.py does, in subprocesses)."""
