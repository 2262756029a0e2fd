// SPDX-License-Identifier: MIT
// combine.cuh: the start state of every segment (design §6.2 phase B), between the
// segment pass and the rerun of the recurrence kernel.
//
// Segment j of a sequence, run from its true start state s_j (V-first, [v][k]), ends in
// s_{j+1} = s_j X_j + S^_j: X_j = M_j^T is the [128 k'][128 k] transition block and S^_j
// the zero-start end state, both written by the segment pass (bf16-valued). The
// chain runs in fp32 (s_j is never rounded); each start is stored as bf16, the precision
// the recurrence keeps its state in:
//   start_0 = bf(initial state)   (a copy: the rerun never reads the caller's tensor, which
//                                  may be final_state itself)
//   start_1 = S^_0                (segment 0 ran from the true initial state)
//   start_{j+1} = bf(s_{j+1}),  s_{j+1} = fma-chain over k' ascending of s_j[v][k'] X_j[k'][k],
//                               then + S^_j[v][k] (round to nearest, no flush)
// The order is fixed, so the result is deterministic.
//
// One CTA = four value rows v of one (sequence, head); 128 threads, warp w owns row
// v0 + w, lane l owns columns 4 l .. 4 l + 3. Shared memory: X_j (32 KB bf16) and the four
// rows of s_j (2 KB fp32); the next X_j is loaded into registers while the current one is
// used. Grid N * H * 32.
#pragma once
#ifndef FLASH_KDA_ARCH
#error "define FLASH_KDA_ARCH (the arch namespace, e.g. sm90a) before including kda headers"
#endif

#include "kda/chains.cuh"

namespace flash_kda::FLASH_KDA_ARCH {

constexpr int kCombineRows = 4;  // value rows per CTA, one per warp
constexpr int kCombineThreads = 32 * kCombineRows;
constexpr int kCombineCtasPerHead = kHeadDim / kCombineRows;
constexpr int kTransitionVecs = kHeadDim * kHeadDim * 2 / 16 / kCombineThreads;  // uint4 per thread

struct CombineSmem {
  alignas(16) uint16_t x[kHeadDim][kHeadDim];  // X_j[k'][k], bf16
  float s[kCombineRows][kHeadDim];             // rows of s_j
};

// Four consecutive bf16 of a row as fp32.
__device__ __forceinline__ void load_bf16x4(const uint16_t *src, float (&x)[4]) {
  const uint2 w = *reinterpret_cast<const uint2 *>(src);
  x[0] = bf16_to_f32(lo16(w.x));
  x[1] = bf16_to_f32(hi16(w.x));
  x[2] = bf16_to_f32(lo16(w.y));
  x[3] = bf16_to_f32(hi16(w.y));
}

__device__ __forceinline__ void store_bf16x4(uint16_t *dst, const float (&x)[4]) {
  *reinterpret_cast<uint2 *>(dst) = make_uint2(pack_bf16x2(x[0], x[1]), pack_bf16x2(x[2], x[3]));
}

// The transition block X_j = rows 128..255 of the segment's [256][128] block, one thread's
// share of its 16-byte vectors.
__device__ __forceinline__ void load_transition(const uint16_t *block,
                                                uint4 (&regs)[kTransitionVecs]) {
  const uint4 *src = reinterpret_cast<const uint4 *>(block + kHeadDim * kHeadDim);
#pragma unroll
  for (int i = 0; i < kTransitionVecs; ++i) regs[i] = src[threadIdx.x + i * kCombineThreads];
}

__device__ __forceinline__ void stage_transition(const uint4 (&regs)[kTransitionVecs],
                                                 CombineSmem &sm) {
  uint4 *dst = reinterpret_cast<uint4 *>(&sm.x[0][0]);
#pragma unroll
  for (int i = 0; i < kTransitionVecs; ++i) dst[threadIdx.x + i * kCombineThreads] = regs[i];
}

// acc[c] = sum over k' ascending of s[k'] X[k'][4 lane + c], one fma per term, from zero.
__device__ __forceinline__ void row_times_transition(const float (&s)[kHeadDim],
                                                     const CombineSmem &sm, float (&acc)[4]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int c = 0; c < 4; ++c) acc[c] = 0.f;
#pragma unroll 8
  for (int kk = 0; kk < kHeadDim; ++kk) {
    float x[4];
    load_bf16x4(&sm.x[kk][4 * lane], x);
    const float sv = s[kk];
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[c] = __fmaf_rn(sv, x[c], acc[c]);
  }
}

__global__ void __launch_bounds__(kCombineThreads) combine_kernel(const FwdParams p) {
  __shared__ CombineSmem sm;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t pair = blockIdx.x / kCombineCtasPerHead;
  const int64_t seq = pair / p.heads, head = pair % p.heads;
  const int v = static_cast<int>(blockIdx.x % kCombineCtasPerHead) * kCombineRows + warp;
  const int k0 = 4 * lane;
  const int64_t s0 = first_segment(p, seq);
  const int64_t count = segment_count(p, seq);
  if (count < 1) return;  // an empty sequence has no segment (CTA-uniform)
  const int64_t row = int64_t{v} * kHeadDim + k0;

  float s[4];  // start_0 = bf(initial state), design §1.4
  const StateSource init = initial_source(p, seq, head);
  for (int c = 0; c < 4; ++c) {
    s[c] = 0.f;
    if (init.block != nullptr && init.dtype == Dtype::kBf16)
      s[c] = bf16_to_f32(static_cast<const uint16_t *>(init.block)[row + c]);
    else if (init.block != nullptr)
      s[c] = bf16_to_f32(f32_to_bf16(static_cast<const float *>(init.block)[row + c]));
  }
  store_bf16x4(segment_start_block(p, s0, head) + row, s);
  if (count < 2) return;

  load_bf16x4(segment_state_block(p, s0, head) + row, s);  // start_1 = S^_0, exactly
  store_bf16x4(segment_start_block(p, s0 + 1, head) + row, s);
  uint4 next[kTransitionVecs];
  if (count > 2) load_transition(segment_state_block(p, s0 + 1, head), next);
  for (int64_t j = 1; j + 1 < count; ++j) {
    const uint16_t *block = segment_state_block(p, s0 + j, head);
    float shat[4];
    load_bf16x4(block + row, shat);
    __syncthreads();  // the previous step is done with sm
    stage_transition(next, sm);
    for (int c = 0; c < 4; ++c) sm.s[warp][k0 + c] = s[c];
    __syncthreads();
    if (j + 2 < count) load_transition(segment_state_block(p, s0 + j + 1, head), next);
    float acc[4];
    row_times_transition(sm.s[warp], sm, acc);
    for (int c = 0; c < 4; ++c) s[c] = __fadd_rn(acc[c], shat[c]);
    store_bf16x4(segment_start_block(p, s0 + j + 1, head) + row, s);  // rounds to bf16
  }
}

}  // namespace flash_kda::FLASH_KDA_ARCH
