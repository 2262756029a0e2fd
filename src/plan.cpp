// SPDX-License-Identifier: MIT
// plan.cpp: size limits, the cost model and the workspace layout (plan.h). Host-only.
#include "plan.h"

#include <flash_kda/flash_kda.h>

#include <algorithm>

#include "costs.h"
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
// Microseconds (costs.h: the device's family's row, fitted to per-kernel profiles at forced
// segment lengths, benchmarks/profile_kernels.py), K1 included (prepare_us and the overlap
// models below).

// The cost model's inputs for one chunk length and gate: the family's costs (costs.h) and
// the device's facts (plan.h PlanDevice).
struct Model {
  const ArchCosts &costs;
  const PlanDevice &device;
  int32_t tokens;  // 16 or 32 (design §4.8)
  bool unbounded;  // the softplus or log-decay gate (their own 16-token K1 rates)

  int record_index() const { return tokens == 32 ? 1 : 0; }
  const K1Costs &k1() const {
    return tokens == 32 ? costs.k1_32 : unbounded ? costs.k1_16_unbounded : costs.k1_16;
  }
  int32_t sms() const { return device.sms; }
  int k1_alone() const { return device.k1_alone[record_index()]; }
  int k1_overlap() const { return device.k1_overlap[record_index()]; }
  const WidthCosts &width(int32_t block_v) const { return costs.widths[shape_index(block_v)]; }
  // A link of width block_v for these chunks against the table's 16-token link times.
  double link_scale(int32_t block_v) const {
    return tokens == 32 ? width(block_v).chunk32_link_scale : 1.0;
  }
  // This gate's K1 CTAs beside one CTA of the whole-sequence pass at width block_v (0: none
  // fits): the unbounded gates' K1 holds more registers, so fewer of it fit there.
  int k1_beside(int32_t block_v) const {
    const auto &fits = unbounded ? device.k1_beside_unbounded : device.k1_beside;
    return fits[record_index()][shape_index(block_v)];
  }
};

Model model_of(const PlanDevice &device, int32_t tokens, int32_t gate) {
  return {costs_for(device.cc, device.generic), device, tokens, gate != FLASH_KDA_GATE_LOWER_BOUND};
}

// Whether the whole-sequence pass of this width is built for 32-token chunks (config.h).
bool chunk32_built(int32_t block_v) {
  return instantiated(*recurrence_shape(block_v), PassCode::kPlain, 2);
}

double waves(int64_t ctas, int64_t slots) {
  return static_cast<double>(ceil_div(ctas, slots));
}

// The whole-sequence pass: one CTA per SM, chains of `chunks` links.
double whole_us(const Model &m, int64_t pairs, int64_t chunks, int32_t block_v) {
  return waves(pairs * (kHeadDim / block_v), m.sms()) * static_cast<double>(chunks) *
         m.width(block_v).whole_link_us * m.link_scale(block_v);
}

// A pass of `ctas` CTAs in chains of `links` links, `resident` CTAs per SM: each wave
// costs its links plus a fixed part (the start state in, the end state out, the ring
// filling). A last wave of at most one CTA per SM runs its links at `alone_us`, a single
// wave of more at `wave_us`.
double pass_us(const Model &m, int64_t ctas, int64_t links, int resident, double link_us,
               double alone_us, double wave_us) {
  const int64_t num_sms = m.sms(), slots = num_sms * resident;
  const double fixed = m.costs.wave_us;
  if (ctas > num_sms && ctas <= slots) return static_cast<double>(links) * wave_us + fixed;
  const int64_t rest = ctas % slots;
  double t = static_cast<double>(ctas / slots) * (static_cast<double>(links) * link_us + fixed);
  if (rest > 0) t += static_cast<double>(links) * (rest <= num_sms ? alone_us : link_us) + fixed;
  return t;
}

