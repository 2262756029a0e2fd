// SPDX-License-Identifier: MIT
// recurrence.cuh: K2, the serial chunk chain (design §3.3, §4.5), split over value columns
// (design §5) and, in AUTO mode, over sequence segments (design §6).
//
// One CTA = one chain task (chains.cuh: chain_task): a sequence or segment, a head and a
// slice of kBlockV value columns. Value columns evolve independently given the chunk's
// record (design §2.4), so slices need no communication; the segment pass runs 256
// "columns" per (segment, head): 128 value columns from zero and the 128 columns of the
// transition M^T from the identity (design §6.1).
// Threads: kWarps compute warps, each owning kNB blocks of 8 columns and keeping
// its slice of the state S^T (128 x 8 kNB, bf16) in registers for the whole sequence,
// plus one producer warp that streams records and value rows into a ring of up to
// kMaxStages stages with bulk copies (TMA) on mbarriers. Output rows go from registers to
// global memory. Shared memory: 128 + stages * (kRecordBytes + 32 block_v) bytes, stages
// chosen at launch to fit the device (sm_120: 99 KB per block). kBlocks = 2 runs 32-token
// chunks (AUTO mode, design §4.8): the same link over two 16-row blocks, 32-token records
// and value rows per stage.
//
// Bit-exactness (design §5): per column the same m16n8k16 instructions in the same k order,
// the same roundings and the same FFMA as a one-CTA-per-head kernel; only the warp that
// computes a column changes.
#pragma once
#ifndef FLASH_KDA_ARCH
#error "define FLASH_KDA_ARCH (the arch namespace, e.g. sm90a) before including kda headers"
#endif

#include "kda/chains.cuh"
#include "kda/config.h"

