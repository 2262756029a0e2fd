// SPDX-License-Identifier: MIT
// plan.cpp: size limits, the cost model and the workspace layout (plan.h). Host-only.
#include "plan.h"

#include <flash_kda/flash_kda.h>

#include <algorithm>

#include "kda/config.h"
#include "kda/workspace.h"

namespace flash_kda {
namespace {

// a * b, or -1 when either is -1 (a failed step before) or the product exceeds `limit`.
int64_t mul_within(int64_t a, int64_t b, int64_t limit) {
  int64_t r = 0;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r) || r > limit) return -1;
  return r;
}

// a + b for a, b >= 0, or -1 when either is -1 or the sum exceeds `limit`.
int64_t add_within(int64_t a, int64_t b, int64_t limit) {
  if (a < 0 || b < 0 || a > limit - b) return -1;
  return a + b;
}

std::string str(int64_t x) {
  return std::to_string(x);
}

// ---------------------------------------------------------------- cost model
// Microseconds on the H200 (config.h; fitted to per-kernel profiles at forced segment
// lengths, benchmarks/profile_kernels.py), K1 included (prepare_us and the overlap models below).

constexpr double kLaunchUs = 5.0;  // one more kernel launch on the stream
constexpr double kWaveUs = 6.0;    // a segment pass's fixed cost per wave of CTAs
// combine_kernel, one step a start: 0.85 us with 8-row CTAs, 1.22 with 16-row CTAs, as
// fitted with its older cp.async ring. Its steps now take 0.72 and 1.04 (ncu, H200), but
// with those the plan cut T = 2048 H = 1-4 into segments of 8 chunks instead of 10, 3%
// slower there: the older step stands in for the fixed part the model undercounts at
// short T.
constexpr double kCombineStepUs = 0.85;      // 8-row CTAs, one an SM
constexpr double kCombineWideStepUs = 1.22;  // 16-row CTAs, one an SM
constexpr double kCombineFixedUs = 4.0;      // combine_kernel's first two starts and its tail
constexpr double kMargin = 0.9;              // segments only when the forward is predicted
                                             // 10% faster
// Segments rather than 32-token whole chains only where predicted 12% faster. Against the
// 32-token forward the segments' predicted-to-measured ratio ran 0.06-0.20 high at H = 16-24
// (H200: T = 131072 H = 16 predicted 0.886, measured 0.949; H = 20
// 0.911 and 1.052; T = 1M H = 20 0.892 and 1.095; H = 16 0.865 and 0.982). 0.88 takes no
// measured loss and keeps the wins at T = 262144 - 1M H = 16 and T = 2048 H = 1-4; the 2-5% it
// gave up at T = 65536 - 131072 H = 16 the margin below takes back.
constexpr double kSegmentsOver32Margin = 0.88;
// Where the 32-token forward has K1 leave the pass's SMs (N H = 9-18 on 132 SMs) and the
// segments are at most 512 chunks long, 5% suffices: there the 32-token prediction ran 5-6%
// high and the segments' within 2% (H200: T = 32768 H = 16 predicted
// 0.790 against 0.864 ms, measured 0.776 against 0.822; T = 8192 H = 14 segments measured 0.191
// against 0.220). Longer segments ran up to 9% slower than predicted (T = 131072 H = 18, 1639
// chunks: 3.31 predicted, 3.48 measured; T = 65536 H = 18, 820 chunks, 1.68-1.81 against the
// 32-token 1.73).
constexpr double kSegmentsOver32LeavingMargin = 0.95;
constexpr int64_t kLeavingMarginMaxChunks = 512;
// Segments of at most 32 chunks need no margin over the 32-token forward: there the segments'
// prediction ran ~8 us high and the 32-token one 5-9 us low (H200:
// T = 2048 H = 8 predicted 56.8 against 59.4 us, measured 48.8 against 64.5; H = 5-8 and N H =
// 5-8 at T = 2048, T = 2560 H = 9 and T = 3072 H = 11 ran 16-32% faster segmented).
constexpr int64_t kShortSegmentChunks = 32;
// The whole-sequence pass at a wider block_v than the narrowest that fits one wave where the
// model predicts the forward 12.5% faster: at N H = 28-33 block_v 64 (half the CTAs, K1 on the
// SMs they leave free) against block_v 32 (K1 beside it). Its prediction ran 4-6% low (H200:
// T = 8192 H = 32 predicted 0.291 against 0.345 ms, measured
// 0.307 against 0.343); at T = 2048 H = 28 (predicted 0.886) block_v 64 measured 3.6% slower,
// at T = 8192 H = 28 (0.873) 2.5% faster, at T = 2048 H = 30 (0.871) 2.4% slower, the one loss
// this margin keeps.
constexpr double kWiderMargin = 0.875;
constexpr int64_t kMinSegments = 3;         // two segments cost as much as one chain (§6.4)
constexpr int64_t kMinSegmentChunks = 8;    // shortest segment considered
constexpr int64_t kFineSegmentCounts = 64;  // every segment count up to this one is a candidate
// K1 (design §4.7), one record per K1 CTA: 11.6 us at 12 CTAs on each SM (T=8192 H=96:
// 49,152 records in 360 us on 132 SMs: the rate the plan's choices and margins were fitted
// with; K1 with cp.async rows takes 10.3 us, 320 us there, which only the leave's lead
// counts, ChunkCosts::k1_lead_record_us), 6.2 us at 3 per SM beside a pass (H=24: 12,288
// records on 396 CTAs in 194 us), less for a lone K1 CTA beside a pass CTA (config.h
// prepare_one_us). While K1 runs beside it, the pass's links take ~1.3x as
// long (T=8192 H=96: 749 us against 590 alone, T=32768: 2.96 ms against 2.30).
constexpr double kPrepareRecordUs = 11.6;
constexpr double kPrepareBesideRecordUs = 6.2;
constexpr double kBesideSlowdown = 1.3;
constexpr int kPrepareCtasAlone = 12;  // K1's CTAs per SM by itself (__launch_bounds__)
constexpr double kOverlapUs = 3.0;     // the flags' memset
// Where the SMs the pass leaves free can write this share of the records the pass reads,
// one K1 CTA per SM beside the pass is enough (H200: T=8192 H=96 0.781 ms with
// one and the free SMs, 0.787 with three; T=32768 H=96 3.22 against 3.40).
constexpr double kFreeSupply = 0.4;

