#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "loom/core/cuda/cuda_check.hpp"
#include "loom/kernels/cuda/cublas_context.hpp"
#include "loom/kernels/cuda/device_common.cuh"
#include "loom/kernels/cuda/elementwise.hpp"
#include "loom/kernels/cuda/gemm.hpp"

namespace loom::cuda {

namespace {

using detail::to_f32;

template <typename T>
constexpr cudaDataType_t data_type();
template <>
constexpr cudaDataType_t data_type<float>() {
  return CUDA_R_32F;
}
template <>
constexpr cudaDataType_t data_type<bf16>() {
  return CUDA_R_16BF;
}

// Owners of cuBLASLt descriptors, so an exception between create and destroy leaks nothing.
struct MatmulDesc {
  cublasLtMatmulDesc_t desc = nullptr;
  MatmulDesc() {
    LOOM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  }
  ~MatmulDesc() { cublasLtMatmulDescDestroy(desc); }
  template <typename V>
  void set(cublasLtMatmulDescAttributes_t attribute, const V& value) {
    LOOM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof value));
  }
};
struct MatrixLayout {
  cublasLtMatrixLayout_t layout = nullptr;
  MatrixLayout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld) {
    LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout, type, static_cast<uint64_t>(rows),
                                                 static_cast<uint64_t>(cols), ld));
  }
  ~MatrixLayout() { cublasLtMatrixLayoutDestroy(layout); }
};
struct MatmulPreference {
  cublasLtMatmulPreference_t pref = nullptr;
  MatmulPreference() { LOOM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref)); }
  ~MatmulPreference() { cublasLtMatmulPreferenceDestroy(pref); }
  template <typename V>
  void set(cublasLtMatmulPreferenceAttributes_t attribute, const V& value) {
    LOOM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attribute, &value, sizeof value));
  }
};

// cuBLASLt assumes 256-byte aligned operands unless told otherwise; q|k|v column slices and
// strided views are not, so each operand's real alignment goes into the preference.
uint32_t alignment_bytes(const void* ptr) {
  const auto address = reinterpret_cast<uintptr_t>(ptr);
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

// One product in loom's row-major terms (see gemm.hpp), plus an optional epilogue.
struct MatmulSpec {
  bool transpose_a = false, transpose_b = false;
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f, beta = 0.0f;
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  void* c = nullptr;
  int64_t ldc = 0;
  cudaDataType_t a_type = CUDA_R_32F, b_type = CUDA_R_32F, c_type = CUDA_R_32F;
  // FP8 operands' dequantisation factors (device floats; null for other types): one per tensor,
  // or per tile in cuBLASLt's block-scaled layouts (kernels/cuda/fp8.hpp) under these modes
  // (cublasLtMatmulMatrixScale_t values; 0, one scalar, is cuBLASLt's default).
  const float* a_scale = nullptr;
  const float* b_scale = nullptr;
  int32_t a_scale_mode = 0, b_scale_mode = 0;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  void* bias = nullptr;  // bias (BIAS, per column of row-major C) or bias gradient (BGRADB)
  // GELU_AUX's pre-activation output and DGELU's input: shaped like C, rows aux_ld apart.
  void* aux = nullptr;
  int64_t aux_ld = 0;
};

// One cached plan: the descriptors and the algorithm cuBLASLt's heuristic chose for a shape,
// or that it found none. Keyed by everything the heuristic sees (the device, transposes, sizes,
// leading dimensions, types, epilogue and operand alignments), never by pointers or alpha/beta.
struct PlanKey {
  int device;
  bool transpose_a, transpose_b;
  int64_t m, n, k, lda, ldb, ldc;
  cudaDataType_t a_type, b_type, c_type;
  cublasLtEpilogue_t epilogue;
  uint32_t align_a, align_b, align_c, align_bias;  // the heuristic reads the bias pointer's too
  int64_t aux_ld;
  uint32_t align_aux;
  int32_t a_scale_mode, b_scale_mode;
  bool operator==(const PlanKey&) const = default;
};
struct PlanKeyHash {
  size_t operator()(const PlanKey& key) const {
    size_t h = 0;
    auto mix = [&h](uint64_t v) {
      h ^= std::hash<uint64_t>{}(v) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    };
    mix(static_cast<uint64_t>(key.device));
    mix(uint64_t{key.transpose_a} | uint64_t{key.transpose_b} << 1);
    for (int64_t v : {key.m, key.n, key.k, key.lda, key.ldb, key.ldc})
      mix(static_cast<uint64_t>(v));
    mix(static_cast<uint64_t>(key.a_type) << 40 | static_cast<uint64_t>(key.b_type) << 20 |
        static_cast<uint64_t>(key.c_type));
    mix(static_cast<uint64_t>(key.epilogue));
    mix(uint64_t{key.align_a} << 48 | uint64_t{key.align_b} << 32 | uint64_t{key.align_c} << 16 |
        key.align_bias);
    mix(static_cast<uint64_t>(key.aux_ld) << 16 | key.align_aux);
    mix(static_cast<uint64_t>(key.a_scale_mode) << 8 | static_cast<uint64_t>(key.b_scale_mode));
    return h;
  }
};
struct Plan {
  std::unique_ptr<MatmulDesc> desc;
  std::unique_ptr<MatrixLayout> a_layout, b_layout, c_layout;
  cublasLtMatmulHeuristicResult_t result{};
  bool supported = false;
};

struct PlanCache {
  std::mutex mutex;
  std::unordered_map<PlanKey, std::unique_ptr<Plan>, PlanKeyHash> plans;
  MatmulPlanStats stats;
};
PlanCache& plan_cache() {
  static PlanCache cache;
  return cache;
}

bool is_fp8(cudaDataType_t type) { return type == CUDA_R_8F_E4M3 || type == CUDA_R_8F_E5M2; }

// FP8 operands' scale factors (cuBLAS's A is our B, see below). Other types take none.
void set_scale_pointers(MatmulDesc& desc, const MatmulSpec& s) {
  if (!is_fp8(s.a_type) && !is_fp8(s.b_type)) return;
  desc.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(s.b_scale));
  desc.set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(s.a_scale));
}

