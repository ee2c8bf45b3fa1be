// libloom_cudnn.so: cuDNN's fused flash attention on loom's layouts, behind the C interface of
// attention_cudnn_abi.h. Built where NVIDIA's header-only cudnn-frontend is found
// (cmake/loom_cuda.cmake); links libcudnn.so.9 and libcudart, nothing of loom's, so that its
// singletons (the caching allocator) stay loom's: the caller allocates the workspace.
//
// One graph per shape and direction, built once (cuDNN's heuristics, mode A, else its fallback
// list) and kept: a training step calls the same few shapes thousands of times. Tensors are
// described in cuDNN's [batch, heads, seq, head_dim] order with the strides of the fused rows,
// so nothing is copied: query head h of token t of sequence b is at qkv + (b seq + t) ld + h D,
// key head g at column (heads + g) D, value head g at (heads + kv_heads + g) D, with ld =
// (heads + 2 kv_heads) D; out and d_out rows are heads D wide; d_q, d_k and d_v land in d_qkv
// as q, k and v lie in qkv. The lse ("stats") is [batch, heads, seq, 1] f32: max + log(sum exp)
// of the scaled, masked scores, the statistic FlashAttention-2 and loom's own kernels keep.
#include <cmath>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>

#include "loom/kernels/cuda/cudnn/attention_cudnn_abi.h"

// The frontend's JSON serialisation is not used.
#define CUDNN_FRONTEND_SKIP_JSON_LIB
#include <cudnn_frontend.h>

namespace {

namespace fe = cudnn_frontend;

// Tensor ids of the graphs' variant packs.
enum : int64_t { kQ = 1, kK, kV, kOut, kStats, kDOut, kDQ, kDK, kDV };

struct Key {
  int device;
  LoomCudnnAttentionShape s;
  auto tied() const {
    return std::tie(device, s.batch, s.seq_len, s.heads, s.kv_heads, s.head_dim, s.backward,
                    s.deterministic);
  }
  bool operator<(const Key& o) const { return tied() < o.tied(); }
};

struct Built {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace_bytes = 0;
};

// [batch, heads, seq, head_dim] over rows of `ld` elements.
fe::graph::Tensor_attributes rows_view(const char* name, int64_t uid, int64_t batch, int64_t heads,
                                       int64_t seq, int64_t head_dim, int64_t ld) {
  return fe::graph::Tensor_attributes()
      .set_name(name)
      .set_uid(uid)
      .set_dim({batch, heads, seq, head_dim})
      .set_stride({seq * ld, head_dim, ld, 1});
}

fe::graph::Tensor_attributes lse_view(int64_t batch, int64_t heads, int64_t seq) {
  return fe::graph::Tensor_attributes()
      .set_name("lse")
      .set_uid(kStats)
      .set_data_type(fe::DataType_t::FLOAT)
      .set_dim({batch, heads, seq, 1})
      .set_stride({heads * seq, seq, 1, 1});
}

void check(fe::error_t status, const char* what) {
  if (status.is_bad()) throw std::runtime_error(std::string(what) + ": " + status.get_message());
}

Built build(cudnnHandle_t handle, const LoomCudnnAttentionShape& s) {
  const int64_t b = s.batch, t = s.seq_len, h = s.heads, g = s.kv_heads, d = s.head_dim;
  const int64_t ld = (h + 2 * g) * d, out_ld = h * d;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto q = graph->tensor(rows_view("q", kQ, b, h, t, d, ld));
  auto k = graph->tensor(rows_view("k", kK, b, g, t, d, ld));
  auto v = graph->tensor(rows_view("v", kV, b, g, t, d, ld));
  if (!s.backward) {
    auto options = fe::graph::SDPA_attributes()
                       .set_name("loom_causal_attention")
                       .set_generate_stats(true)
                       .set_attn_scale(scale)
                       .set_causal_mask(true);
    auto [out, stats] = graph->sdpa(q, k, v, options);
    out->set_output(true)
        .set_uid(kOut)
        .set_dim({b, h, t, d})
        .set_stride({t * out_ld, d, out_ld, 1});
    stats->set_output(true)
        .set_uid(kStats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim({b, h, t, 1})
        .set_stride({h * t, t, 1, 1});
  } else {
    auto out = graph->tensor(rows_view("out", kOut, b, h, t, d, out_ld));
    auto d_out = graph->tensor(rows_view("d_out", kDOut, b, h, t, d, out_ld));
    auto stats = graph->tensor(lse_view(b, h, t));
    auto options = fe::graph::SDPA_backward_attributes()
                       .set_name("loom_causal_attention_backward")
                       .set_attn_scale(scale)
                       .set_causal_mask(true)
                       .set_deterministic_algorithm(s.deterministic != 0);
    auto [d_q, d_k, d_v] = graph->sdpa_backward(q, k, v, out, d_out, stats, options);
    d_q->set_output(true).set_uid(kDQ).set_dim({b, h, t, d}).set_stride({t * ld, d, ld, 1});
    d_k->set_output(true).set_uid(kDK).set_dim({b, g, t, d}).set_stride({t * ld, d, ld, 1});
    d_v->set_output(true).set_uid(kDV).set_dim({b, g, t, d}).set_stride({t * ld, d, ld, 1});
  }
  check(graph->build(handle, {fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}),
        s.backward ? "building the backward graph" : "building the forward graph");
  Built built;
  built.graph = graph;
  check(graph->get_workspace_size(built.workspace_bytes), "sizing the workspace");
  return built;
}

// The process's handles (one per device) and graphs. One lock over finding, building and
// running: a handle's stream is set and used under it, so two threads cannot race on one.
struct Cache {
  std::mutex mutex;
  std::unordered_map<int, cudnnHandle_t> handles;
  std::map<Key, Built> graphs;
};
Cache& cache() {
  static Cache* c = new Cache;  // never destroyed: handles outlive static destruction order
  return *c;
}

// Under the lock.
const Built& find_or_build(Cache& c, const Key& key) {
  auto h = c.handles.find(key.device);
  if (h == c.handles.end()) {
    cudnnHandle_t created = nullptr;
    if (cudnnCreate(&created) != CUDNN_STATUS_SUCCESS)
      throw std::runtime_error("cudnnCreate failed on device " + std::to_string(key.device));
    h = c.handles.emplace(key.device, created).first;
  }
  auto found = c.graphs.find(key);
  if (found == c.graphs.end()) found = c.graphs.emplace(key, build(h->second, key.s)).first;
  return found->second;
}

Key key_of(const LoomCudnnAttentionShape& s) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) throw std::runtime_error("cudaGetDevice failed");
  return {device, s};
}

