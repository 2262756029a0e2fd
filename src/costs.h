// SPDX-License-Identifier: MIT
// costs.h: the plan's cost table (docs/design.md §5, §6.3, §4.7): one row per arch family,
// every rate, knob and margin of the cost model named for what it is. Host-only, read by
// plan.cpp alone (C++20: designated initialisers). The rows' rates were measured on the
// H200; the mma.sync row's are the H200 running the other arches' passes (the generic-pass
// switch, flash_kda_testing.h) and stay estimates until measured on those GPUs. What the
// plan knows of a device besides (SM count, K1 CTAs an SM, shared memory) comes from the
// device itself (plan.h PlanDevice).
#pragma once

#include <cstdint>

#include <flash_kda/flash_kda_testing.h>

#include "kda/config.h"
#include "plan.h"

namespace flash_kda {

// One recurrence width's link times, microseconds (config.h kRecurrenceShapes).
struct WidthCosts {
  // The whole-sequence pass, one CTA an SM: K2 time / 512 links at T = 8192, N = 1 (H = 6 /
  // 48 / 96 for block_v 32 / 64 / 128).
  double whole_link_us = 0;
  // The segment pass at states_resident CTAs an SM and alone (a grid of at most one CTA an
  // SM); 0: never used for segments (<1, 4> was slowest there at every segment length).
  // Fitted to per-kernel profiles at forced segment lengths.
  double states_link_us = 0;
  double states_alone_us = 0;
  // The segment pass where all its CTAs fit one wave at states_resident an SM with more
  // than one on some SM, and over more waves for chains of at most short_chain_links links;
  // 0: states_link_us there too.
  double states_wave_us = 0;
  // The segment pass runs one CTA an SM although config.h builds it for two: its "two an
  // SM" (states_link_us = 2 states_alone_us) are two turns of each SM, each paying a wave's
  // fixed part.
  bool states_turns = false;
  // The rerun at `resident` CTAs an SM and alone; 0: never used for segments.
  double rerun_link_us = 0;
  double rerun_alone_us = 0;
  // A record's time of a lone K1 CTA beside one CTA of this width's whole pass (each of
  // several takes K1Costs::beside_record_us): fitted to the forwards whose launch keeps one
  // K1 CTA on the pass's SMs (T=8192, 16-token chunks: H=28 at block_v 32 0.319 ms, H=48
  // at 64 0.533, H=96 at 128 0.790). 0: never beside.
  double k1_lone_record_us = 0;
  // A 32-token link (one CTA an SM) against a 16-token link of the same width at one CTA an
  // SM (the plain pass with K1 before it at T=8192, H=24 for <1, 4>, H=48 for <1, 8>); 0
  // where config.h builds no 32-token pass.
  double chunk32_link_scale = 0;
};

// K1's rates for one record length, microseconds a record per K1 CTA.
struct K1Costs {
  double record_us;         // K1 alone, at the device's CTAs an SM (PlanDevice k1_alone)
  double beside_record_us;  // each of several K1 CTAs beside a pass CTA
  double lead_record_us;    // K1 alone as measured now (faster): the leave's lead only
  double lone_scale = 1.0;   // a lone K1 CTA beside a pass CTA: WidthCosts::k1_lone_record_us times this
  double leave_scale = 1.0;  // K1 leaving the pass's SMs: its record times (both) times this
};

// One arch family's costs and the plan's knobs. The knobs' values were fitted on the H200
// and are every row's until a GPU of the family says otherwise.
struct ArchCosts {
  const char *family;
  // Whether the rates were measured on a GPU of the family (false: estimates).
  bool measured;
  WidthCosts widths[kNumRecurrenceShapes];
  // 16-token records: 11.6 us at 12 CTAs on each SM (T=8192 H=96: 49,152 records in 360 us
  // on 132 SMs: the rate the plan's choices and margins were fitted with; K1 with cp.async
  // rows takes 10.3 us, 320 us there, which only the leave's lead counts), 6.2 us at 3 an SM
  // beside a pass (H=24: 12,288 records on 396 CTAs in 194 us). 32-token records (256
  // threads): 9.4 (9.0 for the lead) alone, ~14 beside the pass.
  K1Costs k1_16;
  K1Costs k1_32;
  // The unbounded gates' 16-token records (design §2.5; softplus and log decay alike), at
  // the bounded ones' CTA counts: alone 1.085x their time (T=8192 H=96, K1 first: 349
  // against 322 us), which the several-beside and lead rates take too; leaving the pass's
  // SMs 1.15x more (fitted when K1 left them at eight CTAs an SM, not twelve: T=8192 H=96
  // 0.79 ms against 0.70, H=48 at block_v 64 0.456; its leaving form at ten, prepare.cuh
  // overlap_ctas, runs the same leads 0.3-1.7% faster, leads 5% shorter within 1.2% of them
  // and 11% shorter 2-4% slower: H200, 2026-12-03); a lone CTA beside a pass CTA 1.9x
  // (T=8192 H=48, one beside each block_v 64 pass CTA and the free SMs: 0.499 against
  // 0.382 ms), so that the plan takes the wider pass with K1 on the SMs it leaves free
  // there (0.41). H200, 2026-12-02. Their 32-token records take k1_32.
  K1Costs k1_16_unbounded;