// The chunk length's part of the cost model. 16-token chunks: config.h's link times and
// K1's measured rates above. 32-token chunks (design §4.8): whole-sequence passes only (no
// segments), one CTA per SM (config.h resident_ctas), and a link costs chunk32_link_scale
// 16-token links of the same width at one CTA per SM (config.h); K1's 32-token CTAs are
// 256 threads, four per SM by their shared memory: 9.4 us a record per CTA alone (9.0 for
// the leave's lead, as k1_lead_record_us) and ~14 beside the pass, where config.h's
// prepare32_beside fit (H200).
struct ChunkCosts {
  int32_t tokens;
  double k1_record_us;         // K1 alone: one record per CTA
  int k1_ctas_alone;           // K1 CTAs per SM alone
  double k1_beside_record_us;  // a record per K1 CTA beside the pass
  int k1_overlap_ctas;         // prepare_overlap_kernel's CTAs per SM (its launch bounds)
  double k1_lead_record_us;    // K1 alone as measured now: the lead's records (k1_leaves_us)
};
constexpr ChunkCosts kCosts16 = {
    16, kPrepareRecordUs, kPrepareCtasAlone, kPrepareBesideRecordUs, 12, 10.3};
constexpr ChunkCosts kCosts32 = {32, 9.4, 4, 14.0, 3, 9.0};

// A link of width s for these chunks against config.h's 16-token link times.
double link_scale(const RecurrenceShape &s, const ChunkCosts &cost) {
  return cost.tokens == 32 ? s.chunk32_link_scale : 1.0;
}

// Whether the whole-sequence pass of this width is built for 32-token chunks (config.h).
bool chunk32_built(int32_t block_v) {
  return instantiated(*recurrence_shape(block_v), PassCode::kPlain, 2);
}

const ChunkCosts &costs_of(int32_t tokens) {
  return tokens == 32 ? kCosts32 : kCosts16;
}

double waves(int64_t ctas, int64_t slots) {
  return static_cast<double>(ceil_div(ctas, slots));
}

// The whole-sequence pass: one CTA per SM, chains of `chunks` links.
double whole_us(int64_t pairs, int64_t chunks, int32_t block_v, int32_t num_sms,
                const ChunkCosts &cost) {
  const RecurrenceShape &s = *recurrence_shape(block_v);
  return waves(pairs * (kHeadDim / block_v), num_sms) * static_cast<double>(chunks) *
         s.whole_link_us * link_scale(s, cost);
}

// A pass of `ctas` CTAs in chains of `links` links, `resident` CTAs per SM: each wave
// costs its links plus a fixed part (the start state in, the end state out, the ring
// filling). A last wave of at most one CTA per SM runs its links at `alone_us`, a single
// wave of more at `wave_us`.
double pass_us(int64_t ctas, int64_t links, int32_t num_sms, int resident, double link_us,
               double alone_us, double wave_us) {
  const int64_t slots = int64_t{num_sms} * resident;
  if (ctas > num_sms && ctas <= slots) return static_cast<double>(links) * wave_us + kWaveUs;
  const int64_t rest = ctas % slots;
  double t = static_cast<double>(ctas / slots) * (static_cast<double>(links) * link_us + kWaveUs);
  if (rest > 0) t += static_cast<double>(links) * (rest <= num_sms ? alone_us : link_us) + kWaveUs;
  return t;
}

// The segment pass at block_v 128 is one CTA an SM (the warpgroup pass): config.h's "two an
// SM" for it (states_link_us = 2 x states_alone_us) are two turns of each SM, and each turn
// pays a wave's fixed part, not one for both. Counted where its CTAs fit that one "wave",
// as measured on the H200; a pass of more keeps pass_us's one fixed part a wave.
bool takes_turns(const RecurrenceShape &s) {
  return s.states_resident > 1 && s.states_link_us >= 0.95 * s.states_resident * s.states_alone_us;
}

