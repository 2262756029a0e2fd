// SPDX-License-Identifier: MIT
// combine.cuh: the start state of every segment (design §6.2 phase B), between the
// segment pass and the rerun of the recurrence kernel.
//
// Segment j of a sequence, run from its true start state s_j (V-first, [v][k]), ends in
// s_{j+1} = s_j X_j + S^_j: X_j = M_j^T is the [128 k'][128 k] transition block and S^_j
// the zero-start end state, both written by the segment pass (bf16-valued). The chain
// runs in fp32 (s_j is never rounded); each start is stored as bf16, the precision the
// recurrence keeps its state in:
//   start_0 = bf(initial state)   (a copy: the rerun never reads the caller's tensor, which
//                                  may be final_state itself)
//   start_1 = S^_0                (segment 0 ran from the true initial state)
//   start_{j+1} = bf(s_{j+1}),  s_{j+1} = s_j X_j + S^_j
//
// The product runs on the tensor cores without losing fp32: s_j = hi + mid + lo exactly,
// three bf16 terms (hi = bf(s), mid = bf(s - hi), lo = bf(s - hi - mid); both differences
// are exact in fp32 and 3 x 8 mantissa bits cover fp32's 24), and X_j is bf16. Each term's
// MMA32 chain over the eight k-blocks (ascending) accumulates in fp32 from zero; then
// s_{j+1} = ((P_lo + P_mid) + P_hi) + S^_j, each add rounded to nearest. The order is
// fixed, so the result is deterministic; hi is bf(s_{j+1}), the stored start.
//
// One CTA = 16 value rows of one (sequence, head), 4 warps; warp w owns the 32 columns
// [32 w, 32 w + 32) of s_{j+1}, four 8-column MMA tiles. Two adjacent tiles of the
// accumulator are, lane for lane, the A fragment of one k-block, so each warp splits its
// own columns into the three terms and publishes them in fragment order (`terms`, double
// buffered); every warp then reads all eight k-blocks. X_j streams through a ring of
// padded row-major stages by cp.async, `stages - 1` steps ahead, and reaches the MMA by
// ldmatrix.trans. Grid N * H * 8.
#pragma once
#ifndef FLASH_KDA_ARCH
#error "define FLASH_KDA_ARCH (the arch namespace, e.g. sm90a) before including kda headers"
#endif

#include "kda/chains.cuh"
#include "kda/config.h"

namespace flash_kda::FLASH_KDA_ARCH {

constexpr int kCombineWarps = 4;  // 32 columns each
constexpr int kCombineThreads = 32 * kCombineWarps;
static_assert(kCombineRows == 16 && kCombineCtasPerHead * kCombineRows == kHeadDim,
              "config.h: one 16-row MMA block per CTA");
constexpr int kCombineTerms = 3;      // hi, mid, lo
constexpr int kCombineMaxStages = 3;  // X_j ring depth where shared memory allows
static_assert(kCombineMaxStages == 3, "combine_kernel's ring wait covers depths 3 and 2");
constexpr int kXRow = kHeadDim + 8;  // padded stage row (272 B): ldmatrix rows conflict-free
constexpr int kXStageBytes = kHeadDim * kXRow * 2;
constexpr int kXChunks = kHeadDim * kHeadDim * 2 / 16;  // 16-byte copies per X_j
// The s_j terms in A-fragment order: [buffer][term][k-block][lane].
constexpr int kTermBytes = 2 * kCombineTerms * kKBlocks * 32 * 16;

constexpr int combine_smem_bytes(int stages) {
  return kTermBytes + stages * kXStageBytes;
}

// Shared memory: the term buffers, then the X_j stages.
struct CombineSmem {
  uint4 (*terms)[kCombineTerms][kKBlocks][32];
  uint16_t (*x)[kHeadDim][kXRow];
};

// One thread's share of the copies of X_j (rows 128..255 of the segment's block) into a stage.
__device__ __forceinline__ void issue_transition(const uint16_t *block,
                                                 uint16_t (&stage)[kHeadDim][kXRow]) {
  const uint16_t *x = block + kHeadDim * kHeadDim;
#pragma unroll
  for (int i = 0; i < kXChunks / kCombineThreads; ++i) {
    const int c = threadIdx.x + i * kCombineThreads, row = c / 16, col = 8 * (c % 16);
    copy16_async(&stage[row][col], x + row * kHeadDim + col);
  }
}

// The lane's accumulator positions: pair (nt, r) is row g + 8 r, columns 32 w + 8 nt + 2 cq
// and + 1 of the CTA's rows, as an offset into a [128][128] block.
__device__ __forceinline__ int64_t pair_offset(int v0, int nt, int r) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = v0 + lane / 4 + 8 * r, col = 32 * warp + 8 * nt + 2 * (lane % 4);
  return int64_t{row} * kHeadDim + col;
}

