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
//   start_1 = S^_0                (segment 0 ran from the true initial state; the rerun
//                                  reads it from the segment block, nothing is copied)
//   start_{j+1} = bf(s_{j+1}),  s_{j+1} = s_j X_j + S^_j
//
// The product runs on the tensor cores without losing fp32: s_j = hi + mid + lo exactly,
// three bf16 terms (hi = bf(s), mid = bf(s - hi), lo = bf(s - hi - mid); both differences
// are exact in fp32 and 3 x 8 mantissa bits cover fp32's 24), and X_j is bf16. Each term's
// MMA32 chain over the eight k-blocks (ascending) accumulates in fp32 from zero; then
// s_{j+1} = ((P_lo + P_mid) + P_hi) + S^_j, each add rounded to nearest. The order is
// fixed, so the result is deterministic; hi is bf(s_{j+1}), the stored start.
//
// One CTA = kRows (8 or 16) value rows of one (sequence, head): four compute warps and a
// producer warp. The product runs transposed, s_{j+1}^T = X_j^T s_j^T + S^_j^T, so that the
// MMA's 16-row side spans output columns and its 8-column side value rows: a (sequence,
// head) takes 128 / kRows CTAs, 16 of 8 rows where they fit one per SM (half a CTA's work,
// twice the CTAs), else 8 of 16 (config.h combine_rows). Compute warp w owns the output
// columns [32 w, 32 w + 32), two 16-column tiles. A = X_j^T, read from the row-major X_j
// stage by ldmatrix.trans; B = s_j^T, read by ldmatrix from the terms, which every compute
// warp publishes row-major ([term][v][k], double buffered) by stmatrix.trans after
// splitting its columns (16-bit stores took ~20% longer a step). X_j and the CTA's
// rows of S^_j stream through a ring of stages by four tensor copies a stage, in 128-byte
// swizzled halves of 64 columns, which the producer warp's lane 0 issues onto the stage's
// mbarrier: with cp.async, 17 copies a thread a step, the copies' issue and the registers
// they held stalled the warps for ~30% of a step (ncu on the H200; the tensor copies took
// the step from ~0.89 to ~0.72 us). A step's compute warps load
// all they read of its stage before the step's barrier, so that the producer refills the
// stage as soon as every warp has passed that barrier, `stages` steps ahead, and no compute
// warp issues copies between two barriers.
#pragma once
#ifndef FLASH_KDA_ARCH
#error "define FLASH_KDA_ARCH (the arch namespace, e.g. sm90a) before including kda headers"
#endif

#include "kda/chains.cuh"
#include "kda/config.h"

