// SPDX-License-Identifier: MIT
// prepare.cuh: K1, the token-parallel half of the forward (design §3.2, §4.4).
//
// A CTA computes one 16-token chunk of one head and writes its record (workspace.h):
// decayed keys/queries Kd, Qd, Kr, the chunk decay e, the inverse (I + L)^-1, the causal
// scores Mqk and bf16 beta. prepare_kernel: grid (chunks, heads), one record per CTA;
// prepare_overlap_kernel: resident CTAs that take records one after another beside the
// recurrence (design §4.7). 128 threads (4 warps), 15.5 KB static smem. Rows t >= n of a
// partial chunk are loaded as zeros: k, q and g rows become 0, so Kd/Qd/Ki/Kr rows and
// gamma are 0 there, as in the reference (design §3.5: free). The kernels' template
// argument 2 makes 32-token records instead (AUTO mode, design §4.8; the section
// "32-token records" below).
//
// Shared-memory layout: the 16x128 tiles are row-major with rows padded to 136 elements,
// which makes every access below conflict-free: per-channel threads touch 128 contiguous
// bytes of one row per warp, and the ldmatrix fragment gathers read 8 rows of 16 bytes
// at a time, which land in banks 4 r .. 4 r + 3. The first version staged the record in
// fragment order with 2-byte scattered stores; ncu on the H200 showed the L1 pipe 88%
// busy at 2.4 TB/s of DRAM. K1 is issue-bound (ncu on the H200: SM issue 77%), so the
// per-channel steps work on channel pairs (4-byte words, paired bf16 products) and the
// fragments come from ldmatrix.
#pragma once
#ifndef FLASH_KDA_ARCH
#error "define FLASH_KDA_ARCH (the arch namespace, e.g. sm90a) before including kda headers"
#endif

#include <type_traits>

#include "kda/numerics.cuh"
#include "kda/sequences.cuh"

namespace flash_kda::FLASH_KDA_ARCH {

constexpr int kPrepareThreads = 128;
constexpr int kRow = kHeadDim + 8;                     // padded row of a 16x128 bf16 tile (272 B)
constexpr float kLog2eF = 1.44269502162933349609375f;  // LOG2E_F, design §0

// What a K1 instantiation takes (the launch picks one per call, launch.cuh k1_kind):
// - kBounded: FlashKDA's contract, the bounded gate, bf16 beta logits and the fp16 Neumann
//   inverse; the kernels every call ran before the other forms existed, kept apart so that
//   their code does not change with them;
// - kBoundedForms: the bounded gate with any beta form (fp32, probabilities) and, where
//   p.stable_inverse, the stable inverse (design §2.6): both CTA-uniform switches, so one
//   instantiation carries both;
// - kUnbounded: the softplus and log-decay gates (design §2.5, 16-token chunks), any beta or
//   g form, the stable inverse where p.stable_inverse; its decays need their own code and
//   register budget.
enum class K1Variant { kBounded, kBoundedForms, kUnbounded };

struct PrepareSmem {
  // Raw q, k, g; then in place: q -> q_hat -> Qd, k -> k_hat -> Kd, g -> Ki (from the
  // gate on, each thread owns two columns over half the rows).
  alignas(16) uint16_t x[3][kChunk][kRow];
  alignas(16) uint16_t inv[kTileElems];       // INV in A-fragment order
  alignas(16) uint16_t mqk[kTileElems];       // Mqk in A-fragment order
  alignas(16) uint16_t lmat[kChunk][kChunk];  // L (fp16 bits), row-major
  alignas(8) float decay[kHeadDim];           // G[7][k] (hand-off), then e[k] = EX2(G[15][k])
  float beta_h[kChunk];                       // f(hf(b_t)) for L, §3.2 step 8
  alignas(16) uint16_t beta_bf[kChunk];       // bf(b_t) for K2
};

enum Tile { kQ = 0, kK = 1, kG = 2, kQd = 0, kKd = 1, kKi = 2 };

// Load: q, k, g rows t < n (zeros beyond), beta -> b_t = sig(f(beta_t)) (bf16 logits; with
// kForms also fp32, or a probability: min(max(f(beta_t), 0), 1), NaN giving 0). Thread t
// copies 16-byte vector t % 16 of rows t / 16 + kStep r (kStep = threads / 16) of each tile
// (one row base per tensor, then one multiply-add per row: K1 is issue-bound, ncu H200)
// straight into shared memory (cp.async: no registers held, no store), and computes beta
// while the copies fly. An fp32 g (the log-decay gate, kForms) is not copied: the unbounded
// K1 reads its rows into registers (GateLoad; prefetching them into L2 here made its calls
// 1-3.5% slower on the H200). kRows = 16 or 32 (a 32-token chunk, K1 of 256 threads).
template <int kRows, int kThreads, bool kForms>
__device__ __forceinline__ void load_rows(const FwdParams &p, int64_t h, const ChunkRef &ch,
                                          uint16_t (*const x[3])[kRow], uint16_t *beta_bf,
                                          float *beta_h) {
  constexpr int kStep = kThreads / 16;
  static_assert(kRows % kStep == 0, "16 vectors per row, kStep rows per pass");
  const int vec = threadIdx.x % 16, row0 = threadIdx.x / 16;
  const uint16_t *const src[3] = {p.q, p.k, p.g};
  const Strides *const st[3] = {&p.q_strides, &p.k_strides, &p.g_strides};
#pragma unroll
  for (int which = 0; which < 3; ++which) {
    if constexpr (kForms)
      if (which == kG && p.g_fp32) continue;  // CTA-uniform
    const uint4 *base = reinterpret_cast<const uint4 *>(
                            src[which] + token_offset(*st[which], ch.b, ch.t0 + row0, h)) +
                        vec;
    const int64_t step = st[which]->token;  // kStep rows of token stride s: kStep s / 8 vectors
#pragma unroll
    for (int r = 0; r < kRows / kStep; ++r) {
      const int row = row0 + kStep * r;
      const bool valid = row < ch.n;
      // the tensor's first vector stands in for the address of a zero-filled row
      copy16_or_zero(
          &x[which][row][8 * vec],
          valid ? base + r * step * (kStep / 8) : reinterpret_cast<const uint4 *>(src[which]),
          valid);
    }
  }
  if (threadIdx.x < kRows) {
    const int t = threadIdx.x;
    if constexpr (kForms) {
      float raw = 0.f;
      if (t < ch.n) {
        const int64_t at = token_offset(p.beta_strides, ch.b, ch.t0 + t, h);
        raw = p.beta_fp32 ? __ldg(reinterpret_cast<const float *>(p.beta) + at)
                          : bf16_to_f32(__ldg(p.beta + at));
      }
      const float b = p.beta_prob ? min_num(max_num(raw, 0.f), 1.f) : sigmoid_tanh(raw);
      beta_bf[t] = static_cast<uint16_t>(f32_to_bf16(b));
      beta_h[t] = f16_to_f32(f32_to_f16(b));
    } else {
      const uint32_t raw =
          t < ch.n ? __ldg(p.beta + token_offset(p.beta_strides, ch.b, ch.t0 + t, h)) : 0u;
      const float b = sigmoid_tanh(bf16_to_f32(raw));
      beta_bf[t] = static_cast<uint16_t>(f32_to_bf16(b));
      beta_h[t] = f16_to_f32(f32_to_f16(b));
    }
  }
  wait_copies();
}

template <bool kForms>
__device__ __forceinline__ void load_chunk(const FwdParams &p, int64_t h, const ChunkRef &ch,
                                           PrepareSmem &sm) {
  uint16_t (*const x[3])[kRow] = {sm.x[0], sm.x[1], sm.x[2]};
  load_rows<kChunk, kPrepareThreads, kForms>(p, h, ch, x, sm.beta_bf, sm.beta_h);
}

// §3.2 step 2: x_hat = bf(f(x) * RSQ(T + 1e-6)) with T the fixed reduction tree:
// 16 segments of 8 elements, fma partials in element order, then a butterfly (xor 8, 4, 2, 1) over
// the segments. Required. Thread = (segment j, rows r0 + kStep rr) of q and of k; the 16 lanes
// holding one row's segments form a half-warp.
template <int kRows, int kThreads>
__device__ __forceinline__ void l2_normalize_rows(uint16_t (*const x[2])[kRow]) {
  constexpr int kStep = kThreads / 16;
  const int j = threadIdx.x % 16, r0 = threadIdx.x / 16;
#pragma unroll
  for (int which = 0; which < 2; ++which) {
#pragma unroll
    for (int rr = 0; rr < kRows / kStep; ++rr) {
      uint4 *seg = reinterpret_cast<uint4 *>(&x[which][r0 + kStep * rr][8 * j]);
      const uint4 raw = *seg;
      const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
      float partial = 0.f;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float xe = bf16_to_f32(e % 2 ? hi16(w[e / 2]) : lo16(w[e / 2]));
        partial = fma_ftz(xe, xe, partial);
      }
#pragma unroll
      for (int off = 8; off >= 1; off /= 2)
        partial = add_ftz(partial, __shfl_xor_sync(0xffffffffu, partial, off));
      const float r = rsqrt_approx(add_ftz(partial, 1e-6f));
      uint32_t o[4];
#pragma unroll
      for (int m = 0; m < 4; ++m)
        o[m] =
            pack_bf16x2(mul_ftz(bf16_to_f32(lo16(w[m])), r), mul_ftz(bf16_to_f32(hi16(w[m])), r));
      *seg = make_uint4(o[0], o[1], o[2], o[3]);
    }
  }
}

__device__ __forceinline__ void l2_normalize(PrepareSmem &sm) {
  uint16_t (*const x[2])[kRow] = {sm.x[kQ], sm.x[kK]};
  l2_normalize_rows<kChunk, kPrepareThreads>(x);
}

// The 4-byte word holding elements (row, col), (row, col + 1) of a padded tile.
__device__ __forceinline__ uint32_t tile_pair(const uint16_t (*tile)[kRow], int row, int col) {
  return *reinterpret_cast<const uint32_t *>(&tile[row][col]);
}

// §3.2 steps 1, 3-6 run per channel, two channels and half the chunk per thread: thread =
// (channel pair cp = tid % 64, i.e. channels 2 cp and 2 cp + 1; token half th = tid / 64,
// i.e. rows 8 th .. 8 th + 7). The pair makes every shared-memory access a 4-byte word
// (a warp reads 128 contiguous bytes of one row) and every bf16 product a paired
// HMUL2; the halves keep all 128 threads busy. The two halves of a channel sit in
// different warps (0-1 and 2-3) and meet once: the first hands G[7] to the second
// through sm.decay across barrier 1, which the halves reach at different points of the
// code (the second before its sums, the first after them), so each channel's cumulative
// sum is still the one sequential chain of §3.2 step 4. Both halves wait there: with the
// first half only arriving (bar.arrive), racecheck reported the next __syncthreads'
// accesses as hazards.
constexpr int kPairs = kHeadDim / 2;
constexpr uint32_t kHandoffBarrier = 1;
static_assert(kPrepareThreads == 2 * kPairs, "thread = (channel pair, token half)");

// §3.2 steps 1, 3 for the thread's channel pair cp and rows 8 th .. 8 th + 7 of the raw gate
// tile: gamma[j] of both channels, 0 for rows t >= n (selected, not branched).
__device__ __forceinline__ void gate_values(const FwdParams &p, int64_t h, int n,
                                            const uint16_t (*g)[kRow], int cp, int th,
                                            float2 (&gamma)[8]) {
  const float a = ex2_approx(mul_ftz(__ldg(p.A_log + h), kLog2eF));
  const float2 dt = __ldg(reinterpret_cast<const float2 *>(p.dt_bias + h * kHeadDim) + cp);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int t = 8 * th + j;
    const uint32_t w = tile_pair(g, t, 2 * cp);
    const float y0 = mul_ftz(add_ftz(bf16_to_f32(lo16(w)), dt.x), a);
    const float y1 = mul_ftz(add_ftz(bf16_to_f32(hi16(w)), dt.y), a);
    const float g0 = mul_ftz(p.gate_scale, sigmoid_tanh(y0));
    const float g1 = mul_ftz(p.gate_scale, sigmoid_tanh(y1));
    gamma[j] = t < n ? make_float2(g0, g1) : make_float2(0.f, 0.f);
  }
}

