// SPDX-License-Identifier: MIT
// recurrence_wg.cuh: K2's passes on Hopper's warpgroup MMA (sm_90a only; design §4.9): the
// whole-sequence pass, the segment pass and the rerun. The other arches build recurrence.cuh's
// passes alone.
//
// The link of recurrence.cuh (design §3.3) in transposed form. A warpgroup (4 warps) owns
// 64 value columns v and keeps its rows of the V-first state S[v][k] in registers as the
// A operand of wgmma (rows v, columns k; the state's memory layout, so loads and stores are
// word pairs). The chunk's operands are B operands that the tensor cores read from the
// stage by descriptor (records in tile order, workspace.h RecordTiles): no fragment loads
// per warp and no movmatrix. Per chunk, lane rows v and v + 8 of its warp's 16:
//   [Pk | Pq]^T = S [Kd; Qd]^T     m64n32k16, k-blocks 0..7 in order, fp32
//   u^T = (v^T (-) bf(Pk^T)) (*) beta   bf16 pairs along t
//   U^T = bf(u^T INV^T)            m64n16k16
//   Y = U^T Mqk^T                  m64n16k16;  O^T = bf(Pq^T) (+) bf(Y)
//   Delta = U^T Kr                 m64n128k16; S' = bf(fma(f(S), e[k], Delta))
// Every element is the same dot product, in the same k order and with the same roundings,
// as in recurrence_kernel, and wgmma's k16 step gives the bits of mma.sync m16n8k16 (a probe
// on the H200, design §4.9): the pass is bitwise equal to recurrence_kernel's kPlain pass,
// which it replaces on sm_90a at block_v 64 and 128 (launch.cuh configure_pass; H200, the
// pass alone: 0.56 us a link against 0.88, and 0.73 against 1.10), and its kStates pass and
// the rerun likewise. Threads: kGroups warpgroups
// plus the producer of recurrence.cuh (produce_chunks and its ring, the value rows in 8-column
// groups); 16-token chunks, no checkpoints.
#pragma once
#ifndef FLASH_KDA_ARCH
#error "define FLASH_KDA_ARCH (the arch namespace, e.g. sm90a) before including kda headers"
#endif
#ifndef FLASH_KDA_CC
#error "define FLASH_KDA_CC (the arch's compute capability, e.g. 90) before including kda headers"
#endif

#include "kda/recurrence.cuh"

#if FLASH_KDA_CC == 90
namespace flash_kda::FLASH_KDA_ARCH {

// ---------------------------------------------------------------- wgmma

// A B-operand descriptor of a tile-order operand at `smem` (no swizzle, K-major): 128 bytes
// between the k halves of a core row group, 256 between row groups (workspace.h).
__device__ __forceinline__ uint64_t tile_desc(const uint8_t *smem) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  return uint64_t{(a & 0x3FFFFu) >> 4} | (uint64_t{RecordTiles::kCoreKBytes >> 4} << 16) |
         (uint64_t{RecordTiles::kCoreRowBytes >> 4} << 32);
}

// D (+)= A B for a 64 x kN tile: A (64 x 16 bf16) from registers in mma.sync's A-fragment
// layout (warp w of the group holds rows 16 w ..), B by descriptor; D in fp32, the
// accumulator layout of mma.sync per 8-column block (d[4 j + 2 r + c]: row g + 8 r, column
// 8 j + 2 cq + c). Asynchronous: wgmma_fence before, wgmma_commit and wgmma_wait after.
template <int kN>
__device__ __forceinline__ void wgmma(float (&d)[kN / 2], const uint32_t (&a)[4], uint64_t desc,
                                      int accumulate) {
  static_assert(kN == 16 || kN == 32 || kN == 128, "the link's three shapes");
  if constexpr (kN == 16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, "
        "{%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate));
  }
  if constexpr (kN == 32) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
        "%9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate));
  }
  if constexpr (kN == 128) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, "
        "%8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, "
        "%26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "
        "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "
        "%62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
          "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
          "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
          "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
          "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
          "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
          "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate));
  }
}

// Orders this warp's register accesses before the next wgmma, and its prior wgmma before
// the group's register reads (PTX wgmma.fence).
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}

__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}