namespace flash_kda::FLASH_KDA_ARCH {

constexpr int kCombineWarps = 4;  // 32 output columns each
constexpr int kCombineComputeThreads = 32 * kCombineWarps;
constexpr int kCombineThreads = kCombineComputeThreads + 32;  // and the producer warp
constexpr uint32_t kStepBarrier = 1;                          // every warp, once a step
constexpr uint32_t kComputeBarrier = 2;                       // the compute warps
constexpr int kCombineTerms = 3;                              // hi, mid, lo
constexpr int kCombineMaxStages = 3;  // ring depth where shared memory allows
static_assert(kCombineMaxStages >= 2, "a stage in flight while one is read");
constexpr int kStageRow = kHeadDim + 8;  // a term's padded row (272 B): ldmatrix conflict-free
constexpr int kRowPieces = kHeadDim * 2 / 16;  // 16-byte pieces of one unpadded row
constexpr int kHalfCols = 64;                  // columns of a tensor copy's box: 128 bytes
constexpr int kSwizzleAlign = 1024;            // a 128-byte-swizzled tile's alignment

// Shared memory of the kRows-row kernel, from a 1024-byte aligned base: the stages'
// mbarriers, the s_j terms, row-major ([buffer][term][value row][k]), then the stages,
// each the two 64-column halves of X_j's 128 rows, then of the CTA's kRows rows of S^_j,
// as the tensor copies land them (swizzled_offset).
template <int kRows>
struct CombineSmem {
  static_assert(kRows == 8 || kRows == 16, "one or two 8-column MMA blocks of value rows");
  static constexpr int kBarrierBytes = 128;
  static constexpr int kTermBytes = static_cast<int>(
      round_up(kBarrierBytes + 2 * kCombineTerms * kRows * kStageRow * 2, kSwizzleAlign) -
      kBarrierBytes);
  static constexpr int kXHalfBytes = kHeadDim * kHalfCols * 2;
  static constexpr int kSHalfBytes = kRows * kHalfCols * 2;
  static constexpr int kStageBytes = 2 * kXHalfBytes + 2 * kSHalfBytes;
  static constexpr int bytes(int stages) {  // with the slack for aligning the base
    return kSwizzleAlign + kBarrierBytes + kTermBytes + stages * kStageBytes;
  }
  using Terms = uint16_t[kCombineTerms][kRows][kStageRow];
  uint64_t *full;  // full[s]: stage s's copies have landed
  Terms *terms;
  uint8_t *stages;
  __device__ uint8_t *stage(int s) const { return stages + s * kStageBytes; }
};
static_assert(8 * kCombineMaxStages <= CombineSmem<8>::kBarrierBytes &&
                  CombineSmem<8>::kStageBytes % kSwizzleAlign == 0 &&
                  CombineSmem<16>::kStageBytes % kSwizzleAlign == 0,
              "every swizzled tile stays 1024-byte aligned");

// Byte offset of columns col .. col + 7 (col % 8 == 0) of row r in a stage tile of 64-column
// halves of `half_bytes` each: the tensor copy's 128-byte swizzle puts 16-byte chunk c of
// a 128-byte row r at chunk c ^ (r % 8), so that ldmatrix's eight rows meet in no bank.
__device__ __forceinline__ int swizzled_offset(int r, int col, int half_bytes) {
  return col / kHalfCols * half_bytes + 128 * r + ((col % kHalfCols / 8) ^ (r % 8)) * 16;
}

constexpr int combine_smem_bytes(int rows, int stages) {
  return rows == 8 ? CombineSmem<8>::bytes(stages) : CombineSmem<16>::bytes(stages);
}

// The thread's 16-byte pieces of a kRows-row block: piece i is row piece_row(i), columns
// piece_col() .. + 7.
__device__ __forceinline__ int piece_row(int i) {
  return static_cast<int>(threadIdx.x) / kRowPieces + kCombineComputeThreads / kRowPieces * i;
}
__device__ __forceinline__ int piece_col() {
  return 8 * (threadIdx.x % kRowPieces);
}
template <int kRows>
constexpr int kPieces = kRows * kRowPieces / kCombineComputeThreads;  // per compute thread

// One thread's tensor copies of a stage: X_j (rows 128..255 of the segment block whose
// first row is `row0` in the [blocks x 256 rows][128] view of the segment states) and S^_j's
// rows v0 .. v0 + kRows - 1, each as two 64-column halves, after arming `full`.
template <int kRows>
__device__ __forceinline__ void issue_stage(const CUtensorMap *xmap, const CUtensorMap *smap,
                                            int32_t row0, int v0, uint8_t *stage, uint64_t *full) {
  using Smem = CombineSmem<kRows>;
  TxBarrier::arrive_and_expect_tx(full, Smem::kStageBytes);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    tensor_copy_2d_g2s(stage + h * Smem::kXHalfBytes, xmap, kHalfCols * h, row0 + kHeadDim, full);
    tensor_copy_2d_g2s(stage + 2 * Smem::kXHalfBytes + h * Smem::kSHalfBytes, smap, kHalfCols * h,
                       row0 + v0, full);
  }
}

// First row of segment s, head `head`'s block in the 2-D view of the segment states.
__device__ __forceinline__ int32_t segment_row(const FwdParams &p, int64_t s, int64_t head) {
  return static_cast<int32_t>((s * p.heads + head) * 2 * kHeadDim);
}

// The CTA's rows of s_j = the hi term of `terms` -> start_j in global memory.
template <int kRows>
__device__ __forceinline__ void store_start(const uint16_t (&hi)[kRows][kStageRow], int v0,
                                            uint16_t *start) {
#pragma unroll
  for (int i = 0; i < kPieces<kRows>; ++i)
    *reinterpret_cast<uint4 *>(start + (v0 + piece_row(i)) * kHeadDim + piece_col()) =
        *reinterpret_cast<const uint4 *>(&hi[piece_row(i)][piece_col()]);
}