// §3.2 steps 1, 3, 4: G[j] = cumulative sum of gamma up to row 8 th + j of both channels
// (sequential, fp32, FTZ). Ends with sm.decay[c] = e[c] = EX2(G[15][c]) (§3.2 step 5).
__device__ __forceinline__ void gate_cumsum(const FwdParams &p, int64_t h, int n, PrepareSmem &sm,
                                            float2 (&G)[kChunk / 2]) {
  const int cp = threadIdx.x % kPairs, th = threadIdx.x / kPairs;
  float2 gamma[kChunk / 2];
  gate_values(p, h, n, sm.x[kG], cp, th, gamma);
  float2 *const handoff = reinterpret_cast<float2 *>(sm.decay) + cp;
  float2 acc = make_float2(0.f, 0.f);
  if (th == 1) {  // G[7] of the first half
    cta_barrier(kHandoffBarrier, kPrepareThreads);
    acc = *handoff;
  }
#pragma unroll
  for (int j = 0; j < kChunk / 2; ++j) {
    // design §3.2 step 4: a separate add, not fused; required
    acc = make_float2(add_ftz(acc.x, gamma[j].x), add_ftz(acc.y, gamma[j].y));
    G[j] = acc;
  }
  if (th == 0) {
    *handoff = acc;
    cta_barrier(kHandoffBarrier, kPrepareThreads);
  } else {
    *handoff = make_float2(ex2_approx(acc.x), ex2_approx(acc.y));
  }
}

// The 4-byte word of channel pair cp in row t of a padded tile, and bf(EX2) of two values.
__device__ __forceinline__ uint32_t *pair_word(uint16_t (*tile)[kRow], int t, int cp) {
  return reinterpret_cast<uint32_t *>(&tile[t][2 * cp]);
}

__device__ __forceinline__ uint32_t ex2_pair(float x0, float x1) {
  return pack_bf16x2(ex2_approx(x0), ex2_approx(x1));
}

// §3.2 step 6, in place on rows 8 th .. 8 th + 7 of both channels: Qd = (q (*) E+) (*) sb,
// Kd = k (*) E+, Ki = k (*) E-. Order required (scale last). Kr = Ki (*) bf(e) is formed
// when the record is written.
__device__ __forceinline__ void apply_decays(const FwdParams &p, const float2 (&G)[kChunk / 2],
                                             PrepareSmem &sm) {
  const int cp = threadIdx.x % kPairs, th = threadIdx.x / kPairs;
  const uint32_t sb = p.scale_bf16 | (p.scale_bf16 << 16);
#pragma unroll
  for (int j = 0; j < kChunk / 2; ++j) {
    const int t = 8 * th + j;
    const uint32_t e_plus = ex2_pair(G[j].x, G[j].y);
    const uint32_t e_minus = ex2_pair(-G[j].x, -G[j].y);
    uint32_t *const q = pair_word(sm.x[kQ], t, cp);
    uint32_t *const k = pair_word(sm.x[kK], t, cp);
    uint32_t *const ki = pair_word(sm.x[kKi], t, cp);
    const uint32_t q_hat = *q, k_hat = *k;
    *q = bf16x2_mul(bf16x2_mul(q_hat, e_plus), sb);  // -> Qd
    *k = bf16x2_mul(k_hat, e_plus);                  // -> Kd
    *ki = bf16x2_mul(k_hat, e_minus);
  }
}

// Lane's A fragment of the 16x16 block of `tile` at columns [16 kb, 16 kb + 16): one
// ldmatrix, matrices (rows 0-7 | 8-15) x (columns 0-7 | 8-15), rows first.
__device__ __forceinline__ uint4 a_frag(const uint16_t (*tile)[kRow], int kb) {
  const int lane = threadIdx.x % 32;
  uint32_t d[4];
  ldmatrix_x4(&tile[lane % 8 + 8 * (lane / 8 % 2)][16 * kb + 8 * (lane / 16)], d);
  return make_uint4(d[0], d[1], d[2], d[3]);
}

// Columns [8 nb, 8 nb + 8) of A B^T for 16 rows of A and of B (rows of padded tiles):
// MMA32 over k-blocks 0..7 in order; required (design §3.2 steps 7, 8).
__device__ __forceinline__ void score_columns(const uint16_t (*a)[kRow], const uint16_t (*b)[kRow],
                                              int nb, float (&acc)[4]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < 4; ++i) acc[i] = 0.f;
#pragma unroll
  for (int kb = 0; kb < kKBlocks; kb += 2) {
    // B^T rows 8 nb + g for k-blocks kb and kb + 1: one ldmatrix whose matrix m is rows
    // 8 nb .. 8 nb + 7 at columns 16 kb + 8 m.
    uint32_t bt[4];
    ldmatrix_x4(&b[8 * nb + lane % 8][16 * kb + 8 * (lane / 8)], bt);
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const uint4 av = a_frag(a, kb + s);
      const uint32_t af[4] = {av.x, av.y, av.z, av.w};
      mma_bf16_f32(acc, af, bt[2 * s], bt[2 * s + 1]);
    }
  }
}

// acc[2 r + c] is element (g + 8 r, j0 + c), j0 = 8 nb + 2 cq: each row's two columns go
// out as one word (a zeroed element is +0 before the conversion, i.e. bits 0 as before).
// L = hf(hf(acc) * beta_i), fp16 into a row-major block, strictly lower unless `full`.
__device__ __forceinline__ void store_l(const float (&acc)[4], int nb, const float *beta_h,
                                        bool full, uint16_t (*lmat)[kChunk]) {
  const int lane = threadIdx.x % 32, g = lane / 4, j0 = 8 * nb + 2 * (lane % 4);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = g + 8 * r;
    const float beta = beta_h[i];
    float l[2];
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const float l_raw = f16_to_f32(f32_to_f16(acc[2 * r + c]));
      l[c] = full || i > j0 + c ? mul_ftz(l_raw, beta) : 0.f;
    }
    *reinterpret_cast<uint32_t *>(&lmat[i][j0]) = pack_f16x2(l[0], l[1]);
  }
}

// Mqk = bf(acc) into a block in A-fragment order, lower with the diagonal unless `full`.
__device__ __forceinline__ void store_mqk(const float (&acc)[4], int nb, bool full, uint16_t *mqk) {
  const int lane = threadIdx.x % 32, g = lane / 4, j0 = 8 * nb + 2 * (lane % 4);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = g + 8 * r;
    *reinterpret_cast<uint32_t *>(&mqk[frag_a_index(i, j0)]) =
        pack_bf16x2(full || i >= j0 ? acc[2 * r] : 0.f, full || i >= j0 + 1 ? acc[2 * r + 1] : 0.f);
  }
}

// §3.2 steps 7, 8: warp w computes columns [8 (w % 2), +8) of L = Kd Ki^T (w < 2, scaled by
// beta, strictly lower, fp16 into lmat) or of Mqk = Qd Ki^T (w >= 2, lower with the
// diagonal, bf16 in fragment order).
__device__ __forceinline__ void chunk_scores(PrepareSmem &sm) {
  const int warp = threadIdx.x / 32, nb = warp % 2;
  const bool is_l = warp < 2;
  float acc[4];
  score_columns(sm.x[is_l ? kKd : kQd], sm.x[kKi], nb, acc);
  if (is_l)
    store_l(acc, nb, sm.beta_h, false, sm.lmat);
  else
    store_mqk(acc, nb, false, sm.mqk);
}

// A 16x16 fp16 matrix in accumulator layout: c[nb][r] = {X[g + 8r][8nb + 2cq], +1}.
struct Tile16 {
  uint32_t c[2][2];
};

// A row-major fp16 16x16 block as a Tile16, and back.
__device__ __forceinline__ Tile16 load_tile16(const uint16_t (*m)[kChunk]) {
  const int lane = threadIdx.x % 32, g = lane / 4, cq = lane % 4;
  Tile16 t;
#pragma unroll
  for (int nb = 0; nb < 2; ++nb)
#pragma unroll
    for (int r = 0; r < 2; ++r)
      t.c[nb][r] = *reinterpret_cast<const uint32_t *>(&m[g + 8 * r][8 * nb + 2 * cq]);
  return t;
}

__device__ __forceinline__ void store_tile16(const Tile16 &t, uint16_t (*m)[kChunk]) {
  const int lane = threadIdx.x % 32, g = lane / 4, cq = lane % 4;
#pragma unroll
  for (int nb = 0; nb < 2; ++nb)
#pragma unroll
    for (int r = 0; r < 2; ++r)
      *reinterpret_cast<uint32_t *>(&m[g + 8 * r][8 * nb + 2 * cq]) = t.c[nb][r];
}

// bf(f(X)) (negated when `negate`: bf(-x) = -bf(x) exactly) into a block in A-fragment
// order; the two halves of a word are adjacent there.
__device__ __forceinline__ void store_bf16_frag(const Tile16 &t, bool negate, uint16_t *frag) {
  const int lane = threadIdx.x % 32, g = lane / 4, cq = lane % 4;
  const float sign = negate ? -1.f : 1.f;
#pragma unroll
  for (int idx = 0; idx < 4; ++idx) {
    const int nb = idx / 2, r = idx % 2;
    const uint32_t pair = t.c[nb][r];
    *reinterpret_cast<uint32_t *>(&frag[frag_a_index(g + 8 * r, 8 * nb + 2 * cq)]) =
        pack_bf16x2(sign * f16_to_f32(lo16(pair)), sign * f16_to_f32(hi16(pair)));
  }
}

// X (+h) Y: elementwise fp16 add, exact fp32 sum rounded once; required (design §3.2 step 9).
__device__ __forceinline__ Tile16 add_f16(const Tile16 &x, const Tile16 &y) {
  Tile16 z;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t a = x.c[i / 2][i % 2], b = y.c[i / 2][i % 2];
    z.c[i / 2][i % 2] = pack_f16x2(add_rn(f16_to_f32(lo16(a)), f16_to_f32(lo16(b))),
                                   add_rn(f16_to_f32(hi16(a)), f16_to_f32(hi16(b))));
  }
  return z;
}

// MMA16(X, Y) = X Y with fp16 accumulation from zero. The accumulator layout of X is its
// A fragment; Y's B fragment is the movmatrix transpose of its 8x8 quadrants.
__device__ __forceinline__ Tile16 mma16(const Tile16 &x, const Tile16 &y) {
  const uint32_t a[4] = {x.c[0][0], x.c[0][1], x.c[1][0], x.c[1][1]};
  Tile16 d = {};
#pragma unroll
  for (int nb = 0; nb < 2; ++nb)
    mma_f16_f16(d.c[nb], a, movmatrix_trans(y.c[nb][0]), movmatrix_trans(y.c[nb][1]));
  return d;
}

// §3.2 step 9 before its rounding (one warp): N3 = (I - L)(I + L^2)(I + L^4)(I + L^8) by the
// doubling recurrence N_{m+1} = N_m (+h) MMA16(N_m, P), P = L^(2^(m+1)), all in registers.
__device__ __forceinline__ Tile16 neumann_product(const Tile16 &l) {
  const int lane = threadIdx.x % 32, g = lane / 4, cq = lane % 4;
  Tile16 n0;
#pragma unroll
  for (int nb = 0; nb < 2; ++nb) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = g + 8 * r, j = 8 * nb + 2 * cq;
      const uint32_t neg =
          l.c[nb][r] ^ 0x80008000u;  // N0 = I - L: exact sign flip off the diagonal
      const uint32_t one = 0x3c00u;  // fp16 1.0
      n0.c[nb][r] = (i == j ? one : lo16(neg)) | ((i == j + 1 ? one : hi16(neg)) << 16);
    }
  }
  const Tile16 p2 = mma16(l, l);
  const Tile16 n1 = add_f16(n0, mma16(n0, p2));
  const Tile16 p4 = mma16(p2, p2);
  const Tile16 n2 = add_f16(n1, mma16(n1, p4));
  const Tile16 p8 = mma16(p4, p4);
  return add_f16(n2, mma16(n2, p8));
}

// The stable inverse (AUTO mode, design §2.6). The fp16 product N of a diagonal block is sound
// where the residual R = N + MMA16(L, N) - I, each entry an fp32 sum of the two fp16 values
// (RN) and 1 subtracted on the diagonal, has every |R_ij| <= kInverseTolerance (NaN is not).
// Warp-uniform (a vote).
constexpr float kInverseTolerance = 0.00390625f;  // 2^-8

