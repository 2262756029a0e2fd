// SPDX-License-Identifier: MIT
// replay.h: the launches of a known call (call_cache.h) as one CUDA graph launch
// (docs/dispatch.md, "Replays"). A forward's launch sequence depends on its signature only
// (the kernels, grids and shared memory; the pointers sit in the parameters), so the first
// repeat of a signature on a stream records the sequence as a graph, and each later call
// sets the graph's node parameters to its own and launches it: one graph launch and a
// parameter update per kernel cost less host time than the kernel launches. Thread-safe;
// host-only.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "arch/table.h"

namespace flash_kda {

// Runs `table.fwd(params)` for the known call `call` (KnownCall::id) on `stream`: replays
// the graph of the call's signature on this stream and device, recording it at the first
// such call; kernel by kernel on the stream where the stream is capturing a graph of the
// caller's, where replays are off, or where a graph cannot be recorded or replayed (nothing
// of the call has launched then).
LaunchStatus launch_known(uint64_t call, const ArchTable &table, const FwdParams &params,
                          cudaStream_t stream);

// The calls launch_known has replayed since the library was loaded.
int64_t replayed_calls();

// Turns replays on (the default) or off; returns the previous setting.
bool set_replays(bool on);

}  // namespace flash_kda