// x = hi + mid + lo exactly (bf16 pairs), for a pair of fp32 values.
__device__ __forceinline__ void split3(float x0, float x1, uint32_t (&t)[kCombineTerms]) {
  t[0] = pack_bf16x2(x0, x1);
  const float m0 = sub_rn(x0, bf16_to_f32(lo16(t[0]))), m1 = sub_rn(x1, bf16_to_f32(hi16(t[0])));
  t[1] = pack_bf16x2(m0, m1);
  t[2] = pack_bf16x2(sub_rn(m0, bf16_to_f32(lo16(t[1]))), sub_rn(m1, bf16_to_f32(hi16(t[1]))));
}

// What a step reads of its stage, which does not depend on s_j: the warp's A fragments of
// X_j^T (k-block kb, column tile `tile`; matrix m: k-half m / 2, column half m % 2 of the
// 16 x 16 tile) and S^_j's elements in accumulator order (matrix m: rows 8 vt + (2 c,
// 2 c + 1), column 32 w + 8 m + g). They are loaded before the CTA barrier that publishes
// s_j, so that their shared-memory latency overlaps the wait for the other warps.
template <int kRows>
struct StageFragments {
  uint32_t a[kKBlocks][2][4];
  uint32_t shat[kRows / 8][4];
};

template <int kRows>
__device__ __forceinline__ void load_stage(const uint8_t *stage, StageFragments<kRows> &f) {
  using Smem = CombineSmem<kRows>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int m = lane / 8, row = lane % 8;  // the 8x8 matrix and row this lane addresses
#pragma unroll
  for (int kb = 0; kb < kKBlocks; ++kb)
#pragma unroll
    for (int tile = 0; tile < 2; ++tile)
      ldmatrix_x4_trans(
          stage + swizzled_offset(16 * kb + 8 * (m / 2) + row, 32 * warp + 16 * tile + 8 * (m % 2),
                                  Smem::kXHalfBytes),
          f.a[kb][tile]);
#pragma unroll
  for (int vt = 0; vt < kRows / 8; ++vt)
    ldmatrix_x4_trans(stage + 2 * Smem::kXHalfBytes +
                          swizzled_offset(8 * vt + row, 32 * warp + 8 * m, Smem::kSHalfBytes),
                      f.shat[vt]);
}

// P_term^T = X_j^T (s_j's term)^T for the warp's two column tiles and the CTA's value
// tiles: acc[term][vt][tile] holds output columns 32 w + 16 tile + (g, g + 8) x value rows
// 8 vt + (2 c, 2 c + 1) (g = lane / 4, c = lane % 4), each an MMA32 chain over the
// k-blocks in ascending order from zero. The B fragments are all loaded before the first
// MMA, the A fragments before the step's barrier (load_stage).
template <int kRows>
__device__ __forceinline__ void times_transition(const typename CombineSmem<kRows>::Terms &terms,
                                                 const uint32_t (&a)[kKBlocks][2][4],
                                                 float (&acc)[kCombineTerms][kRows / 8][2][4]) {
  constexpr int kVTiles = kRows / 8;
  const int lane = threadIdx.x % 32;
  const int m = lane / 8, row = lane % 8;
  uint32_t b[kKBlocks / 2][kCombineTerms][kVTiles][4];  // matrix m: value rows x k 32 kp + 8 m ..
#pragma unroll
  for (int kp = 0; kp < kKBlocks / 2; ++kp)
#pragma unroll
    for (int term = 0; term < kCombineTerms; ++term)
#pragma unroll
      for (int vt = 0; vt < kVTiles; ++vt)
        ldmatrix_x4(&terms[term][8 * vt + row][32 * kp + 8 * m], b[kp][term][vt]);
#pragma unroll
  for (int term = 0; term < kCombineTerms; ++term)
#pragma unroll
    for (int vt = 0; vt < kVTiles; ++vt)
#pragma unroll
      for (int tile = 0; tile < 2; ++tile)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[term][vt][tile][i] = 0.f;
#pragma unroll
  for (int kb = 0; kb < kKBlocks; ++kb)
#pragma unroll
    for (int tile = 0; tile < 2; ++tile)
#pragma unroll
      for (int term = 0; term < kCombineTerms; ++term)
#pragma unroll
        for (int vt = 0; vt < kVTiles; ++vt)
          mma_bf16_f32(acc[term][vt][tile], a[kb][tile], b[kb / 2][term][vt][2 * (kb % 2)],
                       b[kb / 2][term][vt][2 * (kb % 2) + 1]);
}