// cuBLAS is column-major. A row-major matrix is its transpose in column-major, so row-major
// C = op(A) op(B) is computed as column-major C^T = op(B)^T op(A)^T: cuBLAS's "A" is our B,
// its "B" is our A, its M = n and N = m. Then BIAS (one value per row of cuBLAS's D) is one
// value per column of our C, and BGRADB (sums of cuBLAS's op(B) over k, one per column of D)
// is the row sums of our op(A): for d_weight = d_out^T @ input, the column sums of d_out.
std::unique_ptr<Plan> make_plan(const MatmulSpec& s, const PlanKey& key, CublasContext& context) {
  auto plan = std::make_unique<Plan>();
  plan->desc = std::make_unique<MatmulDesc>();
  MatmulDesc& desc = *plan->desc;
  desc.set(CUBLASLT_MATMUL_DESC_TRANSA,
           static_cast<int32_t>(s.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N));
  desc.set(CUBLASLT_MATMUL_DESC_TRANSB,
           static_cast<int32_t>(s.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N));
  if (s.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE, s.epilogue);
    desc.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, s.bias);
  }
  if (s.aux) {
    desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, s.aux);
    desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, s.aux_ld);
  }
  set_scale_pointers(desc, s);
  if (s.a_scale_mode != 0 || s.b_scale_mode != 0) {
#if CUBLAS_VERSION >= 120900
    // Block scaling (cuBLAS 12.9+, Hopper): cuBLAS's A is our B.
    desc.set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, s.b_scale_mode);
    desc.set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, s.a_scale_mode);
#else
    return plan;  // supported = false: block-scaled FP8 needs cuBLAS 12.9