// The fastest width for a pass of segments (code kStates: phase A; kGeneral: the rerun)
// that covers `columns` value columns in chains of `links` links (16-token chunks: segments
// never run 32-token ones, design §4.8). A segment pass whose "two an SM" are two turns
// (WidthCosts::states_turns) pays a wave's fixed part a turn where its CTAs fit that one
// "wave", as measured on the H200; a pass of more keeps pass_us's one a wave.
double best_pass_us(const Model &m, PassCode code, int64_t columns, int64_t links,
                    int32_t &block_v) {
  double best = -1.0;
  for (const RecurrenceShape &s : kRecurrenceShapes) {
    const WidthCosts &w = m.width(s.block_v);
    const bool states = code == PassCode::kStates;
    double link_us = states ? w.states_link_us : w.rerun_link_us;
    if (link_us <= 0) continue;
    const double wave_us = states && w.states_wave_us > 0 ? w.states_wave_us : link_us;
    if (states && w.states_wave_us > 0 && links <= m.costs.short_chain_links)
      link_us = w.states_wave_us;
    const int64_t ctas = ceil_div(columns, s.block_v);
    const int resident = states ? s.states_resident : s.resident;
    double t = pass_us(m, ctas, links, resident, link_us,
                       states ? w.states_alone_us : w.rerun_alone_us, wave_us);
    if (states && w.states_turns && ctas > m.sms() && ctas <= int64_t{m.sms()} * resident)
      t += (resident - 1) * m.costs.wave_us;
    if (best < 0 || t < best) {
      best = t;
      block_v = s.block_v;
    }
  }
  return best;
}

// Phase B for P segments a sequence: one step per start after the second, per wave of the
// launch's CTAs (config.h combine_rows).
double combine_us(const Model &m, int64_t pairs, int64_t P) {
  const int rows = combine_rows(pairs, m.sms(), m.device.combine_wide);
  return static_cast<double>(P - 2) *
             (rows == 8 ? m.costs.combine_step_us : m.costs.combine_wide_step_us) *
             waves(pairs * (kHeadDim / rows), m.sms()) +
         m.costs.combine_fixed_us;
}

// Predicted recurrence time with segments of L chunks, chains of `chunks` chunks.
double segmented_us(const Model &m, int64_t pairs, int64_t chunks, int64_t L, int32_t &bv_a,
                    int32_t &bv_c) {
  const int64_t P = std::max<int64_t>(ceil_div(chunks, L), 2);
  // Phase A: value columns of segments 0..P-2, transition columns of segments 1..P-2.
  const int64_t columns_a = pairs * kHeadDim * ((P - 1) + (P - 2));
  const double a = best_pass_us(m, PassCode::kStates, columns_a, L, bv_a);
  const double combine = combine_us(m, pairs, P);
  const double c = best_pass_us(m, PassCode::kGeneral, pairs * P * kHeadDim, L, bv_c);
  return a + combine + c + 2 * m.costs.launch_us;
}

// K1 alone on the GPU.
double prepare_us(const Model &m, int64_t records) {
  return static_cast<double>(records) * m.k1().record_us / (m.sms() * m.k1_alone());
}

// SMs the whole-sequence pass leaves free (none where it runs in more than one wave).
int64_t free_sms(const Model &m, int64_t pairs, int32_t block_v) {
  return std::max<int64_t>(m.sms() - pairs * (kHeadDim / block_v), 0);
}

// K1 then the whole-sequence pass (k = 0), or K1 beside the pass (design §4.7): k K1
// CTAs on each of the pass's SMs (a lone one writes its records faster than each of
// several) and K1's CTAs alone on each SM it leaves free. While K1 runs, the pass advances
// beside_slowdown times slower; the forward ends when both have.
double k1_and_pass_us(const Model &m, int64_t pairs, int64_t chunks, int32_t block_v, int k) {
  const double pass = whole_us(m, pairs, chunks, block_v);
  const double records = static_cast<double>(pairs * chunks);
  if (k == 0) return prepare_us(m, pairs * chunks) + pass;
  const int64_t ctas = pairs * (kHeadDim / block_v), free = free_sms(m, pairs, block_v);
  const double lone_us = m.width(block_v).k1_lone_record_us * m.k1().lone_scale;
  const double lone = m.tokens == 16 && lone_us > 0 ? 1.0 / lone_us : 0.0;
  const double per_pass_sm = std::max(lone, k / m.k1().beside_record_us);
  const double rate = static_cast<double>(std::min<int64_t>(ctas, m.sms())) * per_pass_sm +
                      static_cast<double>(free * m.k1_alone()) / m.k1().record_us;
  const double beside = records / rate;
  return beside + std::max(0.0, pass - beside / m.costs.beside_slowdown) + m.costs.flags_us;
}