__device__ __forceinline__ void load_pairs(const uint16_t *block, int v0, uint32_t (&w)[4][2]) {
#pragma unroll
  for (int nt = 0; nt < 4; ++nt)
#pragma unroll
    for (int r = 0; r < 2; ++r)
      w[nt][r] = *reinterpret_cast<const uint32_t *>(block + pair_offset(v0, nt, r));
}

// Accumulator element i (0..3) of tile nt, as fp32, from load_pairs' words.
__device__ __forceinline__ float pair_element(const uint32_t (&w)[4][2], int nt, int i) {
  return bf16_to_f32(i % 2 ? hi16(w[nt][i / 2]) : lo16(w[nt][i / 2]));
}

// x = hi + mid + lo exactly (bf16 pairs), for a pair of fp32 values.
__device__ __forceinline__ void split3(float x0, float x1, uint32_t (&t)[kCombineTerms]) {
  t[0] = pack_bf16x2(x0, x1);
  const float m0 = sub_rn(x0, bf16_to_f32(lo16(t[0]))), m1 = sub_rn(x1, bf16_to_f32(hi16(t[0])));
  t[1] = pack_bf16x2(m0, m1);
  t[2] = pack_bf16x2(sub_rn(m0, bf16_to_f32(lo16(t[1]))), sub_rn(m1, bf16_to_f32(hi16(t[1]))));
}

// s_{j+1} (the lane's accumulator values d[nt][0..3]) -> start_{j+1} = bf(s_{j+1}) in
// global memory and its three terms in fragment order for the next step.
__device__ __forceinline__ void emit_state(const float (&d)[4][4], int v0, uint16_t *start,
                                           uint4 (&terms)[kCombineTerms][kKBlocks][32]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int half = 0; half < 2; ++half) {  // k-block 2 w + half = tiles 2 half, 2 half + 1
    uint32_t t[4][kCombineTerms];         // A registers 0..3: (tile, row r) pairs
#pragma unroll
    for (int reg = 0; reg < 4; ++reg) {
      const int nt = 2 * half + reg / 2, r = reg % 2;
      split3(d[nt][2 * r], d[nt][2 * r + 1], t[reg]);
      *reinterpret_cast<uint32_t *>(start + pair_offset(v0, nt, r)) = t[reg][0];
    }
#pragma unroll
    for (int term = 0; term < kCombineTerms; ++term)
      terms[term][2 * warp + half][lane] =
          make_uint4(t[0][term], t[1][term], t[2][term], t[3][term]);
  }
}

// P_term = s_j's term times X_j for the warp's four tiles: MMA32 over k-blocks ascending.
__device__ __forceinline__ void times_transition(const uint4 (&terms)[kCombineTerms][kKBlocks][32],
                                                 const uint16_t (&x)[kHeadDim][kXRow],
                                                 float (&acc)[kCombineTerms][4][4]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int m = lane / 8, row = lane % 8;  // the 8x8 matrix and row this lane addresses
#pragma unroll
  for (int term = 0; term < kCombineTerms; ++term)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[term][nt][i] = 0.f;
#pragma unroll
  for (int kb = 0; kb < kKBlocks; ++kb) {
    uint32_t a[kCombineTerms][4];
#pragma unroll
    for (int term = 0; term < kCombineTerms; ++term) {
      const uint4 v = terms[term][kb][lane];
      a[term][0] = v.x, a[term][1] = v.y, a[term][2] = v.z, a[term][3] = v.w;
    }
#pragma unroll
    for (int np = 0; np < 2; ++np) {  // tiles 2 np, 2 np + 1: matrices (k-half, n-half)
      uint32_t b[4];
      ldmatrix_x4_trans(&x[16 * kb + 8 * (m % 2) + row][32 * warp + 16 * np + 8 * (m / 2)], b);
#pragma unroll
      for (int term = 0; term < kCombineTerms; ++term) {
        mma_bf16_f32(acc[term][2 * np], a[term], b[0], b[1]);
        mma_bf16_f32(acc[term][2 * np + 1], a[term], b[2], b[3]);
      }
    }
  }
}