#endif
  }
  plan->a_layout = std::make_unique<MatrixLayout>(s.b_type, s.transpose_b ? s.k : s.n,
                                                  s.transpose_b ? s.n : s.k, s.ldb);
  plan->b_layout = std::make_unique<MatrixLayout>(s.a_type, s.transpose_a ? s.m : s.k,
                                                  s.transpose_a ? s.k : s.m, s.lda);
  plan->c_layout = std::make_unique<MatrixLayout>(s.c_type, s.n, s.m, s.ldc);
  MatmulPreference pref;
  pref.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
           static_cast<uint64_t>(context.workspace_bytes));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_b);
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_a);
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c);
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c);
  // Split-K partial sums reduced in the output type would round a bf16 result once per split
  // (an H100 gave 0.5 for 0.5127 on a 12x16x24 product). OUTPUT_TYPE does that, and so does
  // INPLACE (it accumulates in the output buffer, in its type): for a non-f32 output only
  // COMPUTE_TYPE (f32 partials in the workspace) is allowed, besides no split at all.
  const uint32_t reductions = s.c_type == CUDA_R_32F
                                  ? static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_INPLACE |
                                                          CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE)
                                  : static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE);
  pref.set(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, reductions);
  int found = 0;
  const cublasStatus_t heuristic = cublasLtMatmulAlgoGetHeuristic(
      context.handle, desc.desc, plan->a_layout->layout, plan->b_layout->layout,
      plan->c_layout->layout, plan->c_layout->layout, pref.pref, 1, &plan->result, &found);
  if (heuristic == CUBLAS_STATUS_NOT_SUPPORTED ||
      (heuristic == CUBLAS_STATUS_SUCCESS && found == 0))
    return plan;  // supported = false: callers fall back
  LOOM_CUBLAS_CHECK(heuristic);
  plan->supported = true;
  return plan;
}

// Returns CUBLAS_STATUS_NOT_SUPPORTED when no algorithm exists (callers fall back); throws on
// any other failure. The heuristic runs once per shape; later calls take the cached plan.
cublasStatus_t try_matmul(const MatmulSpec& s, cudaStream_t stream) {
  CublasContext& context = cublas_context();
  void* workspace = cublas_workspace(context, stream);
  const PlanKey key{context.device,
                    s.transpose_a,
                    s.transpose_b,
                    s.m,
                    s.n,
                    s.k,
                    s.lda,
                    s.ldb,
                    s.ldc,
                    s.a_type,
                    s.b_type,
                    s.c_type,
                    s.epilogue,
                    alignment_bytes(s.a),
                    alignment_bytes(s.b),
                    alignment_bytes(s.c),
                    s.bias ? alignment_bytes(s.bias) : 0u,
                    s.aux ? s.aux_ld : 0,
                    s.aux ? alignment_bytes(s.aux) : 0u,
                    s.a_scale_mode,
                    s.b_scale_mode};
  PlanCache& cache = plan_cache();
  Plan* plan = nullptr;
  {
    const std::lock_guard<std::mutex> lock(cache.mutex);
    auto it = cache.plans.find(key);
    if (it == cache.plans.end()) {
      ++cache.stats.misses;
      it = cache.plans.emplace(key, make_plan(s, key, context)).first;
    } else {
      ++cache.stats.hits;
    }
    plan = it->second.get();
    if (!plan->supported) return CUBLAS_STATUS_NOT_SUPPORTED;
    // The bias (or bias-gradient) pointer is the one attribute that changes between calls.
    if (s.epilogue != CUBLASLT_EPILOGUE_DEFAULT)
      plan->desc->set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, s.bias);
    if (s.aux) plan->desc->set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, s.aux);
    set_scale_pointers(*plan->desc, s);  // FP8's dequantisation factors change with the call
    const cublasStatus_t rc = cublasLtMatmul(
        context.handle, plan->desc->desc, &s.alpha, s.b, plan->a_layout->layout, s.a,
        plan->b_layout->layout, &s.beta, s.c, plan->c_layout->layout, s.c, plan->c_layout->layout,
        &plan->result.algo, workspace, context.workspace_bytes, stream);
    if (rc == CUBLAS_STATUS_NOT_SUPPORTED) return rc;
    LOOM_CUBLAS_CHECK(rc);
    return rc;
  }
}

