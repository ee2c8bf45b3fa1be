// A CUDA injection library: the device timeline of any CUDA program (loom, llm.c, PyTorch), from
// CUPTI's activity records, without Nsight Systems (which the lent machines lack) and without
// Nsight Compute's replay (which serialises kernels and flushes the caches between them).
//
//   CUDA_INJECTION64_PATH=/path/libloom_kernel_trace.so LOOM_KERNEL_TRACE_OUT=trace.csv PROGRAM ...
//
// The CUDA driver loads the library at cuInit and calls InitializeInjection (CUPTI's documented
// injection entry point, as Nsight Systems uses it). Recorded: every kernel (concurrent-kernel
// records: start, end, stream), memcpy and memset on the device, and the host's runtime and
// driver API calls that launch or wait (start, end, the correlation id that ties a launch to its
// kernel), so that each idle gap on the device can be told apart: the host had not yet launched
// the next kernel (host-bound) or it had and the kernel waited (a dependency).
// At exit the records go to LOOM_KERNEL_TRACE_OUT (NAME.<pid> for any other process of the job
// that initialises CUDA; a forked child writes nothing) as CSV:
//   kind,start_ns,end_ns,stream,correlation,name
// kind: kernel | memcpy | memset | api. An api row's name is the call's name ("cudaLaunchKernel").
// tools/device/kernel_trace_summary.py reads it.
#include <cupti.h>
#include <cxxabi.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Row {
  char kind;  // k kernel, c memcpy, s memset, a api
  uint64_t start, end;
  uint32_t stream, correlation;
  std::string name;
};

std::mutex g_mutex;
std::vector<Row>* g_rows = nullptr;  // never freed: written at exit, after which nothing runs
std::string* g_out = nullptr;
bool g_written = false;
pid_t g_pid = 0;  // the process that initialised: a forked child inherits the atexit, not the job
constexpr size_t kBufferBytes = 8u << 20;

std::string demangle(const char* name) {
  if (!name) return "?";
  int status = 0;
  char* plain = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = status == 0 && plain ? plain : name;
  std::free(plain);
  return out;
}

// The calls whose timing matters to the gaps: launches (runtime and driver, as cuBLAS, cuDNN and
// PyTorch make them) and the host's waits. Other API records are dropped to keep the file small.
bool interesting_api(const char* name) {
  if (!name) return false;
  static const char* kKeep[] = {"Launch",      "Synchronize", "Memcpy",
                                "Memset",      "EventRecord", "StreamWait",
                                "GraphLaunch", "EventQuery",  "StreamQuery"};
  for (const char* k : kKeep)
    if (std::strstr(name, k)) return true;
  return false;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::vector<Row> rows;
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        rows.push_back({'k', k->start, k->end, k->streamId, k->correlationId, demangle(k->name)});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        rows.push_back({'c', m->start, m->end, m->streamId, m->correlationId,
                        "memcpy kind " + std::to_string(m->copyKind) + " " +
                            std::to_string(m->bytes) + " bytes"});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
        rows.push_back({'s', m->start, m->end, m->streamId, m->correlationId,
                        "memset " + std::to_string(m->bytes) + " bytes"});
        break;
      }
      case CUPTI_ACTIVITY_KIND_RUNTIME:
      case CUPTI_ACTIVITY_KIND_DRIVER: {
        const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(record);
        const char* name = nullptr;
        const CUpti_CallbackDomain domain = record->kind == CUPTI_ACTIVITY_KIND_RUNTIME
                                                ? CUPTI_CB_DOMAIN_RUNTIME_API
                                                : CUPTI_CB_DOMAIN_DRIVER_API;
        cuptiGetCallbackName(domain, a->cbid, &name);
        if (interesting_api(name))
          rows.push_back({'a', a->start, a->end, 0, a->correlationId, name});
        break;
      }
      default: break;
    }
  }
  std::free(buffer);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_rows->insert(g_rows->end(), rows.begin(), rows.end());
}

void write_trace() {
  if (getpid() != g_pid) return;  // a fork of the traced process: its parent writes
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  size_t dropped = 0;
  if (cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped) == CUPTI_SUCCESS && dropped > 0)
    std::fprintf(stderr, "loom_kernel_trace: CUPTI dropped %zu records (they show as idle time)\n",
                 dropped);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_written) return;
  g_written = true;
  FILE* f = std::fopen(g_out->c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "loom_kernel_trace: cannot write %s\n", g_out->c_str());
    return;
  }
  std::fprintf(f, "kind,start_ns,end_ns,stream,correlation,name\n");
  for (const Row& r : *g_rows) {
    const char* kind = r.kind == 'k'   ? "kernel"
                       : r.kind == 'c' ? "memcpy"
                       : r.kind == 's' ? "memset"
                                       : "api";
    std::string name = r.name;  // CSV: the name is the last field, quoted, quotes doubled
    for (size_t p = name.find('"'); p != std::string::npos; p = name.find('"', p + 2))
      name.insert(p, "\"");
    std::fprintf(f, "%s,%llu,%llu,%u,%u,\"%s\"\n", kind, static_cast<unsigned long long>(r.start),
                 static_cast<unsigned long long>(r.end), r.stream, r.correlation, name.c_str());
  }
  std::fclose(f);
  std::fprintf(stderr, "loom_kernel_trace: %zu records to %s\n", g_rows->size(), g_out->c_str());
}

bool ok(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return true;
  const char* message = nullptr;
  cuptiGetResultString(r, &message);
  std::fprintf(stderr, "loom_kernel_trace: %s failed: %s\n", what, message ? message : "?");
  return false;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int InitializeInjection(void) {
  const char* out = std::getenv("LOOM_KERNEL_TRACE_OUT");
  g_out = new std::string(out && *out ? out : "loom_kernel_trace.csv");
  g_pid = getpid();
  // The first process to initialise CUDA takes the name (created now, so that a helper process
  // that initialises CUDA later and exits first cannot take it); any other writes NAME.<pid>.
  const int fd = open(g_out->c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (fd >= 0)
    close(fd);
  else
    *g_out += "." + std::to_string(g_pid);
  g_rows = new std::vector<Row>();
  g_rows->reserve(1 << 20);
  // A failure here leaves the program untraced, never without CUDA: 1 either way.
  if (!ok(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed),
          "cuptiActivityRegisterCallbacks"))
    return 1;
  bool all = ok(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enable kernels");
  all = ok(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "enable memcpy") && all;
  all = ok(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET), "enable memset") && all;
  all = ok(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME), "enable runtime API") && all;
  all = ok(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER), "enable driver API") && all;
  std::atexit(write_trace);
  std::fprintf(stderr, "loom_kernel_trace: tracing to %s%s\n", g_out->c_str(),
               all ? "" : " (some kinds off)");
  return 1;
}
