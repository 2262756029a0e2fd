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
 * layout or meaning. Enums are append-only. Argument structs start with their own size, so
 * a later version can append fields and still read an older caller's struct. Test and
 * benchmark knobs are not part of this ABI: flash_kda_testing.h has its own entry points
 * and version.
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

#define FLASH_KDA_ABI_VERSION 8

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

/* Element types of tensors passed by pointer (append-only). */
typedef enum flash_kda_dtype {
  FLASH_KDA_DTYPE_NONE = 0,
  FLASH_KDA_DTYPE_BF16 = 1,
  FLASH_KDA_DTYPE_FP32 = 2,
  FLASH_KDA_DTYPE_INT32 = 3,
  FLASH_KDA_DTYPE_INT64 = 4
} flash_kda_dtype;

/* How the forward may split the serial chunk chain (flash_kda_fwd_args.mode). */
typedef enum flash_kda_mode {
  /* One chain per (sequence, head): out and final_state are bitwise equal to the
   * precision ledger (docs/design.md §3), i.e. to FlashKDA. The ABI 1 behaviour. */
  FLASH_KDA_MODE_EXACT = 0,
  /* The library may split long sequences into segments whose start states it combines
   * in fp32 (docs/design.md §6) when its cost model predicts
   * that is faster; deterministic, within the accuracy contract, not bit-exact. */
  FLASH_KDA_MODE_AUTO = 1
} flash_kda_mode;

/* The decay gate's form (flash_kda_fwd_args.gate, append-only; docs/design.md §2.2, §2.5). */
typedef enum flash_kda_gate {
  /* lower_bound * sigmoid(exp(A_log) * (g + dt_bias)), lower_bound in [-5, 0]: FlashKDA's
   * bounded gate (the only gate before ABI 7) */
  FLASH_KDA_GATE_LOWER_BOUND = 0,
  /* -exp(A_log) * softplus(g + dt_bias): Kimi-Linear's unbounded gate; lower_bound unused */
  FLASH_KDA_GATE_SOFTPLUS = 1,
  /* g is the per-channel natural-log decay itself (<= 0; a larger value or NaN counts as 0,
   * -inf decays fully); A_log and dt_bias must be NULL, lower_bound unused */
  FLASH_KDA_GATE_LOG_DECAY = 2
} flash_kda_gate;

/* What beta holds (flash_kda_fwd_args.beta_form, append-only). */
typedef enum flash_kda_beta {
  FLASH_KDA_BETA_LOGIT = 0,      /* raw logits, sigmoid applied inside (as before ABI 7) */
  FLASH_KDA_BETA_PROBABILITY = 1 /* the write strength itself, clamped to [0, 1] (NaN: 0) */
} flash_kda_beta;

/* Bits of flash_kda_arch_desc.features. The kernels of the last two are built for every arch;
 * a table enables them once they have been validated on that arch's GPU. Without GATE_FORMS,
 * flash_kda_fwd refuses any gate or beta form but the default (LOWER_BOUND, bf16 LOGIT) with
 * FLASH_KDA_UNSUPPORTED_DEVICE; without STABLE_INVERSE, AUTO mode keeps FlashKDA's fp16
 * inverse (flash_kda_testing.h reaches both). */
#define FLASH_KDA_FEATURE_FWD 1u            /* the KDA forward (prepare + recurrence) */
#define FLASH_KDA_FEATURE_PROBES 2u         /* single-instruction probes for the reference */
#define FLASH_KDA_FEATURE_GATE_FORMS 4u     /* every flash_kda_gate, flash_kda_beta, fp32 g / beta */
#define FLASH_KDA_FEATURE_STABLE_INVERSE 8u /* AUTO mode: each chunk's inverse checked, an
                                             * unsound one recomputed in fp32 (design §2.6) */

typedef struct flash_kda_arch_desc {
  const char *name;           /* "sm_90a" */
  int32_t compute_capability; /* 10 * major + minor: 90 */
  uint32_t features;          /* FLASH_KDA_FEATURE_* */
} flash_kda_arch_desc;

