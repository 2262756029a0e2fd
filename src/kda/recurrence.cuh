// SPDX-License-Identifier: MIT
// recurrence.cuh: K2, the serial chunk chain (spec §3.3, §4.5), split over value columns
// (spec §5).
//
// One CTA = one (sequence, head, slice of block_v value columns). Value columns evolve
// independently given the chunk's record (spec §2.4), so slices need no communication.
// Threads: warps_per_cta compute warps, each owning kNB blocks of 8 columns and keeping
// its slice of the state S^T (128 x 8 kNB, bf16) in registers for the whole sequence,
// plus one producer warp that streams records and value rows into a kStages-deep ring
// with bulk copies (TMA) on mbarriers. Output rows go from registers to global memory.
// Shared memory: 128 + kStages * (kRecordBytes + 16 * (2 block_v + 16)) bytes
// (73,344 B at block_v = 128, under sm_120's 99 KB).
//
// Bit-exactness (spec §5): per column the same m16n8k16 instructions in the same k order,
// the same roundings and the same FFMA as a one-CTA-per-head kernel; only the warp that
// computes a column changes.
#pragma once
#ifndef FLASH_KDA_ARCH
#error "define FLASH_KDA_ARCH (the arch namespace, e.g. sm90a) before including kda headers"
#endif

#include "kda/numerics.cuh"
#include "kda/sequences.cuh"

namespace flash_kda::FLASH_KDA_ARCH {

constexpr int kStages = 4;  // ring depth; spec §5: deeper rings gave no gain
constexpr int kBarrierBytes = 128;

__host__ __device__ constexpr int value_row_stride(int block_v) {
  return 2 * block_v + 16;  // +16 B: rows g = 0..7 of a warp's loads hit distinct banks
}

__host__ __device__ constexpr int stage_bytes(int block_v) {
  return kRecordBytes + kChunk * value_row_stride(block_v);
}

__host__ __device__ constexpr int recurrence_smem_bytes(int block_v) {
  return kBarrierBytes + kStages * stage_bytes(block_v);
}

struct RecurrenceCta {
  int64_t seq, head;
  int col0;  // first value column of the CTA
  SeqSpan span;
};

__device__ __forceinline__ RecurrenceCta recurrence_cta(const FwdParams &p) {
  const int slices = kHeadDim / p.block_v;
  RecurrenceCta cta;
  const int64_t pair = blockIdx.x / slices;
  cta.col0 = static_cast<int>(blockIdx.x % slices) * p.block_v;
  cta.head = pair % p.heads;
  cta.seq = pair / p.heads;
  cta.span = seq_span(p, cta.seq);
  return cta;
}

// Producer (one lane): per chunk, wait for a free stage, then one bulk copy of the
// record and one per valid value row (rows >= n are never read from memory).
__device__ __forceinline__ void produce_chunks(const FwdParams &p, const RecurrenceCta &cta,
                                               uint8_t *stages, uint64_t *full, uint64_t *empty) {
  const uint32_t row_bytes = 2 * p.block_v;
  const uint8_t *records = p.records + (cta.head * p.tiles_per_head + cta.span.first_tile) * kRecordBytes;
  for (int64_t c = 0; c < cta.span.num_chunks; ++c) {
    const int s = static_cast<int>(c % kStages);
    const uint32_t round = static_cast<uint32_t>(c / kStages);
    barrier_wait(&empty[s], (round & 1) ^ 1);
    const int n = static_cast<int>(min(int64_t{kChunk}, cta.span.len - c * kChunk));
    uint8_t *stage = stages + s * stage_bytes(p.block_v);
    TxBarrier::arrive_and_expect_tx(&full[s], kRecordBytes + n * row_bytes);
    bulk_copy_g2s(stage, records + c * kRecordBytes, kRecordBytes, &full[s]);
    const int64_t tok0 = cta.span.bos + c * kChunk;
    for (int r = 0; r < n; ++r) {
      const uint16_t *row = p.v + ((tok0 + r) * p.heads + cta.head) * kHeadDim + cta.col0;
      bulk_copy_g2s(stage + kRecordBytes + r * value_row_stride(p.block_v), row, row_bytes, &full[s]);
    }
  }
}

// The state slice of one warp: st[mb][nb][r] = bf16 pair S^T[16 mb + g + 8 r][col, col + 1]
// (accumulator layout of the state-update MMA), col = warp's column 8 nb + 2 cq; and the
// same values as B fragments of Pk / Pq: sb[kb][nb][r] = movmatrix transpose of st.
template <int kNB>
struct StateSlice {
  uint32_t st[kHeadDim / 16][kNB][2];
  uint32_t sb[kHeadDim / 16][kNB][2];
};

__device__ __forceinline__ int64_t state_index(const FwdParams &p, const RecurrenceCta &cta,
                                               int v, int k) {
  return ((cta.seq * p.heads + cta.head) * kHeadDim + v) * kHeadDim + k;  // V-first
}

// Initial state: zeros, bf16 as is, or fp32 rounded bf(x) (spec §1.4).
template <int kNB>
__device__ __forceinline__ void load_state(const FwdParams &p, const RecurrenceCta &cta, int col,
                                           StateSlice<kNB> &s) {
  const int lane = threadIdx.x % 32, g = lane / 4, cq = lane % 4;
#pragma unroll
  for (int mb = 0; mb < kHeadDim / 16; ++mb) {
#pragma unroll
    for (int nb = 0; nb < kNB; ++nb) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int k = 16 * mb + g + 8 * r, v = col + 8 * nb + 2 * cq;
        const int64_t i0 = state_index(p, cta, v, k), i1 = state_index(p, cta, v + 1, k);
        uint32_t pair = 0;
        if (p.initial_dtype == 1) {
          const uint16_t *src = static_cast<const uint16_t *>(p.initial_state);
          pair = src[i0] | (static_cast<uint32_t>(src[i1]) << 16);
        } else if (p.initial_dtype == 2) {
          const float *src = static_cast<const float *>(p.initial_state);
          pair = pack_bf16x2(src[i0], src[i1]);
        }
        s.st[mb][nb][r] = pair;
        s.sb[mb][nb][r] = movmatrix_trans(pair);
      }
    }
  }
}