// A segment pass of two CTAs an SM (block_v 64) over more than one wave runs chains of at
// most this many links at its one-wave rate (states_wave_us), longer ones at states_link_us
// (H200: L = 94 0.3044 -> 0.3003 ms at T = 32768 H = 6 against block_v 128, but L = 249 and
// 512 2.8% slower at T = 131072 H = 4 and T = 1M). At L = 79-128 the order of the two widths
// follows the machine's power headroom: on a hotter H200 (machine B) block_v 64 ran up to 3%
// slower there, at L <= 64 level or faster on both machines.
constexpr int64_t kShortChainLinks = 128;

// The fastest width for a pass of segments (code kStates: phase A; kGeneral: the rerun)
// that covers `columns` value columns in chains of `links` links (16-token chunks: segments
// never run 32-token ones, design §4.8).
double best_pass_us(PassCode code, int64_t columns, int64_t links, int32_t num_sms,
                    int32_t &block_v) {
  double best = -1.0;
  for (const RecurrenceShape &s : kRecurrenceShapes) {
    const bool states = code == PassCode::kStates;
    double link_us = states ? s.states_link_us : s.rerun_link_us;
    if (link_us <= 0) continue;
    const double wave_us = states && s.states_wave_us > 0 ? s.states_wave_us : link_us;
    if (states && s.states_wave_us > 0 && links <= kShortChainLinks) link_us = s.states_wave_us;
    const int64_t ctas = ceil_div(columns, s.block_v);
    const int resident = states ? s.states_resident : s.resident;
    double t = pass_us(ctas, links, num_sms, resident, link_us,
                       states ? s.states_alone_us : s.rerun_alone_us, wave_us);
    if (states && takes_turns(s) && ctas > num_sms && ctas <= int64_t{num_sms} * resident)
      t += (resident - 1) * kWaveUs;
    if (best < 0 || t < best) {
      best = t;
      block_v = s.block_v;
    }
  }
  return best;
}

// Phase B for P segments a sequence: one step per start after the second, per wave of the
// launch's CTAs (config.h combine_rows).
double combine_us(int64_t pairs, int64_t P, int32_t num_sms) {
  const int rows = combine_rows(pairs, num_sms);
  return static_cast<double>(P - 2) * (rows == 8 ? kCombineStepUs : kCombineWideStepUs) *
             waves(pairs * (kHeadDim / rows), num_sms) +
         kCombineFixedUs;
}

// Predicted recurrence time with segments of L chunks, chains of `chunks` chunks.
double segmented_us(int64_t pairs, int64_t chunks, int64_t L, int32_t num_sms, int32_t &bv_a,
                    int32_t &bv_c) {
  const int64_t P = std::max<int64_t>(ceil_div(chunks, L), 2);
  // Phase A: value columns of segments 0..P-2, transition columns of segments 1..P-2.
  const int64_t columns_a = pairs * kHeadDim * ((P - 1) + (P - 2));
  const double a = best_pass_us(PassCode::kStates, columns_a, L, num_sms, bv_a);
  const double combine = combine_us(pairs, P, num_sms);
  const double c = best_pass_us(PassCode::kGeneral, pairs * P * kHeadDim, L, num_sms, bv_c);
  return a + combine + c + 2 * kLaunchUs;
}

// K1 alone on the GPU.
double prepare_us(int64_t records, int32_t num_sms, const ChunkCosts &cost) {
  return static_cast<double>(records) * cost.k1_record_us / (num_sms * cost.k1_ctas_alone);
}

// SMs the whole-sequence pass leaves free (none where it runs in more than one wave).
int64_t free_sms(int64_t pairs, int32_t block_v, int32_t num_sms) {
  return std::max<int64_t>(num_sms - pairs * (kHeadDim / block_v), 0);
}

// K1 then the whole-sequence pass (k = 0), or K1 beside the pass (design §4.7): k K1
// CTAs on each of the pass's SMs (a lone one writes its records faster than each of
// several) and kPrepareCtasAlone on each SM it leaves free. While K1
// runs, the pass advances kBesideSlowdown times slower; the forward ends when both have.
double k1_and_pass_us(int64_t pairs, int64_t chunks, int32_t block_v, int32_t num_sms, int k,
                      const ChunkCosts &cost) {
  const double pass = whole_us(pairs, chunks, block_v, num_sms, cost);
  const double records = static_cast<double>(pairs * chunks);
  if (k == 0) return prepare_us(pairs * chunks, num_sms, cost) + pass;
  const int64_t ctas = pairs * (kHeadDim / block_v), free = free_sms(pairs, block_v, num_sms);
  const double lone = cost.tokens == 16 ? 1.0 / recurrence_shape(block_v)->prepare_one_us : 0.0;
  const double per_pass_sm = std::max(lone, k / cost.k1_beside_record_us);
  const double rate = static_cast<double>(std::min<int64_t>(ctas, num_sms)) * per_pass_sm +
                      static_cast<double>(free * cost.k1_ctas_alone) / cost.k1_record_us;
  const double beside = records / rate;
  return beside + std::max(0.0, pass - beside / kBesideSlowdown) + kOverlapUs;
}