__device__ __forceinline__ bool residual_sound(const Tile16 &a, const Tile16 &b) {
  const int lane = threadIdx.x % 32, g = lane / 4, cq = lane % 4;
  bool ok = true;
#pragma unroll
  for (int idx = 0; idx < 4; ++idx) {
    const int nb = idx / 2, r = idx % 2;
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int i = g + 8 * r, j = 8 * nb + 2 * cq + c;
      const uint32_t wa = a.c[nb][r], wb = b.c[nb][r];
      float x = add_rn(f16_to_f32(c ? hi16(wa) : lo16(wa)), f16_to_f32(c ? hi16(wb) : lo16(wb)));
      if (i == j) x = add_rn(x, -1.f);
      ok = ok && fabsf(x) <= kInverseTolerance;
    }
  }
  return __all_sync(0xffffffffu, ok);
}

// N + MMA16(L, N) - I within tolerance (a diagonal block; L reloaded from its row-major block
// rather than kept live through the Neumann product: the 40-register K1 spilled otherwise).
__device__ __forceinline__ bool neumann_sound(const uint16_t (*lmat)[kChunk], const Tile16 &n) {
  return residual_sound(n, mma16(load_tile16(lmat), n));
}

// (f(x) - f(y)) - f(e) within tolerance (the cross block of a 32-token chunk, cross_inverse32).
__device__ __forceinline__ bool cross_sound(const Tile16 &x, const Tile16 &y, const Tile16 &e) {
  bool ok = true;
#pragma unroll
  for (int idx = 0; idx < 4; ++idx) {
    const uint32_t wx = x.c[idx / 2][idx % 2], wy = y.c[idx / 2][idx % 2];
    const uint32_t we = e.c[idx / 2][idx % 2];
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const float fx = f16_to_f32(c ? hi16(wx) : lo16(wx));
      const float fy = f16_to_f32(c ? hi16(wy) : lo16(wy));
      const float r = sub_rn(sub_rn(fx, fy), f16_to_f32(c ? hi16(we) : lo16(we)));
      ok = ok && fabsf(r) <= kInverseTolerance;
    }
  }
  return __all_sync(0xffffffffu, ok);
}

// Lower triangle of a chunk's fp16 L (kBlocks 16-row blocks, row-major blocks in block_pair
// order), as fp32: L(i, s), s < i.
template <int kBlocks>
__device__ __forceinline__ float l_entry(const uint16_t (*lmat)[kChunk][kChunk], int i, int s) {
  return f16_to_f32(lmat[block_pair(i / kChunk, s / kChunk)][i % kChunk][s % kChunk]);
}

// (I + L)^-1 in fp32 by forward substitution (one warp), in `scratch`, kN x kN floats of shared
// memory that nothing else reads at the time: lane j computes column j (lanes past the chunk's
// rows idle): X_jj = 1, X_ij = 0 above, and for i > j X_ij = -acc with acc the FMA chain
// acc = fma(L(i, s), X_sj, acc) over s = 0 .. i - 1 in order from +0 (the zeros X_sj, s < j,
// add nothing). Required (design §2.6). Then bf(X) into the chunk's INV tiles (block_pair
// order). It runs for unsound chunks only: loops, not unrolled, keep its registers and code
// small (with the column in registers the 40-register K1 spilled).
template <int kBlocks>
__device__ __forceinline__ void fp32_inverse(const uint16_t (*lmat)[kChunk][kChunk],
                                             float *scratch, uint16_t (*inv)[kTileElems]) {
  constexpr int kN = kBlocks * kChunk;
  const int j = threadIdx.x % 32;
  // The warp's earlier accesses of the INV tiles (the Neumann INV's stores, the record's loads
  // of the plane) by other lanes than the one that overwrites an entry here: the residual
  // test's votes converge the warp but do not order its shared-memory accesses.
  __syncwarp();
  if (j < kN) {
    float (*x)[kN] = reinterpret_cast<float (*)[kN]>(scratch);
#pragma unroll 1
    for (int i = 0; i < kN; ++i) {
      float acc = 0.f;
#pragma unroll 1
      for (int s = 0; s < i; ++s)
        acc = fma_ftz(l_entry<kBlocks>(lmat, i, s), x[s][j], acc);
      x[i][j] = i == j ? 1.f : i < j ? 0.f : -acc;
    }
#pragma unroll 1
    for (int i = j / kChunk * kChunk; i < kN; ++i)  // the blocks (I, J), J <= I, of column j
      inv[block_pair(i / kChunk, j / kChunk)][frag_a_index(i % kChunk, j % kChunk)] =
          static_cast<uint16_t>(f32_to_bf16(x[i][j]));
  }
  __syncwarp();
}

// §3.2 step 9 (one warp): INV = bf(N3).
__device__ __forceinline__ void neumann_inverse(PrepareSmem &sm) {
  store_bf16_frag(neumann_product(load_tile16(sm.lmat)), false, sm.inv);
}

// §3.2 step 9 (one warp) where the stable inverse may run: INV = bf(N3) into sm.inv, and
// whether N3 is sound, true without p.stable_inverse (returned to every lane: a vote).
__device__ __forceinline__ bool neumann_inverse_checked(const FwdParams &p, PrepareSmem &sm) {
  const Tile16 n = neumann_product(load_tile16(sm.lmat));
  store_bf16_frag(n, false, sm.inv);
  return !p.stable_inverse || neumann_sound(sm.lmat, n);
}

// The stable inverse's fp32 INV of an unsound 16-token chunk (warp 0), over sm.inv, with the
// q tile (no longer read) as scratch.
__device__ __forceinline__ void fp32_inverse16(PrepareSmem &sm) {
  fp32_inverse<1>(&sm.lmat, reinterpret_cast<float *>(sm.x[kQ]),
                  reinterpret_cast<uint16_t (*)[kTileElems]>(sm.inv));
}

// Lane's A fragment of key block mb of X^T (rows k = 16 mb + i, columns t) from a
// row-major tile X[t][k]: the pairs (X[t][k], X[t + 1][k]) come from one ldmatrix.trans,
// matrix m = rows t in 8 (m / 2) .. + 7 at columns k in 16 mb + 8 (m % 2) .. + 7.
__device__ __forceinline__ uint4 t_frag(const uint16_t (*tile)[kRow], int mb) {
  const int lane = threadIdx.x % 32;
  uint32_t d[4];
  ldmatrix_x4_trans(&tile[lane % 8 + 8 * (lane / 16)][16 * mb + 8 * (lane / 8 % 2)], d);
  return make_uint4(d[0], d[1], d[2], d[3]);
}

// Lane's A fragment of key block mb of Kr^T (rows k = 16 mb + i, columns t):
// Kr[t][k] = Ki[t][k] (*) bf(e[k]), design §3.2 step 6 (required: Kr from the rounded Ki);
// each word of Ki^T is one paired product with bf(e[k]) in both halves.
__device__ __forceinline__ uint4 kr_t_frag(const PrepareSmem &sm, int mb) {
  const int k = 16 * mb + (threadIdx.x % 32) / 4;
  const uint4 ki = t_frag(sm.x[kKi], mb);
  const float e0 = sm.decay[k], e1 = sm.decay[k + 8];
  const uint32_t e0_bf = pack_bf16x2(e0, e0), e1_bf = pack_bf16x2(e1, e1);
  return make_uint4(bf16x2_mul(ki.x, e0_bf), bf16x2_mul(ki.y, e1_bf), bf16x2_mul(ki.z, e0_bf),
                    bf16x2_mul(ki.w, e1_bf));
}

