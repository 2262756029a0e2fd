// SPDX-License-Identifier: MIT
// call_cache.h: the signatures flash_kda_fwd has run before, with what their checks found
// that reads no pointer: the arch table, the stable-inverse choice and the plan on a device.
// A repeated call of one skips check_call, check_tensors, the feature and driver checks, the
// device's facts and the plan, and replays its launches as one graph (replay.h); the checks of
// its pointers (check_pointers, check_workspace) run every call.
// Thread-safe; host-only.
#pragma once

#include <cstdint>

#include <flash_kda/flash_kda.h>

#include "arch/table.h"
#include "args.h"
#include "plan.h"

namespace flash_kda {

struct KnownCall {
  const ArchTable *table;
  int32_t stable_inverse;  // FwdParams::stable_inverse
  Plan plan;
  PointerFacts facts;  // what the checks of its pointers read
  uint64_t id;         // set by remember_call: distinct for each signature remembered (replay.h)
};

// A call's signature: every field of `a` but the workspace, each pointer as whether it is
// NULL (what the checks that read no pointer depend on), with the caller's arch and device.
struct CallSignature {
  flash_kda_fwd_args shape;
  int32_t compute_capability;
  int32_t device;
};

CallSignature signature_of(const flash_kda_fwd_args &a, int32_t compute_capability, int32_t device);

// What a signature's checks found when it last passed them, if it is remembered.
bool known_call(const CallSignature &signature, KnownCall &known);

// Remember a signature that passed every check of flash_kda_fwd that reads no pointer.
void remember_call(const CallSignature &signature, const KnownCall &known);

}  // namespace flash_kda
