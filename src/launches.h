// SPDX-License-Identifier: MIT
// launches.h: where the launches of one forward go. launch.cuh issues a call's memsets and
// kernels through a LaunchSink in order; this one puts them on the caller's stream, and
// replay.h's Replay (a subclass) records them once as a CUDA graph and then replays that
// graph with each later call's parameters. Host-only C++.
#pragma once

#include <cstddef>

#include <cuda_runtime_api.h>

namespace flash_kda {

class LaunchSink {
 public:
  explicit LaunchSink(cudaStream_t stream) : stream_(stream) {}
  virtual ~LaunchSink() = default;

  // Zeroes `bytes` bytes at `ptr` (device memory), ordered after the stream's earlier work.
  virtual cudaError_t zero(void *ptr, size_t bytes) {
    return cudaMemsetAsync(ptr, 0, bytes, stream_);
  }

  // Launches `kernel` with `args` (its parameters' addresses). `programmatic`: it may start
  // once every CTA of the kernel before it has executed griddepcontrol.launch_dependents
  // (design §4.1, §4.7); otherwise it starts after the stream's earlier work ends.
  virtual cudaError_t kernel(const void *kernel, dim3 grid, dim3 block, int smem, void **args,
                             bool programmatic) {
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = static_cast<size_t>(smem);
    config.stream = stream_;
    config.attrs = programmatic ? &attr : nullptr;
    config.numAttrs = programmatic ? 1 : 0;
    return cudaLaunchKernelExC(&config, kernel, args);
  }

  cudaStream_t stream() const { return stream_; }

 protected:
  cudaStream_t stream_;
};

}  // namespace flash_kda
