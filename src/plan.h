// SPDX-License-Identifier: MIT
// plan.h: the host-side plan of one forward: size limits checked without overflow, the
// cost model that picks the column split and the sequence segments (docs/design.md §5,
// §6), and the workspace layout. Pure functions of the sizes and the device's facts
// (PlanDevice, which the launch code queries): no device query here, no CUDA.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "kda/config.h"

namespace flash_kda {

// Upper bounds of the C ABI, each set by the narrowest index that carries it.
constexpr int64_t kMaxTokens = (int64_t{1} << 31) - 1;  // B * T: int32 tensor-copy coordinates
constexpr int64_t kMaxHeads = 65535;                    // H: K1's grid.y
constexpr int64_t kMaxSeqs = int64_t{1} << 30;          // N: int32 record/segment prefixes
constexpr int64_t kMaxWorkspace = int64_t{1} << 50;     // bytes: far beyond any device

// The sizes a plan depends on (from flash_kda_fwd_args).
struct ProblemSizes {
  int64_t batch, seqlen, heads, num_seqs;
  bool varlen;
  int32_t checkpoint_every;  // tokens, 0 = none
  int64_t max_seqlen;        // varlen: the longest sequence's tokens, 0 = unknown
};

struct Plan {
  int32_t chunk_tokens;      // tokens per chunk: 16, or 32 (AUTO mode; design §4.3)
  int32_t block_v;           // recurrence CTA width of the whole-sequence or rerun pass
  int32_t segment_chunks;    // 0 = one chain per sequence; else chunks per segment
  int32_t segment_block_v;   // CTA width of the segment pass
  int64_t max_segments;      // segments the grids are sized for
  int32_t overlap_min_ctas;  // K1 CTAs per SM beside the first pass for it to overlap K1
                             // (design §4.7); 0 = never
  int32_t overlap_max_ctas;  // K1 CTAs per SM kept beside the pass at its start: 1 where
                             // the SMs the pass leaves free can carry K1, else all that fit
  int32_t overlap_lead;      // overlap_max_ctas 0 (K1 leaving the pass's SMs): K1's items
                             // written on every SM before it leaves them
  int32_t overlap_group;     // K1's items beside the pass come in groups of this many
                             // sequences: those one wave of the pass starts together
  bool longest_first;        // varlen whole pass of more than one wave: its CTAs take the
                             // sequences longest first (design §4.2)
  // Workspace layout, byte offsets from its base (each 128-byte aligned).
  int64_t tile_prefix, segment_prefix, checkpoint_prefix, segment_states, segment_starts;
  int64_t ready;         // one uint32 ready flag per record (design §4.7)
  int64_t overlap_sync;  // K1's work counter after the flags (workspace.h OverlapSync)
  int64_t workspace_bytes;
};

// The caller's choices that a plan honours.
struct PlanRequest {
  int32_t mode;            // flash_kda_mode
  int32_t block_v;         // 0 = pick
  int32_t segment_chunks;  // 0 = pick (AUTO mode)
  int32_t overlap;         // 0 = pick, 1 = wherever it can run, 2 = K1 leaving, -1 = never
  int32_t chunk_tokens;    // 0 = pick, 16 or 32 (32: AUTO mode only)
  int32_t gate;            // flash_kda_gate
};

// What the plan knows of the device: the facts its choices depend on, as the launch code
// finds them (launch.cuh plan_device; simulated limits included), so that a plan never
// counts on a schedule the launch cannot run there. Index [b] of the K1 counts: records of
// b + 1 16-token blocks (16- and 32-token chunks).
struct PlanDevice {
  int32_t cc;    // compute capability, 10 major + minor: picks the cost table (costs.h)
  bool generic;  // every pass on recurrence_kernel (every arch but sm_90a, whose warpgroup
                 // passes a test switch turns off)
  int32_t sms;   // multiprocessors the plan spreads the work over
  int32_t smem_optin, smem_sm;  // shared memory per block (opt-in) and per SM, bytes
  int32_t threads_sm, regs_sm;  // threads and registers per SM
  int32_t k1_alone[2];          // prepare_kernel CTAs an SM by itself
  int32_t k1_overlap[2];        // prepare_overlap_kernel CTAs an SM by itself
  // prepare_overlap_kernel CTAs that fit on an SM beside one CTA of each width's
  // whole-sequence pass (the most of the forms the launch may pick; 0: none, or no
  // 32-token pass of that width): FlashKDA's K1 (the bounded gate's forms hold as much), and
  // the unbounded gates' (design §2.5), which holds more registers
  int32_t k1_beside[2][kNumRecurrenceShapes];
  int32_t k1_beside_unbounded[2][kNumRecurrenceShapes];
  bool combine_wide;  // two stages of 16-row combine CTAs fit a block's shared memory
};

// PlanDevice field by field as int32 words, in order (flash_kda_testing_device's layout after
// its struct_size; the plan cache's key).
constexpr int kPlanDeviceWords = 24;
inline void plan_device_words(const PlanDevice &d, int32_t (&w)[kPlanDeviceWords]) {
  int i = 0;
  for (int32_t x : {d.cc, d.generic ? 1 : 0, d.sms, d.smem_optin, d.smem_sm, d.threads_sm,
                    d.regs_sm, d.k1_alone[0], d.k1_alone[1], d.k1_overlap[0], d.k1_overlap[1]})
    w[i++] = x;
  for (const auto *fits : {&d.k1_beside, &d.k1_beside_unbounded})
    for (const auto &row : *fits)
      for (int32_t x : row) w[i++] = x;
  w[i++] = d.combine_wide ? 1 : 0;
}

// "" when the sizes are within the limits, else what is wrong ("batch * seqlen must be
// ..."); never overflows, whatever the inputs. Calls without tokens or sequences pass (they
// have no plan: make_plan needs tokens).
std::string check_sizes(const ProblemSizes &sizes);

// "" when a request is one make_plan can honour (given a device), else what is wrong.
std::string check_request(const ProblemSizes &sizes, const PlanRequest &request);

// Fills plan for valid sizes (check_sizes(sizes) == "") on `device`; "" or the reason it
// cannot.
std::string make_plan(const ProblemSizes &sizes, const PlanRequest &request,
                      const PlanDevice &device, Plan &plan);

// Workspace bytes of an exact-mode call, -1 when the sizes are out of range.
int64_t exact_workspace_bytes(int64_t total_tokens, int64_t heads, int64_t num_seqs);

// The narrowest recurrence width whose CTAs fit one wave for `pairs` (sequence, head)
// chains on num_sms multiprocessors (design §5).
int32_t pick_block_v(int64_t pairs, int32_t num_sms);

}  // namespace flash_kda
