// SPDX-License-Identifier: MIT
// workspace.h: the per-chunk records that K1 (prepare) writes and K2 (recurrence) reads
// (design §4.3). Host and device constexpr only, shared with api.cpp, so it lives in the
// arch-independent namespace: it defines no symbol that two arch TUs could both emit.
//
// Record of one (head, chunk), in the order K2 consumes it. 16x16 operand tiles are
// stored in mma.m16n8k16 A-fragment order (frag_a_index), so each lane of a K2 warp
// reads its fragment as one 16-byte vector, conflict-free, with no ldmatrix:
//   Kd   [8 k-blocks]  A tiles of Kd  (rows t, cols k)       4096 B
//   Qd   [8 k-blocks]  A tiles of Qd  (rows t, cols k)       4096 B
//   KrT  [8 k-blocks]  A tiles of Kr^T (rows k, cols t)      4096 B
//   INV                A tile of (I + L)^-1 (rows t, cols s)  512 B
//   Mqk                A tile of Mqk  (rows t, cols s)         512 B
//   decay fp32 e[k] = 2^Gtot[k] at decay_index(k)              512 B
//   beta  bf16 bf(sig(beta_raw[t])), t = 0..15                  32 B, padded to 128
// The format is free (design §3.5): only the values matter for bit-exactness.
#pragma once

#include <cstdint>

namespace flash_kda {

constexpr int kChunk = 16;     // tokens per chunk (design §0)
constexpr int kHeadDim = 128;  // K = V = D (design §0)

constexpr int kTileElems = 16 * 16;              // one 16x16 operand tile
constexpr int kTileBytes = kTileElems * 2;       // bf16: 512 B, one lane's 16 B times 32 lanes
constexpr int kKBlocks = kHeadDim / 16;          // 16-wide blocks of the head dimension
constexpr int kOpBytes = kKBlocks * kTileBytes;  // 8 bf16 tiles = 4096 B
constexpr int kOffKd = 0;
constexpr int kOffQd = kOffKd + kOpBytes;
constexpr int kOffKrT = kOffQd + kOpBytes;
constexpr int kOffInv = kOffKrT + kOpBytes;
constexpr int kOffMqk = kOffInv + kTileBytes;
constexpr int kOffDecay = kOffMqk + kTileBytes;
constexpr int kOffBeta = kOffDecay + kHeadDim * 4;

constexpr int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

constexpr int64_t round_up(int64_t a, int64_t b) {
  return ceil_div(a, b) * b;
}

// Records stay 128-byte aligned (bulk copies want 16, L2 sectors 32, lines 128): 13,952 B.
constexpr int kRecordBytes = static_cast<int>(round_up(kOffBeta + kChunk * 2, 128));

static_assert(kOffBeta + kChunk * 2 <= kRecordBytes, "record overflow");
static_assert(kRecordBytes % 128 == 0, "records must keep 128-byte alignment");
static_assert(kOffKd % 16 == 0 && kOffQd % 16 == 0 && kOffKrT % 16 == 0 && kOffInv % 16 == 0 &&
                  kOffMqk % 16 == 0 && kOffDecay % 16 == 0 && kOffBeta % 16 == 0,
              "every plane must allow 16-byte vector access");

// Element offset of (row i, col j) of a 16x16 tile in A-fragment order: lane
// (i % 8) * 4 + (j % 8) / 2 holds 8 values, register (i / 8) + 2 * (j / 8), half j % 2.
constexpr int frag_a_index(int i, int j) {
  return ((i % 8) * 4 + (j % 8) / 2) * 8 + ((i / 8) + 2 * (j / 8)) * 2 + (j % 2);
}

// Float offset of e[k] in the decay plane: lanes with g = lane / 4 read 16 contiguous
// floats e[16 mb + g + 8 h] for mb = 0..7, h = 0..1 (the rows of their accumulators).
constexpr int decay_index(int k) {
  return ((k % 8) * 8 + k / 16) * 2 + (k / 8) % 2;
}

// Records per head: an upper bound on the chunks of any split of total_tokens into
// num_seqs sequences (design §1.6).
constexpr int64_t tiles_per_head(int64_t total_tokens, int64_t num_seqs) {
  return ceil_div(total_tokens, kChunk) + num_seqs;
}

// prefix_kernel's threads (one CTA): it scans the varlen prefix arrays, and ranks up to this
// many sequences by length, one a thread, for the whole pass's longest-first order, which
// it writes in the segment prefix's space (that pass has no segments; design §4.2).
constexpr int kPrefixThreads = 1024;

// The overlapped forward's work counter (design §4.7), after the ready flags (one uint32
// per record); the launch zeroes flags and counter together.
struct OverlapSync {
  uint32_t next_item;  // K1's next item
  uint32_t pad[31];    // 128 bytes: the workspace stays 128-byte aligned
};
static_assert(sizeof(OverlapSync) == 128, "keeps the workspace 128-byte aligned");

// Bytes of the ready flags and the counters.
constexpr int64_t ready_bytes(int64_t heads, int64_t tiles) {
  return round_up(4 * heads * tiles, 128) + static_cast<int64_t>(sizeof(OverlapSync));
}

}  // namespace flash_kda
