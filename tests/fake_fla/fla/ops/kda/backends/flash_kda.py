# SPDX-License-Identifier: MIT
"""fla's own FlashKDA backend as far as the registry sees it: its type, switch and priority;
it takes only FlashKDA's flags and records the calls it runs."""

from fla.backends import BaseBackend, register
from fla.ops.kda.chunk import chunk_kda

CALLS = []


@register(chunk_kda)
class FlashKDABackend(BaseBackend):
    backend_type = "flash_kda"
    package_name = "flash_kda"
    env_var = "FLA_FLASH_KDA"
    priority = 3

    def chunk_kda_verifier(self, *args, safe_gate=False, use_gate_in_kernel=False, **kwargs):
        if not (safe_gate and use_gate_in_kernel):
            return False, "FlashKDA requires safe_gate=True"
        return True, None

    def chunk_kda(self, *args, **kwargs):
        CALLS.append(kwargs)
        return "fla's flash_kda backend", None
