#pragma once
// A stand-in for cuBLASLt's header under tools/cuda_emulation (see cuda_runtime.h here): the
// status type loom's error checks name.
using cublasStatus_t = int;
constexpr cublasStatus_t CUBLAS_STATUS_SUCCESS = 0;
inline const char* cublasLtGetStatusName(cublasStatus_t) { return "CUBLAS_STATUS"; }
inline const char* cublasLtGetStatusString(cublasStatus_t) { return "no cuBLASLt under emulation"; }