// K1 CTAs per SM kept beside the pass at its start (at least overlap_min_ctas): one where
// the free SMs write at least free_supply of the records as fast as the pass reads them,
// else as many as fit.
int32_t overlap_max_ctas(const Model &m, int64_t pairs, int32_t block_v) {
  const int64_t free = free_sms(m, pairs, block_v);
  const double free_rate = static_cast<double>(free * m.k1_alone()) / m.k1().record_us;
  const double pass_rate =
      static_cast<double>(pairs) / (m.width(block_v).whole_link_us * m.link_scale(block_v));
  return free_rate >= m.costs.free_supply * pass_rate ? 1 : m.k1_alone();
}

// K1 leaving the pass's SMs (design §4.7): K1 on every SM for a lead of `lead` records,
// then only on the SMs the pass leaves free, while the pass runs as it does alone. The lead
// is what those SMs could not write while the pass reads its records (at K1's rate alone),
// so the forward takes the lead, the pass and leave_us; -1 where no SM is free. The time
// compared with the other ways counts the lead at record_us, the rate the margins were
// fitted with; the lead the launch takes is counted at lead_record_us, K1's measured rate
// (on the H200 the decisions that rate would move measured 1-6% slower, the shorter leads
// alone 1-5% faster).
double k1_leaves_us(const Model &m, int64_t pairs, int64_t chunks, int32_t block_v, int64_t &lead) {
  lead = 0;
  const int64_t free = free_sms(m, pairs, block_v);
  if (free < 1) return -1.0;
  const double pass = whole_us(m, pairs, chunks, block_v);
  // Records the free SMs have not written when the pass has read them all, at `per_sm`
  // records a us on each.
  const auto behind = [&](double per_sm) {
    const double left = static_cast<double>(pairs * chunks) - per_sm * free * pass;
    return left > 0 ? static_cast<int64_t>(left) + 1 : int64_t{0};
  };
  lead = behind(m.k1_overlap() / (m.k1().lead_record_us * m.k1().leave_scale));
  const double per_sm = m.k1_overlap() / (m.k1().record_us * m.k1().leave_scale);
  return static_cast<double>(behind(per_sm)) / (per_sm * m.sms()) + pass + m.costs.leave_us;
}

