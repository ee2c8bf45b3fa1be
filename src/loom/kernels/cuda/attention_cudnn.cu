// cuDNN attention from loom's side (attention_cudnn.hpp): libloom_cudnn.so (cudnn/, built where
// the cudnn-frontend headers are found) is opened the first time it is asked for, through the C
// interface of cudnn/attention_cudnn_abi.h; the workspace comes from loom's own scratch buffers
// (the caching allocator on the default stream, counted as Workspace).
//
// Where the plugin is looked for: libloom_cudnn.so on the library path (the device pack puts it
// in its lib/, tools/device/pack.sh), then where this build wrote it (LOOM_CUDNN_PLUGIN_PATH).
// LOOM_CUDA_CUDNN_DETERMINISTIC=0 takes cuDNN's non-deterministic backward (atomic dQ, no
// O(seq^2) dP workspace); the default is the deterministic one, as loom's own kernels are.
#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>

#include "loom/kernels/cuda/attention_cudnn.hpp"
#include "loom/kernels/cuda/cudnn/attention_cudnn_abi.h"
#include "loom/kernels/cuda/device_common.cuh"
#include "loom/kernels/cuda/device_info.hpp"

namespace loom::cuda::detail {

namespace {

struct Plugin {
  const LoomCudnnAttentionApi* api = nullptr;
  std::string why_not;  // empty when `api` is usable
};

const Plugin& plugin() {
  static const Plugin loaded = [] {
    Plugin p;
    std::string tried;
    void* handle = nullptr;
    const char* candidates[] = {
      "libloom_cudnn.so",
#if defined(LOOM_CUDNN_PLUGIN_PATH)
      LOOM_CUDNN_PLUGIN_PATH
#else
      nullptr
#endif
    };
    for (const char* name : candidates) {
      if (name == nullptr) continue;
      handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (handle) break;
      const char* error = dlerror();
      tried += std::string(tried.empty() ? "" : "; ") + (error ? error : name);
    }
    if (!handle) {
#if defined(LOOM_CUDNN_PLUGIN_PATH)
      p.why_not = "libloom_cudnn.so did not load (" + tried +
                  "): cuDNN 9 (libcudnn.so.9) must be on LD_LIBRARY_PATH";
#else
      p.why_not =
          "loom was built without cuDNN attention: run tools/device/cudnn_frontend.sh and "
          "reconfigure (CMake's LOOM_CUDNN_FRONTEND_INCLUDE) to build libloom_cudnn.so";
#endif
      return p;
    }
    using Entry = const LoomCudnnAttentionApi* (*)();
    auto entry = reinterpret_cast<Entry>(dlsym(handle, "loom_cudnn_attention_api"));
    if (!entry) {
      p.why_not = "libloom_cudnn.so has no loom_cudnn_attention_api";
      return p;
    }
    const LoomCudnnAttentionApi* api = entry();
    if (!api || api->abi != LOOM_CUDNN_ATTENTION_ABI) {
      p.why_not = "libloom_cudnn.so is of interface version " +
                  std::to_string(api ? api->abi : -1) + ", this loom needs " +
                  std::to_string(LOOM_CUDNN_ATTENTION_ABI) + ": rebuild it with this loom";
      return p;
    }
    if (api->cudnn_version() < 90000) {
      p.why_not = "cuDNN " + std::to_string(api->cudnn_version()) +
                  " was loaded; cuDNN attention needs cuDNN 9";
      return p;
    }
    p.api = api;
    return p;
  }();
  return loaded;
}

bool deterministic() {
  static const bool value = [] {
    const char* text = std::getenv("LOOM_CUDA_CUDNN_DETERMINISTIC");
    if (!text || !*text || std::string(text) == "1") return true;
    if (std::string(text) == "0") return false;
    throw_error("LOOM_CUDA_CUDNN_DETERMINISTIC='", text, "': expected 0 or 1");
  }();
  return value;
}

void run(const cpu::AttentionShape& s, bool backward, const LoomCudnnAttentionPointers& pointers,
         cudaStream_t stream) {
  const Plugin& p = plugin();
  if (!p.api) throw_error("cuDNN attention: ", p.why_not);
  LoomCudnnAttentionShape shape{s.batch,
                                s.seq_len,
                                s.heads,
                                s.kv_heads,
                                s.head_dim,
                                backward ? 1 : 0,
                                deterministic() ? 1 : 0};
  int64_t workspace_bytes = 0;
  if (const char* error = p.api->prepare(&shape, &workspace_bytes))
    throw_error("cuDNN attention: ", error);
  ScratchBuffer<unsigned char> workspace(workspace_bytes, stream);
  if (const char* error = p.api->execute(&shape, &pointers, workspace.get(), stream))
    throw_error("cuDNN attention: ", error);
}

}  // namespace

std::string cudnn_attention_refusal(const cpu::AttentionShape& shape,
                                    std::initializer_list<const void*> pointers) {
  if (shape.head_dim % 8 != 0 || shape.head_dim > 128)
    return "head_dim " + std::to_string(shape.head_dim) +
           " (cuDNN attention takes multiples of 8 up to 128 here)";
  if (shape.seq_len < 2) return "a sequence of 1 (cuDNN's backward takes 2 or more)";
  for (const void* p : pointers)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return "a pointer not 16-byte aligned";
  int device = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&device));
  static const DeviceInfo info = device_info();  // read once: this runs on every call
  if (device >= 0 && device < static_cast<int>(info.devices.size()) &&
      info.devices[static_cast<size_t>(device)].compute_major < 8)
    return "device " + std::to_string(device) + " is older than sm_80";
  return plugin().why_not;
}

void cudnn_attention_forward(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv,
                             const cpu::AttentionShape& shape, cudaStream_t stream) {
  LoomCudnnAttentionPointers p{};
  p.qkv = qkv;
  p.out = out;
  p.lse = lse;
  run(shape, false, p, stream);
}

void cudnn_attention_backward(__nv_bfloat16* d_qkv, const __nv_bfloat16* d_out,
                              const __nv_bfloat16* qkv, const __nv_bfloat16* out, const float* lse,
                              const cpu::AttentionShape& shape, cudaStream_t stream) {
  LoomCudnnAttentionPointers p{};
  p.qkv = qkv;
  p.out = const_cast<__nv_bfloat16*>(out);
  p.lse = const_cast<float*>(lse);
  p.d_out = d_out;
  p.d_qkv = d_qkv;
  run(shape, true, p, stream);
}

}  // namespace loom::cuda::detail
