// SPDX-License-Identifier: MIT
// table.h: what each arch TU exports (one ArchTable) and api.cpp walks. Host-only C++.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "kda/params.h"
#include "launches.h"
#include "plan.h"

namespace flash_kda {

// The outcome of a launch sequence: the first failing CUDA call and which stage it was.
struct LaunchStatus {
  cudaError_t error;
  const char *stage;  // e.g. "prepare_kernel launch", nullptr on success
};

struct ArchTable {
  const char *name;            // "sm_90a"
  int32_t compute_capability;  // 90
  uint32_t features;           // FLASH_KDA_FEATURE_* bits
  // A forward's launches, through `sink` (launches.h): the caller's stream, or a graph replay.
  LaunchStatus (*fwd)(const FwdParams &params, LaunchSink &sink);
  // The current device's facts for the plan, under the test switches.
  LaunchStatus (*plan_device)(const TestSwitches &switches, PlanDevice &facts);
  LaunchStatus (*probe_unary)(int op, const float *x, float *y, int64_t count, cudaStream_t stream);
  LaunchStatus (*probe_mma)(int op, const void *a, const void *b, void *c, int64_t batch, int64_t m,
                            int64_t n, int64_t k, cudaStream_t stream);
};

}  // namespace flash_kda

#define FLASH_KDA_CONCAT_(a, b) a##b
#define FLASH_KDA_CONCAT(a, b) FLASH_KDA_CONCAT_(a, b)
// The table symbol of an arch: flash_kda::table_sm90a.
#define FLASH_KDA_TABLE_SYMBOL(arch) FLASH_KDA_CONCAT(table_, arch)
