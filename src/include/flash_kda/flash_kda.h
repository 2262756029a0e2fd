/* SPDX-License-Identifier: MIT */
/*
 * flash_kda.h: the C ABI of libflash_kda, the only symbols the library exports.
 *
 * Valid C99 and C++. The library never allocates device memory, never synchronises,
 * never changes the current device and never prints: the caller passes a workspace
 * (flash_kda_workspace_size bytes) and a stream (a cudaStream_t, passed as void *).
 * Every call that can fail returns a flash_kda_status; flash_kda_last_error() then
 * holds a message for the calling thread, valid until that thread's next call.
 *
 * Versioning: FLASH_KDA_ABI_VERSION changes with any signature, enum value or struct
 * layout. Enums are append-only. Argument structs start with their own size, so a
 * later version can append fields and still read an older caller's struct.
 */
#ifndef FLASH_KDA_FLASH_KDA_H_
#define FLASH_KDA_FLASH_KDA_H_

#include <stddef.h>
#include <stdint.h>

#if defined(FLASH_KDA_BUILDING_LIBRARY)
#define FLASH_KDA_API __attribute__((visibility("default")))
#else
#define FLASH_KDA_API
#endif

#ifdef __cplusplus
#define FLASH_KDA_NOEXCEPT noexcept
#else
#define FLASH_KDA_NOEXCEPT
#endif

#define FLASH_KDA_ABI_VERSION 1