// K1 CTAs per SM kept beside the pass at its start (at least overlap_min_ctas): one where
// the free SMs write at least kFreeSupply of the records as fast as the pass reads them,
// else as many as fit.
int32_t overlap_max_ctas(int64_t pairs, int32_t block_v, int32_t num_sms, const ChunkCosts &cost) {
  const int64_t free = free_sms(pairs, block_v, num_sms);
  const double free_rate = static_cast<double>(free * cost.k1_ctas_alone) / cost.k1_record_us;
  const RecurrenceShape &s = *recurrence_shape(block_v);
  const double pass_rate = static_cast<double>(pairs) / (s.whole_link_us * link_scale(s, cost));
  return free_rate >= kFreeSupply * pass_rate ? 1 : cost.k1_ctas_alone;
}

// K1 leaving the pass's SMs (design §4.7): K1 on every SM for a lead of `lead` records,
// then only on the SMs the pass leaves free, while the pass runs as it does alone. The lead
// is what those SMs could not write while the pass reads its records (at K1's rate alone),
// so the forward takes the lead, the pass and kLeaveUs; -1 where no SM is free. The time
// compared with the other ways counts the lead at k1_record_us, the rate the margins were
// fitted with; the lead the launch takes is counted at k1_lead_record_us, K1's measured
// rate (on the H200 the decisions that rate would move measured 1-6% slower, the shorter
// leads alone 1-5% faster).
constexpr double kLeaveUs = 4.0;       // K1 leaving the SMs the pass starts on, its tail
constexpr double kLeaveMargin = 0.97;  // chosen over K1 beside the pass or first only when
                                       // predicted 3% faster (H200)
double k1_leaves_us(int64_t pairs, int64_t chunks, int32_t block_v, int32_t num_sms,
                    const ChunkCosts &cost, int64_t &lead) {
  lead = 0;
  const int64_t free = free_sms(pairs, block_v, num_sms);
  if (free < 1) return -1.0;
  const double pass = whole_us(pairs, chunks, block_v, num_sms, cost);
  // Records the free SMs have not written when the pass has read them all, at `per_sm`
  // records a us on each.
  const auto behind = [&](double per_sm) {
    const double left = static_cast<double>(pairs * chunks) - per_sm * free * pass;
    return left > 0 ? static_cast<int64_t>(left) + 1 : int64_t{0};
  };
  lead = behind(cost.k1_overlap_ctas / cost.k1_lead_record_us);
  const double per_sm = cost.k1_overlap_ctas / cost.k1_record_us;
  return static_cast<double>(behind(per_sm)) / (per_sm * num_sms) + pass + kLeaveUs;
}

// K1 CTAs per SM beside the whole-sequence pass that the plan counts on (config.h, H200);
// 0 where none fits (32-token records beside <1, 8>).
int k1_beside_ctas(int32_t block_v, const ChunkCosts &cost) {
  const RecurrenceShape &s = *recurrence_shape(block_v);
  return cost.tokens == 32 ? s.prepare32_beside : s.prepare_beside;
}

// Whether K1 can run beside the whole-sequence pass: not for varlen (records by sequence),
// segments (the segment pass fills the GPU) or 2^31 items or more (K1's 32-bit counter). A
// pass of more than one wave gets K1's items wave by wave (overlap_group).
bool can_overlap(const ProblemSizes &z, int32_t segment_chunks, const PlanRequest &r,
                 const ChunkCosts &cost) {
  const int64_t pairs = z.num_seqs * z.heads;
  return r.overlap >= 0 && !z.varlen && segment_chunks == 0 && r.num_sms >= 1 &&
         2 * pairs * ceil_div(z.seqlen, cost.tokens) < (int64_t{1} << 31);
}

// The chains the plan models a call as: `seqs` sequences of `chunks` chunks each. Batched:
// the call itself. Varlen (the lengths live on the device; reading them would synchronise):
// the mean length without a hint (and in EXACT mode, whose plan only picks widths, not
// measured with the hint); in AUTO mode with the caller's max_seqlen, sequences of that length,
// as many as the call's chunks fill, rounded (at least one, at most num_seqs), so that a batch
// whose longest sequence holds most of its tokens is planned for that sequence's chain (H200, 11
// sequences [7000, 100 x 10] at H = 6: 0.267 ms as one whole pass planned for the mean,
// 0.109 in segments of 40 chunks). Whole sequences, not heads: chains for the short
// sequences' tokens overstate the segment pass, which skips every sequence's last segment
// (rounding by heads was 7-11% slower on four of thirteen skewed batches, 2-13% faster on
// three).
struct Chains {
  int64_t seqs, chunks;
};