// Whether K1 can run beside the whole-sequence pass: not for varlen (records by sequence),
// segments (the segment pass fills the GPU) or 2^31 items or more (K1's 32-bit counter). A
// pass of more than one wave gets K1's items wave by wave (overlap_group).
bool can_overlap(const Model &m, const ProblemSizes &z, int32_t segment_chunks,
                 const PlanRequest &r) {
  const int64_t pairs = z.num_seqs * z.heads;
  return r.overlap >= 0 && !z.varlen && segment_chunks == 0 && m.sms() >= 1 &&
         2 * pairs * ceil_div(z.seqlen, m.tokens) < (int64_t{1} << 31);
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
// must be predicted leave_margin faster than the better of the other two.
struct WholeForward {
  double us;     // predicted time
  bool first;    // K1 first is the fastest
  bool leaves;   // K1 leaving the pass's SMs is the fastest
  int64_t lead;  // its lead, in records
};

WholeForward whole_forward(const Model &m, const ProblemSizes &z, const PlanRequest &r,
                           const Chains &chains, int32_t block_v) {
  const int64_t pairs = chains.seqs * z.heads, chunks = chains.chunks;
  WholeForward best = {k1_and_pass_us(m, pairs, chunks, block_v, 0), true, false, 0};
  if (!can_overlap(m, z, 0, r)) return best;
  // As many K1 CTAs beside the pass as the launch keeps there (make_plan).
  const int beside = std::min(m.k1_beside(block_v), overlap_max_ctas(m, pairs, block_v));
  if (beside > 0) {
    const double t = k1_and_pass_us(m, pairs, chunks, block_v, beside);
    if (t < best.us) best = {t, false, false, 0};
  }
  int64_t lead = 0;
  const double leave = k1_leaves_us(m, pairs, chunks, block_v, lead);
  if (leave >= 0 && leave < m.costs.leave_margin * best.us) best = {leave, false, true, lead};
  return best;
}

// K1's item groups beside the pass (design §4.7): the sequences whose pass CTAs one wave
// starts together, one CTA an SM beside K1's; all of them where the pass fits one wave.
int32_t overlap_group(const ProblemSizes &z, int32_t block_v, int32_t num_sms) {
  const int64_t per_sequence = z.heads * (kHeadDim / block_v);
  return static_cast<int32_t>(std::clamp<int64_t>(num_sms / per_sequence, 1, z.num_seqs));
}

// The fewest K1 CTAs per SM beside the whole-sequence pass with which the overlap beats K1
// then the pass, at most as many as fit beside it (so that the launch overlaps wherever the
// plan says it pays); 0 where none does or it cannot run. Only for records that may share
// the pass's SMs (make_plan asks Model::k1_beside).
int32_t overlap_min_ctas(const Model &m, const ProblemSizes &z, const Plan &plan,
                         const PlanRequest &r) {
  if (!can_overlap(m, z, plan.segment_chunks, r)) return 0;
  if (r.overlap > 0) return 1;
  const int64_t pairs = z.num_seqs * z.heads, chunks = ceil_div(z.seqlen, m.tokens);
  const double serial = k1_and_pass_us(m, pairs, chunks, plan.block_v, 0);
  const int most = std::min(m.k1_alone(), m.k1_beside(plan.block_v));
  for (int k = 1; k <= most; ++k)
    if (k1_and_pass_us(m, pairs, chunks, plan.block_v, k) < serial) return k;
  return 0;
}

// Whether K1 leaves the pass's SMs instead of staying beside them (plan overlap_max_ctas
// 0), where the pass leaves SMs free, and after how many records (`lead`): where forced
// (overlap 2; overlap 1 too where no K1 CTA fits beside the pass), or where
// whole_forward picks it.
bool k1_leaves(const Model &m, const ProblemSizes &z, const Plan &plan, const PlanRequest &r,
               int64_t &lead) {
  const Chains chains = chains_of(z, r, m.tokens);  // the call itself: never varlen here
  const int64_t pairs = chains.seqs * z.heads;
  lead = 0;
  if (!can_overlap(m, z, plan.segment_chunks, r) || free_sms(m, pairs, plan.block_v) < 1)
    return false;
  if (r.overlap == 2 || (r.overlap == 1 && m.k1_beside(plan.block_v) == 0)) {
    k1_leaves_us(m, pairs, chains.chunks, plan.block_v, lead);
    return true;
  }
  if (r.overlap == 1) return false;
  const WholeForward best = whole_forward(m, z, r, chains, plan.block_v);
  lead = best.lead;
  return best.leaves;
}

// Whether the whole-sequence pass takes a varlen call's sequences longest first (design
// §4.2): where its CTAs run in more than one wave, a long sequence started last would
// finish alone (H200, six sequences of 271-3063 tokens, H = 96: 0.923 ms in the given
// order, 0.866 longest first, 0.969 shortest first). prefix_kernel ranks
// up to kPrefixThreads sequences, one thread each.
bool longest_first(const ProblemSizes &z, const Plan &plan, int32_t num_sms) {
  return z.varlen && plan.segment_chunks == 0 && z.num_seqs <= kPrefixThreads && num_sms >= 1 &&
         z.num_seqs * z.heads * (kHeadDim / plan.block_v) > num_sms;
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

// Chunk length, widths and segments of a plan for chunks of m.tokens tokens (the rest of
// make_plan follows from them); returns the predicted time of the call in microseconds.
double plan_chunks(const Model &m, const ProblemSizes &z, const PlanRequest &r, Plan &plan) {
  const int64_t total = z.batch * z.seqlen;
  const int64_t tiles = tiles_per_head(total, z.num_seqs, m.tokens);
  const Chains chains = chains_of(z, r, m.tokens);
  const int64_t pairs = chains.seqs * z.heads, chunks = chains.chunks;
  plan.chunk_tokens = m.tokens;
  plan.block_v = r.block_v != 0 ? r.block_v : pick_block_v(pairs, m.sms());

  int64_t L = r.segment_chunks;
  int32_t bv_a = plan.block_v, bv_c = plan.block_v;
  double predicted = 0.0;
  if (m.sms() > 0) {
    // K1 runs alone before the segment passes; beside the whole-sequence pass or leaving
    // its SMs where that can run and pays (whole_forward).
    const double k1 = prepare_us(m, pairs * chunks);
    const WholeForward narrowest = whole_forward(m, z, r, chains, plan.block_v);
    double whole = narrowest.us;
    // A wider whole pass where predicted faster (wider_margin, or wider_over_first_margin
    // against K1 first); not with checkpoints, which keep recurrence_kernel, whose block_v 64
    // link is slower than the warpgroup pass's.
    const double margin = narrowest.first ? m.costs.wider_over_first_margin : m.costs.wider_margin;
    if (r.block_v == 0 && z.checkpoint_every == 0)
      for (const RecurrenceShape &s : kRecurrenceShapes) {
        if (s.block_v <= plan.block_v || (m.tokens == 32 && !chunk32_built(s.block_v))) continue;
        const double t = whole_forward(m, z, r, chains, s.block_v).us;
        if (t < margin * whole) {
          whole = t;
          plan.block_v = s.block_v;
        }
      }
    predicted = whole;
    if (r.mode == FLASH_KDA_MODE_AUTO && L == 0 && m.tokens == 16) {  // 32: no segments
      // Candidates: the shortest segments that give P = min_segments .. fine_segment_counts
      // segments (so that a pass can just fill its waves), then doubling lengths below that.
      double best = m.costs.segments_margin * whole - k1;  // the segmented recurrence to beat
      auto consider = [&](int64_t cand) {
        int32_t a = 0, c = 0;
        const double t = segmented_us(m, pairs, chunks, cand, a, c);
        if (t < best) {
          best = t;
          L = cand;
          bv_a = a;
          bv_c = c;
        }
      };
      for (int64_t P = m.costs.min_segments; P <= m.costs.fine_segment_counts; ++P) {
        const int64_t cand = ceil_div(chunks, P);
        if (cand >= m.costs.min_segment_chunks && ceil_div(chunks, cand) == P) consider(cand);
      }
      for (int64_t cand = m.costs.min_segment_chunks;
           ceil_div(chunks, cand) > m.costs.fine_segment_counts; cand *= 2)
        consider(cand);
      if (L > 0) predicted = best + k1;
    }
  }
  if (L > 0 && r.segment_chunks > 0 && r.block_v == 0)
    segmented_us(m, pairs, chunks, L, bv_a, bv_c);
  if (L > 0) {
    plan.segment_chunks = static_cast<int32_t>(std::min<int64_t>(L, int64_t{1} << 30));
    plan.max_segments = z.varlen ? ceil_div(tiles, L) + z.num_seqs
                                 : z.num_seqs * ceil_div(ceil_div(z.seqlen, m.tokens), L);
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

std::string check_request(const ProblemSizes &z, const PlanRequest &r) {
  if (r.block_v != 0 && recurrence_shape(r.block_v) == nullptr)
    return "block_v must be 0, 32, 64 or 128, got " + str(r.block_v);
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
  return "";
}

namespace {

// The chunk length, widths and segments of a plan (make_plan); "" or why it cannot.
std::string choose_chunks(const ProblemSizes &z, const PlanRequest &r, const PlanDevice &d,
                          Plan &plan) {
  if (r.chunk_tokens != 0) {
    plan_chunks(model_of(d, r.chunk_tokens, r.gate), z, r, plan);
    if (plan.chunk_tokens == 32 && !chunk32_built(plan.block_v))
      return "chunk_tokens 32 needs block_v 32 or 64 (no 32-token kernel is built for " +
             str(plan.block_v) + ")";
    return "";
  }
  // AUTO mode picks the chunk length the cost model predicts faster (forced segments keep
  // 16 tokens, as flash_kda.h says), among widths built for 32-token chunks.
  const double t16 = plan_chunks(model_of(d, 16, r.gate), z, r, plan);
  if (r.mode != FLASH_KDA_MODE_AUTO || r.segment_chunks != 0 || d.sms < 1 ||
      z.checkpoint_every % 32 != 0)
    return "";
  Plan p32{};
  const Model m32 = model_of(d, 32, r.gate);
  const double t32 = plan_chunks(m32, z, r, p32);
  // Segments must beat the 32-token forward by a margin: none for short segments, the
  // smaller one where that forward has K1 leave its pass's SMs (costs.h).
  const ArchCosts &c = m32.costs;
  int64_t lead = 0;
  const bool leaving = plan.segment_chunks > c.short_segment_chunks &&
                       plan.segment_chunks <= c.leaving_margin_max_chunks &&
                       k1_leaves(m32, z, p32, r, lead);
  const double margin = plan.segment_chunks <= c.short_segment_chunks ? 1.0
                        : leaving ? c.segments_over32_leaving_margin
                                  : c.segments_over32_margin;
  const double bar = plan.segment_chunks > 0 ? t16 / margin : t16;
  if (chunk32_built(p32.block_v) && t32 < bar) plan = p32;
  return "";
}

// K1 and the pass (design §4.7): K1 leaving the pass's SMs, else K1 beside it where a K1
// CTA fits beside the pass (PlanDevice k1_beside) and that pays, else K1 first.
void plan_k1(const Model &m, const ProblemSizes &z, const PlanRequest &r, Plan &plan) {
  const int64_t pairs = z.num_seqs * z.heads;
  int64_t lead = 0;
  if (k1_leaves(m, z, plan, r, lead)) {
    plan.overlap_min_ctas = 1;
    plan.overlap_max_ctas = 0;
    plan.overlap_lead = static_cast<int32_t>(std::min<int64_t>(lead, INT32_MAX));
  } else if (m.k1_beside(plan.block_v) > 0) {
    plan.overlap_min_ctas = overlap_min_ctas(m, z, plan, r);
    if (plan.overlap_min_ctas > 0)
      plan.overlap_max_ctas =
          std::max(plan.overlap_min_ctas, overlap_max_ctas(m, pairs, plan.block_v));
  }
  if (plan.overlap_min_ctas > 0) plan.overlap_group = overlap_group(z, plan.block_v, m.sms());
  plan.longest_first = longest_first(z, plan, m.sms());
}

// The grids' and the workspace's sizes of a plan; "" or what exceeds a limit.
std::string size_plan(const ProblemSizes &z, Plan &plan) {
  // One CTA per (sequence or segment, head, column slice), grid.x < 2^31.
  const int64_t units = plan.segment_chunks > 0 ? plan.max_segments : z.num_seqs;
  const int32_t narrowest =
      std::min(plan.block_v, plan.segment_chunks > 0 ? plan.segment_block_v : plan.block_v);
  if (mul_within(mul_within(units, z.heads, kMaxTokens), 2 * kHeadDim / narrowest, kMaxTokens) < 0)
    return "too many chains for one launch: " + str(units) + " sequences or segments times " +
           str(z.heads) + " heads";
  const int64_t total = z.batch * z.seqlen;
  if (!lay_out(total, z.heads, z.num_seqs, plan))
    return "the workspace would exceed 2^50 bytes (batch * seqlen " + str(total) + ", heads " +
           str(z.heads) + ", num_seqs " + str(z.num_seqs) + ")";
  return "";
}

}  // namespace

std::string make_plan(const ProblemSizes &z, const PlanRequest &r, const PlanDevice &d,
                      Plan &plan) {
  plan = Plan{};
  std::string err = check_request(z, r);
  if (err.empty() && r.block_v == 0 && d.sms < 1)
    err = "the device's SM count must be >= 1 when block_v is 0, got " + str(d.sms);
  if (err.empty()) err = choose_chunks(z, r, d, plan);
  if (!err.empty()) return err;
  plan_k1(model_of(d, plan.chunk_tokens, r.gate), z, r, plan);
  return size_plan(z, plan);
}

}  // namespace flash_kda