// s_{j+1} = ((P_lo + P_mid) + P_hi) + S^_j, split into its three terms, row-major into
// `next`. The lane's pair of each (tile, h) block, value rows 8 vt + (2 c, 2 c + 1) of
// column 32 w + 16 tile + 8 h + g, is one 8x8 matrix's element pair (row g, columns 2 c,
// 2 c + 1) as stmatrix takes it; transposed, the block's rows are value rows.
template <int kRows>
__device__ __forceinline__ void emit_state(const float (&acc)[kCombineTerms][kRows / 8][2][4],
                                           const uint32_t (&shat)[kRows / 8][4],
                                           typename CombineSmem<kRows>::Terms &next) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int m = lane / 8, row = lane % 8;  // the 8x8 matrix and row this lane addresses
#pragma unroll
  for (int vt = 0; vt < kRows / 8; ++vt) {
    uint32_t t[2][2][kCombineTerms];  // [tile][h]: the three terms' pairs
#pragma unroll
    for (int tile = 0; tile < 2; ++tile)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t s = shat[vt][2 * tile + h];
        float d[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int i = 2 * h + r;
          d[r] =
              add_rn(add_rn(add_rn(acc[2][vt][tile][i], acc[1][vt][tile][i]), acc[0][vt][tile][i]),
                     bf16_to_f32(r ? hi16(s) : lo16(s)));
        }
        split3(d[0], d[1], t[tile][h]);
      }
#pragma unroll
    for (int term = 0; term < kCombineTerms; ++term)  // matrix m = 2 tile + h
      stmatrix_x4_trans(&next[term][8 * vt + row][32 * warp + 16 * (m / 2) + 8 * (m % 2)],
                        t[0][0][term], t[0][1][term], t[1][0][term], t[1][1][term]);
  }
}

