// SPDX-License-Identifier: MIT
// prepare.cuh: K1, the token-parallel half of the forward (spec §3.2, §4.4).
//
// One CTA computes one 16-token chunk of one head and writes its record (workspace.h):
// decayed keys/queries Kd, Qd, Kr, the chunk decay e, the inverse (I + L)^-1, the causal
// scores Mqk and bf16 beta. Grid (chunks, heads), 128 threads (4 warps), 30.9 KB static
// smem. Rows t >= n of a partial chunk are loaded as zeros: k, q and g rows become 0, so
// Kd/Qd/Ki/Kr rows and gamma are 0 there, as in the reference (spec §3.5: free).
#pragma once
#ifndef FLASH_KDA_ARCH
#error "define FLASH_KDA_ARCH (the arch namespace, e.g. sm90a) before including kda headers"
#endif

#include "kda/numerics.cuh"
#include "kda/sequences.cuh"

namespace flash_kda::FLASH_KDA_ARCH {

constexpr int kPrepareThreads = 128;
constexpr float kLog2eF = 1.44269502162933349609375f;  // LOG2E_F, spec §0

struct PrepareSmem {
  alignas(16) uint8_t record[kRecordBytes];      // the output record, staged
  alignas(16) uint16_t x[3][kChunk][kHeadDim];   // raw q, k, g; q and k normalised in place
  alignas(16) uint16_t ki[kHeadDim / 16 * kTileElems];  // Ki in A-fragment order
  alignas(16) uint16_t lmat[kChunk][kChunk];     // L (fp16 bits), row-major
  float beta_h[kChunk];                          // f(hf(b_t)) for L, step 8
};

template <typename T>
__device__ __forceinline__ T *record_plane(PrepareSmem &sm, int offset) {
  return reinterpret_cast<T *>(sm.record + offset);
}

// Step 0: q, k, g rows t < n (zeros beyond), beta -> b_t = sig(f(beta_t)).
__device__ __forceinline__ void load_chunk(const FwdParams &p, int64_t h, const ChunkRef &ch,
                                           PrepareSmem &sm) {
  for (int idx = threadIdx.x; idx < 3 * kChunk * 16; idx += kPrepareThreads) {
    const int which = idx / (kChunk * 16), row = (idx / 16) % kChunk, vec = idx % 16;
    const uint16_t *src = which == 0 ? p.q : which == 1 ? p.k : p.g;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (row < ch.n) {
      const uint16_t *rowp = src + ((ch.tok0 + row) * p.heads + h) * kHeadDim;
      val = __ldg(reinterpret_cast<const uint4 *>(rowp) + vec);
    }
    reinterpret_cast<uint4 *>(sm.x[which][row])[vec] = val;
  }
  if (threadIdx.x < kChunk) {
    const int t = threadIdx.x;
    const uint32_t raw = t < ch.n ? __ldg(p.beta + (ch.tok0 + t) * p.heads + h) : 0u;
    const float b = sigmoid_tanh(bf16_to_f32(raw));
    record_plane<uint16_t>(sm, kOffBeta)[t] = static_cast<uint16_t>(f32_to_bf16(b));
    sm.beta_h[t] = f16_to_f32(f32_to_f16(b));
  }
  // Record padding after the 16 betas: defined bytes, never read for values.
  for (int i = kOffBeta + 2 * kChunk + 4 * threadIdx.x; i < kRecordBytes; i += 4 * kPrepareThreads)
    *reinterpret_cast<uint32_t *>(sm.record + i) = 0u;
}

// Step 2: x_hat = bf(f(x) * RSQ(T + 1e-6)) with T the spec's fixed reduction tree: 16
// segments of 8 elements, fma partials in element order, then a butterfly (xor 8, 4, 2,
// 1) over the segments. Required. Thread = (segment j, rows r and r + 8) of q and of k;
// the 16 lanes holding one row's segments form a half-warp.
__device__ __forceinline__ void l2_normalize(PrepareSmem &sm) {
  const int j = threadIdx.x % 16, r0 = threadIdx.x / 16;
#pragma unroll
  for (int which = 0; which < 2; ++which) {
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      uint4 *seg = reinterpret_cast<uint4 *>(&sm.x[which][r0 + 8 * rr][8 * j]);
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
        o[m] = pack_bf16x2(mul_ftz(bf16_to_f32(lo16(w[m])), r), mul_ftz(bf16_to_f32(hi16(w[m])), r));
      *seg = make_uint4(o[0], o[1], o[2], o[3]);
    }
  }
}

