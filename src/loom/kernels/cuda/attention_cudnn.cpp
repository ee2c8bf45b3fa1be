// cuDNN's fused flash attention on loom's layouts (attention_cudnn.hpp). Compiled only where the
// cudnn-frontend headers were found (CMake defines LOOM_HAVE_CUDNN and adds this file);
// attention_cudnn_unavailable.cu says why not elsewhere.
//
// One graph per shape and direction, built once (cuDNN's heuristics, mode A) and kept: a
// training step calls the same few shapes thousands of times. Tensors are described in cuDNN's
// [batch, heads, seq, head_dim] order with the strides of the fused rows, so nothing is copied:
// query head h of token t of sequence b is at qkv + (b seq + t) ld + h D, key head g at
// column (heads + g) D, value head g at (heads + kv_heads + g) D. The lse ("stats") is
// [batch, heads, seq, 1] f32, the statistic the scalar and tensor-core kernels keep.
#include "loom/kernels/cuda/attention_cudnn.hpp"

#include <dlfcn.h>

#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>

#include "loom/core/cuda/cuda_check.hpp"
#include "loom/core/cuda/device_allocator.hpp"

// The frontend's JSON serialisation is not used (and would bring a second nlohmann json).
#define CUDNN_FRONTEND_SKIP_JSON_LIB
#include <cudnn_frontend.h>

// Set by the frontend's dynamic loading: the handle of libcudnn.so.9, opened below.
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}

namespace loom::cuda::detail {
namespace {

namespace fe = cudnn_frontend;
using cpu::AttentionShape;

// Tensor ids of the graphs' variant packs.
enum : int64_t { kQ = 1, kK, kV, kOut, kStats, kDOut, kDQ, kDK, kDV };

// libcudnn.so.9, opened once; empty when found, else why not.
const std::string& load_cudnn() {
  static const std::string why = [] {
    for (const char* name : {"libcudnn.so.9", "libcudnn.so"}) {
      if (void* handle = dlopen(name, RTLD_NOW | RTLD_GLOBAL)) {
        fe::cudnn_dlhandle = handle;
        return std::string();
      }
    }
    const char* error = dlerror();
    return std::string("libcudnn.so.9 not found (") + (error ? error : "dlopen failed") +
           "): put cuDNN 9 on LD_LIBRARY_PATH";
  }();
  return why;
}

void check(fe::error_t status, const char* what) {
  if (status.is_bad()) throw_error("cuDNN attention: ", what, " failed: ", status.get_message());
}

struct Key {
  int device;
  bool backward;
  int64_t batch, seq, heads, kv_heads, head_dim;
  bool operator<(const Key& o) const {
    return std::tie(device, backward, batch, seq, heads, kv_heads, head_dim) <
           std::tie(o.device, o.backward, o.batch, o.seq, o.heads, o.kv_heads, o.head_dim);
  }
};

struct Built {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace_bytes = 0;
};

// [batch, heads, seq, head_dim] over rows of `ld` elements, head h at column `column0` + h D.
fe::graph::Tensor_attributes rows_view(const char* name, int64_t uid, int64_t batch, int64_t heads,
                                       int64_t seq, int64_t head_dim, int64_t ld) {
  return fe::graph::Tensor_attributes()
      .set_name(name)
      .set_uid(uid)
      .set_dim({batch, heads, seq, head_dim})
      .set_stride({seq * ld, head_dim, ld, 1});
}

std::shared_ptr<fe::graph::Graph> new_graph() {
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return graph;
}

Built build(cudnnHandle_t handle, const Key& key) {
  const int64_t b = key.batch, s = key.seq, h = key.heads, g = key.kv_heads, d = key.head_dim;
  const int64_t ld = (h + 2 * g) * d, out_ld = h * d;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  auto graph = new_graph();
  auto q = graph->tensor(rows_view("q", kQ, b, h, s, d, ld));
  auto k = graph->tensor(rows_view("k", kK, b, g, s, d, ld));
  auto v = graph->tensor(rows_view("v", kV, b, g, s, d, ld));
  if (!key.backward) {
    auto options = fe::graph::SDPA_attributes()
                       .set_name("loom_causal_attention")
                       .set_generate_stats(true)
                       .set_attn_scale(scale)
                       .set_causal_mask(true);
    auto [out, stats] = graph->sdpa(q, k, v, options);
    out->set_output(true)
        .set_uid(kOut)
        .set_dim({b, h, s, d})
        .set_stride({s * out_ld, d, out_ld, 1});
    stats->set_output(true)
        .set_uid(kStats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim({b, h, s, 1})
        .set_stride({h * s, s, 1, 1});
  } else {
    auto out = graph->tensor(rows_view("out", kOut, b, h, s, d, out_ld));
    auto d_out = graph->tensor(rows_view("d_out", kDOut, b, h, s, d, out_ld));
    auto stats = graph->tensor(fe::graph::Tensor_attributes()
                                   .set_name("lse")
                                   .set_uid(kStats)
                                   .set_data_type(fe::DataType_t::FLOAT)
                                   .set_dim({b, h, s, 1})
                                   .set_stride({h * s, s, 1, 1}));
    auto options = fe::graph::SDPA_backward_attributes()
                       .set_name("loom_causal_attention_backward")
                       .set_attn_scale(scale)
                       .set_causal_mask(true)
                       .set_deterministic_algorithm(true);
    auto [d_q, d_k, d_v] = graph->sdpa_backward(q, k, v, out, d_out, stats, options);
    d_q->set_output(true).set_uid(kDQ).set_dim({b, h, s, d}).set_stride({s * ld, d, ld, 1});
    d_k->set_output(true).set_uid(kDK).set_dim({b, g, s, d}).set_stride({s * ld, d, ld, 1});
    d_v->set_output(true).set_uid(kDV).set_dim({b, g, s, d}).set_stride({s * ld, d, ld, 1});
  }
  check(graph->build(handle, {fe::HeurMode_t::A}),
        key.backward ? "building the backward graph" : "building the forward graph");
  Built built;
  built.graph = graph;
  check(graph->get_workspace_size(built.workspace_bytes), "sizing the workspace");
  return built;
}

// The process's handles (one per device) and graphs, behind one lock: building is rare, and
// the lock is held only to find or build.
struct Cache {
  std::mutex mutex;
  std::unordered_map<int, cudnnHandle_t> handles;
  std::map<Key, Built> graphs;
};
Cache& cache() {
  static Cache* c = new Cache;  // never destroyed: handles outlive static destruction order
  return *c;
}

// Workspace from the caching allocator on the default stream (counted as Workspace), else
// stream-ordered: the same rule as the kernels' scratch buffers (device_common.cuh).
class Workspace {
 public:
  Workspace(int64_t bytes, cudaStream_t stream)
      : stream_(stream), bytes_(static_cast<size_t>(bytes)) {
    if (bytes_ == 0) return;
    if (stream_ == nullptr)
      ptr_ = DeviceAllocator::current().allocate(bytes_, MemCategory::Workspace);
    else
      LOOM_CUDA_CHECK(cudaMallocAsync(&ptr_, bytes_, stream_));
  }
  ~Workspace() {
    if (!ptr_) return;
    if (stream_ == nullptr)
      DeviceAllocator::current().release(ptr_, bytes_, MemCategory::Workspace);
    else
      (void)cudaFreeAsync(ptr_, stream_);
  }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  void* get() const { return ptr_; }

 private:
  cudaStream_t stream_;
  size_t bytes_;
  void* ptr_ = nullptr;
};

void run(const Key& key, std::unordered_map<int64_t, void*>& pack, cudaStream_t stream) {
  if (const std::string& why = load_cudnn(); !why.empty()) throw_error("cuDNN attention: ", why);
  Cache& c = cache();
  std::shared_ptr<fe::graph::Graph> graph;
  cudnnHandle_t handle = nullptr;
  int64_t workspace_bytes = 0;
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    auto h = c.handles.find(key.device);
    if (h == c.handles.end()) {
      cudnnHandle_t created = nullptr;
      if (fe::detail::create_handle(&created) != CUDNN_STATUS_SUCCESS)
        throw_error("cuDNN attention: cudnnCreate failed on device ", key.device);
      h = c.handles.emplace(key.device, created).first;
    }
    handle = h->second;
    auto found = c.graphs.find(key);
    if (found == c.graphs.end()) found = c.graphs.emplace(key, build(handle, key)).first;
    graph = found->second.graph;
    workspace_bytes = found->second.workspace_bytes;
  }
  if (fe::detail::set_stream(handle, stream) != CUDNN_STATUS_SUCCESS)
    throw_error("cuDNN attention: cudnnSetStream failed");
  Workspace workspace(workspace_bytes, stream);
  check(graph->execute(handle, pack, workspace.get()),
        key.backward ? "the backward" : "the forward");
}

Key key_of(const AttentionShape& s, bool backward) {
  int device = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&device));
  return {device, backward, s.batch, s.seq_len, s.heads, s.kv_heads, s.head_dim};
}

