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
    context->workspace_bytes = kCublasWorkspaceBytes;
    slot = context;
  }
  return *slot;
}

void* cublas_workspace(CublasContext& context, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(g_contexts_mutex);
  CublasStreamScratch& scratch = context.streams[stream];
  if (!scratch.workspace) LOOM_CUDA_CHECK(cudaMalloc(&scratch.workspace, context.workspace_bytes));
  return scratch.workspace;
}

float* bias_grad_scratch(CublasContext& context, int64_t elements, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(g_contexts_mutex);
  CublasStreamScratch& scratch = context.streams[stream];
  if (elements > scratch.bias_grad_capacity) {
    // The old buffer may still be read by work queued on the stream: wait before freeing it.
    // This happens only while the largest layer has not been seen yet.
    if (scratch.bias_grad_scratch) {
      LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
      LOOM_CUDA_CHECK(cudaFree(scratch.bias_grad_scratch));
      scratch.bias_grad_scratch = nullptr;
    }
    LOOM_CUDA_CHECK(
        cudaMalloc(&scratch.bias_grad_scratch, static_cast<size_t>(elements) * sizeof(float)));
    scratch.bias_grad_capacity = elements;
  }
  return scratch.bias_grad_scratch;
}

void set_bias_epilogues_enabled(bool enabled) { g_bias_epilogues.store(enabled); }
bool bias_epilogues_enabled() { return g_bias_epilogues.load(); }

}  // namespace loom::cuda
