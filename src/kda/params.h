// SPDX-License-Identifier: MIT
// params.h: the plain struct at the host/kernel boundary. api.cpp fills it from a
// validated flash_kda_fwd_args; every kernel takes it by value. Arch-independent (no
// symbols), like workspace.h.
#pragma once

#include <cstdint>

#include <flash_kda/flash_kda_testing.h>

#include "kda/workspace.h"

namespace flash_kda {

// Element types of state and index tensors; the values are flash_kda_dtype's.
enum class Dtype : int32_t { kNone = 0, kBf16 = 1, kFp32 = 2, kInt32 = 3, kInt64 = 4 };

// Element strides of an activation [B, T, H, 128] (last stride 1) or of beta [B, T, H].
struct Strides {
  int64_t batch;
  int64_t token;
  int64_t head;
};

// Which chunk chains one launch of the recurrence kernel runs (docs/design.md §5, §6).
enum class ChainPass : int32_t {
  kWhole = 0,    // one chain per (sequence, head): the exact path
  kSegment = 1,  // §6 phase A: each segment but the last from zero (value columns) and
                 // from the identity (transition columns); no output
  kRerun = 2,    // §6 phase C: each segment from its combined start state, with output
};

// What a call launched, as a test records it (TestSwitches::record; flash_kda_testing.h
// flash_kda_testing_launch: the instantiation as the source names it, its ring depth, CTAs
// per SM and dynamic shared memory as launched).
constexpr int32_t kLaunchedPrefix = 1, kLaunchedPrepare = 2, kLaunchedPrepareOverlap = 3,
                  kLaunchedRecurrence = 4, kLaunchedWarpgroup = 5, kLaunchedCombine = 6;
using LaunchedKernel = flash_kda_testing_launch;
using LaunchRecord = flash_kda_testing_launches;
constexpr int kMaxLaunches = FLASH_KDA_TESTING_MAX_LAUNCHES;

// Test-only switches (flash_kda_testing.h): the GPU at hand runs the passes of the other
// arches and reproduces a smaller device's residency, or a planted stall shows that a hang
// ends in an error. All zero in a product call.
struct TestSwitches {
  int32_t generic;  // every pass on recurrence_kernel, records in fragment order (sm_90a's
                    // warpgroup passes off)
  // > 0: the device has at most this many (launch.cuh simulate): SMs (the launch takes at
  // most the real count, the plan the simulated one), opt-in shared memory per block and
  // shared memory per SM (bytes), threads and registers per SM, K1 CTAs per SM.
  int32_t sms, smem_optin, smem_sm, threads_sm, regs_sm, k1_ctas_sm;
  int32_t stall;         // > 0: CTA 0 of the first recurrence pass never arms its first stage
  LaunchRecord *record;  // host memory: what the call launched, or nullptr
  bool any() const {
    return generic || sms || smem_optin || smem_sm || threads_sm || regs_sm || k1_ctas_sm || stall;
  }
  bool simulated() const {
    return sms || smem_optin || smem_sm || threads_sm || regs_sm || k1_ctas_sm;
  }
};

// A bounded wait (numerics.cuh) that has not returned after this long traps: a wait that
// can never complete ends the kernel with an error instead of hanging the process. Far
// beyond any legal wait: the longest is a pass CTA's for its next record while K1 writes
// the records before it, a few ms on the H200.
constexpr uint64_t kWaitLimitNs = uint64_t{60} * 1000 * 1000 * 1000;

// The decay gate's form (flash_kda_gate): FlashKDA's bounded gate, or one of the two
// unbounded forms, which K1 takes through the split of design §2.5.
enum class Gate : uint8_t { kLowerBound = 0, kSoftplus = 1, kLogDecay = 2 };

struct FwdParams {
  // Activations [B, T, H, 128] bf16 (bit patterns) with their element strides; g is fp32
  // where g_fp32 (the log-decay gate), beta where beta_fp32.
  const uint16_t *q;
  const uint16_t *k;
  const uint16_t *v;
  const uint16_t *g;
  const uint16_t *beta;  // [B, T, H]
  uint16_t *out;
  Strides q_strides, k_strides, v_strides, g_strides, beta_strides, out_strides;
  const float *A_log;    // [heads]; nullptr with Gate::kLogDecay
  const float *dt_bias;  // [heads, 128]; likewise

  // States [S, heads, 128 (V), 128 (K)], S = num_seqs, or pool_size with state_indices.
  const void *initial_state;
  void *final_state;
  Dtype initial_dtype;
  Dtype final_dtype;
  const void *state_indices;  // [num_seqs] slot per sequence (< 0: padding), or nullptr
  Dtype index_dtype;
  int64_t pool_size;
  const uint8_t *has_initial_state;  // [num_seqs] or nullptr

  // Checkpoints [checkpoint_slots, heads, 128, 128]: the state every checkpoint_chunks
  // chunks of each sequence (flash_kda.h).
  void *checkpoints;
  Dtype checkpoint_dtype;
  int32_t checkpoint_chunks;
  int64_t checkpoint_slots;