  // ---- fixed costs, microseconds
  double launch_us = 5.0;  // one more kernel launch on the stream
  double wave_us = 6.0;    // a segment pass's fixed cost per wave of CTAs
  double flags_us = 3.0;   // the ready flags' memset where K1 runs beside the pass
  double leave_us = 4.0;   // K1 leaving the SMs the pass starts on, its tail
  // combine_kernel, one step a start: 0.85 us with 8-row CTAs, 1.22 with 16-row CTAs, as
  // fitted with its older cp.async ring. Its steps now take 0.72 and 1.04 (ncu, H200), but
  // with those the plan cut T = 2048 H = 1-4 into segments of 8 chunks instead of 10, 3%
  // slower there: the older step stands in for the fixed part the model undercounts at
  // short T.
  double combine_step_us = 0.85;       // 8-row CTAs, one an SM
  double combine_wide_step_us = 1.22;  // 16-row CTAs, one an SM
  double combine_fixed_us = 4.0;       // its first two starts and its tail

  // ---- K1 beside the pass (design §4.7)
  // While K1 runs beside it, the pass's links take ~1.3x as long (T=8192 H=96: 749 us
  // against 590 alone, T=32768: 2.96 ms against 2.30).
  double beside_slowdown = 1.3;
  // Where the SMs the pass leaves free can write this share of the records the pass reads,
  // one K1 CTA an SM beside the pass is enough (H200: T=8192 H=96 0.781 ms with one and
  // the free SMs, 0.787 with three; T=32768 H=96 3.22 against 3.40).
  double free_supply = 0.4;
  // K1 leaving the pass's SMs only where predicted 3% faster than beside or first (H200).
  double leave_margin = 0.97;