// uint4 number i (0..31) of the decay plane in kOrder: floats f = 4 i .. 4 i + 3 hold e[k]
// for the k of workspace.h decay_key(f) (fragment order) or tile_decay_key(f) (tile order).
template <RecordOrder kOrder>
__device__ __forceinline__ uint4 decay_vec(const float *decay, int i) {
  uint32_t w[4];
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    const int f = 4 * i + m;
    int k;
    if constexpr (kOrder == RecordOrder::kFragments)
      k = decay_key(f);
    else
      k = tile_decay_key(f);
    w[m] = __float_as_uint(decay[k]);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// A lane's A fragment of a 16x16 tile, stored at `offset` of a record in either order:
// as the lane's 16 bytes (fragment order), or as four words, each register's 32 words
// forming 128 contiguous bytes of the tile's core matrices (tile order).
template <RecordOrder kOrder>
__device__ __forceinline__ void store_tile(uint8_t *rec, int offset, uint4 frag) {
  const uint32_t lane = threadIdx.x % 32;
  if constexpr (kOrder == RecordOrder::kFragments) {
    reinterpret_cast<uint4 *>(rec + offset)[lane] = frag;
  } else {
    const uint32_t w[4] = {frag.x, frag.y, frag.z, frag.w};
#pragma unroll
    for (int r = 0; r < 4; ++r)
      *reinterpret_cast<uint32_t *>(rec + offset + tile_word_offset(r, lane)) = w[r];
  }
}

// Lane's 16 bytes of the k-block kb tile of a row-major tile X[t][k] in tile order
// (workspace.h tile_vec_row / tile_vec_col): 8 elements of one row, one contiguous vector
// of the padded row (conflict-free: the 8 rows of a quarter warp start 272 bytes apart,
// 4 banks apart).
__device__ __forceinline__ uint4 tile_row_vec(const uint16_t (*tile)[kRow], uint32_t kb) {
  const uint32_t lane = threadIdx.x % 32;
  return *reinterpret_cast<const uint4 *>(&tile[tile_vec_row(lane)][16 * kb + tile_vec_col(lane)]);
}

// The record, written straight to global memory: each warp writes one plane tile (512
// contiguous bytes) per step, in the order K2 reads (workspace.h: Record16 for the mma.sync
// passes, RecordTiles for the warpgroup pass). In tile order a Kd or Qd tile is the
// row-major tile re-blocked in 16-byte rows, so a lane copies one vector (tile_row_vec)
// instead of gathering its A fragment and storing four words.
template <RecordOrder kOrder>
__device__ __forceinline__ void store_record(const FwdParams &p, int64_t h, const ChunkRef &ch,
                                             const PrepareSmem &sm) {
  uint8_t *rec = p.records + (h * p.tiles_per_head + ch.tile) * kRecordBytes;
  constexpr bool kTiles = kOrder == RecordOrder::kTiles;
  // Unsigned thread numbers and fixed trip counts: with a signed tid the compiler kept
  // the signed division of the tile number and, for a strided loop, remainder loops.
  const uint32_t tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  constexpr uint32_t kWarps = kPrepareThreads / 32;
#pragma unroll
  for (uint32_t i = 0; i < kKBlocks / kWarps; ++i) {  // k-block kb of Kd, Qd and Kr^T
    const uint32_t kb = warp + kWarps * i;
    const int kd =
        kTiles ? RecordTiles::kKdQd + kb * RecordTiles::kKdQdStride : kOffKd + kb * kTileBytes;
    const int qd = kTiles ? kd + RecordTiles::kQdInBlock : kOffQd + kb * kTileBytes;
    if constexpr (kTiles) {
      reinterpret_cast<uint4 *>(rec + kd)[lane] = tile_row_vec(sm.x[kKd], kb);
      reinterpret_cast<uint4 *>(rec + qd)[lane] = tile_row_vec(sm.x[kQd], kb);
    } else {
      store_tile<kOrder>(rec, kd, a_frag(sm.x[kKd], kb));
      store_tile<kOrder>(rec, qd, a_frag(sm.x[kQd], kb));
    }
    store_tile<kOrder>(rec, kOffKrT + kb * kTileBytes, kr_t_frag(sm, kb));
  }
  uint4 *const vec = reinterpret_cast<uint4 *>(rec);
  if (tid < 32) {
    store_tile<kOrder>(rec, kOffInv, reinterpret_cast<const uint4 *>(sm.inv)[lane]);
  } else if (tid < 64) {
    store_tile<kOrder>(rec, kOffMqk, reinterpret_cast<const uint4 *>(sm.mqk)[lane]);
  } else if (tid < 96) {
    vec[kOffDecay / 16 + lane] = decay_vec<kOrder>(sm.decay, lane);
  } else if (tid < 96 + (kRecordBytes - kOffBeta) / 16) {
    const uint32_t i = tid - 96;  // beta (32 B), then zero padding
    uint4 v = make_uint4(0, 0, 0, 0);
    if (i < 2) v = reinterpret_cast<const uint4 *>(sm.beta_bf)[i];
    vec[kOffBeta / 16 + i] = v;
  }
}

// One record of the bounded gate: the load and §3.2 steps 1-9 of chunk `ch` of head h, written
// to the workspace in kOrder (kVariant kBounded or kBoundedForms).
template <RecordOrder kOrder, K1Variant kVariant>
__device__ __forceinline__ void prepare_chunk(const FwdParams &p, int64_t h, const ChunkRef &ch,
                                              PrepareSmem &sm) {
  constexpr bool kForms = kVariant == K1Variant::kBoundedForms;
  load_chunk<kForms>(p, h, ch, sm);
  __syncthreads();
  l2_normalize(sm);
  __syncthreads();
  {  // each thread owns its (channel pair, token half) from here to the barrier
    float2 G[kChunk / 2];
    gate_cumsum(p, h, ch.n, sm, G);
    apply_decays(p, G, sm);
  }
  __syncthreads();
  chunk_scores(sm);
  __syncthreads();
  if constexpr (!kForms) {
    if (threadIdx.x < 32) neumann_inverse(sm);
    __syncthreads();
    store_record<kOrder>(p, h, ch, sm);
  } else {
    __shared__ int unsound;  // whether N3 failed the residual test (design §2.6)
    if (threadIdx.x < 32) {
      const bool sound = neumann_inverse_checked(p, sm);
      if (threadIdx.x == 0) unsound = !sound;
    }
    __syncthreads();
    store_record<kOrder>(p, h, ch, sm);
    // The stable inverse, an unsound chunk (CTA-uniform, rare): once every tile is stored,
    // warp 0 forms the fp32 inverse and writes the INV plane again.
    if (p.stable_inverse && unsound) {
      __syncthreads();
      if (threadIdx.x < 32) {
        fp32_inverse16(sm);
        uint8_t *rec = p.records + (h * p.tiles_per_head + ch.tile) * kRecordBytes;
        store_tile<kOrder>(rec, kOffInv, reinterpret_cast<const uint4 *>(sm.inv)[threadIdx.x]);
      }
    }
  }
}

// ---------------------------------------------------------------- unbounded gates
// The softplus and log-decay gates (design §2.5, ledger steps U1-U3): gamma is any value in
// [-inf, 0], so K1 never forms 2^-G. Per channel, with the chunk's halves H0 = rows 0-7 and
// H1 = rows 8-15, each factor is EX2 of a sum that never subtracts:
//   Kd, Qd  G_t = sum_{s<=t} gamma_s; in H1 G_7 + F_t with F_t = sum_{s=8..t} gamma_s
//   Kr      D_t = sum_{s=t+1..15} gamma_s; in H0 B_t + T with B_t = sum_{s=t+1..7} gamma_s,
//           T = D_7
//   e       EX2(G_7 + T)
// L and Mqk are the one MMA32 of §3.2 step 7 on operands rebased on token 7 with the clamped
// gamma~ = max(gamma, -C): A = k^ (*) bf(EX2(a_t)), A_q = (q^ (*) bf(EX2(a_t))) (*) sb and
// B = k^ (*) bf(EX2(-a_t)), a_t = -B~_t in H0 and F~_t in H1, so that A_i B_j =
// 2^(sum_{s=j+1..i} gamma~_s) for i >= j in every block. The three tiles hold these operands,
// so Kd and Qd go to the record straight from registers and Kr waits in registers for a tile
// the scores leave free. The bounds (tests/test_gates.py checks them against fp64):
// - range: H1 sums 8 terms, H0 7, so |a_t| <= 8 C = 120: no EX2 flush, no bf16 overflow;
// - clamp: where no token s in (j, i] has gamma_s < -C the factor is exact to rounding; else the
//   true factor is below 2^gamma_s < 2^-C and the computed one at most 2^-C, so |dL_ij| <=
//   beta_i sum_k |k^_ik k^_jk| 2^-C <= 2^-15 (unit keys) and |dMqk_ij| <= |scale| 2^-15;
// - underflow: an operand below bf16's 2^-133 is lost against a partner of at most 2^7C (B of
//   j <= 14 in H1, A of i >= 1 in H0 below 2^6C): under 2^-28 a channel, 2^-21 an entry.
// One reference is what one MMA needs (the cross block must come from the diagonal blocks'
// operands) and it spans 15 steps, so 8 C <= 126 bounds C. The state's factors are never
// clamped: they are all <= 1, so one that underflows stands for a true one below 2^-126.
constexpr float kClampLog2 = 15.f;  // C: |a_t| <= 8 C = 120, within EX2's normal range

// §3.2 step U1, softplus: gamma = min(-a * log2(1 + 2^y), 0) with y = (g + dt) log2 e, the
// logarithm as max(y, 0) + LG2(1 + EX2(-|y|)) (no overflow, -inf and +inf exact); NaN gives 0.
__device__ __forceinline__ float softplus_gamma(float g, float dt, float neg_a) {
  const float y = mul_ftz(add_ftz(g, dt), kLog2eF);
  const float sp = add_ftz(max_num(y, 0.f), lg2_approx(add_ftz(1.f, ex2_approx(-fabsf(y)))));
  return min_num(mul_ftz(neg_a, sp), 0.f);
}

// §3.2 step U1, log decay: gamma = min(g log2 e, 0); g > 0 and NaN give 0.
__device__ __forceinline__ float log_decay_gamma(float g) {
  return min_num(mul_ftz(g, kLog2eF), 0.f);
}

// The first of an fp32 g's rows 8 th .. 8 th + 7 at channel pair cp (the log-decay gate).
__device__ __forceinline__ const float *gate_rows_fp32(const FwdParams &p, int64_t h,
                                                       const ChunkRef &ch, int cp, int th) {
  return reinterpret_cast<const float *>(p.g) + token_offset(p.g_strides, ch.b, ch.t0 + 8 * th, h) +
         2 * cp;
}

// Row 8 th + j of those, zeros for rows t >= n.
__device__ __forceinline__ float2 gate_pair_fp32(const FwdParams &p, const float *rows,
                                                 const ChunkRef &ch, int th, int j) {
  float2 x = make_float2(0.f, 0.f);
  if (8 * th + j < ch.n) x = __ldg(reinterpret_cast<const float2 *>(rows + j * p.g_strides.token));
  return x;
}

// Where the unbounded K1 reads an fp32 g's rows: with the decays (gate_values_unbounded, after
// the load and l2_normalize: a second round trip of memory, but no register held across them),
// or before the load's copies are waited for (prepare_chunk_unbounded), so that q, k and g come
// in one round trip. The second holds 16 registers more across the load: the tile-order
// prepare_kernel of the 16-token unbounded K1 then takes 53 (nine CTAs an SM, not ten), so the
// launch runs it for an fp32 g alone (H200, 2026-12-04: an fp32 g's K1 2.6% shorter on varlen6
// at H=96, as fast in bytes as the bounded K1; the other gates' calls 1-3% slower with it).
enum class GateLoad { kWithDecays, kBeforeWait };

// §3.2 step U1 for the thread's channel pair cp and rows 8 th .. 8 th + 7: gamma of both channels,
// 0 for rows t >= n (selected). An fp32 g is read here (kWithDecays) or was read into `first`.
template <GateLoad kLoad>
__device__ __forceinline__ void gate_values_unbounded(const FwdParams &p, int64_t h,
                                                      const ChunkRef &ch, const uint16_t (*g)[kRow],
                                                      int cp, int th, const float2 *first,
                                                      float2 (&gamma)[8]) {
  if (p.gate == Gate::kSoftplus) {
    const float neg_a = -ex2_approx(mul_ftz(__ldg(p.A_log + h), kLog2eF));
    const float2 dt = __ldg(reinterpret_cast<const float2 *>(p.dt_bias + h * kHeadDim) + cp);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint32_t w = tile_pair(g, 8 * th + j, 2 * cp);
      gamma[j] = make_float2(softplus_gamma(bf16_to_f32(lo16(w)), dt.x, neg_a),
                             softplus_gamma(bf16_to_f32(hi16(w)), dt.y, neg_a));
    }
  } else if (p.g_fp32 && kLoad == GateLoad::kBeforeWait) {
#pragma unroll
    for (int j = 0; j < 8; ++j)
      gamma[j] = make_float2(log_decay_gamma(first[j].x), log_decay_gamma(first[j].y));
  } else if (p.g_fp32) {  // each row converted as it arrives
    const float *rows = gate_rows_fp32(p, h, ch, cp, th);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float2 x = gate_pair_fp32(p, rows, ch, th, j);
      gamma[j] = make_float2(log_decay_gamma(x.x), log_decay_gamma(x.y));
    }
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint32_t w = tile_pair(g, 8 * th + j, 2 * cp);
      gamma[j] = make_float2(log_decay_gamma(bf16_to_f32(lo16(w))),
                             log_decay_gamma(bf16_to_f32(hi16(w))));
    }
  }
#pragma unroll
  for (int j = 0; j < 8; ++j)
    if (8 * th + j >= ch.n) gamma[j] = make_float2(0.f, 0.f);
}

__device__ __forceinline__ float2 add_pair(float2 a, float2 b) {
  return make_float2(add_ftz(a.x, b.x), add_ftz(a.y, b.y));
}

__device__ __forceinline__ float2 clamp_pair(float2 g) {
  return make_float2(max_num(g.x, -kClampLog2), max_num(g.y, -kClampLog2));
}

// The rebased score operands of row t, channel pair cp (§3.2 step U3), in place of q^, k^
// and g: A_q = (q^ (*) bf(EX2(a))) (*) sb, A = k^ (*) bf(EX2(a)), B = k^ (*) bf(EX2(-a)), from
// qk = (q^, k^) of the row.
__device__ __forceinline__ void rebased_operands(uint16_t (*q)[kRow], uint16_t (*k)[kRow],
                                                 uint16_t (*g)[kRow], int t, int cp, uint2 qk,
                                                 float2 a, uint32_t sb) {
  const uint32_t up = ex2_pair(a.x, a.y), down = ex2_pair(-a.x, -a.y);
  *pair_word(q, t, cp) = bf16x2_mul(bf16x2_mul(qk.x, up), sb);
  *pair_word(k, t, cp) = bf16x2_mul(qk.y, up);
  *pair_word(g, t, cp) = bf16x2_mul(qk.y, down);
}

