// SPDX-License-Identifier: MIT
// config.h: the recurrence kernel's instantiations, the one table that api.cpp's plan,
// launch.cuh's switch and the kernel itself read (docs/design.md §5). Host and device
// constexpr, arch-independent.
#pragma once

#include <cstdint>

namespace flash_kda {

// The code a recurrence_kernel instantiation carries (launch.cuh: configure_pass). Each
// leaves out the branches of the passes it never runs: the link loop is latency-bound,
// and dead branches cost it registers and instructions.
enum class PassCode {
  kPlain,    // the whole-sequence pass without checkpoints (the exact path's kernel)
  kGeneral,  // passes with output and checkpoints: the whole pass with checkpoints, the rerun
  kStates,   // the segment pass (phase A): states only, so no Pq, no Mqk U, no output rows
  kRerun,    // the rerun without checkpoints: sm_90a's warpgroup pass only (recurrence_wg.cuh;
             // recurrence_kernel runs every rerun as kGeneral)
};

// One width of recurrence_kernel<kNB, kWarps, kCode>: kWarps compute warps of kNB
// blocks of 8 value columns, so block_v = 8 kNB kWarps columns per CTA. What is built and
// how it is launched, the same on every arch; what a link costs is the plan's (costs.h).
struct RecurrenceShape {
  int block_v;
  int nb;     // 8-column blocks per warp
  int warps;  // compute warps (plus one producer warp)
  // CTAs per SM the general kernel and the segment pass are compiled for (register_cap,
  // __launch_bounds__). A sub-partition holds 16K registers: two CTAs of <1, 4> (10 warps,
  // 3 on one sub-partition) allow 168 a thread and its latency schedule needs 209 (ptxas,
  // CUDA 13.0; 52 bytes spilled at 168); two of <1, 8> allow 96 and it needs 79; two
  // segment-pass CTAs of <2, 8> (18 warps, 5 on one) allow 96 (the grouped value rows made
  // that pass 11% faster on the H200); the general <2, 8> kernel needs 132.
  int resident;
  int states_resident;
  // Whether the whole-sequence passes (kPlain, kGeneral) are built for 32-token chunks
  // (design §4.8): <1, 4> and <1, 8>; <2, 8>'s 32-token link took 1.96x its 16-token one at
  // H=96, slower than 16-token chunks wherever measured.
  bool chunk32;
};

// block_v -> <kNB, kWarps>, chosen on the H200 with benchmarks/bench_fwd.py --block-v
// (whole-forward medians, ms):
//   32  -> <1, 4>, latency schedule. T=8192: H=6 0.329, H=24 0.412.
//   64  -> <1, 8>, streamed. H=48 0.672 (<2, 4> latency schedule: 0.707; 8x1024 H=8:
//          0.111 vs 0.118).
//   128 -> <2, 8>, streamed. H=96 1.064 (<4, 4>: 1.140, <1, 16>: 1.268); T=32768 H=96
//          4.15 (4.40); varlen six sequences H=96 1.04 (1.10).
// Three widths instead of the style's two: each width's best shape differs and the
// benchmarks above show the gain. On sm_90a the warpgroup passes replace block_v 64's and
// 128's recurrence_kernel where they can (recurrence_wg.cuh, launch.cuh configure_pass).
constexpr RecurrenceShape kRecurrenceShapes[] = {
    [] {
      RecurrenceShape s{};
      s.block_v = 32, s.nb = 1, s.warps = 4, s.resident = 1, s.states_resident = 1;
      s.chunk32 = true;
      return s;
    }(),
    [] {
      RecurrenceShape s{};
      s.block_v = 64, s.nb = 1, s.warps = 8, s.resident = 2, s.states_resident = 2;
      s.chunk32 = true;
      return s;
    }(),
    [] {
      RecurrenceShape s{};
      s.block_v = 128, s.nb = 2, s.warps = 8, s.resident = 1, s.states_resident = 2;
      s.chunk32 = false;
      return s;
    }(),
};
constexpr int kNumRecurrenceShapes = 3;

constexpr bool shape_is_consistent(const RecurrenceShape &s) {
  return s.block_v == 8 * s.nb * s.warps && 128 % s.block_v == 0 && s.resident >= 1 &&
         s.states_resident >= 1;
}
static_assert(shape_is_consistent(kRecurrenceShapes[0]) &&
                  shape_is_consistent(kRecurrenceShapes[1]) &&
                  shape_is_consistent(kRecurrenceShapes[2]),
              "every instantiation covers block_v = 8 nb warps columns");
static_assert(sizeof(kRecurrenceShapes) / sizeof(kRecurrenceShapes[0]) == kNumRecurrenceShapes,
              "kNumRecurrenceShapes");

// Whether recurrence_kernel<s.nb, s.warps, code, blocks> is built: every 16-token one; with
// 32-token chunks (design §4.8) only the whole-sequence passes (kPlain, kGeneral) of the
// widths that gain from them. The segment pass and the rerun keep 16-token chunks: at one
// CTA per SM their 32-token links were no faster.
constexpr bool instantiated(const RecurrenceShape &s, PassCode code, int blocks) {
  return blocks == 1 || (code != PassCode::kStates && s.chunk32);
}

// combine_kernel (design §6.2 phase B): the value rows of one CTA, so that a (sequence,
// head) takes 128 / rows CTAs: 8 rows (16 CTAs a head) where all fit one per SM, else 16
// (8 a head) where two stages of 16 rows fit the device's shared memory per block (`wide`:
// sm_120's 99 KB hold them exactly). launch.cuh launches it and the plan's cost model counts
// it.
constexpr int combine_rows(int64_t pairs, int64_t num_sms, bool wide) {
  return pairs * 16 <= num_sms || !wide ? 8 : 16;
}

// CTAs per SM the instantiation <nb, warps, code, blocks> is compiled for (its
// __launch_bounds__): the whole-sequence kernel runs one per SM (its grid is at most one
// wave), and so does every 32-token pass (blocks = 2): its link holds two blocks' inputs,
// which spilled at the two-CTA register cap.
constexpr int resident_ctas(int nb, int warps, PassCode code, int blocks = 1) {
  if (code == PassCode::kPlain || blocks > 1) return 1;
  for (int i = 0; i < kNumRecurrenceShapes; ++i)
    if (kRecurrenceShapes[i].nb == nb && kRecurrenceShapes[i].warps == warps)
      return code == PassCode::kStates ? kRecurrenceShapes[i].states_resident
                                       : kRecurrenceShapes[i].resident;
  return 1;
}

// Registers a thread may hold so that `ctas` CTAs of `warps` warps share an SM: the warps
// spread over four sub-partitions of 16K registers each, allocated 8 a thread at a time.
// __launch_bounds__ alone counts the SM's 64K as one pool, which let the <2, 8> segment
// pass take 103 registers where two CTAs need at most 96.
constexpr int register_cap(int warps, int ctas) {
  const int per_partition = (ctas * warps + 3) / 4;
  const int cap = 16384 / (32 * per_partition) / 8 * 8;
  return cap > 255 ? 255 : cap;
}
static_assert(register_cap(9, 2) == 96 && register_cap(5, 2) == 168 && register_cap(5, 1) == 255,
              "register_cap");

// The index of a block_v's entry in kRecurrenceShapes, or -1.
constexpr int shape_index(int block_v) {
  for (int i = 0; i < kNumRecurrenceShapes; ++i)
    if (kRecurrenceShapes[i].block_v == block_v) return i;
  return -1;
}

// The table entry of a block_v, or nullptr.
constexpr const RecurrenceShape *recurrence_shape(int block_v) {
  for (int i = 0; i < kNumRecurrenceShapes; ++i)
    if (kRecurrenceShapes[i].block_v == block_v) return &kRecurrenceShapes[i];
  return nullptr;
}

}  // namespace flash_kda