  // ---- segments against the whole pass (design §6.3)
  double segments_margin = 0.9;  // segments only where the forward is predicted 10% faster
  // Segments rather than 32-token whole chains only where predicted 12% faster. Against the
  // 32-token forward the segments' predicted-to-measured ratio ran 0.06-0.20 high at H =
  // 16-24 (H200: T = 131072 H = 16 predicted 0.886, measured 0.949; H = 20 0.911 and
  // 1.052; T = 1M H = 20 0.892 and 1.095; H = 16 0.865 and 0.982). 0.88 takes no measured
  // loss and keeps the wins at T = 262144 - 1M H = 16 and T = 2048 H = 1-4.
  double segments_over32_margin = 0.88;
  // Where the 32-token forward has K1 leave the pass's SMs (N H = 9-18 on 132 SMs) and the
  // segments are at most leaving_margin_max_chunks long, 5% suffices: there the 32-token
  // prediction ran 5-6% high and the segments' within 2% (H200: T = 32768 H = 16
  // predicted 0.790 against 0.864 ms, measured 0.776 against 0.822). Longer segments ran up
  // to 9% slower than predicted (T = 131072 H = 18, 1639 chunks: 3.31 predicted, 3.48).
  double segments_over32_leaving_margin = 0.95;
  int64_t leaving_margin_max_chunks = 512;
  // Segments of at most this many chunks need no margin over the 32-token forward: there
  // the segments' prediction ran ~8 us high and the 32-token one 5-9 us low (H200: T =
  // 2048 H = 8 predicted 56.8 against 59.4 us, measured 48.8 against 64.5).
  int64_t short_segment_chunks = 32;
  // The whole pass at a wider block_v than the narrowest that fits one wave where predicted
  // 12.5% faster: at N H = 28-33 block_v 64 (half the CTAs, K1 on the SMs they leave free)
  // against block_v 32 (K1 beside it). Its prediction ran 4-6% low (H200: T = 8192 H = 32
  // predicted 0.291 against 0.345 ms, measured 0.307 against 0.343); T = 2048 H = 30
  // (predicted 0.871) measured 2.4% slower, the one loss this margin keeps.
  double wider_margin = 0.875;
  // The same against the narrowest width with K1 first, whose prediction ran within 1-4%
  // (the wider pass's 4-6% low): the unbounded gates at N H = 64, K1 first at block_v 64 (no
  // 3 of their K1 CTAs fit beside it) against block_v 128 with K1 leaving, predicted 0.880-0.887
  // of it and measured 0.927-0.941 (H200, T = 8192 and 32768 H = 64, 8 x 32768 at H = 8).
  double wider_over_first_margin = 0.95;
  int64_t min_segments = 3;          // two segments cost as much as one chain (§6.4)
  int64_t min_segment_chunks = 8;    // the shortest segment considered
  int64_t fine_segment_counts = 64;  // every segment count up to this one is a candidate
  // A segment pass of two CTAs an SM over more than one wave runs chains of at most this
  // many links at its one-wave rate (WidthCosts::states_wave_us), longer ones at
  // states_link_us (H200: L = 94 0.3044 -> 0.3003 ms at T = 32768 H = 6 against block_v
  // 128, but L = 249 and 512 2.8% slower at T = 131072 H = 4 and T = 1M). At L = 79-128 the
  // order of the two widths follows the machine's power headroom: on a hotter H200 (machine
  // B) block_v 64 ran up to 3% slower there, at L <= 64 level or faster on both machines.
  int64_t short_chain_links = 128;
};

// block_v 32: recurrence_kernel<1, 4> on every arch (the same kernel on the H200 in both
// rows).
constexpr WidthCosts kWidth32OnH200 = {
    .whole_link_us = 0.56,
    .k1_lone_record_us = 2.0,
    .chunk32_link_scale = 1.50,
};

// sm_90a: block_v 64 and 128 run the warpgroup passes (recurrence_wg.cuh, design §4.9).
// The segments' passes (T = 8192 H = 6 and 12, T = 32768 H = 6): at block_v 64 the segment
// pass 0.66 us a link two CTAs an SM and ~0.52 alone, 0.62 in one wave of two an SM, the
// rerun 0.83 and 0.52; at block_v 128 (one CTA an SM) the segment
// pass 0.65 us a link, so that its "two CTAs an SM" are two turns, 1.30, and the rerun 0.72.
// The whole pass: at block_v 64 0.56 us a link (284.5 us for 512 links at T = 8192 H = 48,
// K1 first) and a 32-token <1, 8> link of 2.76 of them (1.55 us); at block_v 128 0.73 us a
// link (373.5 us at T = 8192 H = 96, two warpgroups and a producer warpgroup),
// beside which no K1 CTA fits (PlanDevice k1_beside).
constexpr ArchCosts kHopperCosts = {
    .family = "sm_90a (warpgroup passes)",
    .measured = true,
    .widths = {kWidth32OnH200,
               {.whole_link_us = 0.56,
                .states_link_us = 0.66,
                .states_alone_us = 0.52,
                .states_wave_us = 0.62,
                .rerun_link_us = 0.83,
                .rerun_alone_us = 0.52,
                .k1_lone_record_us = 3.0,
                .chunk32_link_scale = 2.76},
               {.whole_link_us = 0.73,
                .states_link_us = 1.30,
                .states_alone_us = 0.65,
                .states_turns = true,
                .rerun_link_us = 0.72,
                .rerun_alone_us = 0.72}},
    .k1_16 = {.record_us = 11.6, .beside_record_us = 6.2, .lead_record_us = 10.3},
    .k1_32 = {.record_us = 9.4, .beside_record_us = 14.0, .lead_record_us = 9.0},
    .k1_16_unbounded =
        {.record_us = 12.6,
         .beside_record_us = 6.7,
         .lead_record_us = 11.2,
         .lone_scale = 1.9,
         .leave_scale = 1.15},
};

// Every other arch (and sm_90a with checkpoints or 32-token chunks, where its passes are
// recurrence_kernel too): recurrence_kernel at every width, records in fragment order.
// Estimates: recurrence_kernel<1, 8> and <2, 8> on the H200 (whole passes: 0.88 and 1.10 us
// a link; segment passes and reruns, as fitted before the warpgroup passes: 1.10 / 1.10 /
// 1.65 and 1.52 / 0.90 / 1.15), K1's rates the H200's.
constexpr ArchCosts kMmaSyncCosts = {
    .family = "mma.sync passes (estimates from the H200)",
    .measured = false,
    .widths = {kWidth32OnH200,
               {.whole_link_us = 0.88,
                .states_link_us = 1.10,
                .states_alone_us = 1.10,
                .rerun_link_us = 1.65,
                .rerun_alone_us = 1.65,
                .k1_lone_record_us = 3.0,
                .chunk32_link_scale = 1.76},
               {.whole_link_us = 1.10,
                .states_link_us = 1.52,
                .states_alone_us = 0.90,
                .rerun_link_us = 1.15,
                .rerun_alone_us = 1.15,
                .k1_lone_record_us = 3.0}},
    .k1_16 = kHopperCosts.k1_16,
    .k1_32 = kHopperCosts.k1_32,
    .k1_16_unbounded = kHopperCosts.k1_16_unbounded,
};

// The row for a device: sm_90a's where its warpgroup passes run, else the mma.sync row.
constexpr const ArchCosts &costs_for(int32_t cc, bool generic) {
  return cc == 90 && !generic ? kHopperCosts : kMmaSyncCosts;
}

// ---------------------------------------------------------------- reference devices
// The facts the launch code finds (launch.cuh plan_device) on the devices the plan is
// evaluated for without a GPU (flash_kda_testing_plan; benchmarks/plan_grid.py), the SM
// count aside. Each is what an H200 reports in a test mode (tests/test_arches_gpu.py checks
// them there): itself, the other arches' passes (generic; sm_100's limits are the H200's),
// and those with sm_120's limits (99 KB a block, 100 KB and 1,536 threads an SM). The
// registers are sm_90a's; a real sm_100 or sm_120 finds its own.
struct ReferenceDevice {
  int32_t id;  // flash_kda_testing_device_id
  const char *name;
  PlanDevice facts;
};

// The H200 by itself. K1 alone: 12 CTAs an SM of 16-token records (40 registers, 15.5 KB),
// 4 of 32-token ones (64 registers, ~56 KB), 3 of its 32-token overlap kernel (80 registers).
// Beside one pass CTA: <1, 4> (187 registers, 2 warps on its fullest sub-partition) leaves
// room for 3 (1 of 32-token records); the warpgroup block_v 64 pass 4 in its 168-register
// form; the block_v 128 one none (twelve warps hold the register file). The unbounded gates'
// 16-token overlap kernel (64 registers against 40) fits 2 beside each of the first two; its
// 32-token one takes the bounded one's 80.
constexpr PlanDevice kH200 = {.cc = 90,
                              .generic = false,
                              .sms = 132,
                              .smem_optin = 232448,
                              .smem_sm = 233472,
                              .threads_sm = 2048,
                              .regs_sm = 65536,
                              .k1_alone = {12, 4},
                              .k1_overlap = {12, 3},
                              .k1_beside = {{3, 4, 0}, {1, 0, 0}},
                              .k1_beside_unbounded = {{2, 2, 0}, {1, 0, 0}},
                              .combine_wide = true};

// The H200 running the other arches' passes, with sm_100's SM count (its limits are the
// H200's): recurrence_kernel<1, 8> (91 registers, 3 warps on one sub-partition) leaves room
// for 5 K1 CTAs (3 of the unbounded gates'), <2, 8> (119) for 3 (2).
constexpr PlanDevice kSm100 = [] {
  PlanDevice d = kH200;
  d.cc = 100, d.generic = true, d.sms = 148;
  d.k1_beside[0][1] = 5, d.k1_beside[0][2] = 3;
  d.k1_beside_unbounded[0][1] = 3, d.k1_beside_unbounded[0][2] = 2;
  return d;
}();

// Those passes with sm_120's limits (an RTX 5090's SM count): a pass CTA's ring takes the SM's
// shared memory, so no K1 CTA fits beside any pass, and 6 (16-token) or 1 (32-token) alone.
constexpr PlanDevice kSm120 = [] {
  PlanDevice d = kSm100;
  d.cc = 120, d.sms = 170, d.smem_optin = 101376, d.smem_sm = 102400, d.threads_sm = 1536;
  d.k1_alone[0] = d.k1_overlap[0] = 6, d.k1_alone[1] = d.k1_overlap[1] = 1;
  for (auto *fits : {&d.k1_beside, &d.k1_beside_unbounded})
    for (auto &row : *fits)
      for (int32_t &fit : row) fit = 0;
  return d;
}();

constexpr ReferenceDevice kReferenceDevices[] = {
    {FLASH_KDA_TESTING_DEVICE_H200, "h200", kH200},
    {FLASH_KDA_TESTING_DEVICE_SM100, "sm100", kSm100},
    {FLASH_KDA_TESTING_DEVICE_SM120, "sm120", kSm120},
};

}  // namespace flash_kda