__device__ __forceinline__ void wgmma_wait_all() {
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
}

// ---------------------------------------------------------------- the state

// The lane's rows v = col, col + 8 of the state as A fragments for key block kb:
// a[kb][q] = bf16 pair S[col + 8 (q % 2)][16 kb + 8 (q / 2) + 2 cq, + 1].
struct StateRows {
  uint32_t a[kKBlocks][4];
};

// Calls fn(kb, q, v, k, i) for each pair of the lane's rows: (row v, keys k, k + 1) at
// element i = 128 v + k of a V-first block.
template <typename Fn>
__device__ __forceinline__ void for_each_row_pair(int col, Fn fn) {
  const int cq = threadIdx.x % 4;
#pragma unroll
  for (int kb = 0; kb < kKBlocks; ++kb)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int v = col + 8 * (q % 2), k = 16 * kb + 8 * (q / 2) + 2 * cq;
      fn(kb, q, v, k, int64_t{v} * kHeadDim + k);
    }
}

// Initial state: zeros, bf16 as is, fp32 rounded bf(x) (design §1.4), or the identity (the
// segment pass's transition slices, rows 128 ..; the other passes leave out its branch,
// which changed the whole pass's code).
template <PassCode kCode>
__device__ __forceinline__ void load_state_rows(const StateSource &src, int col, StateRows &s) {
  for_each_row_pair(col, [&](int kb, int q, int v, int k, int64_t i) {
    uint32_t pair = 0;
    if (kCode == PassCode::kStates && src.identity) {
      pair = identity_entry(v, k) | identity_entry(v, k + 1) << 16;
    } else if (src.block != nullptr && src.dtype == Dtype::kBf16) {
      pair = *reinterpret_cast<const uint32_t *>(static_cast<const uint16_t *>(src.block) + i);
    } else if (src.block != nullptr) {
      const float2 x = *reinterpret_cast<const float2 *>(static_cast<const float *>(src.block) + i);
      pair = pack_bf16x2(x.x, x.y);
    }
    s.a[kb][q] = pair;
  });
}

// Final state: bf16 as is, or fp32 as the exact widening f(S).
__device__ __forceinline__ void store_state_rows(const StateSink &dst, int col,
                                                 const StateRows &s) {
  if (dst.block == nullptr) return;
  for_each_row_pair(col, [&](int kb, int q, int, int, int64_t i) {
    const uint32_t pair = s.a[kb][q];
    if (dst.dtype == Dtype::kBf16)
      *reinterpret_cast<uint32_t *>(static_cast<uint16_t *>(dst.block) + i) = pair;
    else
      *reinterpret_cast<float2 *>(static_cast<float *>(dst.block) + i) =
          make_float2(bf16_to_f32(lo16(pair)), bf16_to_f32(hi16(pair)));
  });
}

// ---------------------------------------------------------------- one link

// What one warp's chain reads and writes besides the state.
struct RowChain {
  const uint8_t *stages;
  uint64_t *full, *empty;
  int num_stages, stage_bytes;
  int row;            // the lane's first value row within the slice
  uint16_t *out;      // (first token, head, first column of the slice); nullptr in the
                      // segment pass
  int64_t row_pitch;  // out's token stride
  bool values;        // false for the segment pass's transition slices: v = 0 (design §6.1)
};

// What a link reads from its stage with ordinary loads, before its first wgmma (behind the
// wgmma's operand reads they waited in the shared-memory pipe: ncu, H200, the top stall):
// the lane's value pairs (t, t + 1) of rows row + 8 (q % 2),
// t = 8 (q / 2) + 2 cq, zero for tokens t >= n (the stage holds the next sequence's rows
// there), and beta pairs (t, t + 1) for t = 2 cq and 2 cq + 8.
struct RowInputs {
  uint32_t v[4];
  uint32_t beta[2];
};

// The value pairs come by one ldmatrix.trans from the stage's 8-column groups
// (recurrence.cuh value_offset): matrix q is the 8 tokens 8 (q / 2) .. of the warp's group
// 2 warp + q % 2, 8 rows of 16 bytes in a row, so its lanes' reads meet in no bank.
__device__ __forceinline__ void load_row_betas(const uint8_t *stage, RowInputs &in) {
  const int cq = threadIdx.x % 4;
  const uint16_t *beta = reinterpret_cast<const uint16_t *>(stage + RecordTiles::kBeta);
  in.beta[0] = *reinterpret_cast<const uint32_t *>(beta + 2 * cq);
  in.beta[1] = *reinterpret_cast<const uint32_t *>(beta + 2 * cq + 8);
}

