#include "loom/ckpt/hf_weights.hpp"

#include <cstring>
#include <set>
#include <string>

#include "loom/core/error.hpp"

namespace loom {

namespace {

// HF keeps these in some state dicts although they are not trained: GPT-2's causal-mask
// buffers and older Llama exports' RoPE frequency table. loom rebuilds them from the config.
constexpr const char* kHfBufferSuffixes[] = {".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq"};
constexpr const char* kLmHeadName = "lm_head.weight";
constexpr size_t kExtraNamesShown = 5;

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_hf_buffer(const std::string& name) {
  for (const char* suffix : kHfBufferSuffixes)
    if (ends_with(name, suffix)) return true;
  return false;
}

bool stored_transposed(const Parameter& param) { return param.hf_transposed && param.value.dim() == 2; }

Shape hf_shape(const Parameter& param) {
  if (!stored_transposed(param)) return param.value.shape();
  return {param.value.size(1), param.value.size(0)};
}

// [rows, cols] row-major -> [cols, rows] row-major.
std::vector<float> transpose_2d(const std::vector<float>& values, int64_t rows, int64_t cols) {
  std::vector<float> out(values.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      out[static_cast<size_t>(c * rows + r)] = values[static_cast<size_t>(r * cols + c)];
  return out;
}

std::vector<uint8_t> encode(const std::vector<float>& values, DType dtype) {
  std::vector<uint8_t> bytes(values.size() * dtype_size_bytes(dtype));
  if (dtype == DType::F32) {
    if (!values.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  } else {
    for (size_t i = 0; i < values.size(); ++i) {
      const uint16_t half = f32_to_bf16(values[i]);
      std::memcpy(bytes.data() + 2 * i, &half, sizeof half);
    }
  }
  return bytes;
}

// The entry's values as f32; the dtype was checked to be F32 or BF16 beforehand.
std::vector<float> decode(const SafetensorsEntry& entry) {
  const size_t element_bytes = entry.dtype == "F32" ? 4 : 2;
  std::vector<float> values(entry.bytes.size() / element_bytes);
  if (entry.dtype == "F32") {
    if (!values.empty()) std::memcpy(values.data(), entry.bytes.data(), entry.bytes.size());
  } else {
    for (size_t i = 0; i < values.size(); ++i) {
      uint16_t half;
      std::memcpy(&half, entry.bytes.data() + 2 * i, sizeof half);
      values[i] = bf16_to_f32(half);
    }
  }
  return values;
}

void store_values(const std::vector<float>& values, Tensor& target) {
  if (target.device() != Device::CPU) {  // through a host copy, converted to the target's dtype
    Tensor host = Tensor::empty(target.shape(), DType::F32, MemCategory::Workspace);
    if (!values.empty()) std::memcpy(host.f32(), values.data(), values.size() * sizeof(float));
    target.copy_from(host);
    return;
  }
  if (target.dtype() == DType::F32) {
    if (!values.empty()) std::memcpy(target.f32(), values.data(), values.size() * sizeof(float));
  } else {
    uint16_t* out = target.bf16();
    for (size_t i = 0; i < values.size(); ++i) out[i] = f32_to_bf16(values[i]);
  }
}

struct PlannedCopy {
  Parameter* param;
  const SafetensorsEntry* entry;
};

}  // namespace

std::vector<SafetensorsEntry> export_hf_weights(const ParameterList& params, DType dtype) {
  std::vector<SafetensorsEntry> entries;
  entries.reserve(params.size());
  for (const Parameter* param : params) {
    LOOM_CHECK(param != nullptr, "null parameter in list");
    if (!param->value.defined()) throw_error("cannot export parameter '", param->name, "': it has no value tensor");
    std::vector<float> values = param->value.to_f32_vector();
    if (stored_transposed(*param)) values = transpose_2d(values, param->value.size(0), param->value.size(1));
    SafetensorsEntry entry;
    entry.name = param->name;
    entry.dtype = dtype == DType::F32 ? "F32" : "BF16";
    entry.shape = hf_shape(*param);
    entry.bytes = encode(values, dtype);
    entries.push_back(std::move(entry));
  }
  return entries;
}

void import_hf_weights(const ParameterList& params, const SafetensorsFile& file) {
  const std::string where = "HF weights '" + file.path + "'";
  std::set<std::string> param_names;
  std::vector<PlannedCopy> plan;
  for (Parameter* param : params) {
    LOOM_CHECK(param != nullptr, "null parameter in list");
    param_names.insert(param->name);
    if (!param->value.defined()) throw_error("cannot import parameter '", param->name, "': it has no value tensor");
    const SafetensorsEntry* entry = file.find(param->name);
    if (entry == nullptr) throw_error(where, ": missing tensor for model parameter '", param->name, "'");
    if (entry->dtype != "F32" && entry->dtype != "BF16")
      throw_error(where, ": parameter '", param->name, "' has dtype ", entry->dtype, ", expected F32 or BF16");
    const Shape expected = hf_shape(*param);
    if (entry->shape != expected)
      throw_error(where, ": parameter '", param->name, "' has shape ", shape_to_string(entry->shape),
                  " in the file, expected ", shape_to_string(expected),
                  stored_transposed(*param) ? " (HF Conv1D layout [in, out])" : "");
    plan.push_back({param, entry});
  }

  const bool ties_embeddings = !param_names.count(kLmHeadName);
  std::vector<std::string> extras;
  for (const SafetensorsEntry& entry : file.entries) {
    if (param_names.count(entry.name) || is_hf_buffer(entry.name)) continue;
    if (entry.name == kLmHeadName && ties_embeddings) continue;
    extras.push_back(entry.name);
  }
  if (!extras.empty()) {
    std::string shown;
    for (size_t i = 0; i < extras.size() && i < kExtraNamesShown; ++i) shown += (i ? ", '" : "'") + extras[i] + "'";
    if (extras.size() > kExtraNamesShown) shown += ", ...";
    throw_error(where, ": ", extras.size(), " tensor(s) match no model parameter: ", shown,
                " (is the checkpoint for a different architecture or config?)");
  }

  for (const PlannedCopy& copy : plan) {
    std::vector<float> values = decode(*copy.entry);
    if (stored_transposed(*copy.param))
      values = transpose_2d(values, copy.entry->shape[0], copy.entry->shape[1]);
    store_values(values, copy.param->value);
  }
}

std::vector<float> hf_entry_to_loom_values(const SafetensorsEntry& entry, bool hf_transposed) {
  if (entry.dtype != "F32" && entry.dtype != "BF16")
    throw_error("tensor '", entry.name, "' has dtype ", entry.dtype, ", expected F32 or BF16");
  std::vector<float> values = decode(entry);
  if (hf_transposed) {
    if (entry.shape.size() != 2) throw_error("tensor '", entry.name, "' is stored transposed but is not 2-D");
    values = transpose_2d(values, entry.shape[0], entry.shape[1]);
  }
  return values;
}

}  // namespace loom