/* Element strides of an activation [B, T, H, 128] (the last dimension has stride 1) or of
 * beta [B, T, H]. All three zero means contiguous. Activation strides must be multiples
 * of 8 elements (16 bytes); beta's are any positive values. */
typedef struct flash_kda_strides {
  int64_t batch;
  int64_t token;
  int64_t head;
} flash_kda_strides;

/*
 * Arguments of one forward call (docs/api.md). Activations q, k, v, g, out are bf16
 * [B, T, H, 128] with the strides below (g may be fp32, see g_dtype); beta bf16 or fp32
 * [B, T, H]; A_log fp32 [H]; dt_bias fp32 [H, 128] contiguous (both NULL with
 * GATE_LOG_DECAY). States are contiguous bf16 or fp32 [S, H, 128 (V), 128 (K)]
 * (V-first) with S = num_seqs, or S = state_pool_size when state_indices is given.
 * cu_seqlens [N + 1] (int64 or int32, on the device) or NULL for batched mode (N = B).
 * Every tensor pointer must be 16-byte aligned (beta: 2-byte, 4-byte when fp32; cu_seqlens
 * and state_indices 8-byte). No output (out, final_state, checkpoints, workspace) may overlap
 * another argument's bytes, except final_state == initial_state (in place).
 *
 * A call may hold no tokens (batch or seqlen 0) or no sequences (num_seqs 0): it writes
 * each sequence's final state as its start state (the initial state rounded to bf16 like
 * any state, zero without one or where has_initial_state is 0) and nothing else; pointers
 * of tensors without elements may be NULL, and such a call needs no workspace.
 *
 * Fields after `reserved` are ABI 2. A caller built against an older header passes a
 * smaller struct_size: the library reads only that prefix and takes the later fields
 * as zero (contiguous strides, no pool, no checkpoints, exact mode), never reading past
 * struct_size bytes.
 *
 * ABI 6: the plan overrides of ABI 1-5 (block_v, segment_chunks, overlap, chunk_tokens)
 * left this struct for flash_kda_testing_overrides (flash_kda_testing.h). Their slots stay,
 * named reserved0 .. reserved3, and must be 0: a caller of ABI 2-5 that left them 0 runs
 * unchanged; one that set them gets FLASH_KDA_INVALID_ARGUMENT rather than a silently
 * ignored request. ABI 6 also added the overlap check above and calls without tokens.
 *
 * ABI 7: the gate and beta forms (gate, g_dtype, beta_form, beta_dtype after max_seqlen), the
 * feature bits GATE_FORMS and STABLE_INVERSE and the probe LG2.
 *
 * ABI 8: flash_kda_fwd_plan takes the compute capability, and plans for the current
 * device's facts through that arch's table.
 */