// §3.2 steps U2, U3 (thread as in gate_cumsum): Kd and Qd to the record, the score operands A_q, A
// and B in place of q^, k^ and g, e into sm.decay, and the thread's Kr words (row 8 th + j)
// into kr[j]. H0 sums forward (G), hands G_7 over and takes T, then sums backward (B, B~);
// H1 sums backward (D, ending at T), hands T over and takes G_7, then sums forward (F, F~).
// Each sum is a sequential fp32 chain (FTZ) over the rows in the order stated; required.
template <RecordOrder kOrder, GateLoad kLoad>
__device__ __forceinline__ void unbounded_decays(const FwdParams &p, int64_t h, const ChunkRef &ch,
                                                 uint8_t *rec, PrepareSmem &sm, const float2 *first,
                                                 uint32_t (&kr)[kChunk / 2]) {
  const int cp = threadIdx.x % kPairs, th = threadIdx.x / kPairs;
  const uint32_t sb = p.scale_bf16 | (p.scale_bf16 << 16);
  float2 gamma[kChunk / 2];
  gate_values_unbounded<kLoad>(p, h, ch, sm.x[kG], cp, th, first, gamma);
  float2 *const head = reinterpret_cast<float2 *>(sm.decay) + cp;  // G_7, then e
  float2 *const tail = reinterpret_cast<float2 *>(sm.lmat) + cp;   // T (lmat is free until L)
  auto hats = [&](int t) {  // q^, k^ of row t
    return make_uint2(*pair_word(sm.x[kQ], t, cp), *pair_word(sm.x[kK], t, cp));
  };
  // Kd, Qd of row t to the record (t ascending). In tile order rows t and t + 1 (t even) of
  // a pair share a 32-byte sector: a row's words wait for the next row in the thread's slot
  // of sm.inv and sm.mqk (free until the scores; registers here would spill beside the
  // pass), the two lanes of a channel-pair couple swap one word each, and each stores 8
  // bytes, so that every store fills whole sectors (4-byte stores of one row fill half
  // sectors: twice the L2 writes).
  uint32_t &held_kd = reinterpret_cast<uint32_t *>(sm.inv)[threadIdx.x];
  uint32_t &held_qd = reinterpret_cast<uint32_t *>(sm.mqk)[threadIdx.x];
  static_assert(sizeof(sm.inv) == 4 * kPrepareThreads && sizeof(sm.mqk) == 4 * kPrepareThreads,
                "one word a thread");
  auto kd_qd = [&](int t, float2 G, uint2 qk) {
    const uint32_t e = ex2_pair(G.x, G.y);
    const uint32_t kd = bf16x2_mul(qk.y, e), qd = bf16x2_mul(bf16x2_mul(qk.x, e), sb);
    if constexpr (kOrder == RecordOrder::kFragments) {
      *reinterpret_cast<uint32_t *>(rec + plane_word_offset(kOrder, false, t, cp)) = kd;
      *reinterpret_cast<uint32_t *>(rec + plane_word_offset(kOrder, true, t, cp)) = qd;
    } else if (t % 2 == 0) {
      held_kd = kd;
      held_qd = qd;
    } else {  // the even lane stores row t - 1 of pairs cp, cp + 1; the odd lane row t of cp - 1, cp
      const bool odd = cp % 2 != 0;
      // the couple's two lanes alone: with the whole warp's mask, the code ptxas adds for a
      // warp not converged there needed registers the ten-CTA form lacks (design §4.7)
      const uint32_t couple = 3u << (threadIdx.x & 30u);
      const uint32_t kd_in = __shfl_xor_sync(couple, odd ? held_kd : kd, 1);
      const uint32_t qd_in = __shfl_xor_sync(couple, odd ? held_qd : qd, 1);
      // row t sits 16 bytes after row t - 1 (workspace.h plane_words_consistent)
      uint8_t *const at = rec + 16 * (cp % 2) + plane_word_offset(kOrder, false, t - 1, cp & ~1);
      *reinterpret_cast<uint2 *>(at) = odd ? make_uint2(kd_in, kd) : make_uint2(held_kd, kd_in);
      *reinterpret_cast<uint2 *>(at + RecordTiles::kQdInBlock) =
          odd ? make_uint2(qd_in, qd) : make_uint2(held_qd, qd_in);
    }
  };
  auto operands = [&](int t, float2 a, uint2 qk) {
    rebased_operands(sm.x[kQ], sm.x[kK], sm.x[kG], t, cp, qk, a, sb);
  };
  auto kr_word = [&](uint32_t k_hat, float2 D) { return bf16x2_mul(k_hat, ex2_pair(D.x, D.y)); };
  const float2 zero = make_float2(0.f, 0.f);
  if (th == 0) {
    float2 G = zero;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      G = add_pair(G, gamma[j]);
      kd_qd(j, G, hats(j));
    }
    *head = G;
    cta_barrier(kHandoffBarrier, kPrepareThreads);  // G_7 and T of every channel
    const float2 T = *tail;
    float2 B = zero, Bc = zero;  // B_t, B~_t
#pragma unroll
    for (int j = 7; j >= 0; --j) {
      const uint2 qk = hats(j);
      kr[j] = kr_word(qk.y, add_pair(B, T));
      operands(j, make_float2(-Bc.x, -Bc.y), qk);
      B = add_pair(B, gamma[j]);
      Bc = add_pair(Bc, clamp_pair(gamma[j]));
    }
  } else {
    float2 D = zero;
#pragma unroll
    for (int j = 7; j >= 0; --j) {
      kr[j] = kr_word(*pair_word(sm.x[kK], 8 + j, cp), D);
      D = add_pair(D, gamma[j]);
    }
    *tail = D;
    cta_barrier(kHandoffBarrier, kPrepareThreads);
    const float2 G7 = *head;
    *head = make_float2(ex2_approx(add_ftz(G7.x, D.x)), ex2_approx(add_ftz(G7.y, D.y)));  // e
    float2 F = zero, Fc = zero;  // F_t, F~_t
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      F = add_pair(F, gamma[j]);
      Fc = add_pair(Fc, clamp_pair(gamma[j]));
      const uint2 qk = hats(8 + j);
      kd_qd(8 + j, add_pair(G7, F), qk);
      operands(8 + j, Fc, qk);
    }
  }
}

// Warps 1-3 of the unbounded record's last stage: Kr^T (eight tiles from the staged Kr,
// ldmatrix.trans), Mqk, the decay plane and beta. (Warp 0 forms and stores INV meanwhile.)
template <RecordOrder kOrder>
__device__ __forceinline__ void store_unbounded_planes(uint8_t *rec, const PrepareSmem &sm) {
  const uint32_t tid = threadIdx.x - 32, warp = tid / 32, lane = tid % 32;
  constexpr uint32_t kStoreWarps = kPrepareThreads / 32 - 1;
  for (uint32_t mb = warp; mb < kKBlocks; mb += kStoreWarps)
    store_tile<kOrder>(rec, kOffKrT + mb * kTileBytes, t_frag(sm.x[kK], mb));
  uint4 *const vec = reinterpret_cast<uint4 *>(rec);
  if (warp == 0) {
    store_tile<kOrder>(rec, kOffMqk, reinterpret_cast<const uint4 *>(sm.mqk)[lane]);
  } else if (warp == 1) {
    vec[kOffDecay / 16 + lane] = decay_vec<kOrder>(sm.decay, lane);
  } else if (lane < (kRecordBytes - kOffBeta) / 16) {  // beta (32 B), then zero padding
    uint4 v = make_uint4(0, 0, 0, 0);
    if (lane < 2) v = reinterpret_cast<const uint4 *>(sm.beta_bf)[lane];
    vec[kOffBeta / 16 + lane] = v;
  }
}

// One record of an unbounded gate: the load and §3.2 steps 2, U1-U3, 7-9 of chunk `ch` of head
// h, in kOrder, an fp32 g's rows read as kLoad says.
template <RecordOrder kOrder, GateLoad kLoad>
__device__ __forceinline__ void prepare_chunk_unbounded(const FwdParams &p, int64_t h,
                                                        const ChunkRef &ch, PrepareSmem &sm) {
  uint8_t *rec = p.records + (h * p.tiles_per_head + ch.tile) * kRecordBytes;
  float2 first[kChunk / 2];
  if constexpr (kLoad == GateLoad::kBeforeWait) {
    const int th = threadIdx.x / kPairs;
    const float *rows = gate_rows_fp32(p, h, ch, threadIdx.x % kPairs, th);
#pragma unroll
    for (int j = 0; j < kChunk / 2; ++j) first[j] = gate_pair_fp32(p, rows, ch, th, j);
  }
  load_chunk<true>(p, h, ch, sm);
  __syncthreads();
  l2_normalize(sm);
  __syncthreads();
  uint32_t kr[kChunk / 2];
  unbounded_decays<kOrder, kLoad>(p, h, ch, rec, sm, first, kr);
  __syncthreads();
  chunk_scores(sm);  // L from (A, B), Mqk from (A_q, B): the tiles of Kd, Qd, Ki
  __syncthreads();
  {  // Kr into the tile A leaves
    const int cp = threadIdx.x % kPairs, th = threadIdx.x / kPairs;
#pragma unroll
    for (int j = 0; j < kChunk / 2; ++j) *pair_word(sm.x[kK], 8 * th + j, cp) = kr[j];
  }
  __syncthreads();
  if (threadIdx.x < 32) {  // the q tile (A_q) is free: the fp32 inverse's scratch
    if (!neumann_inverse_checked(p, sm)) fp32_inverse16(sm);
    __syncwarp();
    store_tile<kOrder>(rec, kOffInv, reinterpret_cast<const uint4 *>(sm.inv)[threadIdx.x]);
  } else {
    store_unbounded_planes<kOrder>(rec, sm);
  }
}

// ---------------------------------------------------------------- 32-token records
// (design §4.8; AUTO mode where the plan picks them). One CTA of
// 256 threads makes the record of a 32-token chunk. Blocks I = 0, 1 are its rows
// 16 I .. 16 I + 15. The chunk's cumulative gate G runs over all 32 rows; block 1 also has
// its own, G^1, restarted at row 16 (block 0's own is G). Kd and Qd come from G, and
// Kr = k^ (*) bf(EX2(G_31 - G)) is formed directly. Each diagonal block's L, Mqk and Neumann
// product come from the block's own gate, i.e. §3.2 steps 6-9 on 16 rows. The
// cross block is taken against the end of block 0, so no factor exceeds 1:
// B_j = k^_j (*) bf(EX2(G_15 - G_j)), L10 = hf(hf(Kd^1 B^T) * hf(b_i)), Mqk10 =
// bf(Qd^1 B^T) with block 1's own Kd^1, Qd^1, and INV10 = bf(-MMA16(N11, MMA16(L10, N00)))
// from the blocks' fp16 Neumann products (forward substitution). _chunk_model.py is the
// same arithmetic in PyTorch, the oracle of this kernel.
constexpr int kPrepare32Threads = 256;
static_assert(kPrepare32Threads == 4 * kPairs, "thread = (channel pair, quarter of 8 rows)");

struct PrepareSmem32 {
  // q -> Qd, k -> Kd (the chunk's gate), g -> Kr; 32 rows each.
  alignas(16) uint16_t x[3][2 * kChunk][kRow];
  // Blocks' own operands (16 rows): Ki of block 0, B, and block 1's Qd^1, Kd^1, Ki^1.
  alignas(16) uint16_t own[5][kChunk][kRow];
  // INV and Mqk blocks 00, 10, 11 in A-fragment order; L blocks and the diagonal Neumann
  // products N00, N11 in fp16, row-major.
  alignas(16) uint16_t inv[Record32::kPairs][kTileElems];
  alignas(16) uint16_t mqk[Record32::kPairs][kTileElems];
  alignas(16) uint16_t lmat[Record32::kPairs][kChunk][kChunk];
  alignas(16) uint16_t nprod[2][kChunk][kChunk];
  alignas(16) float handoff[4][kHeadDim];  // G_7, G_15, G_23 and G^1_23, by channel
  alignas(16) float g_end[kHeadDim];       // G_31
  alignas(16) float decay[kHeadDim];       // e = EX2(G_31)
  float beta_h[2 * kChunk];
  alignas(16) uint16_t beta_bf[2 * kChunk];
  int diagonal_sound[2];  // the stable inverse: N00's and N11's residual tests
};
enum OwnTile { kKi0 = 0, kB0 = 1, kQd1 = 2, kKd1 = 3, kKi1 = 4 };
enum Handoff { kG7 = 0, kG15 = 1, kG23 = 2, kOwn23 = 3 };

// §3.2 steps 1, 3, 4 on 32 rows: thread = (channel pair cp, quarter th, i.e. rows 8 th .. 8 th +
// 7). The chunk's sum is one sequential chain over the 32 rows, handed from quarter to
// quarter through shared memory across CTA barriers; block 1's own sum starts from zero at
// row 16 (quarter 2, at once) and is handed to quarter 3 with G_23. G[j] and G1[j] (block 1
// only) are the sums up to row 8 th + j; after the CTA barrier that follows, handoff[kG15]
// and g_end hold G_15 and G_31 of every channel. (Named barriers between pairs of quarters,
// as the 16-token K1 hands G_7 over, made racecheck report the hand-offs through barriers
// 2 and 3 on the H200, and accesses after later CTA barriers.)
// §3.2 step 6 for block 1's own operands, rows 8 th .. 8 th + 7 (th = 2, 3), as soon as its own
// gate G^1 is known: Qd^1 = (q^ (*) E1+) (*) sb, Kd^1 = k^ (*) E1+, Ki^1 = k^ (*) E1-. So
// G^1 need not live on to the chunk's decays (the overlap kernel's registers).
__device__ __forceinline__ void own_decays32(const FwdParams &p, const float2 (&G1)[8], int cp,
                                             int th, PrepareSmem32 &sm) {
  const uint32_t sb = p.scale_bf16 | (p.scale_bf16 << 16);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int t = 8 * th + j, r = t % kChunk;
    const uint32_t q_hat = *pair_word(sm.x[kQ], t, cp), k_hat = *pair_word(sm.x[kK], t, cp);
    const uint32_t own_plus = ex2_pair(G1[j].x, G1[j].y);
    *pair_word(sm.own[kQd1], r, cp) = bf16x2_mul(bf16x2_mul(q_hat, own_plus), sb);
    *pair_word(sm.own[kKd1], r, cp) = bf16x2_mul(k_hat, own_plus);
    *pair_word(sm.own[kKi1], r, cp) = bf16x2_mul(k_hat, ex2_pair(-G1[j].x, -G1[j].y));
  }
}

