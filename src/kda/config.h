// SPDX-License-Identifier: MIT
// config.h: the recurrence kernel's instantiations, the one table that api.cpp's plan,
// launch.cuh's switch and the kernel itself read (docs/design.md §5). Host and device
// constexpr, arch-independent.
#pragma once

#include <cstdint>

namespace flash_kda {

// One width of recurrence_kernel<kNB, kWarps, kGeneral>: kWarps compute warps of kNB
// blocks of 8 value columns, so block_v = 8 kNB kWarps columns per CTA.
struct RecurrenceShape {
  int block_v;
  int nb;     // 8-column blocks per warp
  int warps;  // compute warps (plus one producer warp)
  // The general kernel's CTAs per SM (its __launch_bounds__ minimum). A sub-partition
  // holds 16K registers: two CTAs of <1, 4> (10 warps, 3 on one sub-partition) allow 168
  // a thread and its latency schedule needs 209 (ptxas, CUDA 13.0; 52 bytes spilled at
  // 168); two of <1, 8> allow 102 and it needs 79.
  int resident;
  // Cost-model inputs (plan.cpp), one chunk link in microseconds on the H200: of the
  // exact path's whole-sequence kernel alone on its SM (K2 time / 512 links at T = 8192,
  // N = 1, H = 6 / 48 / 96), and of the general kernel in the segment passes at
  // `resident` CTAs per SM (fitted to benchmarks/results/h200-sweep.json; 0: never
  // used for segments, as <1, 4> was slowest there at every segment length).
  double whole_link_us;
  double pass_link_us;
};

// block_v -> <kNB, kWarps>, chosen on the H200 with benchmarks/bench_fwd.py --block-v
// (whole-forward medians, ms):
//   32  -> <1, 4>, latency schedule. T=8192: H=6 0.329, H=24 0.412.
//   64  -> <1, 8>, streamed. H=48 0.672 (<2, 4> latency schedule: 0.707; 8x1024 H=8:
//          0.111 vs 0.118).
//   128 -> <2, 8>, streamed. H=96 1.064 (<4, 4>: 1.140, <1, 16>: 1.268); T=32768 H=96
//          4.15 (4.40); varlen six sequences H=96 1.04 (1.10).
// Three widths instead of the style's two: each width's best shape differs and the
// benchmarks above show the gain.
constexpr RecurrenceShape kRecurrenceShapes[] = {
    {32, 1, 4, 1, 0.64, 0.0},
    {64, 1, 8, 2, 0.88, 1.51},
    {128, 2, 8, 1, 1.26, 1.08},
};
constexpr int kNumRecurrenceShapes = 3;

constexpr bool shape_is_consistent(const RecurrenceShape &s) {
  return s.block_v == 8 * s.nb * s.warps && 128 % s.block_v == 0 && s.resident >= 1;
}
static_assert(shape_is_consistent(kRecurrenceShapes[0]) &&
                  shape_is_consistent(kRecurrenceShapes[1]) &&
                  shape_is_consistent(kRecurrenceShapes[2]),
              "every instantiation covers block_v = 8 nb warps columns");
static_assert(sizeof(kRecurrenceShapes) / sizeof(kRecurrenceShapes[0]) == kNumRecurrenceShapes,
              "kNumRecurrenceShapes");

// combine_kernel (design §6.2 phase B): value rows per CTA, one MMA row block, so a
// (sequence, head) takes kCombineCtasPerHead CTAs. The plan's cost model counts them.
constexpr int kCombineRows = 16;
constexpr int kCombineCtasPerHead = 128 / kCombineRows;

// CTAs per SM the instantiation <nb, warps> is compiled for (its __launch_bounds__).
constexpr int resident_ctas(int nb, int warps) {
  for (int i = 0; i < kNumRecurrenceShapes; ++i)
    if (kRecurrenceShapes[i].nb == nb && kRecurrenceShapes[i].warps == warps)
      return kRecurrenceShapes[i].resident;
  return 1;
}

// The table entry of a block_v, or nullptr.
constexpr const RecurrenceShape *recurrence_shape(int block_v) {
  for (int i = 0; i < kNumRecurrenceShapes; ++i)
    if (kRecurrenceShapes[i].block_v == block_v) return &kRecurrenceShapes[i];
  return nullptr;
}

}  // namespace flash_kda
