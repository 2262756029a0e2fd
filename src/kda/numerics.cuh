// SPDX-License-Identifier: MIT
// numerics.cuh: the instruction-level primitives of design §0 / §3.1, the only file with
// inline PTX. Every rounding point of the kernels goes through one of these helpers, so
// the result never depends on compiler flags (-ftz, -fmad, --use_fast_math): fp32 ops
// that the ledger wants flushed are written with .ftz, 16-bit arithmetic is an exact
// fp32 operation followed by one RNE conversion (or a paired 16-bit instruction with
// provably the same correctly rounded result: bf16x2_mul / _add / _sub), and no helper can be
// contracted into an FMA. The reference (python/flash_kda/reference.py) mirrors each helper.
#pragma once
#ifndef FLASH_KDA_ARCH
#error "define FLASH_KDA_ARCH (the arch namespace, e.g. sm90a) before including kda headers"
#endif

#include <cstdint>

#include <cute/arch/copy_sm75.hpp>
#include <cute/arch/copy_sm80.hpp>
#include <cute/arch/copy_sm90_desc.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/arch/mma_sm80.hpp>
#include <cutlass/arch/barrier.h>

#include "kda/params.h"

namespace flash_kda::FLASH_KDA_ARCH {

// ---------------------------------------------------------------- fp32, FTZ (design §3.1)

__device__ __forceinline__ float add_ftz(float a, float b) {
  float d;
  asm("add.rn.ftz.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
}

__device__ __forceinline__ float mul_ftz(float a, float b) {
  float d;
  asm("mul.rn.ftz.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
}

__device__ __forceinline__ float fma_ftz(float a, float b, float c) {
  float d;
  asm("fma.rn.ftz.f32 %0, %1, %2, %3;" : "=f"(d) : "f"(a), "f"(b), "f"(c));
  return d;
}

// EX2(x): MUFU.EX2; results below 2^-126 flush to zero. Required (design §3.5).
__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// RSQ(x): MUFU.RSQ. Required.
__device__ __forceinline__ float rsqrt_approx(float x) {
  float y;
  asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// LG2(x): MUFU.LG2 (lg2.approx.ftz.f32), the softplus gate's logarithm (design §2.5). Required.
__device__ __forceinline__ float lg2_approx(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// min / max of fp32 (FMNMX): where one operand is NaN, the other (IEEE minNum / maxNum).
__device__ __forceinline__ float min_num(float a, float b) {
  float d;
  asm("min.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
}

__device__ __forceinline__ float max_num(float a, float b) {
  float d;
  asm("max.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
}

__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// sig(x) = fma(TANH(x * 0.5), 0.5, 0.5): the "tanh sigmoid" of design §0. Required.
__device__ __forceinline__ float sigmoid_tanh(float x) {
  return fma_ftz(tanh_approx(mul_ftz(x, 0.5f)), 0.5f, 0.5f);
}

// ---------------------------------------------------------------- 16-bit conversions

// f(x): exact widening of a bf16 held in the low 16 bits.
__device__ __forceinline__ float bf16_to_f32(uint32_t bits) {
  return __uint_as_float((bits & 0xffffu) << 16);
}

// bf(x): fp32 -> bf16, round to nearest even.
__device__ __forceinline__ uint32_t f32_to_bf16(float x) {
  uint16_t h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
  return h;
}

// {bf(lo), bf(hi)} packed with lo in the low half (the MMA fragment order).
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  uint32_t d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}

__device__ __forceinline__ float f16_to_f32(uint32_t bits) {
  float x;
  asm("cvt.f32.f16 %0, %1;" : "=f"(x) : "h"(static_cast<uint16_t>(bits & 0xffffu)));
  return x;
}

// hf(x): fp32 -> fp16, round to nearest even.
__device__ __forceinline__ uint32_t f32_to_f16(float x) {
  uint16_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
  return h;
}

__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
  uint32_t d;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}

__device__ __forceinline__ uint32_t lo16(uint32_t x) {
  return x & 0xffffu;
}
__device__ __forceinline__ uint32_t hi16(uint32_t x) {
  return x >> 16;
}

// ---------------------------------------------------------------- 16-bit arithmetic
// a (*) b, a (-) b, a (+) b of design §0: the exact fp32 result rounded once to bf16. The
// fp32 product of two bf16 is exact, and for bf16/fp16 operands an fp32 sum rounded to
// 16 bits equals the singly rounded sum, so these equal HMUL2/HADD2 bit for bit. No FTZ,
// so subnormal products survive exactly as in the reference's fp32 arithmetic.

__device__ __forceinline__ float mul_rn(float a, float b) {
  float d;
  asm("mul.rn.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
}

__device__ __forceinline__ float add_rn(float a, float b) {
  float d;
  asm("add.rn.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
}

__device__ __forceinline__ float sub_rn(float a, float b) {
  float d;
  asm("sub.rn.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
}

__device__ __forceinline__ uint32_t bf16_mul(uint32_t a, uint32_t b) {
  return f32_to_bf16(mul_rn(bf16_to_f32(a), bf16_to_f32(b)));
}

// bf16_mul on both halves at once (HMUL2.BF16, sm_90+): the correctly rounded (RNE) bf16
// product, subnormals kept (mul.bf16x2 has no .ftz). bf16_mul is that same correctly rounded
// product: the fp32 product of two bf16 (8-bit significands) is exact unless its lowest bit
// lies below 2^-149, and then its magnitude is at most 255 * 255 * 2^-150, so even after the
// fp32 rounding (error <= 2^-150) it stays below 2^-134, the smallest bf16 rounding
// boundary: both give the same signed zero. (Checked on the CPU for every pair of finite
// bf16 against the exact product.)
__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// a (+) b and a (-) b on both halves at once (HADD2.BF16, sm_90+). An fp32 sum of two
// bf16 rounded to bf16 is the correctly rounded bf16 sum (fp32's 24-bit significand is
// more than 2 x 8 + 2 bits), which add.rn.bf16x2 returns, subnormals included (no .ftz).
// tests/test_numerics_gpu.py checks these, bf16x2_mul and pack_bf16x2 against the
// per-element forms on every input, NaN payloads included.
__device__ __forceinline__ uint32_t bf16x2_add(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("add.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

__device__ __forceinline__ uint32_t bf16x2_sub(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("sub.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// ---------------------------------------------------------------- tensor-core products
// MMA32 of design §0: mma.sync m16n8k16 bf16 x bf16 + fp32. Fragments follow the PTX
// ISA layout: with g = lane / 4 and c = lane % 4, a[0..3] hold A rows (g, g+8) x column
// pairs (2c, 2c+8); b[0..1] hold B^T row g x column pairs (2c, 2c+8); acc[0..3] hold
// C rows (g, g+8) x columns (2c, 2c+1).

__device__ __forceinline__ void mma_bf16_f32(float (&acc)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
  cute::SM80_16x8x16_F32BF16BF16F32_TN::fma(acc[0], acc[1], acc[2], acc[3], a[0], a[1], a[2], a[3],
                                            b0, b1, acc[0], acc[1], acc[2], acc[3]);
}

// MMA16 of design §0: fp16 x fp16 with an fp16 accumulator, d += A B (one k16 step).
__device__ __forceinline__ void mma_f16_f16(uint32_t (&d)[2], const uint32_t (&a)[4], uint32_t b0,
                                            uint32_t b1) {
  cute::SM80_16x8x16_F16F16F16F16_TN::fma(d[0], d[1], a[0], a[1], a[2], a[3], b0, b1, d[0], d[1]);
}

// Four 8x8 16-bit matrices from shared memory (ldmatrix .x4): lanes 8 m .. 8 m + 7 give the
// row addresses of matrix m; lane l receives, in d[m], the elements (row l / 4; columns
// 2 (l % 4), 2 (l % 4) + 1) of matrix m, i.e. an A fragment (or two B^T fragments) of an
// MMA whose tile is stored row-major.
__device__ __forceinline__ void ldmatrix_x4(const void *smem_row, uint32_t (&d)[4]) {
  cute::SM75_U32x4_LDSM_N::copy(*static_cast<const cute::uint128_t *>(smem_row), d[0], d[1], d[2],
                                d[3]);
}

// Four 8x8 bf16 matrices from shared memory, transposed (ldmatrix .x4 .trans): lanes
// 8 m .. 8 m + 7 give the row addresses of matrix m; lane l receives, in d[m], the
// elements (rows 2 (l % 4), 2 (l % 4) + 1; column l / 4) of matrix m, i.e. the B fragment
// of an MMA32 whose K x N block is stored with rows along K.
__device__ __forceinline__ void ldmatrix_x4_trans(const void *smem_row, uint32_t (&d)[4]) {
  cute::SM75_U16x8_LDSM_T::copy(*static_cast<const cute::uint128_t *>(smem_row), d[0], d[1], d[2],
                                d[3]);
}

// Four 8x8 bf16 matrices to shared memory, transposed (stmatrix .x4 .trans), the inverse of
// ldmatrix_x4_trans: lane l holds, in s[m], the elements (row l / 4; columns 2 (l % 4),
// 2 (l % 4) + 1) of matrix m, and lanes 8 m .. 8 m + 7 give the addresses of its 16-byte
// rows, row r receiving column r of what the lanes hold.
__device__ __forceinline__ void stmatrix_x4_trans(void *smem_row, uint32_t s0, uint32_t s1,
                                                  uint32_t s2, uint32_t s3) {
  cute::SM90_U16x8_STSM_T::copy(s0, s1, s2, s3, *static_cast<cute::uint128_t *>(smem_row));
}

// Transpose of an 8x8 matrix of 16-bit values held one row-pair per lane (MOVM).
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}

// ---------------------------------------------------------------- memory

// A thread's asynchronous copy of 16 bytes from global to shared memory (cp.async, L1
// bypassed), or 16 zero bytes where `valid` is false (nothing is read; `gmem` must still be
// an address of the tensor). Complete after wait_copies().
__device__ __forceinline__ void copy16_or_zero(void *smem, const void *gmem, bool valid) {
  cute::SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>::copy(
      *static_cast<const cute::uint128_t *>(gmem), *static_cast<cute::uint128_t *>(smem), valid);
}

// Waits for the thread's own copy16_or_zero copies (a barrier then publishes them).
__device__ __forceinline__ void wait_copies() {
  cute::cp_async_wait<0>();
}

// One elected thread's bulk copy of `bytes` (a multiple of 16, both addresses 16-byte
// aligned) into shared memory, completing on `bar`'s transaction count.
__device__ __forceinline__ void bulk_copy_g2s(void *smem, const void *gmem, uint32_t bytes,
                                              uint64_t *bar) {
  cute::SM90_BULK_COPY_G2S::copy(gmem, bar, smem, static_cast<int32_t>(bytes));
}

// One elected thread's tensor copy of the box at (c0, .., c4) of the 5-D tensor map `desc`
// (a __grid_constant__ kernel parameter) into shared memory, completing on `bar`.
__device__ __forceinline__ void tensor_copy_g2s(void *smem, const void *desc, int32_t c0,
                                                int32_t c1, int32_t c2, int32_t c3, int32_t c4,
                                                uint64_t *bar) {
  cute::SM90_TMA_LOAD_5D::copy(desc, bar,
                               static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_NORMAL), smem,
                               c0, c1, c2, c3, c4);
}

// One elected thread's tensor copy of the box at (c0, c1) of the 2-D tensor map `desc` (a
// __grid_constant__ kernel parameter) into shared memory, completing on `bar`.
__device__ __forceinline__ void tensor_copy_2d_g2s(void *smem, const void *desc, int32_t c0,
                                                   int32_t c1, uint64_t *bar) {
  cute::SM90_TMA_LOAD_2D::copy(
      desc, bar, static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_NORMAL), smem, c0, c1);
}

// Fetches a tensor map's descriptor (a __grid_constant__ kernel parameter) ahead of its
// first copy, so that the copy does not wait for it: issued before a kernel waits for the
// one before it (wait_prerequisites), whose output the copy reads.
__device__ __forceinline__ void prefetch_descriptor(const void *desc) {
  cute::prefetch_tma_descriptor(static_cast<const cute::TmaDescriptor *>(desc));
}

using TxBarrier = cutlass::arch::ClusterTransactionBarrier;

// ---------------------------------------------------------------- bounded waits
// In a debug build (CMake FLASH_KDA_DEBUG_WAITS=ON, the build the GPU tests run) every wait
// that spins on another thread's progress (a stage's mbarrier, K1's ready flags) gives up
// after a limit (params.h kWaitLimitNs, or the producers' FwdParams::wait_limit_ns) and
// traps: the kernel, and with it the call's stream, ends in an error (cudaErrorLaunchFailure)
// instead of hanging. The clock (%globaltimer, ns) is read only once a first try has failed,
// and then once per retry: each mbarrier try_wait suspends the thread for a while already
// (PTX ISA: a system-dependent time limit), a flag poll sleeps. The bounded mbarrier wait is
// one asm statement, as CUTLASS's unbounded one: as C++ loops the retry and the clock cost
// the link loops 2-32 registers (ptxas, CUDA 13.0). A release build waits unbounded, and its
// kernels carry neither the clock nor the limit.

__device__ __forceinline__ uint32_t shared_address(const void *p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

#ifdef FLASH_KDA_DEBUG_WAITS
__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Traps once `limit_ns` have passed since `start` (0: the first call, which starts the clock).
__device__ __forceinline__ void check_wait(uint64_t &start, uint64_t limit_ns) {
  const uint64_t now = global_ns();
  if (start == 0) start = now;
  if (now - start > limit_ns) __trap();
}

// The mbarrier wait for parity %1 of the barrier at shared address %0, trapping after %2 ns
// (an immediate or a register). The labels are local to the statement's braces.
#define FLASH_KDA_BOUNDED_WAIT                                 \
  "{\n"                                                        \
  ".reg .pred done;\n"                                         \
  ".reg .u64 start, now;\n"                                    \
  "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n" \
  "@done bra WAIT_DONE;\n"                                     \
  "mov.u64 start, %%globaltimer;\n"                            \
  "WAIT_AGAIN:\n"                                              \
  "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n" \
  "@done bra WAIT_DONE;\n"                                     \
  "mov.u64 now, %%globaltimer;\n"                              \
  "sub.u64 now, now, start;\n"                                 \
  "setp.gt.u64 done, now, %2;\n"                               \
  "@done trap;\n"                                              \
  "bra WAIT_AGAIN;\n"                                          \
  "WAIT_DONE:\n"                                               \
  "}\n"

// The consumers' mbarrier wait, bounded by kWaitLimitNs; the "memory" clobber also orders
// the compiler: shared-memory reads of a stage may not move above the wait that makes them
// valid.
__device__ __forceinline__ void barrier_wait(uint64_t *bar, uint32_t phase) {
  asm volatile(FLASH_KDA_BOUNDED_WAIT::"r"(shared_address(bar)), "r"(phase), "n"(kWaitLimitNs)
               : "memory");
}

// The producers' mbarrier wait, bounded by `limit_ns` (FwdParams::wait_limit_ns).
__device__ __forceinline__ void barrier_wait(uint64_t *bar, uint32_t phase, uint64_t limit_ns) {
  asm volatile(FLASH_KDA_BOUNDED_WAIT::"r"(shared_address(bar)), "r"(phase), "l"(limit_ns)
               : "memory");
}
#undef FLASH_KDA_BOUNDED_WAIT
#else
// mbarrier wait that also orders the compiler: shared-memory reads of a stage may not move
// above the wait that makes them valid.
__device__ __forceinline__ void barrier_wait(uint64_t *bar, uint32_t phase) {
  TxBarrier::wait(bar, phase);
  asm volatile("" ::: "memory");
}

// The producers' wait: unbounded in a release build (the limit is the debug build's).
__device__ __forceinline__ void barrier_wait(uint64_t *bar, uint32_t phase, uint64_t) {
  barrier_wait(bar, phase);
}
#endif

// A consumer's release of a stage that the producer refills with bulk copies: a proxy
// fence orders this thread's shared-memory reads of the stage (generic proxy) before the
// copies' writes (async proxy), then the arrive. The arrive alone did not: on the H200,
// with memory-bound kernels of another stream on the same SMs, fragment loads issued just
// before it read part of the next chunk's bytes. The fence's
// "memory" clobber also keeps the compiler's reads above it.
__device__ __forceinline__ void fence_stage_reads() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

__device__ __forceinline__ void release_stage(uint64_t *bar) {
  fence_stage_reads();
  TxBarrier::arrive(bar);
}

// Two stages released with one fence (the first held since its own link).
__device__ __forceinline__ void release_stages(uint64_t *first, uint64_t *second) {
  fence_stage_reads();
  TxBarrier::arrive(first);
  TxBarrier::arrive(second);
}

// CTA barrier `id` (1..15; __syncthreads is barrier 0) over `threads` threads, which may
// reach it at different points of the code: barrier.sync without .aligned (bar.sync is
// the .aligned form, for one program point shared by all warps).
__device__ __forceinline__ void cta_barrier(uint32_t id, uint32_t threads) {
  asm volatile("barrier.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// ---------------------------------------------------------------- K1 / K2 overlap

// design §4.1, §4.7. A kernel lets the next one launch while it still runs (programmatic
// dependent launch: the next kernel is launched once every CTA of this one has executed
// this). Where K1 runs beside the first recurrence pass, that pass never waits for K1's end:
// each record's readiness is then a flag in global memory, set by K1 with release semantics
// after the whole CTA has written the record.
__device__ __forceinline__ void allow_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// The other use of programmatic launch (design §4.1): a kernel that reads what the kernel
// before it writes is launched early, once that kernel's CTAs have all started, so that its
// CTAs take the SMs as they free up and set up (barriers, ring, task) meanwhile; it waits
// here for that kernel's end (and so for every kernel before it) before reading any of its
// output. Returns at once where the launch was not programmatic.
__device__ __forceinline__ void wait_prerequisites() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

__device__ __forceinline__ void publish_flag(uint32_t *flag) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(flag), "r"(1u) : "memory");
}

// A word another CTA may be writing, read without ordering (a flag before its fence, or a
// counter read as a heuristic's input).
__device__ __forceinline__ uint32_t load_relaxed(const uint32_t *p) {
  uint32_t v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// The SM this thread runs on (%smid: below %nsmid, not necessarily dense).
__device__ __forceinline__ uint32_t sm_id() {
  uint32_t id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  return id;
}

// Flags read in one round trip by the producer (wait_ready).
constexpr int kFlagWindow = 8;

// Spins until record c's flag is set, then returns the end of the run of set flags among
// records c .. c + kFlagWindow - 1 (below `end`): those records are written. The window's
// loads are relaxed, so that all of them are in flight at once, and one acquire fence
// after them orders the records' reads (the acquire pattern of the PTX memory model); then
// the generic-proxy writes they made visible are ordered before this thread's later bulk
// copies (async proxy) of the same memory. One acquire load a record put an L2 round trip
// (~0.5 us) on each chunk of the producer, as long as a link at few heads.
// Bounded by `limit_ns` in a debug build (check_wait).
__device__ __forceinline__ int64_t wait_ready(const uint32_t *flags, int64_t c, int64_t end,
                                              uint64_t limit_ns) {
#ifdef FLASH_KDA_DEBUG_WAITS
  for (uint64_t start = 0;; check_wait(start, limit_ns)) {
#else
  (void)limit_ns;
  for (;;) {
#endif
    uint32_t f[kFlagWindow];
#pragma unroll
    for (int i = 0; i < kFlagWindow; ++i) f[i] = c + i < end ? load_relaxed(flags + c + i) : 0u;
    if (f[0] != 0) {
      int64_t ready = c + 1;
#pragma unroll
      for (int i = 1; i < kFlagWindow; ++i)
        if (ready == c + i && f[i] != 0) ready = c + i + 1;
      asm volatile("fence.acq_rel.gpu;" ::: "memory");
      asm volatile("fence.proxy.async.global;" ::: "memory");
      return ready;
    }
    __nanosleep(64);
  }
}

}  // namespace flash_kda::FLASH_KDA_ARCH
