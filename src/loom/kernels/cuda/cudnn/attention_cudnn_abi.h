#pragma once
// The C interface between loom and libloom_cudnn.so, the plugin that holds cuDNN attention
// (attention_cudnn_plugin.cpp). loom opens the plugin at run time, only when
// LOOM_CUDA_ATTENTION=cudnn asks for it (attention_cudnn.cu), so loom's binaries need neither
// libcudnn nor the plugin to start; the plugin links libcudnn.so.9 and the same libcudart as
// loom. Plain C types across the boundary; errors come back as text, never as exceptions.
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Bumped when a signature below changes; loom refuses a plugin of another version.
#define LOOM_CUDNN_ATTENTION_ABI 1

typedef struct {
  int64_t batch, seq_len, heads, kv_heads, head_dim;
  int backward;       // 0: the forward graph, 1: the backward's
  int deterministic;  // backward: cuDNN's deterministic algorithm (its O(seq^2) dP workspace)
} LoomCudnnAttentionShape;

// Pointers of one call, device memory, in loom's fused layouts (attention_cudnn.hpp). The
// forward reads qkv and writes out and lse; the backward reads qkv, out, d_out and lse and
// writes d_qkv.
typedef struct {
  const void* qkv;
  void* out;
  float* lse;
  const void* d_out;
  void* d_qkv;
} LoomCudnnAttentionPointers;

typedef struct {
  int abi;
  // Builds (or finds) the graph of `shape` on the current device; writes its workspace bytes.
  // Returns NULL, or why not (valid until the calling thread's next call).
  const char* (*prepare)(const LoomCudnnAttentionShape* shape, int64_t* workspace_bytes);
  // Runs the prepared graph on `stream` with `workspace` (at least the prepared bytes).
  const char* (*execute)(const LoomCudnnAttentionShape* shape,
                         const LoomCudnnAttentionPointers* pointers, void* workspace,
                         cudaStream_t stream);
  // The cuDNN library version the plugin runs against (cudnnGetVersion), e.g. 91900.
  size_t (*cudnn_version)(void);
} LoomCudnnAttentionApi;

// The plugin's one exported symbol.
const LoomCudnnAttentionApi* loom_cudnn_attention_api(void);

#ifdef __cplusplus
}
#endif