typedef struct flash_kda_fwd_args {
  uint32_t struct_size; /* sizeof(flash_kda_fwd_args) of the caller's header */
  int32_t reserved0;    /* 0 (ABI 1-5: block_v) */
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
  double lower_bound; /* in [-5, 0] with GATE_LOWER_BOUND; unused by the other gates */
  const void *initial_state;
  void *final_state;           /* may be initial_state itself (in place) */
  int32_t initial_state_dtype; /* flash_kda_dtype: NONE, BF16 or FP32 */
  int32_t final_state_dtype;   /* flash_kda_dtype: NONE, BF16 or FP32 */
  const void *cu_seqlens;      /* int64 (ABI 1) or int32, see cu_seqlens_dtype */
  void *workspace;
  int64_t workspace_bytes;
  int32_t num_sms; /* multiprocessors the plan spreads the work over (the device's), >= 1 */
  int32_t reserved;
  /* ---- ABI 2 ---- */
  flash_kda_strides q_strides;
  flash_kda_strides k_strides;
  flash_kda_strides v_strides;
  flash_kda_strides g_strides;
  flash_kda_strides out_strides;
  flash_kda_strides beta_strides;
  int32_t cu_seqlens_dtype;    /* NONE (= INT64), INT64 or INT32 */
  int32_t state_indices_dtype; /* NONE (no pool), INT32 or INT64 */
  /* [N] pool slot of each sequence: it reads initial_state[slot] and writes
   * final_state[slot]; a negative slot is padding (starts from zero, writes no state).
   * Slots >= state_pool_size are treated as padding too (they cannot be checked on the
   * host without a synchronisation). Non-negative slots must be distinct. */
  const void *state_indices;
  int64_t state_pool_size;          /* S of the pool tensors when state_indices is given */
  const uint8_t *has_initial_state; /* [N] bool or NULL: 0 starts that sequence from zero */
  /* State after every checkpoint_every tokens of each sequence, V-first like final_state:
   * sequence i owns slots [first_i, first_i + floor(len_i / checkpoint_every)), first_i
   * the sum of floor(len_j / checkpoint_every) over j < i; slot first_i + m holds the state
   * after (m + 1) * checkpoint_every tokens. Slots >= checkpoint_slots are not written. */
  void *checkpoints;
  int32_t checkpoints_dtype; /* NONE, BF16 or FP32 */
  int32_t checkpoint_every;  /* tokens, a positive multiple of 16, when checkpoints != NULL */
  int64_t checkpoint_slots;  /* first dimension of checkpoints [slots, H, 128, 128] */
  int32_t mode;              /* flash_kda_mode */
  int32_t reserved1;         /* 0 (ABI 2-5: segment_chunks) */
  /* ---- ABI 3 ---- */
  int32_t reserved2; /* 0 (ABI 3-5: overlap) */
  /* ---- ABI 4 ---- */
  int32_t reserved3; /* 0 (ABI 4-5: chunk_tokens) */
  /* ---- ABI 5: a caller may pass the ABI 4 size, without this field ---- */
  int32_t max_seqlen; /* varlen mode: the longest sequence's tokens, a hint for the plan,
                       * in [0, seqlen] (0 = unknown: the plan takes the mean length; the
                       * lengths live on the device). The call is correct whatever it is;
                       * only AUTO mode's plan (speed and bits) follows it. Ignored in EXACT
                       * and in batched mode */
  /* ---- ABI 7: a caller may pass the ABI 6 size, without these fields (lower_bound gate,
   * bf16 g, bf16 beta logits) ---- */
  int32_t reserved4;  /* ABI 6's tail padding: ignored */
  int32_t gate;       /* flash_kda_gate; the plan reads it (unbounded gates: 16-token chunks) */
  int32_t g_dtype;    /* NONE (= BF16) or BF16; FP32 with GATE_LOG_DECAY. g's strides are in its
                       * elements and must be multiples of 16 bytes */
  int32_t beta_form;  /* flash_kda_beta */
  int32_t beta_dtype; /* NONE (= BF16), BF16 or FP32 (4-byte aligned); either beta_form */
} flash_kda_fwd_args;

/* What flash_kda_fwd will run for some arguments (flash_kda_fwd_plan). */
typedef struct flash_kda_fwd_plan_info {
  uint32_t struct_size;    /* sizeof(flash_kda_fwd_plan_info) */
  int32_t block_v;         /* value columns per CTA of the chunk chain */
  int32_t segment_chunks;  /* 0: one chain per sequence (bit-exact); else chunks per segment */
  int32_t segment_block_v; /* value columns per CTA of the segment pass (segmented only) */
  int64_t max_segments;    /* segments the grids are sized for (0 when not segmented) */
  int64_t workspace_bytes; /* bytes flash_kda_fwd needs in args->workspace */
  /* ---- ABI 3 ---- */
  int32_t overlap_min_ctas; /* K1 beside the first recurrence pass when the device leaves
                             * room for this many K1 CTAs per SM there; 0 = never */
  int32_t overlap_max_ctas; /* K1 CTAs per SM kept beside the pass at its start (at most
                             * what fits); more fill the SMs it leaves free once it runs.
                             * 0 with overlap_min_ctas > 0: K1 starts on every SM and leaves
                             * those the pass starts on (overlap_lead).
                             * (Named `reserved` and 0 before this field existed.) */
  /* ---- ABI 4: a caller may pass the ABI 3 size, without these fields ---- */
  int32_t chunk_tokens; /* tokens per chunk of the call: 16 or 32 */
  int32_t overlap_lead; /* K1 leaving the pass's SMs (overlap_max_ctas 0): records K1
                         * writes on every SM before it leaves them (named reserved4, and
                         * 0, before this field existed) */
} flash_kda_fwd_plan_info;