// Steps 1, 3, 4 for channel `ch`: G[t] = cumulative sum of gamma (sequential, fp32, FTZ).
__device__ __forceinline__ void gate_cumsum(const FwdParams &p, int64_t h, int n, int ch,
                                            const PrepareSmem &sm, float (&G)[kChunk]) {
  const float a = ex2_approx(mul_ftz(__ldg(p.A_log + h), kLog2eF));
  const float dt = __ldg(p.dt_bias + h * kHeadDim + ch);
  float acc = 0.f;
#pragma unroll
  for (int t = 0; t < kChunk; ++t) {
    float gamma = 0.f;
    if (t < n) {
      const float y = mul_ftz(add_ftz(bf16_to_f32(sm.x[2][t][ch]), dt), a);
      gamma = mul_ftz(p.gate_scale, sigmoid_tanh(y));
    }
    acc = add_ftz(acc, gamma);  // spec §3.2 step 4: a separate add, not fused; required
    G[t] = acc;
  }
}

// Steps 5, 6 for channel `ch`: e = EX2(G[15]); Qd = (q (*) E+) (*) sb, Kd = k (*) E+,
// Ki = k (*) E-, Kr = Ki (*) bf(e). Order required (scale last, Kr from rounded Ki).
__device__ __forceinline__ void apply_decays(const FwdParams &p, int ch, const float (&G)[kChunk],
                                             PrepareSmem &sm) {
  const float e = ex2_approx(G[kChunk - 1]);
  record_plane<float>(sm, kOffDecay)[decay_index(ch)] = e;
  const uint32_t e_bf = f32_to_bf16(e);
  const int tile = ch / 16, col = ch % 16;
  uint16_t *kd = record_plane<uint16_t>(sm, kOffKd) + tile * kTileElems;
  uint16_t *qd = record_plane<uint16_t>(sm, kOffQd) + tile * kTileElems;
  uint16_t *krt = record_plane<uint16_t>(sm, kOffKrT) + tile * kTileElems;
  uint16_t *ki = sm.ki + tile * kTileElems;
#pragma unroll
  for (int t = 0; t < kChunk; ++t) {
    const uint32_t e_plus = f32_to_bf16(ex2_approx(G[t]));
    const uint32_t e_minus = f32_to_bf16(ex2_approx(-G[t]));
    const uint32_t q_hat = sm.x[0][t][ch], k_hat = sm.x[1][t][ch];
    const uint32_t k_inv = bf16_mul(k_hat, e_minus);
    qd[frag_a_index(t, col)] = static_cast<uint16_t>(bf16_mul(bf16_mul(q_hat, e_plus), p.scale_bf16));
    kd[frag_a_index(t, col)] = static_cast<uint16_t>(bf16_mul(k_hat, e_plus));
    ki[frag_a_index(t, col)] = static_cast<uint16_t>(k_inv);
    krt[frag_a_index(col, t)] = static_cast<uint16_t>(bf16_mul(k_inv, e_bf));
  }
}

// Steps 7, 8: warp w computes columns [8 (w % 2), +8) of L = Kd Ki^T (w < 2, scaled by
// beta, strictly lower, fp16 into lmat) or of Mqk = Qd Ki^T (w >= 2, lower with the
// diagonal, bf16 into the record). MMA32 over k-blocks 0..7 in order; required.
__device__ __forceinline__ void chunk_scores(PrepareSmem &sm) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, cq = lane % 4;
  const int nb = warp % 2;
  const bool is_l = warp < 2;
  const uint16_t *a_src = record_plane<uint16_t>(sm, is_l ? kOffKd : kOffQd);
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int kb = 0; kb < kHeadDim / 16; ++kb) {
    const uint4 av = *reinterpret_cast<const uint4 *>(a_src + kb * kTileElems + lane * 8);
    const uint4 bv = *reinterpret_cast<const uint4 *>(sm.ki + kb * kTileElems + lane * 8);
    const uint32_t a[4] = {av.x, av.y, av.z, av.w};
    // B^T rows j = 8 nb + g of Ki are registers nb and nb + 2 of Ki's A fragment.
    mma_bf16_f32(acc, a, nb ? bv.y : bv.x, nb ? bv.w : bv.z);
  }
  uint16_t *mqk = record_plane<uint16_t>(sm, kOffMqk);