thread_local std::string t_error;

// Runs `body`, turning anything it throws into the text the interface returns.
template <typename Body>
const char* guarded(Body body) {
  try {
    body();
    return nullptr;
  } catch (const std::exception& e) {
    t_error = e.what();
  } catch (...) {
    t_error = "an unknown exception";
  }
  return t_error.c_str();
}

const char* prepare(const LoomCudnnAttentionShape* shape, int64_t* workspace_bytes) {
  return guarded([&] {
    Cache& c = cache();
    const Key key = key_of(*shape);
    std::lock_guard<std::mutex> lock(c.mutex);
    *workspace_bytes = find_or_build(c, key).workspace_bytes;
  });
}

void* mutable_ptr(const void* p) { return const_cast<void*>(p); }

const char* execute(const LoomCudnnAttentionShape* shape, const LoomCudnnAttentionPointers* p,
                    void* workspace, cudaStream_t stream) {
  return guarded([&] {
    const LoomCudnnAttentionShape& s = *shape;
    const size_t element = 2;  // bf16
    const int64_t d = s.head_dim, k_col = s.heads * d, v_col = (s.heads + s.kv_heads) * d;
    auto at = [&](const void* base, int64_t column) {
      return static_cast<char*>(mutable_ptr(base)) + static_cast<size_t>(column) * element;
    };
    std::unordered_map<int64_t, void*> pack = {
        {kQ, at(p->qkv, 0)}, {kK, at(p->qkv, k_col)}, {kV, at(p->qkv, v_col)}, {kStats, p->lse}};
    if (!s.backward) {
      pack[kOut] = p->out;
    } else {
      pack[kOut] = p->out;
      pack[kDOut] = mutable_ptr(p->d_out);
      pack[kDQ] = at(p->d_qkv, 0);
      pack[kDK] = at(p->d_qkv, k_col);
      pack[kDV] = at(p->d_qkv, v_col);
    }
    Cache& c = cache();
    const Key key = key_of(s);
    std::lock_guard<std::mutex> lock(c.mutex);
    const Built& built = find_or_build(c, key);
    cudnnHandle_t handle = c.handles.at(key.device);
    if (cudnnSetStream(handle, stream) != CUDNN_STATUS_SUCCESS)
      throw std::runtime_error("cudnnSetStream failed");
    check(built.graph->execute(handle, pack, workspace),
          s.backward ? "running the backward" : "running the forward");
  });
}

size_t cudnn_version() { return cudnnGetVersion(); }

}  // namespace

extern "C" const LoomCudnnAttentionApi* loom_cudnn_attention_api(void) {
  static const LoomCudnnAttentionApi api = {LOOM_CUDNN_ATTENTION_ABI, prepare, execute,
                                            cudnn_version};
  return &api;
}