namespace flash_kda::FLASH_KDA_ARCH {

// Ring depth: as deep as the block's shared memory allows, up to kMaxStages 16-token
// chunks (kMaxStages / 2 of 32 tokens, the same tokens in flight; chosen at launch,
// FwdParams::stages). At H200, T=8192, H=6 a 4-deep ring left the warps
// waiting for their next stage (ncu: the stage wait was the top stall).
constexpr int kMaxStages = 6;

// The first kBarrierBytes of a pass's shared memory: full[kMaxStages] and empty[kMaxStages],
// then one release mark per compute warp (release_chunk).
constexpr int kMaxComputeWarps = 8;
constexpr int kBarrierBytes = 128;
static_assert(2 * kMaxStages * 8 + 4 * kMaxComputeWarps <= kBarrierBytes, "barrier area too small");

// A chunk's value rows in a stage: 8-column groups, [block_v / 8][tokens][8] (the tensor
// copy's box, launch.cuh make_value_map), so that the 8 token rows a warp's lanes read at
// once are 128 contiguous bytes. In token rows of block_v columns (64-256 bytes apart) those
// reads met in the same banks: 4-8 way conflicts on every value load.
constexpr int kValueGroup = 8;  // columns of a group (16 bytes)

__host__ __device__ constexpr int value_bytes(int block_v, int tokens) {
  return 2 * block_v * tokens;
}

// Byte offset of the pair (token row, columns col, col + 1) in a stage's value rows of
// `tokens` rows (col even).
__host__ __device__ constexpr int value_offset(int tokens, int row, int col) {
  return (col / kValueGroup) * tokens * 2 * kValueGroup + row * 2 * kValueGroup +
         2 * (col % kValueGroup);
}

// A stage: the record of a chunk of `blocks` 16-token blocks and its value rows.
__host__ __device__ constexpr int stage_bytes(int block_v, int blocks) {
  return record_bytes(kChunk * blocks) + value_bytes(block_v, kChunk * blocks);
}

__host__ __device__ constexpr int recurrence_smem_bytes(int block_v, int stages, int blocks) {
  return kBarrierBytes + stages * stage_bytes(block_v, blocks);
}

// A pass's shared memory as its kernels see it: the ring's mbarriers (full, then empty),
// and its stages after kBarrierBytes.
struct RingSmem {
  uint64_t *full, *empty;
  uint8_t *stages;
};

__device__ __forceinline__ RingSmem ring_smem(uint8_t *smem) {
  uint64_t *const full = reinterpret_cast<uint64_t *>(smem);
  return {full, full + kMaxStages, smem + kBarrierBytes};
}

// A position in the stage ring: the stage and the parity of its current fill. Advanced
// step by step: the ring depth is a runtime value and a division per link showed up in
// the chain (ncu, H200).
struct RingPos {
  int stage;
  uint32_t phase;
  __device__ __forceinline__ void advance(int num_stages) {
    if (++stage == num_stages) {
      stage = 0;
      phase ^= 1u;
    }
  }
};

// Producer (one lane): per chunk, wait for a free stage and, while K1 may still run, for
// the record's ready flag (read with the next ones: numerics.cuh wait_ready); then the
// record (a bulk copy; without kQueries, the segment pass, two that leave out Qd and its
// 4 KB) and, unless the slice is a transition slice (v = 0), the chunk's value rows
// [16 kBlocks, kBlockV] in 8-column groups (a tensor copy; rows past the end of v read as
// zeros, rows past the sequence are masked by the consumers). One value-row copy per row
// (17 copies per chunk) left the consumers waiting for data a third of the time.
template <int kBlockV, bool kQueries, int kBlocks>
__device__ __forceinline__ void produce_chunks(const FwdParams &p, const CUtensorMap *value_map,
                                               const ChainTask &t, uint8_t *stages, uint64_t *full,
                                               uint64_t *empty) {
  using R = RecordLayout<kBlocks>;
  static_assert(R::kOffQd + kBlocks * kOpBytes == R::kOffKrT, "Qd is the second operand plane");
  constexpr uint32_t kRecordRead = kQueries ? R::kBytes : R::kBytes - kBlocks * kOpBytes;
  constexpr int kStageBytes = stage_bytes(kBlockV, kBlocks);
  const bool values = t.col0 < kHeadDim;
  const uint32_t bytes = kRecordRead + (values ? value_bytes(kBlockV, R::kTokens) : 0);
  const int64_t first = t.head * p.tiles_per_head + t.span.first_tile;
  const uint8_t *records = p.records + first * R::kBytes;
  RingPos pos{0, 0};
  int64_t written = p.ready != nullptr ? 0 : t.span.num_chunks;  // records K1 has written
#ifdef FLASH_KDA_DEBUG_WAITS
  // The planted stall (a test switch of the debug build): CTA 0 never arms its first stage,
  // so that its consumers wait for a stage that never fills, and this producer, stages chunks
  // later, for its release: a hang the bounded waits end.
  const bool stall = p.test.stall != 0 && blockIdx.x == 0;
#endif
  for (int64_t c = 0; c < t.span.num_chunks; ++c, pos.advance(p.stages)) {
    const int s = pos.stage;
    barrier_wait(&empty[s], pos.phase ^ 1u, p.wait_limit_ns);  // the first round passes at once
    if (c >= written)
      written = wait_ready(p.ready + first, c, t.span.num_chunks, p.wait_limit_ns);  // §4.7
#ifdef FLASH_KDA_DEBUG_WAITS
    if (stall && c == 0) continue;
#endif
    uint8_t *stage = stages + s * kStageBytes;
    TxBarrier::arrive_and_expect_tx(&full[s], bytes);
    const uint8_t *record = records + c * R::kBytes;
    if constexpr (kQueries) {
      bulk_copy_g2s(stage, record, R::kBytes, &full[s]);
    } else {
      bulk_copy_g2s(stage, record, R::kOffQd, &full[s]);
      bulk_copy_g2s(stage + R::kOffKrT, record + R::kOffKrT, R::kBytes - R::kOffKrT, &full[s]);
    }
    if (values)
      tensor_copy_g2s(stage + R::kBytes, value_map, 0,
                      static_cast<int32_t>(t.span.t0 + c * R::kTokens), t.col0 / kValueGroup,
                      static_cast<int32_t>(t.head), static_cast<int32_t>(t.span.b), &full[s]);
  }
}

// One lane's 16-byte share of a 16x16 A-fragment tile at `offset` of a stage.
struct Frag {
  uint32_t r[4];
};

__device__ __forceinline__ Frag lds_frag(const uint8_t *stage, int offset) {
  const uint4 v = *reinterpret_cast<const uint4 *>(stage + offset + (threadIdx.x % 32) * 16);
  return {{v.x, v.y, v.z, v.w}};
}

// A fragments of Kd and Qd (design §3.3 step 2), the head of a link. They do not depend on
// the state, so the latency-bound schedule loads them one chunk ahead (16-token chunks).
struct ScoreFrags {
  Frag kd[kKBlocks];
  Frag qd[kKBlocks];
};

template <bool kQueries>
__device__ __forceinline__ void load_score_frags(const uint8_t *stage, ScoreFrags &f) {
#pragma unroll
  for (int kb = 0; kb < kKBlocks; ++kb) {
    f.kd[kb] = lds_frag(stage, kOffKd + kb * kTileBytes);
    if constexpr (kQueries) f.qd[kb] = lds_frag(stage, kOffQd + kb * kTileBytes);
  }
}

// The small operands of a link over a chunk of kBlocks 16-row blocks: INV and Mqk
// fragments of every block pair (workspace.h block_pair), this lane's decays
// e[16 mb + g + 8 r] (at e[2 mb + r]), betas of rows 16 I + g and 16 I + g + 8 (each in
// both halves), value pairs (zero for rows >= n, whose smem is stale).
template <int kNB, int kBlocks>
struct LinkInputs {
  Frag inv[RecordLayout<kBlocks>::kPairs], mqk[RecordLayout<kBlocks>::kPairs];
  float e[16];
  uint32_t beta[kBlocks][2];
  uint32_t v[kBlocks][kNB][2];
};

template <int kNB, int kBlocks>
__device__ __forceinline__ void load_link_inputs(const uint8_t *stage, int n, int vcol,
                                                 LinkInputs<kNB, kBlocks> &in) {
  using R = RecordLayout<kBlocks>;
  const int lane = threadIdx.x % 32, g = lane / 4, cq = lane % 4;
#pragma unroll
  for (int i = 0; i < R::kPairs; ++i) {
    in.inv[i] = lds_frag(stage, R::kOffInv + i * kTileBytes);
    in.mqk[i] = lds_frag(stage, R::kOffMqk + i * kTileBytes);
  }
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const uint4 v4 = *reinterpret_cast<const uint4 *>(stage + R::kOffDecay + g * 64 + q * 16);
    in.e[4 * q + 0] = __uint_as_float(v4.x);
    in.e[4 * q + 1] = __uint_as_float(v4.y);
    in.e[4 * q + 2] = __uint_as_float(v4.z);
    in.e[4 * q + 3] = __uint_as_float(v4.w);
  }
  const uint16_t *beta = reinterpret_cast<const uint16_t *>(stage + R::kOffBeta);
  // The lane's pair (row g, columns vcol + 2 cq, + 1); vcol is a multiple of 8, so the
  // other rows and blocks are constant offsets from it.
  const uint8_t *vrows = stage + R::kBytes + value_offset(R::kTokens, g, vcol + 2 * cq);
#pragma unroll
  for (int blk = 0; blk < kBlocks; ++blk) {
    in.beta[blk][0] = beta[kChunk * blk + g] * 0x10001u;
    in.beta[blk][1] = beta[kChunk * blk + g + 8] * 0x10001u;
#pragma unroll
    for (int nb = 0; nb < kNB; ++nb) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = kChunk * blk + g + 8 * r;
        in.v[blk][nb][r] = row < n ? *reinterpret_cast<const uint32_t *>(
                                         vrows + value_offset(R::kTokens, row - g, 8 * nb))
                                   : 0u;
      }
    }
  }
}