/* Single-instruction probes: the reference calls them to reproduce the exact
 * approximate instructions the kernels use (design §3.7). */
typedef enum flash_kda_probe_unary {
  FLASH_KDA_PROBE_EX2 = 0,     /* ex2.approx.ftz.f32 */
  FLASH_KDA_PROBE_SIGMOID = 1, /* fma(tanh.approx(x * 0.5), 0.5, 0.5), FTZ */
  FLASH_KDA_PROBE_RSQRT = 2,   /* rsqrt.approx.ftz.f32 */
  FLASH_KDA_PROBE_LG2 = 3      /* lg2.approx.ftz.f32 (ABI 7) */
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

/* CUDA versions as 1000 * major + 10 * minor: the runtime the library was built with
 * (linked statically) and the driver's (0 when no driver is installed). A driver whose
 * major version is below the runtime's cannot run the kernels. */
FLASH_KDA_API flash_kda_status flash_kda_cuda_versions(int32_t *runtime_version,
                                                       int32_t *driver_version) FLASH_KDA_NOEXCEPT;

/* Bytes of one (head, chunk) record that K1 writes and K2 reads (docs/design.md §4.3). */
FLASH_KDA_API int64_t flash_kda_record_bytes(void) FLASH_KDA_NOEXCEPT;

/* Bytes of workspace of an exact-mode call with total_tokens = B * T, heads and num_seqs
 * (FlashKDA's get_workspace_size); pure, -1 on invalid or too large sizes. */
FLASH_KDA_API int64_t flash_kda_workspace_size(int64_t total_tokens, int64_t heads,
                                               int64_t num_seqs) FLASH_KDA_NOEXCEPT;

/* The narrowest block_v whose CTAs for N * H (sequence, head) pairs fit one wave on num_sms
   multiprocessors: where the forward's plan starts; it may take a wider whole-sequence pass
   where its cost model predicts the call faster (flash_kda_fwd_plan gives a call's own). */
FLASH_KDA_API int32_t flash_kda_pick_block_v(int64_t num_seqs, int64_t heads,
                                             int32_t num_sms) FLASH_KDA_NOEXCEPT;

/* The plan of flash_kda_fwd for these arguments on the current CUDA device, which must be
 * the one the call will run on: only sizes, mode, num_sms, checkpoint_every, max_seqlen, gate
 * and whether cu_seqlens is NULL are read (no memory behind a pointer), so a caller can size
 * the workspace first, and the facts of the device (its shared memory, K1's CTAs an SM beside
 * each pass), asked once per device through the table for `compute_capability` (ABI 8: the
 * plan follows the device, not num_sms alone). The same arguments on the same device always
 * give the same plan (remembered, so a repeated call costs a lookup). */
FLASH_KDA_API flash_kda_status flash_kda_fwd_plan(int32_t compute_capability,
                                                  const flash_kda_fwd_args *args,
                                                  flash_kda_fwd_plan_info *plan) FLASH_KDA_NOEXCEPT;

/* The forward on `stream` with the kernels of the table for `compute_capability`. Every
 * check runs before anything is launched; those that read no pointer run once for each
 * signature (every field but the pointers and the workspace, on one device), whose plan is
 * remembered with them. */
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