Chains chains_of(const ProblemSizes &z, const PlanRequest &r, int32_t tokens) {
  if (!z.varlen) return {z.num_seqs, ceil_div(z.seqlen, tokens)};
  const int64_t all = ceil_div(z.seqlen, tokens);  // B = 1: seqlen is the packed tokens
  const int64_t mean = ceil_div(all, z.num_seqs);
  const int64_t longest = r.mode == FLASH_KDA_MODE_AUTO ? ceil_div(z.max_seqlen, tokens) : 0;
  if (longest <= mean) return {z.num_seqs, mean};
  return {std::clamp<int64_t>((all + longest / 2) / longest, 1, z.num_seqs), longest};
}

// K1 and the whole-sequence pass, the fastest of the ways to run them that the request
// allows (design §4.7): K1 first, K1 beside the pass, or K1 leaving the pass's SMs, which
// must be predicted kLeaveMargin faster than the better of the other two.
struct WholeForward {
  double us;     // predicted time
  bool leaves;   // K1 leaving the pass's SMs is the fastest
  int64_t lead;  // its lead, in records
};

WholeForward whole_forward(const ProblemSizes &z, const PlanRequest &r, const Chains &chains,
                           int32_t block_v, const ChunkCosts &cost) {
  const int64_t pairs = chains.seqs * z.heads, chunks = chains.chunks;
  WholeForward best = {k1_and_pass_us(pairs, chunks, block_v, r.num_sms, 0, cost), false, 0};
  if (!can_overlap(z, 0, r, cost)) return best;
  // As many K1 CTAs beside the pass as the launch keeps there (make_plan).
  const int beside =
      std::min(k1_beside_ctas(block_v, cost), overlap_max_ctas(pairs, block_v, r.num_sms, cost));
  if (beside > 0)
    best.us = std::min(best.us, k1_and_pass_us(pairs, chunks, block_v, r.num_sms, beside, cost));
  int64_t lead = 0;
  const double leave = k1_leaves_us(pairs, chunks, block_v, r.num_sms, cost, lead);
  if (leave >= 0 && leave < kLeaveMargin * best.us) best = {leave, true, lead};
  return best;
}

// K1's item groups beside the pass (design §4.7): the sequences whose pass CTAs one wave
// starts together, one CTA an SM beside K1's; all of them where the pass fits one wave.
int32_t overlap_group(const ProblemSizes &z, int32_t block_v, int32_t num_sms) {
  const int64_t per_sequence = z.heads * (kHeadDim / block_v);
  return static_cast<int32_t>(std::clamp<int64_t>(num_sms / per_sequence, 1, z.num_seqs));
}

// The fewest K1 CTAs per SM beside the whole-sequence pass with which the overlap beats K1
// then the pass (the launch overlaps where that many fit); 0 where none does or it cannot
// run. Only for records that may share the pass's SMs (make_plan asks k1_beside_ctas).
int32_t overlap_min_ctas(const ProblemSizes &z, const Plan &plan, const PlanRequest &r) {
  const ChunkCosts &cost = costs_of(plan.chunk_tokens);
  if (!can_overlap(z, plan.segment_chunks, r, cost)) return 0;
  if (r.overlap > 0) return 1;
  const int64_t pairs = z.num_seqs * z.heads, chunks = ceil_div(z.seqlen, cost.tokens);
  const double serial = k1_and_pass_us(pairs, chunks, plan.block_v, r.num_sms, 0, cost);
  for (int k = 1; k <= cost.k1_ctas_alone; ++k)
    if (k1_and_pass_us(pairs, chunks, plan.block_v, r.num_sms, k, cost) < serial) return k;
  return 0;
}

// Whether K1 leaves the pass's SMs instead of staying beside them (plan overlap_max_ctas
// 0), where the pass leaves SMs free, and after how many records (`lead`): where forced
// (overlap 2; overlap 1 too where no K1 CTA fits beside the pass), or where
// whole_forward picks it.
bool k1_leaves(const ProblemSizes &z, const Plan &plan, const PlanRequest &r, int64_t &lead) {
  const ChunkCosts &cost = costs_of(plan.chunk_tokens);
  const Chains chains = chains_of(z, r, cost.tokens);  // the call itself: never varlen here
  const int64_t pairs = chains.seqs * z.heads;
  lead = 0;
  if (!can_overlap(z, plan.segment_chunks, r, cost) || free_sms(pairs, plan.block_v, r.num_sms) < 1)
    return false;
  if (r.overlap == 2 || (r.overlap == 1 && k1_beside_ctas(plan.block_v, cost) == 0)) {
    k1_leaves_us(pairs, chains.chunks, plan.block_v, r.num_sms, cost, lead);
    return true;
  }
  if (r.overlap == 1) return false;
  const WholeForward best = whole_forward(z, r, chains, plan.block_v, cost);
  lead = best.lead;
  return best.leaves;
}

