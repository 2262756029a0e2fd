// SPDX-License-Identifier: MIT
// chains.cuh: what one CTA of the recurrence kernel runs (design §5, §6.2, §10): its chain
// task (sequence or segment, head, column slice) for the launch's ChainPass, where the
// chain's state comes from and goes (initial state, pool slot, padding, segment buffers),
// and the state slice a warp keeps in registers with its loads and stores. Shared by
// recurrence.cuh and combine.cuh.
#pragma once
#ifndef FLASH_KDA_ARCH
#error "define FLASH_KDA_ARCH (the arch namespace, e.g. sm90a) before including kda headers"
#endif

#include "kda/config.h"
#include "kda/numerics.cuh"
#include "kda/sequences.cuh"

namespace flash_kda::FLASH_KDA_ARCH {

// Where a chain's state comes from: zeros (block == nullptr), a [rows][128] V-first block
// of bf16 or fp32, or the identity (transition columns: row 128 + k' holds column k' of
// M, which starts as I).
struct StateSource {
  const void *block;
  Dtype dtype;
  bool identity;
};

// Where a chain's final state goes: a [rows][128] V-first block, or nowhere.
struct StateSink {
  void *block;
  Dtype dtype;
};

// Slot of sequence i in the state tensors; -1 for padding (nothing read or written).
__device__ __forceinline__ int64_t state_slot(const FwdParams &p, int64_t i) {
  if (p.state_indices == nullptr) return i;
  const int64_t slot = load_index(p.state_indices, p.index_dtype, i);
  return slot >= 0 && slot < p.pool_size ? slot : -1;
}

// Element offset of (slot, head) in a [slots, heads, 128, 128] state tensor (states,
// pools and checkpoints alike).
__device__ __forceinline__ int64_t state_block_offset(int64_t heads, int64_t slot, int64_t head) {
  return (slot * heads + head) * kHeadDim * kHeadDim;
}

// The element `offset` of a bf16 or fp32 tensor.
__device__ __forceinline__ const void *element(const void *base, Dtype dtype, int64_t offset) {
  return dtype == Dtype::kFp32
             ? static_cast<const void *>(static_cast<const float *>(base) + offset)
             : static_cast<const void *>(static_cast<const uint16_t *>(base) + offset);
}

__device__ __forceinline__ void *element(void *base, Dtype dtype, int64_t offset) {
  return const_cast<void *>(element(static_cast<const void *>(base), dtype, offset));
}

// The initial state of (sequence i, head): zero without one, for padding and where
// has_initial_state is false (flash_kda.h).
__device__ __forceinline__ StateSource initial_source(const FwdParams &p, int64_t i, int64_t head) {
  const int64_t slot = state_slot(p, i);
  if (p.initial_state == nullptr || slot < 0 ||
      (p.has_initial_state != nullptr && p.has_initial_state[i] == 0))
    return {nullptr, Dtype::kBf16, false};
  return {element(p.initial_state, p.initial_dtype, state_block_offset(p.heads, slot, head)),
          p.initial_dtype, false};
}

__device__ __forceinline__ StateSink final_sink(const FwdParams &p, int64_t i, int64_t head) {
  const int64_t slot = state_slot(p, i);
  if (p.final_state == nullptr || slot < 0) return {nullptr, Dtype::kNone};
  return {element(p.final_state, p.final_dtype, state_block_offset(p.heads, slot, head)),
          p.final_dtype};
}

// The [256][128] bf16 block of segment s: rows 0..127 S^ (V-first), rows 128..255 M^T.
__device__ __forceinline__ uint16_t *segment_state_block(const FwdParams &p, int64_t s,
                                                         int64_t head) {
  return p.segment_states + (s * p.heads + head) * 2 * kHeadDim * kHeadDim;
}

__device__ __forceinline__ uint16_t *segment_start_block(const FwdParams &p, int64_t s,
                                                         int64_t head) {
  return p.segment_starts + (s * p.heads + head) * kHeadDim * kHeadDim;
}

// What one CTA computes (chain_task).
struct ChainTask {
  bool valid;
  int64_t seq, head;
  int col0;  // first column of the slice: [0, 128) values, [128, 256) transition (kSegment)
  SeqSpan span;
  StateSource source;
  StateSink sink;
  int64_t checkpoint0;  // first checkpoint slot of the sequence, -1 for none
};

// The pass of an instantiation whose code fixes it (every PassCode but kGeneral, which runs
// the whole pass with checkpoints and recurrence_kernel's rerun).
__host__ __device__ constexpr ChainPass fixed_pass(PassCode code) {
  return code == PassCode::kStates  ? ChainPass::kSegment
         : code == PassCode::kRerun ? ChainPass::kRerun
                                    : ChainPass::kWhole;
}

// The pass an instantiation (config.h: PassCode) runs: fixed at compile time except in the
// general kernel.
template <PassCode kCode>
__device__ __forceinline__ ChainPass pass_of(const FwdParams &p) {
  if constexpr (kCode != PassCode::kGeneral) return fixed_pass(kCode);
  return p.pass == ChainPass::kRerun ? ChainPass::kRerun : ChainPass::kWhole;
}

// The task of this CTA. Grid: units x heads x slices, units = sequences (kWhole) or
// segments (kSegment, kRerun); slices = columns / block_v.
template <int kBlockV, PassCode kCode>
__device__ __forceinline__ ChainTask chain_task(const FwdParams &p) {
  const ChainPass pass = pass_of<kCode>(p);
  const int columns = pass == ChainPass::kSegment ? 2 * kHeadDim : kHeadDim;
  const int slices = columns / kBlockV;
  const int64_t unit = blockIdx.x / slices;
  ChainTask t;
  t.col0 = static_cast<int>(blockIdx.x % slices) * kBlockV;
  t.head = unit % p.heads;
  t.checkpoint0 = -1;
  t.sink = {nullptr, Dtype::kNone};
  if (pass == ChainPass::kWhole) {
    t.seq = p.seq_order != nullptr ? p.seq_order[unit / p.heads] : unit / p.heads;
    t.valid = true;
    t.span = seq_span(p, t.seq);
    t.source = initial_source(p, t.seq, t.head);
    t.sink = final_sink(p, t.seq, t.head);
  } else {
    const int64_t s = unit / p.heads;
    SegmentRef seg;
    const bool transition = t.col0 >= kHeadDim;
    // In the segment pass, the last segment's end state is never needed; segment 0 starts
    // from the true initial state, so its transition is not needed either.
    t.valid = locate_segment(p, s, seg) &&
              (pass == ChainPass::kRerun ||
               (seg.index + 1 < seg.count && !(transition && seg.index == 0)));
    if (!t.valid) return t;
    t.seq = seg.seq;
    t.span = seg.span;
    if (pass == ChainPass::kSegment) {  // design §6.2 phase A
      t.source = transition       ? StateSource{nullptr, Dtype::kBf16, true}
                 : seg.index == 0 ? initial_source(p, t.seq, t.head)
                                  : StateSource{nullptr, Dtype::kBf16, false};
      t.sink = {segment_state_block(p, s, t.head), Dtype::kBf16};
    } else {  // phase C: segment 1 starts from S^_0, the others from the combine's starts
      t.source = {seg.index == 1 ? segment_state_block(p, s - 1, t.head)
                                 : segment_start_block(p, s, t.head),
                  Dtype::kBf16, false};
      if (seg.index + 1 == seg.count) t.sink = final_sink(p, t.seq, t.head);
    }
  }
  if (kCode == PassCode::kGeneral && t.valid && p.checkpoints != nullptr)
    t.checkpoint0 = first_checkpoint(p, t.seq);
  return t;
}

// The prologue of every recurrence pass (recurrence_kernel and the warpgroup pass): lets the
// next kernel launch (design §4.1: K1 on the SMs the pass leaves free, or the next kernel of
// the call) and returns the CTA's task once what it reads is written: without ready flags
// the pass waits for the kernel before (K1, or the combine for the rerun); with them K1 still
// runs and the producer reads each record by its flag (§4.7). A segment-pass CTA without a
// task waits too, so that the pass never ends before K1: where every sequence is one segment
// no CTA of it has a task, and the rerun's records are ordered after K1 only through this
// pass and the combine. A rerun CTA without a task has nothing to order.
template <int kBlockV, PassCode kCode>
__device__ __forceinline__ ChainTask begin_chain(const FwdParams &p) {
  allow_dependents();
  const ChainTask task = chain_task<kBlockV, kCode>(p);
  if (task.valid ? p.ready == nullptr : pass_of<kCode>(p) == ChainPass::kSegment)
    wait_prerequisites();
  return task;
}

// The state slice of one warp: st[mb][nb][r] = bf16 pair S^T[16 mb + g + 8 r][col, col + 1]
// (accumulator layout of the state-update MMA), col = warp's column 8 nb + 2 cq; and the
// same values as B fragments of Pk / Pq: sb[kb][nb][r] = movmatrix transpose of st.
template <int kNB>
struct StateSlice {
  uint32_t st[kKBlocks][kNB][2];
  uint32_t sb[kKBlocks][kNB][2];
};

// Calls fn(mb, nb, r, v, k) for each bf16 pair of the lane's state slice: the pair
// S^T[k][v, v + 1] with k = 16 mb + g + 8 r, v = col + 8 nb + 2 cq (a row of a V-first
// block, whose element (v, k) is at v * 128 + k).
template <int kNB, typename Fn>
__device__ __forceinline__ void for_each_state_pair(int col, Fn fn) {
  const int lane = threadIdx.x % 32, g = lane / 4, cq = lane % 4;
#pragma unroll
  for (int mb = 0; mb < kKBlocks; ++mb) {
#pragma unroll
    for (int nb = 0; nb < kNB; ++nb) {
#pragma unroll
      for (int r = 0; r < 2; ++r) fn(mb, nb, r, col + 8 * nb + 2 * cq, 16 * mb + g + 8 * r);
    }
  }
}

// Element (row v, key k) of the transition columns' start, the identity: bf16 1.0 where
// v = 128 + k, else 0 (StateSource::identity).
__device__ __forceinline__ uint32_t identity_entry(int v, int k) {
  return v - kHeadDim == k ? 0x3f80u : 0u;
}

// Initial state: zeros, bf16 as is, fp32 rounded bf(x) (design §1.4), or the identity.
template <int kNB>
__device__ __forceinline__ void load_state(const StateSource &src, int col, StateSlice<kNB> &s) {
  for_each_state_pair<kNB>(col, [&](int mb, int nb, int r, int v, int k) {
    uint32_t pair = 0;
    const int64_t i0 = int64_t{v} * kHeadDim + k, i1 = i0 + kHeadDim;
    if (src.identity) {
      pair = identity_entry(v, k) | identity_entry(v + 1, k) << 16;
    } else if (src.block != nullptr && src.dtype == Dtype::kBf16) {
      const uint16_t *b = static_cast<const uint16_t *>(src.block);
      pair = b[i0] | (static_cast<uint32_t>(b[i1]) << 16);
    } else if (src.block != nullptr) {
      const float *b = static_cast<const float *>(src.block);
      pair = pack_bf16x2(b[i0], b[i1]);
    }
    s.st[mb][nb][r] = pair;
    s.sb[mb][nb][r] = movmatrix_trans(pair);
  });
}

// A state: bf16 as is, or fp32 as the exact widening f(S) (design §1.4). Also writes
// checkpoints.
template <int kNB>
__device__ __forceinline__ void store_state(const StateSink &dst, int col,
                                            const StateSlice<kNB> &s) {
  if (dst.block == nullptr) return;
  for_each_state_pair<kNB>(col, [&](int mb, int nb, int r, int v, int k) {
    const uint32_t pair = s.st[mb][nb][r];
    const int64_t i0 = int64_t{v} * kHeadDim + k, i1 = i0 + kHeadDim;
    if (dst.dtype == Dtype::kBf16) {
      uint16_t *b = static_cast<uint16_t *>(dst.block);
      b[i0] = static_cast<uint16_t>(lo16(pair));
      b[i1] = static_cast<uint16_t>(hi16(pair));
    } else {
      float *b = static_cast<float *>(dst.block);
      b[i0] = bf16_to_f32(lo16(pair));
      b[i1] = bf16_to_f32(hi16(pair));
    }
  });
}

}  // namespace flash_kda::FLASH_KDA_ARCH