#ifdef __cplusplus
extern "C" {
#endif

typedef enum flash_kda_status {
  FLASH_KDA_OK = 0,
  FLASH_KDA_INVALID_ARGUMENT = 1,
  FLASH_KDA_UNSUPPORTED_DEVICE = 2,
  FLASH_KDA_CUDA_ERROR = 3,
  FLASH_KDA_INTERNAL = 4
} flash_kda_status;

typedef enum flash_kda_dtype {
  FLASH_KDA_DTYPE_NONE = 0,
  FLASH_KDA_DTYPE_BF16 = 1,
  FLASH_KDA_DTYPE_FP32 = 2
} flash_kda_dtype;

/* Bits of flash_kda_arch_desc.features. */
#define FLASH_KDA_FEATURE_FWD 1u    /* the KDA forward (prepare + recurrence) */
#define FLASH_KDA_FEATURE_PROBES 2u /* single-instruction probes for the reference */

typedef struct flash_kda_arch_desc {
  const char *name;           /* "sm_90a" */
  int32_t compute_capability; /* 10 * major + minor: 90 */
  uint32_t features;          /* FLASH_KDA_FEATURE_* */
} flash_kda_arch_desc;

/*
 * Arguments of one forward call (spec section 1). Activations are contiguous
 * token-major [B, T, H, 128] bf16; beta [B, T, H] bf16; A_log [H] fp32;
 * dt_bias [H, 128] fp32; states [N, H, 128 (V), 128 (K)] bf16 or fp32 (V-first);
 * cu_seqlens [N + 1] int64 on the device, or NULL for batched mode (N = B).
 * Every device pointer must be 16-byte aligned.
 */
typedef struct flash_kda_fwd_args {
  uint32_t struct_size; /* sizeof(flash_kda_fwd_args) */
  int32_t block_v;      /* value columns per recurrence CTA: 0 = pick, or 32 / 64 / 128 */
  int64_t batch;        /* B */
  int64_t seqlen;       /* T */
  int64_t heads;        /* H */
  int64_t head_dim;     /* D, must be 128 */
  int64_t num_seqs;     /* N: B in batched mode, numel(cu_seqlens) - 1 in varlen mode */
  const void *q;
  const void *k;
  const void *v;
  const void *g;
  const void *beta;
  void *out;
  const float *A_log;
  const float *dt_bias;
  double scale;
  double lower_bound;
  const void *initial_state;
  void *final_state;
  int32_t initial_state_dtype; /* flash_kda_dtype */
  int32_t final_state_dtype;   /* flash_kda_dtype */
  const int64_t *cu_seqlens;
  void *workspace;
  int64_t workspace_bytes;
  int32_t num_sms; /* multiprocessors of the device, for the choice of block_v */
  int32_t reserved;
} flash_kda_fwd_args;

/* Single-instruction probes: the reference calls them to reproduce the exact
 * approximate instructions the kernels use (spec section 3.7). */
typedef enum flash_kda_probe_unary {
  FLASH_KDA_PROBE_EX2 = 0,     /* ex2.approx.ftz.f32 */
  FLASH_KDA_PROBE_SIGMOID = 1, /* fma(tanh.approx(x * 0.5), 0.5, 0.5), FTZ */
  FLASH_KDA_PROBE_RSQRT = 2    /* rsqrt.approx.ftz.f32 */
} flash_kda_probe_unary;

typedef enum flash_kda_probe_mma {
  FLASH_KDA_PROBE_MMA_BF16_F32 = 0, /* m16n8k16 bf16 x bf16 -> fp32 accumulate */
  FLASH_KDA_PROBE_MMA_F16_F16 = 1   /* m16n8k16 fp16 x fp16 -> fp16 accumulate */
} flash_kda_probe_mma;

FLASH_KDA_API int32_t flash_kda_abi_version(void) FLASH_KDA_NOEXCEPT;

FLASH_KDA_API const char *flash_kda_last_error(void) FLASH_KDA_NOEXCEPT;

FLASH_KDA_API int32_t flash_kda_num_archs(void) FLASH_KDA_NOEXCEPT;

FLASH_KDA_API flash_kda_status flash_kda_arch_info(int32_t index,
                                                   flash_kda_arch_desc *info) FLASH_KDA_NOEXCEPT;

/* Bytes of workspace for one forward call; pure, -1 on invalid sizes. */
FLASH_KDA_API int64_t flash_kda_workspace_size(int64_t total_tokens, int64_t heads,
                                               int64_t num_seqs) FLASH_KDA_NOEXCEPT;

/* block_v the forward picks for N * H (sequence, head) pairs on num_sms multiprocessors. */
FLASH_KDA_API int32_t flash_kda_pick_block_v(int64_t num_seqs, int64_t heads,
                                             int32_t num_sms) FLASH_KDA_NOEXCEPT;

/* The forward on `stream` with the kernels of the table for `compute_capability`. */
FLASH_KDA_API flash_kda_status flash_kda_fwd(int32_t compute_capability,
                                             const flash_kda_fwd_args *args,
                                             void *stream) FLASH_KDA_NOEXCEPT;

/* y[i] = op(x[i]) for `count` fp32 values. */
FLASH_KDA_API flash_kda_status flash_kda_probe_unary_op(int32_t compute_capability, int32_t op,
                                                        const float *x, float *y, int64_t count,
                                                        void *stream) FLASH_KDA_NOEXCEPT;

/* C[b][i][j] = sum_k A[b][i][k] * B[b][j][k] ("TN"), one m16n8k16 chain per 16x8 tile of C,
 * zero initial accumulator, k-blocks of 16 in ascending order. A: [batch, m, k], B:
 * [batch, n, k], C: [batch, m, n], contiguous; m % 16 == 0, n % 8 == 0, k % 16 == 0.
 * Inputs and outputs are bf16/bf16/fp32 or fp16/fp16/fp16 by `op`. */
FLASH_KDA_API flash_kda_status flash_kda_probe_mma_op(int32_t compute_capability, int32_t op,
                                                      const void *a, const void *b, void *c,
                                                      int64_t batch, int64_t m, int64_t n,
                                                      int64_t k, void *stream) FLASH_KDA_NOEXCEPT;

#ifdef __cplusplus
}
#endif

#endif /* FLASH_KDA_FLASH_KDA_H_ */