#pragma unroll
  for (int idx = 0; idx < 4; ++idx) {
    const int i = g + 8 * (idx / 2), j = 8 * nb + 2 * cq + idx % 2;
    if (is_l) {
      const float l_raw = f16_to_f32(f32_to_f16(acc[idx]));
      sm.lmat[i][j] = static_cast<uint16_t>(i > j ? f32_to_f16(mul_ftz(l_raw, sm.beta_h[i])) : 0u);
    } else {
      mqk[frag_a_index(i, j)] = static_cast<uint16_t>(i >= j ? f32_to_bf16(acc[idx]) : 0u);
    }
  }
}

// A 16x16 fp16 matrix in accumulator layout: c[nb][r] = {X[g + 8r][8nb + 2cq], +1}.
struct Tile16 {
  uint32_t c[2][2];
};

// X (+h) Y: elementwise fp16 add, exact fp32 sum rounded once; required (spec §3.2 step 9).
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

// Step 9 (one warp): INV = bf((I - L)(I + L^2)(I + L^4)(I + L^8)) by the doubling
// recurrence N_{m+1} = N_m (+h) MMA16(N_m, P), P = L^(2^(m+1)), all in registers.
__device__ __forceinline__ void neumann_inverse(PrepareSmem &sm) {
  const int lane = threadIdx.x % 32, g = lane / 4, cq = lane % 4;
  Tile16 l, n0;
#pragma unroll
  for (int nb = 0; nb < 2; ++nb) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = g + 8 * r, j = 8 * nb + 2 * cq;
      const uint32_t pair = *reinterpret_cast<const uint32_t *>(&sm.lmat[i][j]);
      l.c[nb][r] = pair;
      const uint32_t neg = pair ^ 0x80008000u;  // N0 = I - L: exact sign flip off the diagonal
      const uint32_t one = 0x3c00u;             // fp16 1.0
      n0.c[nb][r] = (i == j ? one : lo16(neg)) | ((i == j + 1 ? one : hi16(neg)) << 16);
    }
  }
  const Tile16 p2 = mma16(l, l);
  const Tile16 n1 = add_f16(n0, mma16(n0, p2));
  const Tile16 p4 = mma16(p2, p2);
  const Tile16 n2 = add_f16(n1, mma16(n1, p4));
  const Tile16 p8 = mma16(p4, p4);
  const Tile16 n3 = add_f16(n2, mma16(n2, p8));
  uint16_t *inv = record_plane<uint16_t>(sm, kOffInv);
#pragma unroll
  for (int idx = 0; idx < 8; ++idx) {
    const int nb = idx / 4, r = (idx / 2) % 2, half = idx % 2;
    const uint32_t bits = half ? hi16(n3.c[nb][r]) : lo16(n3.c[nb][r]);
    inv[frag_a_index(g + 8 * r, 8 * nb + 2 * cq + half)] = static_cast<uint16_t>(f32_to_bf16(f16_to_f32(bits)));
  }
}

__device__ __forceinline__ void store_record(const FwdParams &p, int64_t h, const ChunkRef &ch,
                                             const PrepareSmem &sm) {
  uint4 *dst = reinterpret_cast<uint4 *>(p.records + (h * p.tiles_per_head + ch.tile) * kRecordBytes);
  const uint4 *src = reinterpret_cast<const uint4 *>(sm.record);
  for (int i = threadIdx.x; i < kRecordBytes / 16; i += kPrepareThreads) dst[i] = src[i];
}

__global__ void __launch_bounds__(kPrepareThreads) prepare_kernel(const FwdParams p) {
  __shared__ PrepareSmem sm;
  const int64_t h = blockIdx.y;
  ChunkRef ch;
  if (!locate_chunk(p, blockIdx.x, ch)) return;  // excess CTA of varlen's upper-bound grid

  load_chunk(p, h, ch, sm);
  __syncthreads();
  l2_normalize(sm);
  __syncthreads();
  {
    float G[kChunk];
    gate_cumsum(p, h, ch.n, threadIdx.x, sm, G);
    apply_decays(p, threadIdx.x, G, sm);
  }
  __syncthreads();
  chunk_scores(sm);
  __syncthreads();
  if (threadIdx.x < 32) neumann_inverse(sm);
  __syncthreads();
  store_record(p, h, ch, sm);
}

}  // namespace flash_kda::FLASH_KDA_ARCH