__device__ __forceinline__ void load_row_inputs(const uint8_t *stage, const RowChain &w, int n,
                                                RowInputs &in) {
  const int lane = threadIdx.x % 32, cq = lane % 4, q = lane / 8;
  load_row_betas(stage, in);
  const int group = w.row / kValueGroup + q % 2;  // w.row / 8 = 2 warp (lane / 4 < 8)
  ldmatrix_x4_trans(stage + RecordTiles::kBytes +
                        value_offset(kChunk, 8 * (q / 2) + lane % 8, kValueGroup * group),
                    in.v);
  if (n < kChunk) {  // the sequence's last chunk: CTA-uniform
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int t = 8 * (i / 2) + 2 * cq;
      in.v[i] = t >= n ? 0u : t + 1 >= n ? in.v[i] & 0xFFFFu : in.v[i];
    }
  }
}

// The lane's decays e[8 j + 2 cq], e[8 j + 2 cq + 1] for the key blocks 4 half .. 4 half + 3
// (j = 8 half .. 8 half + 7; 16 floats, float4 m = 4 half + i at slot 4 m + cq of
// tile_decay_index). Loaded half by half, the first half while U is computed: all 32 floats
// through the link spilled at 168 registers.
__device__ __forceinline__ void load_decays(const uint8_t *stage, int half, float4 (&e)[4]) {
  const float4 *src =
      reinterpret_cast<const float4 *>(stage + RecordTiles::kDecay) + 16 * half + threadIdx.x % 4;
#pragma unroll
  for (int i = 0; i < 4; ++i) e[i] = src[4 * i];
}

// The A fragment (k = tokens) of the bf16 pairs of columns t of an m64n16 result held in
// d[4 j + 2 r + c] (row r, token 8 j + 2 cq + c), each pair transformed by fn(q, pair).
template <typename Fn>
__device__ __forceinline__ void tokens_as_a(const float *d, uint32_t (&a)[4], Fn fn) {
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int i = 4 * (q / 2) + 2 * (q % 2);
    a[q] = fn(q, pack_bf16x2(d[i], d[i + 1]));
  }
}

// §3.3 steps 5, 8: O = bf(Pq) (+) bf(Mqk U) for tokens t < n. A lane holds pairs along t of one
// value column; lanes g and g ^ 1 swap halves (shfl.xor 4) so that each writes a pair of
// adjacent columns of one token row: the even lane row t, the odd one row t + 1.
__device__ __forceinline__ void store_rows_output(const RowChain &w, int64_t c, int n,
                                                  const float (&pq)[8], const float (&y)[8]) {
  const int lane = threadIdx.x % 32, cq = lane % 4;
  const bool odd = (lane / 4) % 2 != 0;
  uint16_t *out = w.out + c * kChunk * w.row_pitch + w.row - (odd ? 1 : 0);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int i = 4 * (q / 2) + 2 * (q % 2);
    const uint32_t o = bf16x2_add(pack_bf16x2(pq[i], pq[i + 1]), pack_bf16x2(y[i], y[i + 1]));
    const uint32_t other = __shfl_xor_sync(0xffffffffu, odd ? lo16(o) : hi16(o), 4);
    const uint32_t word = odd ? other | (hi16(o) << 16) : lo16(o) | (other << 16);
    const int t = 8 * (q / 2) + 2 * cq + (odd ? 1 : 0);
    if (t < n) *reinterpret_cast<uint32_t *>(out + t * w.row_pitch + 8 * (q % 2)) = word;
  }
}