// §3.3 step 2: Pk = Kd S^T, Pq = Qd S^T for every 16-row block, fp32 accumulation over
// k-blocks 0..7 in order (required); the chains interleave. kd(blk, kb) / qd(blk, kb) give
// the A fragments; after(kb) runs once the HMMAs of k-block kb are issued. Without
// kQueries (the segment pass writes no output) only Pk: a third of the link's HMMAs fewer.
template <bool kQueries, int kNB, int kBlocks, typename KdOf, typename QdOf, typename After>
__device__ __forceinline__ void chunk_projections(KdOf kd, QdOf qd, After after,
                                                  const StateSlice<kNB> &s,
                                                  float (&pk)[kBlocks][kNB][4],
                                                  float (&pq)[kBlocks][kNB][4]) {
#pragma unroll
  for (int blk = 0; blk < kBlocks; ++blk)
#pragma unroll
    for (int nb = 0; nb < kNB; ++nb)
#pragma unroll
      for (int i = 0; i < 4; ++i) pk[blk][nb][i] = pq[blk][nb][i] = 0.f;
#pragma unroll
  for (int kb = 0; kb < kKBlocks; ++kb) {
#pragma unroll
    for (int blk = 0; blk < kBlocks; ++blk) {
      const Frag a_k = kd(blk, kb);
      Frag a_q;
      if constexpr (kQueries) a_q = qd(blk, kb);
#pragma unroll
      for (int nb = 0; nb < kNB; ++nb) {
        mma_bf16_f32(pk[blk][nb], a_k.r, s.sb[kb][nb][0], s.sb[kb][nb][1]);
        if constexpr (kQueries) mma_bf16_f32(pq[blk][nb], a_q.r, s.sb[kb][nb][0], s.sb[kb][nb][1]);
      }
    }
    after(kb);
  }
}