// Whether the whole-sequence pass takes a varlen call's sequences longest first (design
// §4.2): where its CTAs run in more than one wave, a long sequence started last would
// finish alone (H200, six sequences of 271-3063 tokens, H = 96: 0.923 ms in the given
// order, 0.866 longest first, 0.969 shortest first). prefix_kernel ranks
// up to kPrefixThreads sequences, one thread each.
bool longest_first(const ProblemSizes &z, const Plan &plan, const PlanRequest &r) {
  return z.varlen && plan.segment_chunks == 0 && z.num_seqs <= kPrefixThreads && r.num_sms >= 1 &&
         z.num_seqs * z.heads * (kHeadDim / plan.block_v) > r.num_sms;
}

int32_t width_for(int64_t columns, int32_t num_sms) {
  for (const RecurrenceShape &s : kRecurrenceShapes)
    if (ceil_div(columns, s.block_v) <= num_sms) return s.block_v;
  return kRecurrenceShapes[kNumRecurrenceShapes - 1].block_v;
}

// ---------------------------------------------------------------- layout

int64_t prefix_bytes(int64_t num_seqs) {
  return round_up(4 * (num_seqs + 1), 128);
}

// Fills the offsets of plan from max_segments; false when over kMaxWorkspace.
bool lay_out(int64_t total, int64_t heads, int64_t num_seqs, Plan &plan) {
  const int tokens = plan.chunk_tokens == 32 ? 32 : kChunk;  // exact_workspace_bytes: 16
  const int64_t tiles = tiles_per_head(total, num_seqs, tokens);
  const int64_t records =
      mul_within(mul_within(heads, tiles, kMaxWorkspace), record_bytes(tokens), kMaxWorkspace);
  const int64_t prefix = prefix_bytes(num_seqs);
  plan.tile_prefix = records;
  plan.segment_prefix = add_within(records, prefix, kMaxWorkspace);
  plan.checkpoint_prefix = add_within(plan.segment_prefix, prefix, kMaxWorkspace);
  plan.segment_states = add_within(plan.checkpoint_prefix, prefix, kMaxWorkspace);
  const int64_t seg_heads = mul_within(plan.max_segments, heads, kMaxWorkspace);
  const int64_t states =
      mul_within(seg_heads, 2 * kHeadDim * kHeadDim * int64_t{sizeof(uint16_t)}, kMaxWorkspace);
  plan.segment_starts = add_within(plan.segment_states, states, kMaxWorkspace);
  const int64_t starts =
      mul_within(seg_heads, kHeadDim * kHeadDim * int64_t{sizeof(uint16_t)}, kMaxWorkspace);
  plan.ready = add_within(plan.segment_starts, starts, kMaxWorkspace);
  const int64_t flags =
      mul_within(heads, tiles, kMaxWorkspace) < 0 ? -1 : ready_bytes(heads, tiles);
  plan.overlap_sync = add_within(plan.ready, flags - int64_t{sizeof(OverlapSync)}, kMaxWorkspace);
  plan.workspace_bytes = add_within(plan.ready, flags, kMaxWorkspace);
  return plan.workspace_bytes >= 0;
}

// Chunk length, widths and segments of a plan for chunks of cost.tokens tokens (the rest of
// make_plan follows from them); returns the predicted time of the call in microseconds.
double plan_chunks(const ProblemSizes &z, const PlanRequest &r, const ChunkCosts &cost,
                   Plan &plan) {
  const int64_t total = z.batch * z.seqlen;
  const int64_t tiles = tiles_per_head(total, z.num_seqs, cost.tokens);
  const Chains chains = chains_of(z, r, cost.tokens);
  const int64_t pairs = chains.seqs * z.heads, chunks = chains.chunks;
  plan.chunk_tokens = cost.tokens;
  plan.block_v = r.block_v != 0 ? r.block_v : pick_block_v(pairs, r.num_sms);

  int64_t L = r.segment_chunks;
  int32_t bv_a = plan.block_v, bv_c = plan.block_v;
  double predicted = 0.0;
  if (r.num_sms > 0) {
    // K1 runs alone before the segment passes; beside the whole-sequence pass or leaving
    // its SMs where that can run and pays (whole_forward).
    const double k1 = prepare_us(pairs * chunks, r.num_sms, cost);
    double whole = whole_forward(z, r, chains, plan.block_v, cost).us;
    // A wider whole pass where predicted faster (kWiderMargin); not with checkpoints, which
    // keep recurrence_kernel, whose block_v 64 link is slower than the warpgroup pass's.
    if (r.block_v == 0 && z.checkpoint_every == 0)
      for (const RecurrenceShape &s : kRecurrenceShapes) {
        if (s.block_v <= plan.block_v || (cost.tokens == 32 && !chunk32_built(s.block_v))) continue;
        const double t = whole_forward(z, r, chains, s.block_v, cost).us;
        if (t < kWiderMargin * whole) {
          whole = t;
          plan.block_v = s.block_v;
        }
      }
    predicted = whole;
    if (r.mode == FLASH_KDA_MODE_AUTO && L == 0 && cost.tokens == 16) {  // 32: no segments
      // Candidates: the shortest segments that give P = kMinSegments .. kFineSegmentCounts
      // segments (so that a pass can just fill its waves), then doubling lengths below that.
      double best = kMargin * whole - k1;  // the segmented recurrence to beat
      auto consider = [&](int64_t cand) {
        int32_t a = 0, c = 0;
        const double t = segmented_us(pairs, chunks, cand, r.num_sms, a, c);
        if (t < best) {
          best = t;
          L = cand;
          bv_a = a;
          bv_c = c;
        }
      };
      for (int64_t P = kMinSegments; P <= kFineSegmentCounts; ++P) {
        const int64_t cand = ceil_div(chunks, P);
        if (cand >= kMinSegmentChunks && ceil_div(chunks, cand) == P) consider(cand);
      }
      for (int64_t cand = kMinSegmentChunks; ceil_div(chunks, cand) > kFineSegmentCounts; cand *= 2)
        consider(cand);
      if (L > 0) predicted = best + k1;
    }
  }
  if (L > 0 && r.segment_chunks > 0 && r.block_v == 0)
    segmented_us(pairs, chunks, L, r.num_sms, bv_a, bv_c);
  if (L > 0) {
    plan.segment_chunks = static_cast<int32_t>(std::min<int64_t>(L, int64_t{1} << 30));
    plan.max_segments = z.varlen ? ceil_div(tiles, L) + z.num_seqs
                                 : z.num_seqs * ceil_div(ceil_div(z.seqlen, cost.tokens), L);
    plan.segment_block_v = r.block_v != 0 ? r.block_v : bv_a;
    plan.block_v = r.block_v != 0 ? r.block_v : bv_c;
  }
  return predicted;
}

}  // namespace

