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
// blocks of 8 value columns, so block_v = 8 kNB kWarps columns per CTA.
struct RecurrenceShape {
  int block_v;
  int nb;     // 8-column blocks per warp
  int warps;  // compute warps (plus one producer warp)
  // CTAs per SM the general kernel and the segment pass are compiled for (register_cap,
  // __launch_bounds__). A sub-partition holds 16K registers: two CTAs of <1, 4> (10 warps,
  // 3 on one sub-partition) allow 168 a thread and its latency schedule needs 209 (ptxas,
  // CUDA 13.0; 52 bytes spilled at 168); two of <1, 8> allow 96 and it needs 79; two
  // segment-pass CTAs of <2, 8> (18 warps, 5 on one) allow 96, where sm_90a's spills 16
  // bytes outside its link loop, where the grouped value rows made the pass 11% faster on
  // the H200); the general <2, 8> kernel needs 132.
  int resident;
  int states_resident;
  // Cost-model inputs (plan.cpp), one chunk link in microseconds on the H200: of the
  // exact path's whole-sequence kernel alone on its SM (K2 time / 512 links at T = 8192,
  // N = 1, H = 6 / 48 / 96); of the segment pass at states_resident CTAs per SM and at
  // one (a grid of at most one CTA per SM); of the rerun at `resident` and at one (fitted
  // to per-kernel profiles at forced segment lengths; 0: never used for segments, as
  // <1, 4> was slowest there at every segment length).
  double whole_link_us;
  double states_link_us;
  double states_alone_us;
  // The segment pass's link where all its CTAs fit one wave at states_resident per SM with
  // more than one on some SM; 0: states_link_us there too. Block_v 64 only, and over more
  // than one wave too for chains of at most 128 links (plan.cpp kShortChainLinks); longer
  // chains keep states_link_us, as they lost to block_v 128 at T = 131072 and 1M.
  double states_wave_us;
  double rerun_link_us;
  double rerun_alone_us;
  // K1 CTAs that fit on an SM beside one CTA of the whole-sequence pass on the H200 (the
  // launch computes the device's own, launch.cuh plan_overlap); the plan's choice between
  // segments and the whole pass assumes it. 0: none fits.
  int prepare_beside;
  // A record's time (us) of a lone K1 CTA beside one CTA of this width's whole pass on the
  // H200, where each of prepare_beside takes 6.2 (plan.cpp): fitted to the forwards whose
  // launch keeps one K1 CTA on the pass's SMs (T=8192, 16-token chunks: H=28 at block_v 32
  // 0.319 ms, H=48 at 64 0.533, H=96 at 128 0.790). 0 where prepare_beside is 0.
  double prepare_one_us;
  // A 32-token link (kBlocks = 2, one CTA per SM) against a 16-token link of the same
  // width at one CTA per SM, on the H200 (the plain pass with K1 before it at T=8192, H=24
  // for <1, 4>, H=48 for <1, 8>). 0: this width has no 32-token instantiation (<2, 8>:
  // 1.96x at H=96, slower than 16-token chunks wherever measured).
  double chunk32_link_scale;
  // K1 CTAs for 32-token records (80 registers, 8 warps) that fit on an SM beside one CTA
  // of this width's 32-token whole pass on the H200: one beside <1, 4> (121 registers),
  // none beside <1, 8> (123 registers, 9 warps: 4,096 registers a sub-partition left).
  int prepare32_beside;
};

// block_v 64's and 128's values are those of the warpgroup passes that replace
// recurrence_kernel's at these widths on sm_90a (recurrence_wg.cuh, design §4.9). The
// segments' passes (T = 8192 H = 6 and 12, T = 32768 H = 6): at block_v
// 64 the segment pass 0.66 us a link two CTAs an SM and ~0.52 alone, the rerun 0.83 and 0.52;
// at block_v 128 (one CTA an SM) the segment pass 0.65 us a link, so that its "two CTAs an
// SM" are two waves, 1.30, and the rerun 0.72. The whole pass: at block_v 64 0.56 us a link (284.5
// us for 512 links at T = 8192 H = 48, K1 first), four K1 CTAs beside it (two beside its
// one-CTA-an-SM form, whose fullest sub-partition holds 2 warps x 200 registers; four beside its
// 168-register form, which the launch takes where more than two are asked for), and a 32-token <1,
// 8> link of 2.76 of them (1.55 us); at block_v 128 0.73 us a link
// (373.5 us at T = 8192 H = 96, two warpgroups and a producer warpgroup) and no K1
// CTA beside it: its twelve warps hold the whole register file, so K1 runs first or leaves
// the pass's SMs. The plan is the H200's: on the other arches these widths keep the
// recurrence_kernel passes (block_v 128 then without K1 beside it, by this table).
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
    {32, 1, 4, 1, 1, 0.56, 0.0, 0.0, 0.0, 0.0, 0.0, 3, 2.0, 1.50, 1},
    {64, 1, 8, 2, 2, 0.56, 0.66, 0.52, 0.62, 0.83, 0.52, 4, 3.0, 2.76, 0},
    {128, 2, 8, 1, 2, 0.73, 1.30, 0.65, 0.0, 0.72, 0.72, 0, 0.0, 0.0, 0},
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
  return blocks == 1 || (code != PassCode::kStates && s.chunk32_link_scale > 0);
}

// combine_kernel (design §6.2 phase B): the value rows of one CTA, so that a (sequence,
// head) takes 128 / rows CTAs: 8 rows (16 CTAs a head) where all fit one per SM, else 16
// (8 a head). launch.cuh launches it (8 also where 16 rows do not fit the device's shared
// memory, sm_120) and the plan's cost model counts it.
constexpr int combine_rows(int64_t pairs, int64_t num_sms) {
  return pairs * 16 <= num_sms ? 8 : 16;
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

// The table entry of a block_v, or nullptr.
constexpr const RecurrenceShape *recurrence_shape(int block_v) {
  for (int i = 0; i < kNumRecurrenceShapes; ++i)
    if (kRecurrenceShapes[i].block_v == block_v) return &kRecurrenceShapes[i];
  return nullptr;
}

}  // namespace flash_kda