// §3.3 steps 1, 3, 4: u = (v (-) bf(Pk)) (*) beta; U_I = bf(sum over J <= I of INV_IJ u_J), one
// fp32 accumulator in J order (the 32-token chunk's forward substitution: U_1 takes
// INV10 u_0 first). Returns U as B fragments. The bf16 steps run on column pairs
// (numerics.cuh: bf16x2_sub, bf16x2_mul), the same correctly rounded results as per
// element in fp32 with fewer, fixed-latency instructions.
template <int kNB, int kBlocks>
__device__ __forceinline__ void solve_u(const LinkInputs<kNB, kBlocks> &in,
                                        const float (&pk)[kBlocks][kNB][4],
                                        uint32_t (&ub)[kBlocks][kNB][2]) {
#pragma unroll
  for (int nb = 0; nb < kNB; ++nb) {
    uint32_t u[kBlocks][2];
#pragma unroll
    for (int blk = 0; blk < kBlocks; ++blk) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const uint32_t pk_bf = pack_bf16x2(pk[blk][nb][2 * r], pk[blk][nb][2 * r + 1]);
        u[blk][r] =
            movmatrix_trans(bf16x2_mul(bf16x2_sub(in.v[blk][nb][r], pk_bf), in.beta[blk][r]));
      }
    }
#pragma unroll
    for (int blk = 0; blk < kBlocks; ++blk) {
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int j = 0; j <= blk; ++j)
        mma_bf16_f32(acc, in.inv[block_pair(blk, j)].r, u[j][0], u[j][1]);
      ub[blk][nb][0] = movmatrix_trans(pack_bf16x2(acc[0], acc[1]));
      ub[blk][nb][1] = movmatrix_trans(pack_bf16x2(acc[2], acc[3]));
    }
  }
}

// §3.3 step 5, first half: Mqk U (for block I, the sum over J <= I of Mqk_IJ U_J in J order,
// fp32). Issued before the state update so that it overlaps with it; the output is
// finished by store_output afterwards.
template <int kNB, int kBlocks>
__device__ __forceinline__ void output_scores(const Frag (&mqk)[RecordLayout<kBlocks>::kPairs],
                                              const uint32_t (&ub)[kBlocks][kNB][2],
                                              float (&acc)[kBlocks][kNB][4]) {
#pragma unroll
  for (int blk = 0; blk < kBlocks; ++blk) {
#pragma unroll
    for (int nb = 0; nb < kNB; ++nb) {
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[blk][nb][i] = 0.f;
#pragma unroll
      for (int j = 0; j <= blk; ++j)
        mma_bf16_f32(acc[blk][nb], mqk[block_pair(blk, j)].r, ub[j][nb][0], ub[j][nb][1]);
    }
  }
}

// §3.3 steps 5, 8: O = bf(Pq) (+) bf(Mqk U); rows t < n stored.
template <int kNB, int kBlocks>
__device__ __forceinline__ void store_output(const float (&pq)[kBlocks][kNB][4],
                                             const float (&mu)[kBlocks][kNB][4], int n,
                                             uint16_t *out_row0, int64_t row_pitch) {
  const int lane = threadIdx.x % 32, g = lane / 4, cq = lane % 4;
#pragma unroll
  for (int blk = 0; blk < kBlocks; ++blk) {
#pragma unroll
    for (int nb = 0; nb < kNB; ++nb) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = kChunk * blk + g + 8 * r;
        if (row >= n) continue;
        *reinterpret_cast<uint32_t *>(out_row0 + row * row_pitch + 8 * nb + 2 * cq) =
            bf16x2_add(pack_bf16x2(pq[blk][nb][2 * r], pq[blk][nb][2 * r + 1]),
                       pack_bf16x2(mu[blk][nb][2 * r], mu[blk][nb][2 * r + 1]));
      }
    }
  }
}