// §3.3 steps 6, 7 on key blocks 4 half .. 4 half + 3 of the lane's rows: S' = bf(fma(f(S), e[k],
// Delta)), Delta's 8-column block j (keys 8 j + 2 cq, + 1) into register 2 (j % 2) + r of
// key block j / 2.
__device__ __forceinline__ void update_rows(int half, const float4 (&e)[4],
                                            const float (&delta)[64], StateRows &s) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int kb = 4 * half + i;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float e0 = h ? e[i].z : e[i].x, e1 = h ? e[i].w : e[i].y;
      const int j = 2 * kb + h;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const uint32_t old = s.a[kb][2 * h + r];
        s.a[kb][2 * h + r] =
            pack_bf16x2(fma_ftz(bf16_to_f32(lo16(old)), e0, delta[4 * j + 2 * r]),
                        fma_ftz(bf16_to_f32(hi16(old)), e1, delta[4 * j + 2 * r + 1]));
      }
    }
  }
}

// The chain over the span's chunks. Each link waits for its stage, runs the five products
// of the file comment and stores its output rows. The stage is released (every lane behind
// the proxy fence, as recurrence.cuh's release_chunk) between the two halves of the state
// update: after its last read of the stage (the second half's decays; the wgmma reads are
// complete at their wait) and before the output stores, which the fence would wait for.
// The segment pass (kStates) computes Pk alone (m64n16), no Y and no output, and its
// transition slices read no value rows (v = 0), as recurrence_kernel's.
template <PassCode kCode>
__device__ __forceinline__ void run_chain_rows(const RowChain &w, const SeqSpan &span,
                                               StateRows &s) {
  constexpr bool kOutput = kCode != PassCode::kStates;
  constexpr int kScoreCols = kOutput ? 32 : 16;  // [Pk | Pq]^T, or Pk^T
  RingPos pos{0, 0};
  for (int64_t c = 0; c < span.num_chunks; ++c, pos.advance(w.num_stages)) {
    const uint8_t *stage = w.stages + pos.stage * w.stage_bytes;
    const int n = static_cast<int>(min(int64_t{kChunk}, span.len - c * kChunk));
    barrier_wait(&w.full[pos.stage], pos.phase);
    RowInputs in;
    if (kOutput || w.values) {
      load_row_inputs(stage, w, n, in);
    } else {
      load_row_betas(stage, in);
#pragma unroll
      for (int i = 0; i < 4; ++i) in.v[i] = 0u;
    }
    float p[kScoreCols / 2];  // 8-column blocks 0, 1: Pk^T; 2, 3: Pq^T
    wgmma_fence();
#pragma unroll
    for (int kb = 0; kb < kKBlocks; ++kb)
      wgmma<kScoreCols>(p, s.a[kb],
                        tile_desc(stage + RecordTiles::kKdQd + kb * RecordTiles::kKdQdStride),
                        kb > 0);
    wgmma_commit();
    wgmma_wait_all();
    uint32_t u[4];
    tokens_as_a(p, u, [&](int q, uint32_t pk) {
      return bf16x2_mul(bf16x2_sub(in.v[q], pk), in.beta[q / 2]);
    });
    float acc[8];
    wgmma_fence();
    wgmma<16>(acc, u, tile_desc(stage + RecordTiles::kInv), 0);
    wgmma_commit();
    float4 e_lo[4], e_hi[4];
    load_decays(stage, 0, e_lo);
    wgmma_wait_all();
    uint32_t ua[4];
    tokens_as_a(acc, ua, [](int, uint32_t x) { return x; });
    float y[8], delta[64];
    wgmma_fence();
    if constexpr (kOutput) wgmma<16>(y, ua, tile_desc(stage + RecordTiles::kMqk), 0);
    wgmma<128>(delta, ua, tile_desc(stage + RecordTiles::kKrT), 0);
    wgmma_commit();
    wgmma_wait_all();
    load_decays(stage, 1, e_hi);
    update_rows(0, e_lo, delta, s);
    release_stage(&w.empty[pos.stage]);  // after the last loads from the stage, e_hi
    update_rows(1, e_hi, delta, s);
    if constexpr (kOutput) {
      float pq[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) pq[i] = p[8 + i];
      store_rows_output(w, c, n, pq, y);
    }
  }
}

