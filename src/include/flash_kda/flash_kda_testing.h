/* SPDX-License-Identifier: MIT */
/*
 * flash_kda_testing.h: entry points for tests and benchmarks, outside the stable ABI of
 * flash_kda.h. They run the same checks, plan and launches as flash_kda_fwd_plan and
 * flash_kda_fwd, with parts of the plan forced (flash_kda_testing_overrides). Results never
 * depend on an override in EXACT mode (every plan gives FlashKDA's bits); in AUTO mode the
 * overrides pick among the plans the library could choose itself. unvalidated_forms and
 * stable_inverse reach kernels that an arch table does not enable yet (flash_kda.h features).
 *
 * Versioning: FLASH_KDA_TESTING_VERSION changes with any signature here; it is independent
 * of FLASH_KDA_ABI_VERSION. flash_kda_testing_overrides is append-only and starts with its
 * own size: the library reads only the caller's prefix (later fields read as 0, "the plan
 * decides") and refuses a struct larger than its own (an override it does not know).
 */
#ifndef FLASH_KDA_FLASH_KDA_TESTING_H_
#define FLASH_KDA_FLASH_KDA_TESTING_H_

#include <flash_kda/flash_kda.h>

#define FLASH_KDA_TESTING_VERSION 6 /* 2: unvalidated_forms, stable_inverse; 3: every arch's
                                     * code path on the GPU at hand; 4: launch names of 96 bytes;
                                     * 5: graph replays; 6: the unbounded gates' K1 fits */