// §3.3 steps 6, 7: Delta = Kr^T U (fp32, k16 steps over the token blocks in order), S' =
// bf(fma(f(S), e[k], Delta)) with one FFMA per element (required); the new state is also
// kept as B fragments. krt(mb, blk) gives the A fragment of key block mb, token block blk.
template <int kNB, int kBlocks, typename KrtOf>
__device__ __forceinline__ void update_state(KrtOf krt, const float (&e)[16],
                                             const uint32_t (&ub)[kBlocks][kNB][2],
                                             StateSlice<kNB> &s) {
#pragma unroll
  for (int mb = 0; mb < kKBlocks; ++mb) {
    Frag a[kBlocks];
#pragma unroll
    for (int blk = 0; blk < kBlocks; ++blk) a[blk] = krt(mb, blk);
#pragma unroll
    for (int nb = 0; nb < kNB; ++nb) {
      float delta[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int blk = 0; blk < kBlocks; ++blk)
        mma_bf16_f32(delta, a[blk].r, ub[blk][nb][0], ub[blk][nb][1]);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const uint32_t old = s.st[mb][nb][r];
        const float ek = e[2 * mb + r];
        const uint32_t next = pack_bf16x2(fma_ftz(bf16_to_f32(lo16(old)), ek, delta[2 * r]),
                                          fma_ftz(bf16_to_f32(hi16(old)), ek, delta[2 * r + 1]));
        s.st[mb][nb][r] = next;
        s.sb[mb][nb][r] = movmatrix_trans(next);
      }
    }
  }
}

// Checkpoint slots of a chain's sequence (flash_kda.h): slot first + m holds the state
// after (m + 1) every_chunks chunks; none when base is nullptr.
struct CheckpointSink {
  void *base;  // [slots, heads, 128, 128]
  Dtype dtype;
  int64_t first, slots, head, heads;
  int32_t every_chunks;
};

// What one compute warp needs to run its chain.
struct WarpChain {
  const uint8_t *stages;
  uint64_t *full, *empty;
  int num_stages, stage_bytes, vcol;
  bool values;        // false for transition slices: v = 0 (design §6.1)
  uint16_t *out;      // (first token of the span, head, first column of the warp); nullptr
                      // in the segment pass
  int64_t row_pitch;  // out's token stride
  int col;            // first state row (augmented column) of the warp
  CheckpointSink checkpoints;
  volatile uint32_t *mark;  // the warp's release mark (release_chunk)
};

// After chunk c of the span: the checkpoint, if the chain has just completed one.
template <int kBlocks, int kNB>
__device__ __forceinline__ void maybe_checkpoint(const WarpChain &w, const SeqSpan &span, int64_t c,
                                                 const StateSlice<kNB> &state) {
  constexpr int kTokens = kChunk * kBlocks;
  const CheckpointSink &k = w.checkpoints;
  const int64_t done = span.chunk0 + c + 1;  // chunks of the sequence behind this state
  if (span.len - c * kTokens < kTokens || done % k.every_chunks != 0) return;  // partial chunk
  const int64_t slot = k.first + done / k.every_chunks - 1;
  if (slot >= k.slots) return;  // inconsistent cu_seqlens: never write past the buffer
  const int64_t offset = state_block_offset(k.heads, slot, k.head);
  store_state(StateSink{element(k.base, k.dtype, offset), k.dtype}, w.col, state);
}

// Runs the chain as links(c0, c1) over runs of chunks that end where a checkpoint is due,
// and writes the checkpoints between runs: the link loops themselves carry no checkpoint
// code (inside the loop it grew the <1, 4> link from 296 to 519 instructions, and the
// chain 10% slower at H = 6).
template <PassCode kCode, int kBlocks, int kNB, typename Links>
__device__ __forceinline__ void run_in_intervals(const WarpChain &w, const SeqSpan &span,
                                                 StateSlice<kNB> &state, Links links) {
  if constexpr (kCode != PassCode::kGeneral) {
    links(0, span.num_chunks);
    return;
  }
  const bool checkpoints = w.checkpoints.base != nullptr;
  for (int64_t c = 0; c < span.num_chunks;) {
    int64_t end = span.num_chunks;
    if (checkpoints) {
      const int64_t every = w.checkpoints.every_chunks;
      end = min(end, c + every - (span.chunk0 + c) % every);
    }
    links(c, end);
    c = end;
    if (checkpoints) maybe_checkpoint<kBlocks>(w, span, c - 1, state);
  }
}