__device__ __forceinline__ void gate_cumsum32(const FwdParams &p, int64_t h, int n,
                                              PrepareSmem32 &sm, float2 (&G)[8]) {
  const int cp = threadIdx.x % kPairs, th = threadIdx.x / kPairs;
  float2 gamma[8];
  gate_values(p, h, n, sm.x[kG], cp, th, gamma);
  auto slot = [&](int which) { return reinterpret_cast<float2 *>(sm.handoff[which]) + cp; };
  auto sums = [&](float2 acc, float2(&out)[8]) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      // design §3.2 step 4: a separate add, not fused; required
      acc = make_float2(add_ftz(acc.x, gamma[j].x), add_ftz(acc.y, gamma[j].y));
      out[j] = acc;
    }
    return acc;
  };
  const float2 zero = make_float2(0.f, 0.f);
  if (th == 0) *slot(kG7) = sums(zero, G);
  if (th == 2) {
    float2 G1[8];
    *slot(kOwn23) = sums(zero, G1);
    own_decays32(p, G1, cp, th, sm);
  }
  __syncthreads();
  if (th == 1) *slot(kG15) = sums(*slot(kG7), G);
  __syncthreads();
  if (th == 2) *slot(kG23) = sums(*slot(kG15), G);
  __syncthreads();
  if (th == 3) {
    float2 G1[8];
    sums(*slot(kOwn23), G1);
    own_decays32(p, G1, cp, th, sm);
    reinterpret_cast<float2 *>(sm.g_end)[cp] = sums(*slot(kG23), G);
  }
}

// §3.2 step 6 on 32 rows (thread as in gate_cumsum32), needs G_15 and G_31 of every channel.
// Every row: Qd = (q^ (*) E+) (*) sb, Kd = k^ (*) E+ in place, Kr = k^ (*) bf(EX2(G_31 - G))
// in place of g. Block 0 also Ki = k^ (*) E- and B = k^ (*) bf(EX2(G_15 - G)) (block 1's own
// operands are made in gate_cumsum32). Quarters are warp-uniform, so the branch is too.
__device__ __forceinline__ void apply_decays32(const FwdParams &p, const float2 (&G)[8],
                                               PrepareSmem32 &sm) {
  const int cp = threadIdx.x % kPairs, th = threadIdx.x / kPairs;
  const uint32_t sb = p.scale_bf16 | (p.scale_bf16 << 16);
  const float2 g15 = reinterpret_cast<const float2 *>(sm.handoff[kG15])[cp];
  const float2 g31 = reinterpret_cast<const float2 *>(sm.g_end)[cp];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int t = 8 * th + j, r = t % kChunk;
    uint32_t *const q = pair_word(sm.x[kQ], t, cp);
    uint32_t *const k = pair_word(sm.x[kK], t, cp);
    const uint32_t q_hat = *q, k_hat = *k;
    const uint32_t e_plus = ex2_pair(G[j].x, G[j].y);
    *q = bf16x2_mul(bf16x2_mul(q_hat, e_plus), sb);  // -> Qd
    *k = bf16x2_mul(k_hat, e_plus);                  // -> Kd
    *pair_word(sm.x[kG], t, cp) =
        bf16x2_mul(k_hat, ex2_pair(add_ftz(g31.x, -G[j].x), add_ftz(g31.y, -G[j].y)));  // -> Kr
    if (th < 2) {
      *pair_word(sm.own[kKi0], r, cp) = bf16x2_mul(k_hat, ex2_pair(-G[j].x, -G[j].y));
      *pair_word(sm.own[kB0], r, cp) =
          bf16x2_mul(k_hat, ex2_pair(add_ftz(g15.x, -G[j].x), add_ftz(g15.y, -G[j].y)));
    }
  }
}

// The A and B score tiles of one block pair (chunk_scores32_of).
struct ScoreTiles32 {
  const uint16_t (*a)[kRow];
  const uint16_t (*b)[kRow];
};

// §3.2 steps 7, 8 on 32 rows: warp w < 6 computes block pair w / 2 (00, 11, 10) of L (w even)
// or Mqk (w odd), both column halves, from the A and B tiles that tiles(blk, cross, is_l)
// gives (blk: the pair's row block; cross: the pair is 10).
template <typename Tiles>
__device__ __forceinline__ void chunk_scores32_of(PrepareSmem32 &sm, Tiles tiles) {
  const int warp = threadIdx.x / 32, which = warp / 2;
  if (which > 2) return;  // warp-uniform
  const bool is_l = warp % 2 == 0, cross = which == 2;
  const int blk = which == 0 ? 0 : 1, pair = cross ? block_pair(1, 0) : block_pair(blk, blk);
  const ScoreTiles32 t = tiles(blk, cross, is_l);
#pragma unroll
  for (int nb = 0; nb < 2; ++nb) {
    float acc[4];
    score_columns(t.a, t.b, nb, acc);
    if (is_l)
      store_l(acc, nb, sm.beta_h + kChunk * blk, cross, sm.lmat[pair]);
    else
      store_mqk(acc, nb, cross, sm.mqk[pair]);
  }
}

// The bounded gate's: the diagonal pairs score a block's own operands against its own Ki;
// the cross pair scores block 1's own Kd^1 / Qd^1 against B, in full.
__device__ __forceinline__ void chunk_scores32(PrepareSmem32 &sm) {
  chunk_scores32_of(sm, [&](int blk, bool cross, bool is_l) {
    return ScoreTiles32{
        blk == 0 ? (is_l ? sm.x[kKd] : sm.x[kQd]) : (is_l ? sm.own[kKd1] : sm.own[kQd1]),
        cross ? sm.own[kB0] : (blk == 0 ? sm.own[kKi0] : sm.own[kKi1])};
  });
}

// The 32-token record (workspace.h RecordLayout<2>) goes straight to global memory in
// 16-byte vectors, in two parts that overlap §3.2 step 9: while warps 0 and 1 compute the
// diagonal blocks' Neumann products, warps 2-7 store everything that does not depend on
// INV (ncu on the H200: with that step and the store in sequence, seven warps waited at the
// barriers around it for ~10% of K1's stall samples); warp 0 then forms INV10 and
// stores the INV plane itself.
constexpr int kStoreWarps32 = kPrepare32Threads / 32 - 2;

// A 32-token record's small planes, by store thread tid (warps 2-7, tid = threadIdx.x -
// 64): Mqk, the decay plane, beta and the zero padding after it.
__device__ __forceinline__ void store_small_planes32(uint4 *rec, const PrepareSmem32 &sm,
                                                     uint32_t tid) {
  using R = Record32;
  constexpr uint32_t kPairVecs = R::kPairs * (kTileBytes / 16);
  if (tid < kPairVecs) {
    rec[R::kOffMqk / 16 + tid] = reinterpret_cast<const uint4 *>(sm.mqk)[tid];
  } else if (tid < kPairVecs + 32) {
    rec[R::kOffDecay / 16 + tid - kPairVecs] =
        decay_vec<RecordOrder::kFragments>(sm.decay, tid - kPairVecs);
  } else if (tid < kPairVecs + 32 + (R::kBytes - R::kOffBeta) / 16) {
    const uint32_t i = tid - kPairVecs - 32;  // beta (64 B), then zero padding
    uint4 v = make_uint4(0, 0, 0, 0);
    if (i < 4) v = reinterpret_cast<const uint4 *>(sm.beta_bf)[i];
    rec[R::kOffBeta / 16 + i] = v;
  }
}

// Warps 2-7: the 48 operand tiles (eight a warp), then Mqk, the decay plane and beta.
__device__ __forceinline__ void store_operands32(uint4 *rec, const PrepareSmem32 &sm) {
  using R = Record32;
  const uint32_t tid = threadIdx.x - 64, warp = tid / 32, lane = tid % 32;
  constexpr uint32_t kPlane = 2 * kKBlocks;
  static_assert(3 * kPlane % kStoreWarps32 == 0, "whole rounds of tiles");
#pragma unroll
  for (uint32_t i = 0; i < 3 * kPlane / kStoreWarps32; ++i) {
    const uint32_t tile = warp + kStoreWarps32 * i, plane = tile / kPlane, j = tile % kPlane;
    uint4 v;
    int offset;
    if (plane < 2) {  // Kd, Qd: block j / 8, k-block j % 8
      const uint16_t (*x)[kRow] = sm.x[plane == 0 ? kKd : kQd] + kChunk * (j / kKBlocks);
      v = a_frag(x, j % kKBlocks);
      offset = plane == 0 ? R::kd(j / kKBlocks, j % kKBlocks) : R::qd(j / kKBlocks, j % kKBlocks);
    } else {  // Kr^T: k-block j / 2, token block j % 2
      v = t_frag(sm.x[kG] + kChunk * (j % 2), j / 2);
      offset = R::krt(j / 2, j % 2);
    }
    rec[offset / 16 + lane] = v;
  }
  store_small_planes32(rec, sm, tid);
}
static_assert(Record32::kPairs * (kTileBytes / 16) + 32 +
                      (Record32::kBytes - Record32::kOffBeta) / 16 <=
                  32 * kStoreWarps32,
              "one vector a thread for the small planes");

// §3.2 step 9 on 32 rows, warps 0 and 1: the diagonal blocks' Neumann products (kept in fp16 for
// the cross block) and their INV.
__device__ __forceinline__ void neumann_diagonal32(PrepareSmem32 &sm) {
  const int warp = threadIdx.x / 32, pair = block_pair(warp, warp);
  const Tile16 n = neumann_product(load_tile16(sm.lmat[pair]));
  store_tile16(n, sm.nprod[warp]);
  store_bf16_frag(n, false, sm.inv[pair]);
}

// Warps 0 and 1 of a 32-token record's last stage meet here (cross_inverse32_checked).
constexpr uint32_t kVerdictBarrier = 2;

// Warp 1 in AUTO mode, beside warp 0's cross_inverse32_checked: both diagonal blocks' residual
// tests (design §2.6) from their fp16 products in sm.nprod, into sm.diagonal_sound. (Beside
// the other warps' plane stores, where step 9 ran, they held warps 0 and 1 past those.)
__device__ __forceinline__ void diagonal_sound32(PrepareSmem32 &sm) {
#pragma unroll 1
  for (int b = 0; b < 2; ++b) {
    const bool sound = neumann_sound(sm.lmat[block_pair(b, b)], load_tile16(sm.nprod[b]));
    if (threadIdx.x % 32 == 0) sm.diagonal_sound[b] = sound;
  }
  cta_barrier(kVerdictBarrier, 64);
}

// The INV plane's three tiles to the record (warp 0).
__device__ __forceinline__ void store_inv_plane32(uint4 *rec, const PrepareSmem32 &sm) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < Record32::kPairs; ++i)
    rec[Record32::kOffInv / 16 + 32 * i + lane] = reinterpret_cast<const uint4 *>(sm.inv[i])[lane];
}

// Warp 0, after the diagonal blocks: INV10 = bf(-MMA16(N11, MMA16(L10, N00))), then the INV
// plane (three tiles) to the record.
__device__ __forceinline__ void cross_inverse32(uint4 *rec, PrepareSmem32 &sm) {
  const Tile16 x = mma16(load_tile16(sm.lmat[block_pair(1, 0)]), load_tile16(sm.nprod[0]));
  store_bf16_frag(mma16(load_tile16(sm.nprod[1]), x), true, sm.inv[block_pair(1, 0)]);
  __syncwarp();
  store_inv_plane32(rec, sm);
}

// cross_inverse32 in AUTO mode: then the 32-token record's residual test (design §2.6). Sound
// where both diagonal blocks are (sm.diagonal_sound, from warp 1: diagonal_sound32) and the cross
// block's residual, block 10 of (I + L) N = L10 N00 + (I + L11) N10 with N10 = -y, taken as (f(x) -
// f(y)) - f(MMA16(L11, y)) with the x = MMA16(L10, N00), y = MMA16(N11, x) of INV10, is within
// tolerance; else the INV plane is stored again from the fp32 forward substitution of the 32 rows,
// with the blocks' own tiles (no longer read) as scratch. A stage of its own: inside §3.2 step 9,
// or inlined, its registers made the 80-register K1 spill more on sm_100 and later.
__device__ __noinline__ void cross_inverse32_checked(uint4 *rec, PrepareSmem32 &sm) {
  const Tile16 x = mma16(load_tile16(sm.lmat[block_pair(1, 0)]), load_tile16(sm.nprod[0]));
  const Tile16 y = mma16(load_tile16(sm.nprod[1]), x);
  store_bf16_frag(y, true, sm.inv[block_pair(1, 0)]);
  __syncwarp();
  store_inv_plane32(rec, sm);
  const Tile16 e = mma16(load_tile16(sm.lmat[block_pair(1, 1)]), y);
  const bool cross = cross_sound(x, y, e);  // warp-uniform, as are the flags
  cta_barrier(kVerdictBarrier, 64);         // warp 1's flags
  if (cross && sm.diagonal_sound[0] && sm.diagonal_sound[1]) return;
  fp32_inverse<2>(sm.lmat, reinterpret_cast<float *>(sm.own), sm.inv);
  store_inv_plane32(rec, sm);
}

