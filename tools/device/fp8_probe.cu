// Which FP8 matmul configurations does this machine's cuBLASLt accept? A diagnostic for the
// device checks (run_gpu_checks.sh runs it when built as .device/fp8_probe):
//   nvcc -std=c++17 -arch=sm_90 tools/device/fp8_probe.cu -lcublasLt -o .device/fp8_probe
// For each shape, output type, transposes, scale pointers, alignment preference and fast
// accumulation it prints the heuristic's status and algorithm count, and for the first
// accepted one the matmul's status.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdio>

int main() {
  cublasLtHandle_t handle;
  if (cublasLtCreate(&handle) != CUBLAS_STATUS_SUCCESS) {
    std::puts("fp8_probe: no cublasLt handle");
    return 1;
  }
  std::printf("fp8_probe: cublasLt version %zu, cudart %zu\n", cublasLtGetVersion(),
              cublasLtGetCudartVersion());
  void *a, *b, *c, *ws;
  float* scales;
  cudaMalloc(&a, 1 << 20);
  cudaMalloc(&b, 1 << 20);
  cudaMalloc(&c, 4 << 20);
  cudaMalloc(&ws, 32 << 20);
  cudaMalloc(&scales, 16);
  cudaMemset(a, 0, 1 << 20);
  cudaMemset(b, 0, 1 << 20);
  const float ones[4] = {1, 1, 1, 1};
  cudaMemcpy(scales, ones, 16, cudaMemcpyHostToDevice);
  const int shapes[][3] = {{32, 48, 256}, {64, 96, 32}, {256, 256, 256}};
  const cudaDataType_t outs[] = {CUDA_R_32F, CUDA_R_16BF};
  const cublasOperation_t ops[][2] = {
      {CUBLAS_OP_T, CUBLAS_OP_N}, {CUBLAS_OP_N, CUBLAS_OP_T}, {CUBLAS_OP_N, CUBLAS_OP_N}};
  for (auto& sh : shapes)
    for (cudaDataType_t out : outs)
      for (auto& op : ops)
        for (int scale = 0; scale < 2; ++scale)
          for (int align = 0; align < 2; ++align)
            for (int fast = 0; fast < 2; ++fast) {
              const int M = sh[1], N = sh[0], K = sh[2];
              cublasLtMatmulDesc_t desc;
              cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
              cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op[0],
                                             sizeof op[0]);
              cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op[1],
                                             sizeof op[1]);
              if (scale) {
                const void* p = scales;
                cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &p,
                                               sizeof p);
                cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &p,
                                               sizeof p);
              }
              const int8_t fa = static_cast<int8_t>(fast);
              cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fa, sizeof fa);
              cublasLtMatrixLayout_t la, lb, lc;
              const bool ta = op[0] == CUBLAS_OP_T, tb = op[1] == CUBLAS_OP_T;
              cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, ta ? K : M, ta ? M : K, ta ? K : M);
              cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, tb ? N : K, tb ? K : N, tb ? N : K);
              cublasLtMatrixLayoutCreate(&lc, out, M, N, M);
              cublasLtMatmulPreference_t pref;
              cublasLtMatmulPreferenceCreate(&pref);
              const uint64_t wsb = 32 << 20;
              cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                   &wsb, sizeof wsb);
              if (align) {
                const uint32_t al = 256;
                for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
                  cublasLtMatmulPreferenceSetAttribute(pref, attr, &al, sizeof al);
              }
              cublasLtMatmulHeuristicResult_t result{};
              int found = 0;
              const cublasStatus_t h = cublasLtMatmulAlgoGetHeuristic(handle, desc, la, lb, lc, lc,
                                                                      pref, 1, &result, &found);
              int run = -1;
              if (h == CUBLAS_STATUS_SUCCESS && found) {
                const float alpha = 1, beta = 0;
                run = cublasLtMatmul(handle, desc, &alpha, a, la, b, lb, &beta, c, lc, c, lc,
                                     &result.algo, ws, wsb, 0);
                cudaDeviceSynchronize();
              }
              std::printf(
                  "fp8_probe m=%d n=%d k=%d out=%s ops=%c%c scale=%d align=%d fast=%d: heuristic "
                  "%d found %d run %d\n",
                  sh[0], sh[1], sh[2], out == CUDA_R_32F ? "f32" : "bf16", ta ? 'T' : 'N',
                  tb ? 'T' : 'N', scale, align, fast, static_cast<int>(h), found, run);
              cublasLtMatmulPreferenceDestroy(pref);
              cublasLtMatrixLayoutDestroy(la);
              cublasLtMatrixLayoutDestroy(lb);
              cublasLtMatrixLayoutDestroy(lc);
              cublasLtMatmulDescDestroy(desc);
            }
  std::printf("fp8_probe: cuda error state %s\n", cudaGetErrorString(cudaGetLastError()));
  return 0;
}