// Final state: bf16 as is, or fp32 as the exact widening f(S) (spec §1.4).
template <int kNB>
__device__ __forceinline__ void store_state(const FwdParams &p, const RecurrenceCta &cta, int col,
                                            const StateSlice<kNB> &s) {
  const int lane = threadIdx.x % 32, g = lane / 4, cq = lane % 4;
#pragma unroll
  for (int mb = 0; mb < kHeadDim / 16; ++mb) {
#pragma unroll
    for (int nb = 0; nb < kNB; ++nb) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int k = 16 * mb + g + 8 * r, v = col + 8 * nb + 2 * cq;
        const int64_t i0 = state_index(p, cta, v, k), i1 = state_index(p, cta, v + 1, k);
        const uint32_t pair = s.st[mb][nb][r];
        if (p.final_dtype == 1) {
          uint16_t *dst = static_cast<uint16_t *>(p.final_state);
          dst[i0] = static_cast<uint16_t>(lo16(pair));
          dst[i1] = static_cast<uint16_t>(hi16(pair));
        } else if (p.final_dtype == 2) {
          float *dst = static_cast<float *>(p.final_state);
          dst[i0] = bf16_to_f32(lo16(pair));
          dst[i1] = bf16_to_f32(hi16(pair));
        }
      }
    }
  }
}

__device__ __forceinline__ uint4 lds128(const uint8_t *stage, int offset) {
  return *reinterpret_cast<const uint4 *>(stage + offset);
}

__device__ __forceinline__ void to_regs(const uint4 v, uint32_t (&a)[4]) {
  a[0] = v.x; a[1] = v.y; a[2] = v.z; a[3] = v.w;
}

// One link of the chain for one warp (spec §3.3 steps 1-8). `stage` holds the chunk's
// record and value rows; n = valid rows; out_row0 points at (chunk token 0, head, col).
template <int kNB>
__device__ __forceinline__ void recurrence_step(const FwdParams &p, const uint8_t *stage, int n,
                                                int vcol, uint16_t *out_row0, StateSlice<kNB> &s) {
  const int lane = threadIdx.x % 32, g = lane / 4, cq = lane % 4;

  // Step 2: Pk = Kd S^T, Pq = Qd S^T; fp32 accumulation over k-blocks 0..7 in order.
  float pk[kNB][4] = {}, pq[kNB][4] = {};
#pragma unroll
  for (int kb = 0; kb < kHeadDim / 16; ++kb) {
    uint32_t ak[4], aq[4];
    to_regs(lds128(stage, kOffKd + kb * 512 + lane * 16), ak);
    to_regs(lds128(stage, kOffQd + kb * 512 + lane * 16), aq);
#pragma unroll
    for (int nb = 0; nb < kNB; ++nb) {
      mma_bf16_f32(pk[nb], ak, s.sb[kb][nb][0], s.sb[kb][nb][1]);
      mma_bf16_f32(pq[nb], aq, s.sb[kb][nb][0], s.sb[kb][nb][1]);
    }
  }

  // Steps 1, 3: u = (v (-) bf(Pk)) (*) beta_t, beta_t = bf(sig(beta_raw)) from the record.
  const uint16_t *beta = reinterpret_cast<const uint16_t *>(stage + kOffBeta);
  const uint32_t beta_row[2] = {beta[g], beta[g + 8]};
  const uint8_t *vrows = stage + kRecordBytes;
  uint32_t u[kNB][2];
#pragma unroll
  for (int nb = 0; nb < kNB; ++nb) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = g + 8 * r;
      const uint32_t vv = row < n ? *reinterpret_cast<const uint32_t *>(
                                        vrows + row * value_row_stride(p.block_v) + 2 * (vcol + 8 * nb + 2 * cq))
                                  : 0u;
      float uh[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float v_f = bf16_to_f32(h ? hi16(vv) : lo16(vv));
        const float pk_bf = bf16_to_f32(f32_to_bf16(pk[nb][2 * r + h]));
        uh[h] = mul_rn(bf16_to_f32(f32_to_bf16(sub_rn(v_f, pk_bf))), bf16_to_f32(beta_row[r]));
      }
      u[nb][r] = pack_bf16x2(uh[0], uh[1]);
    }
  }

  // Step 4: U = bf(INV u), one k16 step; then U's B fragments (kept for steps 5 and 6).
  uint32_t inv[4], mqk[4];
  to_regs(lds128(stage, kOffInv + lane * 16), inv);
  to_regs(lds128(stage, kOffMqk + lane * 16), mqk);
  uint32_t ub[kNB][2];
