// SPDX-License-Identifier: MIT
// plan_cache.h: make_plan's results remembered per plan input, so that a repeated call costs
// a lookup instead of the cost model (1-8 us on the CPU). Thread-safe; host-only.
#pragma once

#include <string>

#include "plan.h"

namespace flash_kda {

// make_plan(sizes, request, device, plan) for sizes that passed check_sizes, remembered by
// every field of the three: "" or why there is no plan (a refusal is not remembered).
std::string cached_plan(const ProblemSizes &sizes, const PlanRequest &request,
                        const PlanDevice &device, Plan &plan);

}  // namespace flash_kda