// The opening of every 32-token record: the record's address (first, so that h and ch need
// not live through the steps), then q, k, g and beta loaded (kForms: the beta forms' read)
// and q, k normalised, each stage between barriers.
template <bool kForms>
__device__ __forceinline__ uint4 *load_normalized32(const FwdParams &p, int64_t h,
                                                    const ChunkRef &ch, PrepareSmem32 &sm) {
  uint4 *rec =
      reinterpret_cast<uint4 *>(p.records + (h * p.tiles_per_head + ch.tile) * Record32::kBytes);
  {
    uint16_t (*const x[3])[kRow] = {sm.x[0], sm.x[1], sm.x[2]};
    load_rows<2 * kChunk, kPrepare32Threads, kForms>(p, h, ch, x, sm.beta_bf, sm.beta_h);
  }
  __syncthreads();
  {
    uint16_t (*const x[2])[kRow] = {sm.x[kQ], sm.x[kK]};
    l2_normalize_rows<2 * kChunk, kPrepare32Threads>(x);
  }
  __syncthreads();
  return rec;
}

// One 32-token record of the bounded gate: chunk `ch` of head h (fragment order only).
template <RecordOrder kOrder, K1Variant kVariant>
__device__ __forceinline__ void prepare_chunk(const FwdParams &p, int64_t h, const ChunkRef &ch,
                                              PrepareSmem32 &sm) {
  static_assert(kOrder == RecordOrder::kFragments, "32-token records are in fragment order");
  constexpr bool kForms = kVariant == K1Variant::kBoundedForms;
  uint4 *rec = load_normalized32<kForms>(p, h, ch, sm);
  {  // each thread owns its (channel pair, quarter) from here to the decays
    float2 G[8];
    gate_cumsum32(p, h, ch.n, sm, G);
    __syncthreads();  // G_15, G_31 of every channel; every g row read
    if (threadIdx.x < kHeadDim) sm.decay[threadIdx.x] = ex2_approx(sm.g_end[threadIdx.x]);
    apply_decays32(p, G, sm);
  }
  __syncthreads();
  chunk_scores32(sm);
  __syncthreads();
  const bool checked = kForms && p.stable_inverse;  // CTA-uniform
  if (threadIdx.x >= 64)
    store_operands32(rec, sm);
  else
    neumann_diagonal32(sm);
  __syncthreads();
  if (threadIdx.x < 32) {
    if (checked)
      cross_inverse32_checked(rec, sm);
    else
      cross_inverse32(rec, sm);
  } else if (checked && threadIdx.x < 64) {
    diagonal_sound32(sm);
  }
}

// ---------------------------------------------------------------- 32-token unbounded records
// (design §2.5, "32-token chunks"). Thread = (channel pair cp, quarter th: rows 8 th .. 8 th +
// 7); quarters 2I and 2I + 1 are halves H0, H1 of block I. Each quarter sums its gamma from
// zero: F_j forward (rows 8 th .. 8 th + j), R_j backward (rows 8 th + 7 .. 8 th + j + 1), the
// totals S^f = F_7 and S^b = R_-1 handed over once. Every factor is EX2 of a sum that never
// subtracts:
//   Kd, Qd   G = P + F_j, P = 0, S^f_0, S^f_0 + S^f_1, (S^f_0 + S^f_1) + S^f_2 by quarter
//   Kr       D = R_j + Q, Q = (S^b_3 + S^b_2) + S^b_1, S^b_3 + S^b_2, S^b_3, 0 by quarter
//   e        EX2(P_3 + S^f_3)
// Each diagonal block's L and Mqk come from the 16-token operands (A, A_q, B of
// unbounded_decays, a_t from the quarter's clamped chains). The cross block scores block 1's
// own Kd^1 = k^ (*) bf(EX2(O1)), Qd^1, O1 = F_j (quarter 2), S^f_2 + F_j (quarter 3), against
// block 0's B0 = k^ (*) bf(EX2(O0)), O0 = R_j + S^b_1 (quarter 0), R_j (quarter 1): O1_i + O0_j
// is the decay from token j + 1 to i, and both factors are <= 1. INV10 is the bounded 32-token
// record's (cross_inverse32). tests/chunk_model.py is the same arithmetic.
enum UnboundedTile32 { kKrU = 0 /* own[0..1]: 32 rows */, kB0U = kKi1 };

// Kd and Qd words of row t (0..31), channel pair cp, in a 32-token record (fragment order).
__device__ __forceinline__ uint32_t *record32_word(uint4 *rec, bool qd, int t, int cp) {
  const int blk = t / kChunk, kb = cp / 8, c = cp % 8, r = t % kChunk;
  const int tile = qd ? Record32::qd(blk, kb) : Record32::kd(blk, kb);
  return reinterpret_cast<uint32_t *>(reinterpret_cast<uint8_t *>(rec) + tile) +
         ((r % 8) * 4 + c % 4) * 4 + r / 8 + 2 * (c / 4);
}

// §3.2 steps U2, U3 on 32 rows: Kd, Qd to the record, Kr into own[kKrU], the diagonal score
// operands A_q, A, B in place of q^, k^ and g, the cross operands into own[kQd1], own[kKd1]
// and own[kB0U], e into sm.decay. Quarter totals go through sm.handoff (S^f_0..2, S^b_1) and
// sm.nprod (S^b_2, S^b_3), both free until later steps. Quarters are warp-uniform.
__device__ __forceinline__ void unbounded_decays32(const FwdParams &p, int64_t h,
                                                   const ChunkRef &ch, uint4 *rec,
                                                   PrepareSmem32 &sm) {
  const int cp = threadIdx.x % kPairs, th = threadIdx.x / kPairs;
  const uint32_t sb = p.scale_bf16 | (p.scale_bf16 << 16);
  float2 gamma[8];
  gate_values_unbounded<GateLoad::kWithDecays>(p, h, ch, sm.x[kG], cp, th, nullptr, gamma);
  const float2 zero = make_float2(0.f, 0.f);
  float2 *const nprod = reinterpret_cast<float2 *>(sm.nprod);
  auto sf = [&](int q) { return reinterpret_cast<float2 *>(sm.handoff[q]) + cp; };  // q = 0..2
  auto sb_slot = [&](int q) { return q == 1 ? reinterpret_cast<float2 *>(sm.handoff[3]) + cp
                                            : nprod + (q - 2) * kPairs + cp; };  // q = 1..3
  {
    float2 F = zero, R = zero;
#pragma unroll
    for (int j = 0; j < 8; ++j) F = add_pair(F, gamma[j]);
#pragma unroll
    for (int j = 7; j >= 0; --j) R = add_pair(R, gamma[j]);
    if (th < 3) *sf(th) = F;
    if (th > 0) *sb_slot(th) = R;
  }
  __syncthreads();  // every quarter's totals; every g row read (gamma)
  float2 P = zero, Q = zero, own = zero;  // own: O1's offset (quarter 3), O0's (quarter 0)
  if (th >= 1) P = *sf(0);
  if (th >= 2) P = add_pair(P, *sf(1));
  if (th == 3) P = add_pair(P, own = *sf(2));
  if (th <= 2) Q = *sb_slot(3);
  if (th <= 1) Q = add_pair(Q, *sb_slot(2));
  if (th == 0) Q = add_pair(Q, own = *sb_slot(1));
  const int base = 8 * th;
  auto operands = [&](int t, float2 a) {
    const uint2 qk = make_uint2(*pair_word(sm.x[kQ], t, cp), *pair_word(sm.x[kK], t, cp));
    rebased_operands(sm.x[kQ], sm.x[kK], sm.x[kG], t, cp, qk, a, sb);
  };
  // Forward: Kd, Qd; block 1's cross operands; H1's operands (odd quarters).
  auto forward = [&]() {
    float2 F = zero, Fc = zero;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int t = base + j;
      F = add_pair(F, gamma[j]);
      Fc = add_pair(Fc, clamp_pair(gamma[j]));
      const uint32_t q_hat = *pair_word(sm.x[kQ], t, cp), k_hat = *pair_word(sm.x[kK], t, cp);
      const float2 G = add_pair(P, F);
      const uint32_t e = ex2_pair(G.x, G.y);
      *record32_word(rec, false, t, cp) = bf16x2_mul(k_hat, e);
      *record32_word(rec, true, t, cp) = bf16x2_mul(bf16x2_mul(q_hat, e), sb);
      if (th >= 2) {
        const float2 o = th == 3 ? add_pair(own, F) : F;
        const uint32_t f = ex2_pair(o.x, o.y);
        *pair_word(sm.own[kKd1], t - kChunk, cp) = bf16x2_mul(k_hat, f);
        *pair_word(sm.own[kQd1], t - kChunk, cp) = bf16x2_mul(bf16x2_mul(q_hat, f), sb);
      }
      if (th % 2 == 1) operands(t, Fc);
    }
    if (th == 3) {
      const float2 g31 = add_pair(P, F);
      reinterpret_cast<float2 *>(sm.decay)[cp] =
          make_float2(ex2_approx(g31.x), ex2_approx(g31.y));
    }
  };
  // Backward: Kr; block 0's cross operand; H0's operands (even quarters).
  auto backward = [&]() {
    float2 R = zero, Rc = zero;
#pragma unroll
    for (int j = 7; j >= 0; --j) {
      const int t = base + j;
      const uint32_t k_hat = *pair_word(sm.x[kK], t, cp);
      const float2 D = add_pair(R, Q);
      *pair_word(sm.own[kKrU], t, cp) = bf16x2_mul(k_hat, ex2_pair(D.x, D.y));
      if (th <= 1) {
        const float2 o = th == 0 ? add_pair(R, own) : R;
        *pair_word(sm.own[kB0U], t, cp) = bf16x2_mul(k_hat, ex2_pair(o.x, o.y));
      }
      if (th % 2 == 0) operands(t, make_float2(-Rc.x, -Rc.y));
      R = add_pair(R, gamma[j]);
      Rc = add_pair(Rc, clamp_pair(gamma[j]));
    }
  };
  // The pass that overwrites q^ and k^ with the operands goes second.
  if (th % 2 == 0) {
    forward();
    backward();
  } else {
    backward();
    forward();
  }
}

// §3.2 steps 7, 8 of a 32-token unbounded record (chunk_scores32_of): the diagonal pairs
// score the block's A (A_q) against its B; the cross pair block 1's own Kd^1 (Qd^1) against
// B0, in full.
__device__ __forceinline__ void chunk_scores32_unbounded(PrepareSmem32 &sm) {
  chunk_scores32_of(sm, [&](int blk, bool cross, bool is_l) {
    return ScoreTiles32{cross ? sm.own[is_l ? kKd1 : kQd1] : sm.x[is_l ? kK : kQ] + kChunk * blk,
                        cross ? sm.own[kB0U] : sm.x[kG] + kChunk * blk};
  });
}

// Warps 2-7 of a 32-token unbounded record: Kr^T (16 tiles from own[kKrU]), Mqk, the decay
// plane and beta (Kd and Qd went to the record with the decays).
__device__ __forceinline__ void store_planes32_unbounded(uint4 *rec, const PrepareSmem32 &sm) {
  using R = Record32;
  const uint32_t tid = threadIdx.x - 64, warp = tid / 32, lane = tid % 32;
  for (uint32_t j = warp; j < 2 * kKBlocks; j += kStoreWarps32)  // k-block j / 2, block j % 2
    rec[R::krt(j / 2, j % 2) / 16 + lane] = t_frag(sm.own[kKrU] + kChunk * (j % 2), j / 2);
  store_small_planes32(rec, sm, tid);
}