void run_matmul(const MatmulSpec& s, cudaStream_t stream) {
  if (try_matmul(s, stream) != CUBLAS_STATUS_SUCCESS)
    throw_error("cuBLASLt has no algorithm for a ", s.m, "x", s.n, "x", s.k,
                " matmul (transpose_a=", s.transpose_a, ", transpose_b=", s.transpose_b,
                ", lda=", s.lda, ", ldb=", s.ldb, ", ldc=", s.ldc, ")");
}

template <typename T>
__global__ void add_bias_kernel(T* out, int64_t ld, const T* bias, int64_t rows, int64_t cols) {
  const int64_t total = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / cols, j = i % cols;
    out[r * ld + j] = detail::from_f32<T>(to_f32(out[r * ld + j]) + to_f32(bias[j]));
  }
}

// d_bias[j] += sum over rows of d_out[r, j]. A block owns 32 columns; its 8 thread rows take
// every 8th row and are combined in a fixed order, so the result is deterministic.
constexpr int kBiasCols = 32, kBiasRowGroups = 8;
template <typename T>
__global__ void bias_grad_kernel(float* d_bias, const T* d_out, int64_t ld, int64_t rows,
                                 int64_t cols) {
  __shared__ float partial[kBiasRowGroups][kBiasCols + 1];
  const int64_t col = blockIdx.x * int64_t{kBiasCols} + threadIdx.x;
  float sum = 0.0f;
  if (col < cols)
    for (int64_t r = threadIdx.y; r < rows; r += kBiasRowGroups) sum += to_f32(d_out[r * ld + col]);
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float total = 0.0f;
    for (int g = 0; g < kBiasRowGroups; ++g) total += partial[g][threadIdx.x];
    d_bias[col] += total;
  }
}

template <typename In, typename Out>
void gemm_impl(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
               const In* a, int64_t lda, const In* b, int64_t ldb, float beta, Out* c, int64_t ldc,
               cudaStream_t stream) {
  LOOM_CHECK(m > 0 && n > 0 && k > 0, "gemm of empty shape ", m, "x", n, "x", k);
  MatmulSpec s;
  s.transpose_a = transpose_a;
  s.transpose_b = transpose_b;
  s.m = m, s.n = n, s.k = k, s.alpha = alpha, s.beta = beta;
  s.a = a, s.lda = lda, s.b = b, s.ldb = ldb, s.c = c, s.ldc = ldc;
  s.a_type = s.b_type = data_type<In>();
  s.c_type = data_type<Out>();
  run_matmul(s, stream);
}

template <typename T>
void linear_forward_impl(T* out, int64_t out_ld, const T* input, const T* weight, const T* bias,
                         int64_t n, int64_t in_features, int64_t out_features,
                         cudaStream_t stream) {
  if (n == 0) return;
  MatmulSpec s;
  s.transpose_b = true;  // out = input @ weight^T
  s.m = n, s.n = out_features, s.k = in_features;
  s.a = input, s.lda = in_features, s.b = weight, s.ldb = in_features, s.c = out, s.ldc = out_ld;
  s.a_type = s.b_type = s.c_type = data_type<T>();
  if (bias && bias_epilogues_enabled()) {
    s.epilogue = CUBLASLT_EPILOGUE_BIAS;
    s.bias = const_cast<T*>(bias);
    if (try_matmul(s, stream) == CUBLAS_STATUS_SUCCESS) return;
    s.epilogue = CUBLASLT_EPILOGUE_DEFAULT;  // no algorithm with the epilogue: add it ourselves
    s.bias = nullptr;
  }
  run_matmul(s, stream);
  if (bias) {
    constexpr int kThreads = 256;
    add_bias_kernel<<<detail::grid_for(n * out_features, kThreads), kThreads, 0, stream>>>(
        out, out_ld, bias, n, out_features);
    LOOM_CUDA_CHECK_LAUNCH();
  }
}

