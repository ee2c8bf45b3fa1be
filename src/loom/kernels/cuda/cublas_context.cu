#include <atomic>
#include <mutex>
#include <vector>

#include "loom/kernels/cuda/cublas_context.hpp"
#include "loom/core/cuda/cuda_check.hpp"

namespace loom::cuda {

namespace {
std::mutex g_contexts_mutex;
// Contexts are deliberately never destroyed: static destructors run after the CUDA runtime may
// already have been torn down, and destroying a handle then crashes at exit.
std::vector<CublasContext*> g_contexts;
std::atomic<bool> g_bias_epilogues{true};
}  // namespace

CublasContext& cublas_context() {
  int device = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(g_contexts_mutex);
  if (static_cast<size_t>(device) >= g_contexts.size())
    g_contexts.resize(static_cast<size_t>(device) + 1, nullptr);
  CublasContext*& slot = g_contexts[static_cast<size_t>(device)];
  if (!slot) {
    auto* context = new CublasContext;
    context->device = device;
    LOOM_CUBLAS_CHECK(cublasLtCreate(&context->handle));
    LOOM_CUDA_CHECK(cudaMalloc(&context->workspace, kCublasWorkspaceBytes));
    context->workspace_bytes = kCublasWorkspaceBytes;
    slot = context;
  }
  return *slot;
}

float* bias_grad_scratch(CublasContext& context, int64_t elements) {
  std::lock_guard<std::mutex> lock(g_contexts_mutex);
  if (elements > context.bias_grad_capacity) {
    // The old buffer may still be read by queued work on any stream: wait before freeing it.
    // This happens only while the largest layer has not been seen yet.
    if (context.bias_grad_scratch) {
      LOOM_CUDA_CHECK(cudaDeviceSynchronize());
      LOOM_CUDA_CHECK(cudaFree(context.bias_grad_scratch));
      context.bias_grad_scratch = nullptr;
    }
    LOOM_CUDA_CHECK(
        cudaMalloc(&context.bias_grad_scratch, static_cast<size_t>(elements) * sizeof(float)));
    context.bias_grad_capacity = elements;
  }
  return context.bias_grad_scratch;
}

void set_bias_epilogues_enabled(bool enabled) { g_bias_epilogues.store(enabled); }
bool bias_epilogues_enabled() { return g_bias_epilogues.load(); }

}  // namespace loom::cuda
