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

#define FLASH_KDA_TESTING_VERSION 2 /* 2: unvalidated_forms, stable_inverse */

#ifdef __cplusplus
extern "C" {
#endif

/* Forced parts of the plan, and kernels not yet enabled by default; 0 everywhere = the
 * library's own plan and kernels. */
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
} flash_kda_testing_overrides;

FLASH_KDA_API int32_t flash_kda_testing_version(void) FLASH_KDA_NOEXCEPT;

/* flash_kda_fwd_plan with `overrides` (NULL: none). */
FLASH_KDA_API flash_kda_status
flash_kda_testing_plan(const flash_kda_fwd_args *args, const flash_kda_testing_overrides *overrides,
                       flash_kda_fwd_plan_info *plan) FLASH_KDA_NOEXCEPT;

/* flash_kda_fwd with `overrides` (NULL: none); the workspace must hold what
 * flash_kda_testing_plan gives for the same overrides. */
FLASH_KDA_API flash_kda_status flash_kda_testing_fwd(int32_t compute_capability,
                                                     const flash_kda_fwd_args *args,
                                                     const flash_kda_testing_overrides *overrides,
                                                     void *stream) FLASH_KDA_NOEXCEPT;

#ifdef __cplusplus
}
#endif

#endif /* FLASH_KDA_FLASH_KDA_TESTING_H_ */