// Threads of warpgroup_recurrence_kernel<kGroups, ...>: one warpgroup and the producer warp
// (160), or kGroups warpgroups and a producer warpgroup whose three other warps only hand
// their registers to the compute warpgroups (setmaxnreg): with nine warps the fullest
// sub-partition holds three, which capped a thread at 168 registers and spilled the link's
// decays; with twelve, the compute warps get kComputeRegs.
constexpr int warpgroup_threads(int groups) {
  return groups == 1 ? 128 + 32 : 128 * (groups + 1);
}
constexpr int kProducerRegs = 40;
constexpr int kComputeRegs = 232;
static_assert(32 * (kProducerRegs + 2 * kComputeRegs) <= 16384 && kComputeRegs % 8 == 0,
              "a sub-partition holds one producer-group warp and two compute warps");

template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}

// kGroups warpgroups (block_v = 64 kGroups columns) and the producer (warpgroup_threads).
// kGroups = 1: kResident CTAs per SM, 1 (194 registers) or 2 within register_cap's 168,
// for grids of more than one wave and K1 CTAs beside the pass (launch.cuh
// configure_warpgroup_64). kGroups = 2: one CTA per SM, its compute warps at
// kComputeRegs. kCode (config.h): the whole-sequence pass
// (kPlain), or the segments' passes without checkpoints: the segment pass (kStates) and
// the rerun (kRerun), the same links as recurrence_kernel's kStates and kGeneral passes
// (design §6.2). Every pass copies whole records: tile order
// interleaves Kd and Qd, so the segment pass cannot leave Qd out.
template <int kGroups, int kResident, PassCode kCode>
__global__ void __launch_bounds__(warpgroup_threads(kGroups), kResident)
    __maxnreg__(register_cap(warpgroup_threads(kGroups) / 32, kResident))
        warpgroup_recurrence_kernel(const FwdParams p,
                                    const __grid_constant__ CUtensorMap value_map) {
  static_assert(kGroups == 1 || kResident == 1, "the producer warpgroup form runs alone");
  static_assert(kCode != PassCode::kGeneral, "no checkpoints on the warpgroup MMA");
  constexpr int kBlockV = 64 * kGroups, kWarps = 4 * kGroups;
  extern __shared__ __align__(128) uint8_t smem[];
  const auto [full, empty, stages] = ring_smem(smem);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const ChainTask task = begin_chain<kBlockV, kCode>(p);
  if (!task.valid) return;  // CTA-uniform: the excess of an upper-bound grid

  init_ring<kWarps>(p.stages, full, empty);

  if constexpr (kGroups > 1) {  // warpgroup-uniform
    if (warp >= kWarps)
      setmaxnreg_dec<kProducerRegs>();
    else
      setmaxnreg_inc<kComputeRegs>();
  }
  if (warp >= kWarps) {  // the producer warp (and its idle warpgroup mates)
    if (warp == kWarps && lane == 0)
      produce_chunks<kBlockV, true, 1>(p, &value_map, task, stages, full, empty);
    return;
  }

  const int row = 16 * warp + lane / 4;  // the lane's value rows row, row + 8 of the slice
  StateRows s;
  load_state_rows<kCode>(task.source, task.col0 + row, s);
  const RowChain w{
      stages,
      full,
      empty,
      p.stages,
      stage_bytes(kBlockV, 1),
      row,
      kCode == PassCode::kStates
          ? nullptr
          : p.out + token_offset(p.out_strides, task.span.b, task.span.t0, task.head) + task.col0,
      p.out_strides.token,
      task.col0 < kHeadDim};
  if constexpr (kGroups == 1) {
    // Taking the chain's length from lane 0 (the same in every lane) after a warpgroup fence
    // (an .aligned instruction: the warp runs converged) lets the compiler keep the ring's
    // position and the stage and barrier addresses in uniform registers, as it does after the
    // two-group form's setmaxnreg; without them it kept them per thread and moved them to
    // uniform registers (R2UR) for each barrier and descriptor, 20-22 a link.
    wgmma_fence();
    SeqSpan span = task.span;
    span.num_chunks = __shfl_sync(0xffffffffu, span.num_chunks, 0);
    run_chain_rows<kCode>(w, span, s);
  } else {
    run_chain_rows<kCode>(w, task.span, s);
  }
  store_state_rows(task.sink, task.col0 + row, s);
}

}  // namespace flash_kda::FLASH_KDA_ARCH
#endif  // FLASH_KDA_CC == 90
