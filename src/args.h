// SPDX-License-Identifier: MIT
// args.h: from the caller's flash_kda_fwd_args (and test overrides) to a plan and FwdParams:
// every check of docs/api.md, each returning "" or what is wrong. Host-only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <flash_kda/flash_kda.h>
#include <flash_kda/flash_kda_testing.h>

#include "kda/params.h"
#include "plan.h"

namespace flash_kda {

// The caller's struct, zero-extended to this header's layout (an older caller passes a
// prefix, at least ABI 1's); the fields retired in ABI 6 must be 0.
std::string read_args(const flash_kda_fwd_args *in, flash_kda_fwd_args &a);

// The caller's overrides (NULL: none), zero-extended likewise.
std::string read_overrides(const flash_kda_testing_overrides *in, flash_kda_testing_overrides &o);

// head_dim, the sizes and the request: every check of the plan's inputs that needs no
// device (the plan itself needs the device's facts).
std::string check_call(const flash_kda_fwd_args &a, const flash_kda_testing_overrides &o);

// The plan of a checked call on `device` (remembered per plan input and device; a call
// without tokens or sequences has the empty plan: no workspace, nothing but the state copy).
std::string check_plan(const flash_kda_fwd_args &a, const flash_kda_testing_overrides &o,
                       const PlanDevice &device, Plan &plan);

// The test switches of the overrides (params.h TestSwitches; all zero without overrides).
TestSwitches switches_of(const flash_kda_testing_overrides &o);

// What the checks of a call's pointers read (check_pointers), derived by check_tensors from
// everything but the pointers' values: each argument's span in bytes (0: nothing; the
// workspace's is the call's workspace_bytes) and the alignment its pointer needs, in the order
// out, final_state, checkpoints, workspace, q, k, v, g, beta, A_log, dt_bias, initial_state,
// cu_seqlens, state_indices, has_initial_state; and the activations' strides as FwdParams
// takes them. A known call (call_cache.h) keeps them for its signature.
constexpr int kPointerArgs = 15;
struct PointerFacts {
  int64_t bytes[kPointerArgs];
  int32_t align[kPointerArgs];
  Strides q_strides, k_strides, v_strides, g_strides, beta_strides, out_strides;
};

// Everything about the tensors but their pointers' values (whether each is NULL is part of the
// signature): the forms, strides, states, pool, checkpoints and scale; derives `facts`.
std::string check_tensors(const flash_kda_fwd_args &a, PointerFacts &facts);

// The pointers: each one's alignment, and that no output overlaps another argument.
std::string check_pointers(const flash_kda_fwd_args &a, const PointerFacts &facts);

// The workspace against the plan's size.
std::string check_workspace(const flash_kda_fwd_args &a, const Plan &plan);

// p for a checked call, laid out by its plan.
void fill_params(const flash_kda_fwd_args &a, const Plan &plan, const PointerFacts &facts,
                 FwdParams &p);

// Whether the call takes the default gate and beta forms (LOWER_BOUND gate, bf16 g, bf16 beta
// logits): what every arch table runs; the others need FLASH_KDA_FEATURE_GATE_FORMS.
inline bool default_forms(const flash_kda_fwd_args &a) {
  return a.gate == FLASH_KDA_GATE_LOWER_BOUND && a.beta_form == FLASH_KDA_BETA_LOGIT &&
         a.g_dtype != FLASH_KDA_DTYPE_FP32 && a.beta_dtype != FLASH_KDA_DTYPE_FP32;
}

// Tokens in the call (B * T) and sequences: a call with either 0 runs no kernel but the
// state copy.
inline bool has_tokens(const flash_kda_fwd_args &a) {
  return a.batch > 0 && a.seqlen > 0 && a.num_seqs > 0;
}

}  // namespace flash_kda