#ifdef __cplusplus
extern "C" {
#endif

/* What one call launched, kernel by kernel (flash_kda_testing_overrides.launches). */
#define FLASH_KDA_TESTING_MAX_LAUNCHES 8
typedef struct flash_kda_testing_launch {
  char name[96];    /* the instantiation as the source names it: "recurrence_kernel<1, 8,
                     * kGeneral, 1>", "prepare_overlap_kernel<1, RecordOrder::kFragments,
                     * K1Variant::kUnbounded, K1Place::kLeaving>" (the longest, 92 bytes) */
  int32_t kind;     /* 1 prefix, 2 K1 first, 3 K1 beside or leaving the pass, 4 recurrence
                     * pass (mma.sync), 5 warpgroup pass, 6 combine */
  int32_t code;     /* passes: the PassCode (0 plain, 1 general, 2 states, 3 rerun); K1
                     * beside: 1 for the grid on the SMs the pass leaves free; K1 first: 1
                     * for the lead grid of K1 leaving the pass's SMs */
  int32_t blocks;   /* 16-token blocks a chunk: 1 or 2 */
  int32_t width;    /* passes: block_v; the combine: rows per CTA */
  int32_t stages;   /* ring depth (passes, the combine) */
  int32_t resident; /* CTAs per SM: the pass's instantiation, K1's kept beside the pass */
  int32_t smem;     /* dynamic shared memory as launched, bytes (padded under simulated limits) */
  int32_t order;    /* records' order: 0 fragment order, 1 tile order (sm_90a's warpgroup) */
  int64_t ctas;
} flash_kda_testing_launch;

typedef struct flash_kda_testing_launches {
  int32_t count; /* kernels recorded (at most FLASH_KDA_TESTING_MAX_LAUNCHES) */
  int32_t reserved;
  flash_kda_testing_launch kernels[FLASH_KDA_TESTING_MAX_LAUNCHES];
} flash_kda_testing_launches;

/* Devices the plan can be evaluated for without a GPU (flash_kda_testing_overrides.device):
 * the facts an H200 reports, by itself, running the other arches' passes (generic; sm_100's
 * limits are the H200's) and with sm_120's limits simulated. */
typedef enum flash_kda_testing_device_id {
  FLASH_KDA_TESTING_DEVICE_CURRENT = 0, /* the current CUDA device */
  FLASH_KDA_TESTING_DEVICE_H200 = 1,
  FLASH_KDA_TESTING_DEVICE_SM100 = 2,
  FLASH_KDA_TESTING_DEVICE_SM120 = 3
} flash_kda_testing_device_id;

/* What the plan knows of a device (flash_kda_testing_device_facts). [b]: records of b + 1
 * 16-token blocks; [w]: block_v 32, 64, 128. */
typedef struct flash_kda_testing_device {
  uint32_t struct_size;       /* sizeof(flash_kda_testing_device) */
  int32_t compute_capability; /* picks the plan's cost table */
  int32_t generic_passes;     /* every pass on recurrence_kernel (not sm_90a's warpgroup) */
  int32_t sms;                /* SMs the plan spreads the work over */
  int32_t smem_optin;         /* shared memory per block (opt-in) and per SM, bytes */
  int32_t smem_sm;
  int32_t threads_sm;
  int32_t regs_sm;
  int32_t k1_alone[2];     /* prepare_kernel CTAs an SM by itself */
  int32_t k1_overlap[2];   /* prepare_overlap_kernel CTAs an SM by itself */
  int32_t k1_beside[2][3]; /* prepare_overlap_kernel CTAs beside one whole-pass CTA */
  int32_t k1_beside_unbounded[2][3]; /* the same for the unbounded gates' K1 */
  int32_t combine_wide;              /* 16-row combine CTAs fit (two stages) */
} flash_kda_testing_device;

/* Forced parts of the plan, kernels not yet enabled by default, and test switches; 0
 * everywhere = the library's own plan and kernels. */
typedef struct flash_kda_testing_overrides {
  uint32_t struct_size;   /* sizeof(flash_kda_testing_overrides) of the caller's header */
  int32_t block_v;        /* value columns per recurrence CTA: 0 = pick, or 32 / 64 / 128 */
  int32_t segment_chunks; /* AUTO mode: > 0 forces segments of this many 16-token chunks */
  int32_t overlap;        /* K1 beside the first recurrence pass (design §4.7): 1 = wherever
                           * it can run (leaving the pass's SMs where no K1 CTA fits beside
                           * it), 2 = K1 leaving the pass's SMs wherever the pass leaves some
                           * free, -1 = never; no result changes */
  int32_t chunk_tokens;   /* 16 or 32 tokens per chunk (32: AUTO mode, no segment_chunks,
                           * block_v 32 or 64); AUTO results with 32-token chunks are not
                           * bitwise equal to EXACT's (docs/design.md §4.8) */
  /* ---- version 2 ---- */
  int32_t unvalidated_forms; /* 1: run the gate and beta forms on a table without
                              * FLASH_KDA_FEATURE_GATE_FORMS (kernels not yet validated there) */
  int32_t stable_inverse;    /* AUTO mode's stable inverse (design §2.6): 1 = on, -1 = off,
                              * 0 = as the table's FLASH_KDA_FEATURE_STABLE_INVERSE says */
  /* ---- version 3: every arch's code path on the GPU at hand ---- */
  int32_t generic_passes; /* 1: the other arches' passes: recurrence_kernel everywhere,
                           * records in fragment order (sm_90a's warpgroup passes off) */
  int32_t sim_sms;        /* > 0: the plan spreads the work over this many SMs, the launch over
                           * at most the device's (more are never resident at once) */
  int32_t sim_smem_optin; /* > 0: a smaller device's limits, bytes (the shared memory per block  */
  int32_t sim_smem_sm;    /* opt-in and per SM), threads and registers per SM, K1 CTAs per SM: */
  int32_t sim_threads_sm; /* the launch code and the plan take them, and every launch asks for */
  int32_t sim_regs_sm;    /* shared memory scaled so that this GPU holds at once the CTAs the */
  int32_t sim_k1_ctas_sm; /* smaller one would */
  int32_t stall;          /* 1: CTA 0 of the first recurrence pass never arms its first stage:
                           * a hang that the bounded waits end with a trap, which poisons the
                           * CUDA context (run it in a process of its own). Only in a library
                           * built with FLASH_KDA_DEBUG_WAITS=ON; refused by others */
  int32_t device;         /* flash_kda_testing_plan, flash_kda_testing_device_facts: a
                           * flash_kda_testing_device_id, planned without asking the GPU (with
                           * sim_sms, or args->num_sms, SMs) */
  int64_t wait_limit_ns;  /* > 0: the producers' bounded waits trap after this long (default
                           * 60 s; the consumers' keep it); a release build's waits are
                           * unbounded and ignore it */
  flash_kda_testing_launches *launches; /* flash_kda_testing_fwd: filled with what the call
                                         * launched, or NULL */
} flash_kda_testing_overrides;

FLASH_KDA_API int32_t flash_kda_testing_version(void) FLASH_KDA_NOEXCEPT;

/* flash_kda_fwd_plan with `overrides` (NULL: none); with overrides->device, the plan on that
 * reference device (no GPU asked; compute_capability is not read). */
FLASH_KDA_API flash_kda_status flash_kda_testing_plan(
    int32_t compute_capability, const flash_kda_fwd_args *args,
    const flash_kda_testing_overrides *overrides, flash_kda_fwd_plan_info *plan) FLASH_KDA_NOEXCEPT;

/* The facts the plan takes: of the current device under the overrides' switches (through the
 * table for compute_capability), or of the reference device overrides->device. */
FLASH_KDA_API flash_kda_status flash_kda_testing_device_facts(
    int32_t compute_capability, const flash_kda_testing_overrides *overrides,
    flash_kda_testing_device *facts) FLASH_KDA_NOEXCEPT;

/* flash_kda_fwd with `overrides` (NULL: none); the workspace must hold what
 * flash_kda_testing_plan gives for the same overrides. */
FLASH_KDA_API flash_kda_status flash_kda_testing_fwd(int32_t compute_capability,
                                                     const flash_kda_fwd_args *args,
                                                     const flash_kda_testing_overrides *overrides,
                                                     void *stream) FLASH_KDA_NOEXCEPT;

/* The calls of flash_kda_fwd launched as one CUDA graph (a repeated signature's launches,
 * recorded at its first repeat on a stream) since the library was loaded. */
FLASH_KDA_API int64_t flash_kda_testing_replays(void) FLASH_KDA_NOEXCEPT;

/* 1 (the default): flash_kda_fwd replays a repeated signature's graph; 0: it launches every
 * call kernel by kernel. Returns the previous setting. */
FLASH_KDA_API int32_t flash_kda_testing_set_replays(int32_t on) FLASH_KDA_NOEXCEPT;

#ifdef __cplusplus
}
#endif

#endif /* FLASH_KDA_FLASH_KDA_TESTING_H_ */