void* mutable_ptr(const void* p) { return const_cast<void*>(p); }

}  // namespace

std::string cudnn_attention_refusal(const AttentionShape& shape,
                                    std::initializer_list<const void*> pointers) {
  if (shape.head_dim % 8 != 0 || shape.head_dim > 128)
    return "head_dim " + std::to_string(shape.head_dim) +
           " (cuDNN attention takes multiples of 8 up to 128 here)";
  for (const void* p : pointers)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return "a pointer not 16-byte aligned";
  return load_cudnn();
}

void cudnn_attention_forward(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv,
                             const AttentionShape& shape, cudaStream_t stream) {
  const int64_t d = shape.head_dim;
  std::unordered_map<int64_t, void*> pack = {
      {kQ, mutable_ptr(qkv)},
      {kK, mutable_ptr(qkv + shape.heads * d)},
      {kV, mutable_ptr(qkv + (shape.heads + shape.kv_heads) * d)},
      {kOut, out},
      {kStats, lse}};
  run(key_of(shape, false), pack, stream);
}

void cudnn_attention_backward(__nv_bfloat16* d_qkv, const __nv_bfloat16* d_out,
                              const __nv_bfloat16* qkv, const __nv_bfloat16* out, const float* lse,
                              const AttentionShape& shape, cudaStream_t stream) {
  const int64_t d = shape.head_dim, k_col = shape.heads * d,
                v_col = (shape.heads + shape.kv_heads) * d;
  std::unordered_map<int64_t, void*> pack = {{kQ, mutable_ptr(qkv)},
                                             {kK, mutable_ptr(qkv + k_col)},
                                             {kV, mutable_ptr(qkv + v_col)},
                                             {kOut, mutable_ptr(out)},
                                             {kDOut, mutable_ptr(d_out)},
                                             {kStats, mutable_ptr(lse)},
                                             {kDQ, d_qkv},
                                             {kDK, d_qkv + k_col},
                                             {kDV, d_qkv + v_col}};
  run(key_of(shape, true), pack, stream);
}

}  // namespace loom::cuda::detail