// §3.3 steps 5, 8 for chunk c, unless the pass writes no output (the segment pass).
template <bool kOutput, int kNB, int kBlocks>
__device__ __forceinline__ void store_chunk_output(const WarpChain &w, int64_t c, int n,
                                                   const float (&pq)[kBlocks][kNB][4],
                                                   const float (&mu)[kBlocks][kNB][4]) {
  if constexpr (kOutput)
    store_output(pq, mu, n, w.out + c * kChunk * kBlocks * w.row_pitch, w.row_pitch);
}

// Rows of chunk c whose values are read (transition slices read none, design §6.1).
template <PassCode kCode>
__device__ __forceinline__ int value_rows(const WarpChain &w, int n) {
  if constexpr (kCode == PassCode::kStates) return w.values ? n : 0;
  return n;
}

__device__ __forceinline__ const uint8_t *stage_of(const WarpChain &w, RingPos pos) {
  return w.stages + pos.stage * w.stage_bytes;
}

__device__ __forceinline__ void wait_chunk(const WarpChain &w, RingPos pos) {
  barrier_wait(&w.full[pos.stage], pos.phase);
}

// Whether a warp can hold a whole stage plus the next link's fragments in registers: with
// five warps per CTA a thread may use 255 registers, with nine only 168 (three warps share
// one sub-partition's 64 KB register file), and kNB = 4 needs 128 for its state alone.
__host__ __device__ constexpr bool prefetched_schedule(int nb, int warps) {
  return warps == 4 && nb <= 2;
}

// A compute warp done with a stage: every lane arrives on its empty barrier (32 arrivals a
// warp), since an mbarrier arrive releases the arriving thread's own reads. With one lane
// arriving after __syncwarp(), racecheck reported the other 31 lanes' reads against the
// producer's next copy into the stage, in both schedules, once a chain wraps the ring
// (H200). Each lane's arrive follows a proxy fence
// (release_stage: the copy writes through the async proxy), whose MEMBAR waits for the
// warp's shared-memory accesses still in flight. Lane 0 first stores a word of the new
// state to the warp's mark, a store the fence must follow: so the fence comes after the
// link's last use of the stage, where only that store is in flight (right after the
// stage's last load it cost the exact path 10% at T=8192 H=6; here the exact path is 1-2%
// faster than without a fence, streamed and segmented passes 2-3.5% slower).
constexpr int kReleaseLanes = 32;

template <int kNB>
__device__ __forceinline__ void mark_state(const WarpChain &w, const StateSlice<kNB> &state) {
  if (threadIdx.x % 32 == 0) *w.mark = state.st[kKBlocks - 1][kNB - 1][1];
}

template <int kNB>
__device__ __forceinline__ void release_chunk(const WarpChain &w, RingPos pos,
                                              const StateSlice<kNB> &state) {
  mark_state(w, state);
  release_stage(&w.empty[pos.stage]);
}

// The streamed schedule's release where the ring is deep (kPairedStages or more stages): a
// link holds its stage and the next link releases both behind one fence, which halves the
// fences' waits (the producer then runs at most stages - 2 chunks ahead). Not in the
// prefetched schedule (4-10% slower: its registers), the segment pass (96 registers: it
// spilled) or 32-token links (three stages) (H200).
constexpr int kPairedStages = 4;
template <PassCode kCode, int kBlocks>
__host__ __device__ constexpr bool paired_releases() {
  return kCode != PassCode::kStates && kBlocks == 1;
}

struct HeldStage {
  RingPos pos;
  bool held = false;
};

template <int kNB>
__device__ __forceinline__ void release_or_hold(const WarpChain &w, RingPos pos, bool pairs,
                                                HeldStage &h, const StateSlice<kNB> &state) {
  if (!pairs) {
    release_chunk(w, pos, state);
  } else if (!h.held) {
    h = {pos, true};
  } else {
    mark_state(w, state);
    release_stages(&w.empty[h.pos.stage], &w.empty[pos.stage]);
    h.held = false;
  }
}