template <int kRows>
__global__ void __launch_bounds__(kCombineThreads)
    combine_kernel(const FwdParams p, int stages, const __grid_constant__ CUtensorMap xmap,
                   const __grid_constant__ CUtensorMap smap) {
  using Smem = CombineSmem<kRows>;
  extern __shared__ __align__(16) unsigned char combine_smem[];
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(combine_smem));
  uint8_t *const aligned = combine_smem + (-base & (kSwizzleAlign - 1));
  const Smem sm = {reinterpret_cast<uint64_t *>(aligned),
                   reinterpret_cast<typename Smem::Terms *>(aligned + Smem::kBarrierBytes),
                   aligned + Smem::kBarrierBytes + Smem::kTermBytes};
  constexpr int kCtasPerHead = kHeadDim / kRows;
  const int64_t pair = blockIdx.x / kCtasPerHead;
  const int64_t seq = pair / p.heads, head = pair % p.heads;
  const int v0 = static_cast<int>(blockIdx.x % kCtasPerHead) * kRows;
  const int64_t s0 = first_segment(p, seq);
  const int64_t count = segment_count(p, seq);
  const bool producer = threadIdx.x >= kCombineComputeThreads;  // warp 4 (warp-uniform)
  const bool leader = threadIdx.x == kCombineComputeThreads;    // its lane 0
  allow_dependents();     // the rerun launches early and waits for this kernel's end
  if (count < 1) return;  // an empty sequence has no segment (CTA-uniform)
  // What does not read the segment pass's output is set up before the wait below: the
  // tensor maps' descriptors fetched, the stages' barriers initialized (made visible by the
  // CTA barrier after the wait).
  if (count >= 3 && leader) {
    prefetch_descriptor(&xmap);
    prefetch_descriptor(&smap);
    for (int s = 0; s < stages; ++s) TxBarrier::init(&sm.full[s], 1);
    cutlass::arch::fence_barrier_init();
  }

  // start_0 = bf(initial state), design §1.4, before the wait: it reads the caller's state,
  // which no kernel of the call writes before the rerun, and nothing reads start_0 before it.
  const StateSource init = initial_source(p, seq, head);
  if (!producer) {  // the compute warps' pieces (warp-uniform)
#pragma unroll
    for (int i = 0; i < kPieces<kRows>; ++i) {
      const int64_t at = int64_t{v0 + piece_row(i)} * kHeadDim + piece_col();
      uint32_t w[4] = {0, 0, 0, 0};  // the piece's 8 elements as 4 pairs
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (init.block != nullptr && init.dtype == Dtype::kBf16) {
          w[e] =
              reinterpret_cast<const uint32_t *>(static_cast<const uint16_t *>(init.block) + at)[e];
        } else if (init.block != nullptr) {
          const float *f = static_cast<const float *>(init.block) + at + 2 * e;
          w[e] = pack_bf16x2(f[0], f[1]);
        }
      }
      *reinterpret_cast<uint4 *>(segment_start_block(p, s0, head) + at) =
          make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
  // The segment pass's blocks (design §4.1). Every CTA of a non-empty sequence waits, so that
  // this kernel ends after the segment pass: the rerun, which waits for this kernel, reads
  // S^_0 (start_1) from the segment pass's block.
  wait_prerequisites();
  if (count < 3) return;  // start_1 = S^_0 is where the rerun reads it
  __syncthreads();

  // The producer warp keeps the ring full: X_1 .. X_stages first; then, once every warp has
  // passed step j's barrier, X_j's stage is free (its reads come before that barrier) and
  // takes X_{j+stages}.
  if (producer) {
    int64_t next = 1;  // the next X_j to copy
    for (int s = 0; s < stages && next <= count - 2; ++s, ++next)
      if (leader)
        issue_stage<kRows>(&xmap, &smap, segment_row(p, s0 + next, head), v0, sm.stage(s),
                           &sm.full[s]);
    for (int64_t j = 1; j + 1 < count; ++j) {
      cta_barrier(kStepBarrier, kCombineThreads);
      if (leader && next <= count - 2) {
        // Every warp read X_j's stage before the barrier (each read's value was used or held
        // in registers); the fence orders those reads before the copies that overwrite it.
        fence_stage_reads();
        const int s = static_cast<int>((j - 1) % stages);
        issue_stage<kRows>(&xmap, &smap, segment_row(p, s0 + next, head), v0, sm.stage(s),
                           &sm.full[s]);
      }
      ++next;
    }
    return;
  }

#pragma unroll
  for (int i = 0; i < kPieces<kRows>; ++i) {  // s_1 = S^_0: terms (S^_0, 0, 0)
    const int64_t at = int64_t{v0 + piece_row(i)} * kHeadDim + piece_col();
    const uint4 shat = *reinterpret_cast<const uint4 *>(segment_state_block(p, s0, head) + at);
    const uint4 zero = make_uint4(0, 0, 0, 0);
    *reinterpret_cast<uint4 *>(&sm.terms[1][0][piece_row(i)][piece_col()]) = shat;
    *reinterpret_cast<uint4 *>(&sm.terms[1][1][piece_row(i)][piece_col()]) = zero;
    *reinterpret_cast<uint4 *>(&sm.terms[1][2][piece_row(i)][piece_col()]) = zero;
  }

  // The stage holding X_j and its mbarrier phase.
  int stage = 0;
  uint32_t phase = 0;
  for (int64_t j = 1; j + 1 < count; ++j) {
    barrier_wait(&sm.full[stage], phase, p.wait_limit_ns);
    StageFragments<kRows> frag;
    load_stage<kRows>(sm.stage(stage), frag);
    cta_barrier(kStepBarrier, kCombineThreads);  // s_j's terms visible; X_j's stage read
    float acc[kCombineTerms][kRows / 8][2][4];
    times_transition<kRows>(sm.terms[j % 2], frag.a, acc);
    if (j > 1) store_start<kRows>(sm.terms[j % 2][0], v0, segment_start_block(p, s0 + j, head));
    emit_state<kRows>(acc, frag.shat, sm.terms[(j + 1) % 2]);
    if (++stage == stages) {
      stage = 0;
      phase ^= 1;
    }
  }
  cta_barrier(kComputeBarrier, kCombineComputeThreads);  // the last start, s_{count - 1}
  store_start<kRows>(sm.terms[(count - 1) % 2][0], v0,
                     segment_start_block(p, s0 + count - 1, head));
}

}  // namespace flash_kda::FLASH_KDA_ARCH