int32_t pick_block_v(int64_t pairs, int32_t num_sms) {
  return width_for(mul_within(std::max<int64_t>(pairs, 0), kHeadDim, kMaxWorkspace), num_sms);
}

std::string check_sizes(const ProblemSizes &z) {
  if (z.batch < 0 || z.seqlen < 0 || z.heads < 1)
    return "batch and seqlen must be >= 0 and heads >= 1, got " + str(z.batch) + ", " +
           str(z.seqlen) + ", " + str(z.heads);
  if (z.heads > kMaxHeads) return "heads must be <= " + str(kMaxHeads) + ", got " + str(z.heads);
  if (mul_within(z.batch, z.seqlen, kMaxTokens) < 0)
    return "batch * seqlen must be at most 2^31 - 1, got batch " + str(z.batch) + " and seqlen " +
           str(z.seqlen);
  if (z.varlen && z.batch != 1)
    return "batch must be 1 when cu_seqlens is given, got " + str(z.batch);
  if (z.num_seqs < 0 || z.num_seqs > kMaxSeqs || (!z.varlen && z.num_seqs != z.batch))
    return "num_seqs must be batch (batched) or numel(cu_seqlens) - 1 in [0, 2^30], got " +
           str(z.num_seqs);
  if (z.checkpoint_every < 0 || z.checkpoint_every % kChunk != 0)
    return "checkpoint_every must be a positive multiple of 16 (or 0 for none), got " +
           str(z.checkpoint_every);
  if (z.max_seqlen < 0 || z.max_seqlen > z.seqlen)
    return "max_seqlen must be in [0, seqlen " + str(z.seqlen) + "], got " + str(z.max_seqlen);
  return "";
}

int64_t exact_workspace_bytes(int64_t total_tokens, int64_t heads, int64_t num_seqs) {
  if (total_tokens < 0 || total_tokens > kMaxTokens || heads < 1 || heads > kMaxHeads ||
      num_seqs < 1 || num_seqs > kMaxSeqs)
    return -1;
  Plan plan{};
  return lay_out(total_tokens, heads, num_seqs, plan) ? plan.workspace_bytes : -1;
}