// Latency-bound schedule (few heads, the chain is the run time). A link starts
// with its HMMAs: its Kd/Qd fragments are already in registers. The rest of the stage is
// read at the start of the link, and the stage released after the state update; while the
// Pk/Pq chain runs, the next link's fragments replace the consumed ones k-block by k-block,
// so that no shared-memory traffic delays the movmatrix steps after the chain (ncu, H200:
// the movmatrix behind a burst of 16 fragment loads was the second largest stall).
template <PassCode kCode, int kNB>
__device__ __forceinline__ void run_chain_prefetched(const WarpChain &w, const SeqSpan &span,
                                                     StateSlice<kNB> &state) {
  constexpr bool kOutput = kCode != PassCode::kStates;
  ScoreFrags frags;
  RingPos pos{0, 0}, next_pos{0, 0};
  next_pos.advance(w.num_stages);
  wait_chunk(w, pos);
  load_score_frags<kOutput>(stage_of(w, pos), frags);
  run_in_intervals<kCode, 1>(w, span, state, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c, pos = next_pos, next_pos.advance(w.num_stages)) {
      const uint8_t *stage = stage_of(w, pos);
      const int n = static_cast<int>(min(int64_t{kChunk}, span.len - c * kChunk));
      LinkInputs<kNB, 1> in;
      load_link_inputs(stage, value_rows<kCode>(w, n), w.vcol, in);
      Frag krt[kKBlocks];
#pragma unroll
      for (int mb = 0; mb < kKBlocks; ++mb) krt[mb] = lds_frag(stage, kOffKrT + mb * kTileBytes);

      const bool has_next = c + 1 < span.num_chunks;
      const uint8_t *next = stage_of(w, next_pos);
      auto prefetch = [&](int kb) {
        if (!has_next) return;
        if (kb == 0) wait_chunk(w, next_pos);
        frags.kd[kb] = lds_frag(next, kOffKd + kb * kTileBytes);
        if constexpr (kOutput) frags.qd[kb] = lds_frag(next, kOffQd + kb * kTileBytes);
      };
      float pk[1][kNB][4], pq[1][kNB][4];
      chunk_projections<kOutput>([&](int, int kb) { return frags.kd[kb]; },
                                 [&](int, int kb) { return frags.qd[kb]; }, prefetch, state, pk,
                                 pq);
      uint32_t ub[1][kNB][2];
      solve_u(in, pk, ub);
      float mu[1][kNB][4];
      if constexpr (kOutput) output_scores<kNB, 1>(in.mqk, ub, mu);
      update_state<kNB, 1>([&](int mb, int) { return krt[mb]; }, in.e, ub, state);
      release_chunk(w, pos, state);
      store_chunk_output<kOutput>(w, c, n, pq, mu);
    }
  });
}

// Streamed schedule (when registers are short, or many heads fill the GPU, and every
// 32-token link). Operand fragments are read from shared memory where they are used, which
// keeps the wide state slice in registers without spilling; the stage is released at the
// end of the link, or with the next link's (release_or_hold).
template <PassCode kCode, int kBlocks, int kNB>
__device__ __forceinline__ void run_chain_streamed(const WarpChain &w, const SeqSpan &span,
                                                   StateSlice<kNB> &state) {
  using R = RecordLayout<kBlocks>;
  constexpr bool kOutput = kCode != PassCode::kStates;
  RingPos pos{0, 0};
  const bool pairs = paired_releases<kCode, kBlocks>() && w.num_stages >= kPairedStages;
  HeldStage held;
  run_in_intervals<kCode, kBlocks>(w, span, state, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c, pos.advance(w.num_stages)) {
      const uint8_t *stage = stage_of(w, pos);
      const int n = static_cast<int>(min(int64_t{R::kTokens}, span.len - c * R::kTokens));
      wait_chunk(w, pos);
      LinkInputs<kNB, kBlocks> in;
      load_link_inputs(stage, value_rows<kCode>(w, n), w.vcol, in);
      float pk[kBlocks][kNB][4], pq[kBlocks][kNB][4];
      chunk_projections<kOutput>([&](int blk, int kb) { return lds_frag(stage, R::kd(blk, kb)); },
                                 [&](int blk, int kb) { return lds_frag(stage, R::qd(blk, kb)); },
                                 [](int) {}, state, pk, pq);
      uint32_t ub[kBlocks][kNB][2];
      solve_u(in, pk, ub);
      float mu[kBlocks][kNB][4];
      if constexpr (kOutput) output_scores<kNB, kBlocks>(in.mqk, ub, mu);
      update_state<kNB, kBlocks>([&](int mb, int blk) { return lds_frag(stage, R::krt(mb, blk)); },
                                 in.e, ub, state);
      release_or_hold(w, pos, pairs, held, state);
      store_chunk_output<kOutput>(w, c, n, pq, mu);
    }
  });
  if (held.held) release_chunk(w, held.pos, state);
}