  const void *cu_seqlens;  // [num_seqs + 1] or nullptr (batched)
  Dtype cu_seqlens_dtype;

  int64_t batch;         // B
  int64_t seqlen;        // T
  int64_t total_tokens;  // B * T
  int64_t heads;
  int64_t num_seqs;

  // Workspace (plan.cpp lay_out): records, the prefix arrays, the segment buffers, then
  // the ready flags and K1's counter.
  uint8_t *records;        // [heads, tiles_per_head, record_bytes(16 << (chunk_shift - 4))]
  int32_t chunk_shift;     // log2 of the tokens of a chunk: 4 (16, exact mode) or 5 (32)
  int64_t tiles_per_head;  // record stride of one head
  int64_t prepare_tiles;   // records per head K1 covers: exact in batched mode, upper
                           // bound in varlen
  // K1 beside the whole-sequence pass (design §4.7, batched mode). Order of the items: the
  // sequences in groups of order_group, those one wave of the pass starts together; in a
  // group chunk j of every sequence before chunk j + 1, heads innermost.
  int32_t order_group;
  int32_t prepare_items;  // all heads' items (overlap only)
  // ready[head * tiles_per_head + tile] != 0 once K1 has written that record; nullptr
  // when the recurrence starts only after K1. The launch overlaps the two when K1 can
  // keep overlap_min_ctas CTAs per SM beside the first pass (plan.h; 0 = never).
  uint32_t *ready;
  int32_t overlap_min_ctas;
  int32_t overlap_max_ctas;  // K1 CTAs per SM kept beside the pass at its start (plan.h);
                             // 0: none, K1 leaves the pass's SMs (leave_sms)
  // K1 leaving the pass's SMs (design §4.7; set by the launch, 0 = K1 stays): K1's CTAs
  // on the SMs with %smid below this take no more items once leave_after items are taken
  // and another K1 CTA stays, so that the pass, which asks for all of an SM's shared
  // memory, finds those SMs empty.
  int32_t leave_sms;
  int32_t leave_after;         // K1 items claimed before those CTAs may leave (the plan's lead)
  int32_t lead_items;          // items [0, lead_items) written first, one a CTA, by
                               // prepare_lead_kernel (a long lead; 0: the overlap kernel's own)
  OverlapSync *sync;           // K1's work counter, after the flags (workspace.h)
  int32_t *tile_prefix;        // [num_seqs + 1], varlen only
  int32_t *segment_prefix;     // [num_seqs + 1], varlen and segmented only
  int32_t *checkpoint_prefix;  // [num_seqs + 1], varlen with checkpoints only
  // [num_seqs]: the sequences of a varlen whole pass longest first (ties in order), in the
  // segment prefix's space; nullptr: in order (plan.h longest_first; design §4.2).
  int32_t *seq_order;

  // Sequence-parallel segments (docs/design.md §6); segment_chunks 0 = not segmented.
  int32_t segment_chunks;
  // AUTO mode where enabled (flash_kda.h FEATURE_STABLE_INVERSE): K1 checks each chunk's Neumann
  // inverse and recomputes the unsound ones in fp32 (design §2.6); else FlashKDA's inverse. (In
  // the padding before max_segments, like the forms at the end.)
  int32_t stable_inverse;
  int64_t max_segments;
  uint16_t *segment_states;  // [max_segments, heads, 256, 128] bf16: [S^ ; M^T] per segment
  uint16_t *segment_starts;  // [max_segments, heads, 128, 128] bf16: start state per segment

  float gate_scale;     // c = fp32(lower_bound * log2 e), design §3.2 step 1
  uint32_t scale_bf16;  // sb = bf(fp32(scale)), design §3.2 step 6

  int32_t chain_block_v;    // plan: width of the whole-sequence or rerun pass
  int32_t segment_block_v;  // plan: width of the segment pass

  TestSwitches test;
  // The producers' bounded waits (recurrence.cuh produce_chunks, the combine's): trap after
  // this long. kWaitLimitNs, or shorter in tests (the consumers' waits keep kWaitLimitNs).
  uint64_t wait_limit_ns;

  // Set per recurrence launch by launch.cuh.
  ChainPass pass;
  int32_t block_v;  // value columns per recurrence CTA (the instantiation's kBlockV)
  int32_t stages;   // ring depth, from the device's shared-memory limit

  // The gate and beta forms (K1 only), in the struct's tail padding: its size and every field's
  // offset stay those of FlashKDA's forms alone, and so do the kernels' parameter layouts.
  Gate gate;
  uint8_t g_fp32;     // g holds fp32 (Gate::kLogDecay only)
  uint8_t beta_fp32;  // beta holds fp32
  uint8_t beta_prob;  // beta is the write strength itself (clamped to [0, 1]), not a logit
};

}  // namespace flash_kda