template <typename T>
void linear_backward_impl(T* d_input, bool accumulate_input, float* d_weight, float* d_bias,
                          const T* d_out, int64_t d_out_ld, const T* input, const T* weight,
                          int64_t n, int64_t in_features, int64_t out_features,
                          cudaStream_t stream) {
  if (n == 0) return;
  if (d_input)
    gemm_impl(false, false, n, in_features, out_features, 1.0f, d_out, d_out_ld, weight,
              in_features, accumulate_input ? 1.0f : 0.0f, d_input, in_features, stream);
  bool bias_done = false;
  if (d_weight) {
    MatmulSpec s;  // d_weight += d_out^T @ input
    s.transpose_a = true;
    s.m = out_features, s.n = in_features, s.k = n, s.beta = 1.0f;
    s.a = d_out, s.lda = d_out_ld, s.b = input, s.ldb = in_features, s.c = d_weight,
    s.ldc = in_features;
    s.a_type = s.b_type = data_type<T>();
    s.c_type = CUDA_R_32F;
    if (d_bias && bias_epilogues_enabled()) {
      // BGRADB overwrites its output, so it goes to scratch and is then added into d_bias.
      CublasContext& context = cublas_context();
      float* scratch = bias_grad_scratch(context, out_features, stream);
      s.epilogue = CUBLASLT_EPILOGUE_BGRADB;
      s.bias = scratch;
      if (try_matmul(s, stream) == CUBLAS_STATUS_SUCCESS) {
        add_into(d_bias, scratch, out_features, stream);
        bias_done = true;
      } else {
        s.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
        s.bias = nullptr;
      }
    }
    if (!bias_done) run_matmul(s, stream);
  }
  if (d_bias && !bias_done) {
    const dim3 block(kBiasCols, kBiasRowGroups);
    const auto grid = static_cast<unsigned>(detail::ceil_div(out_features, kBiasCols));
    bias_grad_kernel<<<grid, block, 0, stream>>>(d_bias, d_out, d_out_ld, n, out_features);
    LOOM_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

namespace {
template <typename T>
void add_bias_impl(T* out, int64_t ld, const T* bias, int64_t rows, int64_t cols,
                   cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  add_bias_kernel<<<detail::grid_for(rows * cols, 256), 256, 0, stream>>>(out, ld, bias, rows,
                                                                          cols);
  LOOM_CUDA_CHECK_LAUNCH();
}
}  // namespace

void add_bias(float* out, int64_t ld, const float* bias, int64_t rows, int64_t cols,
              cudaStream_t stream) {
  add_bias_impl(out, ld, bias, rows, cols, stream);
}
void add_bias(bf16* out, int64_t ld, const bf16* bias, int64_t rows, int64_t cols,
              cudaStream_t stream) {
  add_bias_impl(out, ld, bias, rows, cols, stream);
}

MatmulPlanStats matmul_plan_stats() {
  PlanCache& cache = plan_cache();
  const std::lock_guard<std::mutex> lock(cache.mutex);
  MatmulPlanStats stats = cache.stats;
  stats.plans = static_cast<int64_t>(cache.plans.size());
  return stats;
}

void gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
          int64_t ldc, cudaStream_t stream) {
  gemm_impl(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, stream);
}
void gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
          const bf16* a, int64_t lda, const bf16* b, int64_t ldb, float beta, bf16* c, int64_t ldc,
          cudaStream_t stream) {
  gemm_impl(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, stream);
}
void gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
          const bf16* a, int64_t lda, const bf16* b, int64_t ldb, float beta, float* c, int64_t ldc,
          cudaStream_t stream) {
  gemm_impl(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, stream);
}