// The ring's mbarriers (thread 0, then a CTA barrier): full[s] takes the producer's arrival
// and the copies' bytes, empty[s] an arrival from every lane of the compute warps
// (release_chunk). Shared by recurrence_kernel and the warpgroup pass (recurrence_wg.cuh).
template <int kComputeWarps>
__device__ __forceinline__ void init_ring(int stages, uint64_t *full, uint64_t *empty) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) {
      TxBarrier::init(&full[s], 1);
      TxBarrier::init(&empty[s], kComputeWarps * kReleaseLanes);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
}

// kWarps compute warps of kNB blocks of 8 value columns, plus the producer warp;
// config.h lists the widths, launch.cuh launches them. kCode (config.h) says which passes
// the instantiation serves. kPlain is the exact path's whole-sequence pass without
// checkpoints, compiled without the branches of the other passes: with them its chain ran
// 10% slower at H = 6 on the H200 (212 registers, now 188 for <1, 4>; 197 before the
// passes existed), although the link had the same instructions. It runs one CTA per SM
// (its grid is at most one wave); kGeneral and kStates run resident_ctas (config.h), as
// the segment passes fill the GPU, within register_cap's registers. kStates, the segment
// pass, writes states only: no Pq, no Mqk U and no Qd copy.
// kBlocks = 2: 32-token chunks (AUTO mode where the plan picks them), one CTA per SM.
template <int kNB, int kWarps, PassCode kCode, int kBlocks>
__global__ void __launch_bounds__(32 * (kWarps + 1), resident_ctas(kNB, kWarps, kCode, kBlocks))
    __maxnreg__(register_cap(kWarps + 1, resident_ctas(kNB, kWarps, kCode, kBlocks)))
        recurrence_kernel(const FwdParams p, const __grid_constant__ CUtensorMap value_map) {
  constexpr int kBlockV = 8 * kNB * kWarps;
  static_assert(kWarps <= kMaxComputeWarps, "one release mark per compute warp");
  extern __shared__ __align__(128) uint8_t smem[];
  const auto [full, empty, stages] = ring_smem(smem);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const ChainTask task = begin_chain<kBlockV, kCode>(p);
  if (!task.valid) return;  // CTA-uniform: the excess of an upper-bound grid

  init_ring<kWarps>(p.stages, full, empty);

  if (warp == kWarps) {  // producer warp; no CTA-wide barrier follows
    if (lane == 0)
      produce_chunks<kBlockV, kCode != PassCode::kStates, kBlocks>(p, &value_map, task, stages,
                                                                   full, empty);
    return;
  }

  const int vcol = warp * 8 * kNB;  // first value column of this warp within the slice
  StateSlice<kNB> state;
  load_state(task.source, task.col0 + vcol, state);
  uint16_t *out = nullptr;
  if constexpr (kCode != PassCode::kStates)
    out = p.out + token_offset(p.out_strides, task.span.b, task.span.t0, task.head) + task.col0 +
          vcol;
  volatile uint32_t *const mark = reinterpret_cast<volatile uint32_t *>(empty + kMaxStages) + warp;
  const WarpChain w{stages,
                    full,
                    empty,
                    p.stages,
                    stage_bytes(kBlockV, kBlocks),
                    vcol,
                    task.col0 < kHeadDim,
                    out,
                    p.out_strides.token,
                    task.col0 + vcol,
                    {task.checkpoint0 >= 0 ? p.checkpoints : nullptr, p.checkpoint_dtype,
                     task.checkpoint0, p.checkpoint_slots, task.head, p.heads, p.checkpoint_chunks},
                    mark};
  if (task.span.num_chunks > 0) {
    if constexpr (kBlocks == 1 && prefetched_schedule(kNB, kWarps))
      run_chain_prefetched<kCode>(w, task.span, state);
    else
      run_chain_streamed<kCode, kBlocks>(w, task.span, state);
  }
  // The segment pass's sink is always a bf16 segment block (chain_task). Stated here, the
  // store loses its fp32 branch, whose element offsets and the sink's dtype otherwise stay
  // live through the chain: <2, 8> spilled 16 bytes at its 96-register cap on sm_90a. The
  // other widths fit their caps with the runtime dtype and keep it.
  if constexpr (kCode == PassCode::kStates && kNB == 2)
    store_state(StateSink{task.sink.block, Dtype::kBf16}, task.col0 + vcol, state);
  else
    store_state(task.sink, task.col0 + vcol, state);
}

}  // namespace flash_kda::FLASH_KDA_ARCH