__global__ void __launch_bounds__(kCombineThreads) combine_kernel(const FwdParams p, int stages) {
  extern __shared__ __align__(16) unsigned char combine_smem[];
  const CombineSmem sm = {
      reinterpret_cast<uint4(*)[kCombineTerms][kKBlocks][32]>(combine_smem),
      reinterpret_cast<uint16_t (*)[kHeadDim][kXRow]>(combine_smem + kTermBytes)};
  const int64_t pair = blockIdx.x / kCombineCtasPerHead;
  const int64_t seq = pair / p.heads, head = pair % p.heads;
  const int v0 = static_cast<int>(blockIdx.x % kCombineCtasPerHead) * kCombineRows;
  const int64_t s0 = first_segment(p, seq);
  const int64_t count = segment_count(p, seq);
  if (count < 1) return;  // an empty sequence has no segment (CTA-uniform)

  {  // start_0 = bf(initial state), design §1.4
    const StateSource init = initial_source(p, seq, head);
    uint16_t *start = segment_start_block(p, s0, head);
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int64_t at = pair_offset(v0, nt, r);
        uint32_t w = 0;
        if (init.block != nullptr && init.dtype == Dtype::kBf16) {
          w = *reinterpret_cast<const uint32_t *>(static_cast<const uint16_t *>(init.block) + at);
        } else if (init.block != nullptr) {
          const float *f = static_cast<const float *>(init.block) + at;
          w = pack_bf16x2(f[0], f[1]);
        }
        *reinterpret_cast<uint32_t *>(start + at) = w;
      }
  }
  if (count < 2) return;

  // The ring: X_1 .. X_{stages - 1} in flight before the first step; one commit per step
  // (possibly empty) keeps the group count uniform.
  for (int i = 0; i < stages - 1; ++i) {
    if (1 + i <= count - 2) issue_transition(segment_state_block(p, s0 + 1 + i, head), sm.x[i]);
    copy_async_commit();
  }
  // s_1 = S^_0: start_1 = S^_0 exactly, its terms are (S^_0, 0, 0).
  uint32_t shat[4][2];
  load_pairs(segment_state_block(p, s0, head), v0, shat);
  {
    float d[4][4];
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) d[nt][i] = pair_element(shat, nt, i);
    emit_state(d, v0, segment_start_block(p, s0 + 1, head), sm.terms[1]);
  }
  if (count > 2) load_pairs(segment_state_block(p, s0 + 1, head), v0, shat);

  int stage = 0, refill = stages - 1;  // the stage holding X_j; the stage X_{j+stages-1} goes to
  for (int64_t j = 1; j + 1 < count; ++j) {
    if (stages == 3)
      copy_async_wait<1>();
    else
      copy_async_wait<0>();
    __syncthreads();  // X_j and s_j's terms visible; step j - 1 done with its buffers
    if (j + stages - 1 <= count - 2)
      issue_transition(segment_state_block(p, s0 + j + stages - 1, head), sm.x[refill]);
    copy_async_commit();

    float acc[kCombineTerms][4][4];
    times_transition(sm.terms[j % 2], sm.x[stage], acc);
    float d[4][4];
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        d[nt][i] = add_rn(add_rn(add_rn(acc[2][nt][i], acc[1][nt][i]), acc[0][nt][i]),
                          pair_element(shat, nt, i));
    emit_state(d, v0, segment_start_block(p, s0 + j + 1, head), sm.terms[(j + 1) % 2]);
    if (j + 2 < count) load_pairs(segment_state_block(p, s0 + j + 1, head), v0, shat);
    stage = stage + 1 == stages ? 0 : stage + 1;
    refill = refill + 1 == stages ? 0 : refill + 1;
  }
  copy_async_wait<0>();  // no copy outlives the CTA
}

}  // namespace flash_kda::FLASH_KDA_ARCH