namespace {
cudaDataType_t fp8_type(cpu::Fp8Format format) {
  return format == cpu::Fp8Format::E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}

template <typename Out>
void fp8_gemm_impl(Out* c, int64_t ldc, float beta, const Fp8Operand& a, const Fp8Operand& b,
                   int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
  LOOM_CHECK(m > 0 && n > 0 && k > 0, "FP8 gemm of empty shape ", m, "x", n, "x", k);
  if (a.format == cpu::Fp8Format::E5M2 && b.format == cpu::Fp8Format::E5M2)
    throw_error(
        "FP8 gemm: cuBLASLt multiplies E4M3 x E4M3, E4M3 x E5M2 or E5M2 x E4M3, not two "
        "E5M2 operands");
  // cuBLASLt's FP8 kernels want 16-byte aligned operands and every dimension a multiple of 16.
  if (m % 16 != 0 || n % 16 != 0 || k % 16 != 0 || ldc % 8 != 0 || alignment_bytes(a.codes) < 16 ||
      alignment_bytes(b.codes) < 16 || alignment_bytes(c) < 16)
    throw_error(
        "FP8 gemm on CUDA needs m, n and k multiples of 16 and 16-byte aligned operands "
        "(cuBLASLt's FP8 kernels), got ",
        m, "x", n, "x", k,
        " (rows are tokens per "
        "micro-batch, the others model widths)");
  MatmulSpec s;
  s.transpose_b = true;  // c = a @ b^T: both operands K-contiguous, the "TN" form FP8 takes
  s.m = m, s.n = n, s.k = k, s.beta = beta;
  s.a = a.codes, s.lda = k, s.b = b.codes, s.ldb = k, s.c = c, s.ldc = ldc;
  s.a_type = fp8_type(a.format);
  s.b_type = fp8_type(b.format);
  s.c_type = data_type<Out>();
  s.a_scale = a.inverse_scale;
  s.b_scale = b.inverse_scale;
  const bool blocks = a.scaling != Fp8Scaling::Tensor || b.scaling != Fp8Scaling::Tensor;
  if (blocks) {
    // cuBLASLt's block-scaled FP8 (Hopper): both operands per tile, at most one in 128 x 128
    // blocks, every dimension a multiple of 128 (the tiles).
    if (a.scaling == Fp8Scaling::Tensor || b.scaling == Fp8Scaling::Tensor ||
        (a.scaling == Fp8Scaling::Blocks128x128 && b.scaling == Fp8Scaling::Blocks128x128))
      throw_error(
          "FP8 gemm: block-scaled operands go in pairs of 1 x 128 tiles, or tiles with 128 x 128 "
          "blocks (cuBLASLt has no 128 x 128 by 128 x 128 nor mixed per-tensor kernel)");
    if (m % 128 != 0 || n % 128 != 0 || k % 128 != 0)
      throw_error("blockwise FP8 gemm on CUDA needs m, n and k multiples of 128, got ", m, "x", n,
                  "x", k);
#if CUBLAS_VERSION >= 120900
    auto mode = [](Fp8Scaling scaling) {
      return static_cast<int32_t>(scaling == Fp8Scaling::Tiles1x128
                                      ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
                                      : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F);
    };
    s.a_scale_mode = mode(a.scaling);
    s.b_scale_mode = mode(b.scaling);
#else
    throw_error("blockwise FP8 gemm: this build's cuBLAS (", CUBLAS_VERSION,
                ") predates block scaling (12.9)");
#endif
  }
  if (try_matmul(s, stream) != CUBLAS_STATUS_SUCCESS)
    throw_error("cuBLASLt has no FP8 algorithm for a ", m, "x", n, "x", k, " product (",
                cpu::fp8_format_name(a.format), " x ", cpu::fp8_format_name(b.format),
                blocks ? ", scaled per 128-element tile" : "",
                blocks ? "); blockwise FP8 GEMMs need cuBLAS 12.9 or later on a Hopper (sm_90) GPU"
                       : "); FP8 GEMMs need a Hopper (sm_90) or later GPU");
}
}  // namespace

void fp8_gemm(bf16* c, int64_t ldc, float beta, const Fp8Operand& a, const Fp8Operand& b, int64_t m,
              int64_t n, int64_t k, cudaStream_t stream) {
  fp8_gemm_impl(c, ldc, beta, a, b, m, n, k, stream);
}
void fp8_gemm(float* c, int64_t ldc, float beta, const Fp8Operand& a, const Fp8Operand& b,
              int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
  fp8_gemm_impl(c, ldc, beta, a, b, m, n, k, stream);
}