#pragma unroll
  for (int nb = 0; nb < kNB; ++nb) {
    float acc[4] = {};
    mma_bf16_f32(acc, inv, movmatrix_trans(u[nb][0]), movmatrix_trans(u[nb][1]));
    ub[nb][0] = movmatrix_trans(pack_bf16x2(acc[0], acc[1]));
    ub[nb][1] = movmatrix_trans(pack_bf16x2(acc[2], acc[3]));
  }

  // Steps 5, 8: O = bf(Pq) (+) bf(Mqk U); rows t < n stored.
#pragma unroll
  for (int nb = 0; nb < kNB; ++nb) {
    float acc[4] = {};
    mma_bf16_f32(acc, mqk, ub[nb][0], ub[nb][1]);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = g + 8 * r;
      if (row >= n) continue;
      float o[2];
#pragma unroll
      for (int h = 0; h < 2; ++h)
        o[h] = add_rn(bf16_to_f32(f32_to_bf16(pq[nb][2 * r + h])),
                      bf16_to_f32(f32_to_bf16(acc[2 * r + h])));
      *reinterpret_cast<uint32_t *>(out_row0 + row * p.heads * kHeadDim + 8 * nb + 2 * cq) =
          pack_bf16x2(o[0], o[1]);
    }
  }

  // Steps 6, 7: Delta = Kr^T U (one k16 step, fp32), S' = bf(fma(f(S), e[k], Delta)).
  float e[16];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const uint4 v4 = lds128(stage, kOffDecay + g * 64 + q * 16);
    e[4 * q + 0] = __uint_as_float(v4.x);
    e[4 * q + 1] = __uint_as_float(v4.y);
    e[4 * q + 2] = __uint_as_float(v4.z);
    e[4 * q + 3] = __uint_as_float(v4.w);
  }
#pragma unroll
  for (int mb = 0; mb < kHeadDim / 16; ++mb) {
    uint32_t akr[4];
    to_regs(lds128(stage, kOffKrT + mb * 512 + lane * 16), akr);
#pragma unroll
    for (int nb = 0; nb < kNB; ++nb) {
      float delta[4] = {};
      mma_bf16_f32(delta, akr, ub[nb][0], ub[nb][1]);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const uint32_t old = s.st[mb][nb][r];
        const float ek = e[2 * mb + r];  // decay_index: e[16 mb + g + 8 r]
        const uint32_t next = pack_bf16x2(fma_ftz(bf16_to_f32(lo16(old)), ek, delta[2 * r]),
                                          fma_ftz(bf16_to_f32(hi16(old)), ek, delta[2 * r + 1]));
        s.st[mb][nb][r] = next;
        s.sb[mb][nb][r] = movmatrix_trans(next);
      }
    }
  }
}

template <int kNB>
__global__ void __launch_bounds__(32 * (kNB == 1 ? 9 : 5), 1)
    recurrence_kernel(const FwdParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  uint64_t *full = reinterpret_cast<uint64_t *>(smem);
  uint64_t *empty = full + kStages;
  uint8_t *stages = smem + kBarrierBytes;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const RecurrenceCta cta = recurrence_cta(p);

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      TxBarrier::init(&full[s], 1);
      TxBarrier::init(&empty[s], p.warps_per_cta);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  if (warp == p.warps_per_cta) {  // producer warp; no CTA-wide barrier follows
    if (lane == 0) produce_chunks(p, cta, stages, full, empty);
    return;
  }

  const int col = cta.col0 + warp * 8 * kNB;  // first value column of this warp
  StateSlice<kNB> state;
  load_state(p, cta, col, state);
  uint16_t *out = p.out + cta.head * kHeadDim + col;
  for (int64_t c = 0; c < cta.span.num_chunks; ++c) {
    const int s = static_cast<int>(c % kStages);
    barrier_wait(&full[s], static_cast<uint32_t>(c / kStages) & 1);
    const int n = static_cast<int>(min(int64_t{kChunk}, cta.span.len - c * kChunk));
    const int64_t tok0 = cta.span.bos + c * kChunk;
    recurrence_step<kNB>(p, stages + s * stage_bytes(p.block_v), n, warp * 8 * kNB,
                         out + tok0 * p.heads * kHeadDim, state);
    __syncwarp();
    if (lane == 0) barrier_arrive(&empty[s]);
  }
  store_state(p, cta, col, state);
}

}  // namespace flash_kda::FLASH_KDA_ARCH