// One 32-token record of an unbounded gate: chunk `ch` of head h (fragment order).
__device__ __forceinline__ void prepare_chunk_unbounded32(const FwdParams &p, int64_t h,
                                                          const ChunkRef &ch, PrepareSmem32 &sm) {
  uint4 *rec = load_normalized32<true>(p, h, ch, sm);
  unbounded_decays32(p, h, ch, rec, sm);
  __syncthreads();
  chunk_scores32_unbounded(sm);
  __syncthreads();
  if (threadIdx.x >= 64)
    store_planes32_unbounded(rec, sm);
  else
    neumann_diagonal32(sm);
  __syncthreads();
  if (threadIdx.x < 32) {
    if (p.stable_inverse)
      cross_inverse32_checked(rec, sm);
    else
      cross_inverse32(rec, sm);
  } else if (p.stable_inverse && threadIdx.x < 64) {
    diagonal_sound32(sm);
  }
}

// ---------------------------------------------------------------- the K1 kernels

// The two record shapes: 16-token chunks (exact mode, and AUTO's default) with 15.5 KB of
// static shared memory, and 32-token chunks with ~56 KB of dynamic shared memory.
template <int kBlocks>
struct K1Shape;
template <>
struct K1Shape<1> {
  using Smem = PrepareSmem;
  static constexpr int kThreads = kPrepareThreads;
  static constexpr int kOverlapCtas = 12;  // beside the pass: 40 registers (see below)
  static constexpr int kDynamicSmem = 0;
  __device__ __forceinline__ static Smem &smem() {
    __shared__ Smem sm;
    return sm;
  }
};
template <>
struct K1Shape<2> {
  using Smem = PrepareSmem32;
  static constexpr int kThreads = kPrepare32Threads;
  // Three CTAs an SM (80 registers) on sm_90a: bounded to four (64), its item loop spilled
  // 24-44 bytes; the other arches' ptxas spills 4-8 bytes at 80 (CUDA 13.0), so two there
  // (128).
  static constexpr int kOverlapCtas = FLASH_KDA_CC == 90 ? 3 : 2;
  static constexpr int kDynamicSmem = static_cast<int>(sizeof(PrepareSmem32));
  __device__ __forceinline__ static Smem &smem() {
    extern __shared__ __align__(16) uint8_t k1_dynamic[];
    return *reinterpret_cast<Smem *>(k1_dynamic);
  }
};

// One record of variant kVariant (an unbounded gate's with an fp32 g's rows read as kLoad says).
template <K1Variant kVariant, RecordOrder kOrder, GateLoad kLoad = GateLoad::kWithDecays,
          class Smem>
__device__ __forceinline__ void prepare_record(const FwdParams &p, int64_t h, const ChunkRef &ch,
                                               Smem &sm) {
  if constexpr (kVariant == K1Variant::kUnbounded && std::is_same_v<Smem, PrepareSmem32>)
    prepare_chunk_unbounded32(p, h, ch, sm);
  else if constexpr (kVariant == K1Variant::kUnbounded)
    prepare_chunk_unbounded<kOrder, kLoad>(p, h, ch, sm);
  else
    prepare_chunk<kOrder, kVariant>(p, h, ch, sm);
}

// K1 before the recurrence: grid (records, heads), one record per CTA, in kOrder (tile
// order where the first pass is the warpgroup pass). GateLoad::kBeforeWait: the 16-token
// unbounded K1 for an fp32 g only (GateLoad).
template <int kBlocks, RecordOrder kOrder = RecordOrder::kFragments,
          K1Variant kVariant = K1Variant::kBounded, GateLoad kLoad = GateLoad::kWithDecays>
__global__ void __launch_bounds__(K1Shape<kBlocks>::kThreads) prepare_kernel(const FwdParams p) {
  static_assert(
      kLoad == GateLoad::kWithDecays || (kVariant == K1Variant::kUnbounded && kBlocks == 1),
      "an fp32 g's rows before the wait: the 16-token unbounded K1 only");
  auto &sm = K1Shape<kBlocks>::smem();
  allow_dependents();  // the first pass launches early and waits for K1's end (design §4.1)
  ChunkRef ch;
  if (!locate_chunk(p, blockIdx.x, ch)) return;  // excess CTA of varlen's upper-bound grid
  prepare_record<kVariant, kOrder, kLoad>(p, blockIdx.y, ch, sm);
}

// K1 beside the first recurrence pass (design §4.7): a grid that the GPU holds at once
// beside that pass's CTAs (the launch sizes it), which lets the pass launch
// (allow_dependents) and takes items from a counter in locate_item's order, publishing
// each record's ready flag once the whole CTA has written it. Bounded (overlap_ctas) so
// that its CTAs stay small beside the pass: 40 registers for the bounded 16-token K1, 64
// for the unbounded gates'; the 32-token one runs three an SM, one of them beside a <1, 4>
// pass CTA (design §4.8).
//
// K1 leaving the pass's SMs (p.leave_sms > 0; the grid then fills every SM): a CTA on an
// SM with %smid below leave_sms takes no more items once leave_after items are taken (the
// plan's lead, written at the rate of every SM) and some CTA on another SM has registered
// as a stayer; a stayer works until the items run out. So every item is
// taken whichever SMs the CTAs land on (with none on the other SMs, the leavers never
// leave), and the pass, which asks for an SM's whole shared memory, starts on the SMs
// they leave: it runs beside no K1 CTA while the other SMs write its records.
constexpr uint32_t kNoItem = 0xffffffffu;  // above any item count (prepare_items < 2^31)

// Where the overlap kernel runs: beside the pass's CTAs from the start, or leaving the
// pass's SMs (alone on every SM for the lead, then on the SMs the pass leaves free).
enum class K1Place { kBeside, kLeaving };

// CTAs an SM the overlap kernel is bounded to. The unbounded gates' 16-token K1 (design §2.5)
// holds more per thread: eight beside the pass (64 registers; bounded to 40 its decays spilled
// ~110 bytes), ten where it leaves the pass's SMs on sm_90a (48, as the record one per CTA
// takes: the item loop holds nothing across a record), alone on every SM for the lead (H200:
// calls 0.3-1.7% faster than at eight there, 2-4% slower with ten beside the pass; the launch
// leaves an fp32 g at eight, launch.cuh leaving_form). The 16-token kBoundedForms K1 keeps
// twelve (40 registers) but on sm_120 and sm_121, where its residual test spilled 16 bytes at
// 40: ten there (48).
template <int kBlocks, K1Variant kVariant, K1Place kPlace = K1Place::kBeside>
constexpr int overlap_ctas() {
  if (kVariant == K1Variant::kUnbounded && kBlocks == 1)
    return kPlace == K1Place::kLeaving && FLASH_KDA_CC == 90 ? 10 : 8;
  if (kVariant == K1Variant::kBoundedForms && kBlocks == 1 && FLASH_KDA_CC >= 120) return 10;
  return K1Shape<kBlocks>::kOverlapCtas;
}

// Whether K1 of kBlocks and kVariant has a leaving form of its own (another CTA count); where
// it has none, the beside form leaves the pass's SMs too.
template <int kBlocks, K1Variant kVariant>
constexpr bool has_leaving_form() {
  return overlap_ctas<kBlocks, kVariant, K1Place::kLeaving>() !=
         overlap_ctas<kBlocks, kVariant, K1Place::kBeside>();
}

// Thread 0 takes the next item for the CTA (kNoItem: none) into `next` and, for an item below
// prepare_items, its head and chunk (`valid`: locate_item's answer) into shared memory, so that
// the loop carries no register from one record to the next: its K1 fits 48 registers only so.
__device__ __forceinline__ void take_item(const FwdParams &p, uint32_t &next, int64_t &head,
                                          ChunkRef &ref, bool &valid) {
  const bool leaver = sm_id() < static_cast<uint32_t>(p.leave_sms);
  const uint32_t i =
      leaver && load_relaxed(&p.sync->next_item) >= static_cast<uint32_t>(p.leave_after) &&
              load_relaxed(&p.sync->stayers) > 0
          ? kNoItem
          : atomicAdd(&p.sync->next_item, 1u);
  next = i;
  if (i >= static_cast<uint32_t>(p.prepare_items)) return;
  int64_t h = 0;
  ChunkRef ch{};  // set whole on every path: a partly set one stayed in local memory
  valid = locate_item(p, static_cast<int32_t>(i), h, ch);
  head = h;
  ref = ch;
}

template <int kBlocks, RecordOrder kOrder = RecordOrder::kFragments,
          K1Variant kVariant = K1Variant::kBounded, K1Place kPlace = K1Place::kBeside>
__global__ void __launch_bounds__(K1Shape<kBlocks>::kThreads,
                                  overlap_ctas<kBlocks, kVariant, kPlace>())
    prepare_overlap_kernel(const FwdParams p) {
  auto &sm = K1Shape<kBlocks>::smem();
  __shared__ uint32_t next;
  __shared__ int64_t head;
  __shared__ ChunkRef chunk;
  __shared__ bool valid;
  allow_dependents();
  if (threadIdx.x == 0 && p.leave_sms > 0 && sm_id() >= static_cast<uint32_t>(p.leave_sms))
    atomicAdd(&p.sync->stayers, 1u);
  for (;;) {
    if (threadIdx.x == 0) take_item(p, next, head, chunk, valid);
    __syncthreads();
    if (next >= static_cast<uint32_t>(p.prepare_items)) return;  // CTA-uniform
    if (valid) prepare_record<kVariant, kOrder>(p, head, chunk, sm);
    __syncthreads();  // every record store before the flag; smem and the item free again
    if (valid && threadIdx.x == 0) publish_flag(p.ready + head * p.tiles_per_head + chunk.tile);
  }
}

// The lead of K1 leaving the pass's SMs as a grid of its own (p.lead_items > 0, launch.cuh
// kLeadGridWaves; 16-token records, where it was measured): item blockIdx.x, one a CTA, before
// the overlap kernel, which the stream starts after this grid's end. So a slot's next record
// starts as soon as its last one is written, with no counter round trip and no flag release
// in between, and the plain flag stores and the counter's start (the next item, lead_items)
// are visible to the overlap kernel and the pass by the kernel boundary. The overlap kernel's
// CTAs on the pass's SMs then find the lead taken and leave once a stayer exists (take_item).
// It runs alone on every SM, so on sm_90a it is bounded as the leaving form is: the item's
// head and chunk wait in shared memory, as in the item loop, which is what fits the unbounded
// K1 in 48 registers (ten CTAs an SM, not eight) and the tile-order kBoundedForms K1 in 40
// (twelve, not ten). FlashKDA's kBounded K1 keeps them in registers: it takes 40 so, and
// spilled 8 bytes at 40 with them in shared memory. Other arches keep the kernel as it was
// (the item in registers, the register count the compiler's): the lead grid was measured on
// sm_90a only, and at the overlap kernel's CTA counts the bounded K1s spilled 12-20 bytes on
// sm_120a and sm_121a.
#if FLASH_KDA_CC == 90
#define FLASH_KDA_LEAD_BOUNDS \
  __launch_bounds__(kPrepareThreads, overlap_ctas<1, kVariant, K1Place::kLeaving>())
#else
#define FLASH_KDA_LEAD_BOUNDS __launch_bounds__(kPrepareThreads)
#endif
template <RecordOrder kOrder = RecordOrder::kFragments, K1Variant kVariant = K1Variant::kBounded>
__global__ void FLASH_KDA_LEAD_BOUNDS prepare_lead_kernel(const FwdParams p) {
  auto &sm = K1Shape<1>::smem();
  if (blockIdx.x == 0 && threadIdx.x == 0) p.sync->next_item = static_cast<uint32_t>(p.lead_items);
  auto record = [&](const int64_t &h, const ChunkRef &ch) {  // the item's record, then its flag
    prepare_record<kVariant, kOrder>(p, h, ch, sm);
    __syncthreads();  // every record store before the flag
    if (threadIdx.x == 0) p.ready[h * p.tiles_per_head + ch.tile] = 1u;
  };
  if constexpr (kVariant == K1Variant::kBounded || FLASH_KDA_CC != 90) {
    int64_t h = 0;
    ChunkRef ch{};
    if (locate_item(p, static_cast<int32_t>(blockIdx.x), h, ch)) record(h, ch);
  } else {
    __shared__ int64_t head;
    __shared__ ChunkRef chunk;
    __shared__ bool valid;
    if (threadIdx.x == 0) {
      int64_t h = 0;
      ChunkRef ch{};  // set whole on every path (take_item)
      valid = locate_item(p, static_cast<int32_t>(blockIdx.x), h, ch);
      head = h;
      chunk = ch;
    }
    __syncthreads();
    if (valid) record(head, chunk);  // CTA-uniform
  }
}
#undef FLASH_KDA_LEAD_BOUNDS

}  // namespace flash_kda::FLASH_KDA_ARCH