// LOOM_CUDA_GELU_EPILOGUE=0 turns the GELU epilogues off (the model then runs the two-kernel
// path): what the fusion buys is measured against the same build.
bool gelu_epilogues_enabled() {
  static const bool enabled = [] {
    const char* text = std::getenv("LOOM_CUDA_GELU_EPILOGUE");
    return !(text && std::string(text) == "0");
  }();
  return enabled && bias_epilogues_enabled();
}

bool linear_gelu_forward(bf16* act, bf16* pre, int64_t ld, const bf16* input, const bf16* weight,
                         const bf16* bias, int64_t n, int64_t in_features, int64_t out_features,
                         cudaStream_t stream) {
  if (n == 0) return true;
  // cuBLASLt's GELU epilogues want the auxiliary matrix's leading dimension a multiple of 8 and
  // its rows 16-byte aligned; elsewhere the caller's two-kernel path runs.
  if (!gelu_epilogues_enabled() || ld % 8 != 0 || alignment_bytes(pre) < 16) return false;
  MatmulSpec s;
  s.transpose_b = true;  // pre = input @ weight^T + bias, act = gelu(pre)
  s.m = n, s.n = out_features, s.k = in_features;
  s.a = input, s.lda = in_features, s.b = weight, s.ldb = in_features, s.c = act, s.ldc = ld;
  s.a_type = s.b_type = s.c_type = CUDA_R_16BF;
  s.epilogue = bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
  s.bias = const_cast<bf16*>(bias);
  s.aux = pre, s.aux_ld = ld;
  return try_matmul(s, stream) == CUBLAS_STATUS_SUCCESS;
}

bool gelu_input_grad(bf16* d_pre, int64_t ld, const bf16* d_out, int64_t d_out_ld,
                     const bf16* weight, const bf16* pre, int64_t n, int64_t in_features,
                     int64_t out_features, cudaStream_t stream) {
  if (n == 0) return true;
  if (!gelu_epilogues_enabled() || ld % 8 != 0 || alignment_bytes(pre) < 16) return false;
  MatmulSpec s;  // d_pre = gelu'(pre) * (d_out @ weight)
  s.m = n, s.n = in_features, s.k = out_features;
  s.a = d_out, s.lda = d_out_ld, s.b = weight, s.ldb = in_features, s.c = d_pre, s.ldc = ld;
  s.a_type = s.b_type = s.c_type = CUDA_R_16BF;
  s.epilogue = CUBLASLT_EPILOGUE_DGELU;
  s.aux = const_cast<bf16*>(pre), s.aux_ld = ld;
  return try_matmul(s, stream) == CUBLAS_STATUS_SUCCESS;
}

void linear_forward(float* out, int64_t out_ld, const float* input, const float* weight,
                    const float* bias, int64_t n, int64_t in_features, int64_t out_features,
                    cudaStream_t stream) {
  linear_forward_impl(out, out_ld, input, weight, bias, n, in_features, out_features, stream);
}
void linear_forward(bf16* out, int64_t out_ld, const bf16* input, const bf16* weight,
                    const bf16* bias, int64_t n, int64_t in_features, int64_t out_features,
                    cudaStream_t stream) {
  linear_forward_impl(out, out_ld, input, weight, bias, n, in_features, out_features, stream);
}

void linear_backward(float* d_input, bool accumulate_input, float* d_weight, float* d_bias,
                     const float* d_out, int64_t d_out_ld, const float* input, const float* weight,
                     int64_t n, int64_t in_features, int64_t out_features, cudaStream_t stream) {
  linear_backward_impl(d_input, accumulate_input, d_weight, d_bias, d_out, d_out_ld, input, weight,
                       n, in_features, out_features, stream);
}
void linear_backward(bf16* d_input, bool accumulate_input, float* d_weight, float* d_bias,
                     const bf16* d_out, int64_t d_out_ld, const bf16* input, const bf16* weight,
                     int64_t n, int64_t in_features, int64_t out_features, cudaStream_t stream) {
  linear_backward_impl(d_input, accumulate_input, d_weight, d_bias, d_out, d_out_ld, input, weight,
                       n, in_features, out_features, stream);
}

}  // namespace loom::cuda
