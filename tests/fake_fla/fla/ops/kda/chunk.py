# SPDX-License-Identifier: MIT
"""chunk_kda with fla 0.6.0's signature, dispatched; its own body (fla's Triton path) only
records the call."""

from fla.backends import dispatch

CALLS = []


@dispatch
def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
              allow_neg_eigval=False, safe_gate=False, lower_bound=None, disable_recompute=False,
              return_intermediate_states=False, state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None,
              cp_context=None, use_graph=False, max_num_seqs=None, **kwargs):  # fmt: skip
    CALLS.append(dict(safe_gate=safe_gate, use_gate_in_kernel=use_gate_in_kernel))
    return "fla triton", None