std::string make_plan(const ProblemSizes &z, const PlanRequest &r, Plan &plan) {
  plan = Plan{};
  if (r.block_v != 0 && recurrence_shape(r.block_v) == nullptr)
    return "block_v must be 0, 32, 64 or 128, got " + str(r.block_v);
  if (r.block_v == 0 && r.num_sms < 1)
    return "num_sms must be >= 1 when block_v is 0, got " + str(r.num_sms);
  if (r.mode != FLASH_KDA_MODE_EXACT && r.mode != FLASH_KDA_MODE_AUTO)
    return "mode must be EXACT (0) or AUTO (1), got " + str(r.mode);
  if (r.segment_chunks < 0) return "segment_chunks must be >= 0, got " + str(r.segment_chunks);
  if (r.overlap < -1 || r.overlap > 2)
    return "overlap must be -1, 0, 1 or 2, got " + str(r.overlap);
  if (r.segment_chunks > 0 && r.mode != FLASH_KDA_MODE_AUTO)
    return "segment_chunks needs mode AUTO, got mode " + str(r.mode);
  if (r.chunk_tokens != 0 && r.chunk_tokens != 16 && r.chunk_tokens != 32)
    return "chunk_tokens must be 0, 16 or 32, got " + str(r.chunk_tokens);
  if (r.chunk_tokens == 32 && r.mode != FLASH_KDA_MODE_AUTO)
    return "chunk_tokens 32 needs mode AUTO, got mode " + str(r.mode);
  if (r.chunk_tokens == 32 && z.checkpoint_every % 32 != 0)
    return "chunk_tokens 32 needs checkpoint_every a multiple of 32 (or 0), got " +
           str(z.checkpoint_every);
  if (r.chunk_tokens == 32 && r.segment_chunks > 0)
    return "segment_chunks needs 16-token chunks (chunk_tokens 0 or 16), got chunk_tokens 32";
  if (r.gate < FLASH_KDA_GATE_LOWER_BOUND || r.gate > FLASH_KDA_GATE_LOG_DECAY)
    return "gate must be LOWER_BOUND (0), SOFTPLUS (1) or LOG_DECAY (2), got " + str(r.gate);
  // The 32-token K1 is built for the bounded gate only; the unbounded gates (design §2.5)
  // keep 16-token chunks.
  const bool chunk32_gate = r.gate == FLASH_KDA_GATE_LOWER_BOUND;
  if (r.chunk_tokens == 32 && !chunk32_gate)
    return "chunk_tokens 32 needs gate LOWER_BOUND, got gate " + str(r.gate);
  if (r.chunk_tokens != 0) {
    plan_chunks(z, r, costs_of(r.chunk_tokens), plan);
    if (plan.chunk_tokens == 32 && !chunk32_built(plan.block_v))
      return "chunk_tokens 32 needs block_v 32 or 64 (no 32-token kernel is built for " +
             str(plan.block_v) + ")";
  } else {
    // AUTO mode picks the chunk length the cost model predicts faster (forced segments
    // keep 16 tokens, as flash_kda.h says), among widths built for 32-token chunks.
    const double t16 = plan_chunks(z, r, kCosts16, plan);
    if (r.mode == FLASH_KDA_MODE_AUTO && r.segment_chunks == 0 && r.num_sms > 0 &&
        z.checkpoint_every % 32 == 0 && chunk32_gate) {
      Plan p32{};
      const double t32 = plan_chunks(z, r, kCosts32, p32);
      // Segments must beat the 32-token forward by a margin: none for short segments, the
      // smaller one where that forward has K1 leave its pass's SMs (above).
      int64_t lead = 0;
      const bool leaving = plan.segment_chunks > kShortSegmentChunks &&
                           plan.segment_chunks <= kLeavingMarginMaxChunks &&
                           k1_leaves(z, p32, r, lead);
      const double margin = plan.segment_chunks <= kShortSegmentChunks ? 1.0
                            : leaving ? kSegmentsOver32LeavingMargin
                                      : kSegmentsOver32Margin;
      const double bar = plan.segment_chunks > 0 ? t16 / margin : t16;
      if (chunk32_built(p32.block_v) && t32 < bar) plan = p32;
    }
  }
  // K1 and the pass (design §4.7): K1 leaving the pass's SMs, else K1 beside it where a K1
  // CTA fits beside the pass (k1_beside_ctas) and that pays, else K1 first.
  const int64_t total = z.batch * z.seqlen;
  const int64_t pairs = z.num_seqs * z.heads;
  const ChunkCosts &cost = costs_of(plan.chunk_tokens);
  int64_t lead = 0;
  if (k1_leaves(z, plan, r, lead)) {
    plan.overlap_min_ctas = 1;
    plan.overlap_max_ctas = 0;
    plan.overlap_lead = static_cast<int32_t>(std::min<int64_t>(lead, INT32_MAX));
  } else if (k1_beside_ctas(plan.block_v, cost) > 0) {
    plan.overlap_min_ctas = overlap_min_ctas(z, plan, r);
    if (plan.overlap_min_ctas > 0)
      plan.overlap_max_ctas =
          std::max(plan.overlap_min_ctas, overlap_max_ctas(pairs, plan.block_v, r.num_sms, cost));
  }
  if (plan.overlap_min_ctas > 0) plan.overlap_group = overlap_group(z, plan.block_v, r.num_sms);
  plan.longest_first = longest_first(z, plan, r);
  // Grid sizes: one CTA per (sequence or segment, head, column slice), grid.x < 2^31.
  const int64_t units = plan.segment_chunks > 0 ? plan.max_segments : z.num_seqs;
  const int32_t narrowest =
      std::min(plan.block_v, plan.segment_chunks > 0 ? plan.segment_block_v : plan.block_v);
  if (mul_within(mul_within(units, z.heads, kMaxTokens), 2 * kHeadDim / narrowest, kMaxTokens) < 0)
    return "too many chains for one launch: " + str(units) + " sequences or segments times " +
           str(z.heads) + " heads";
  if (!lay_out(total, z.heads, z.num_seqs, plan))
    return "the workspace would exceed 2^50 bytes (batch * seqlen " + str(total) + ", heads " +
           str(z.heads) + ", num_seqs " + str(z.num_seqs) + ")";
  return "";
}

}  // namespace flash_kda
