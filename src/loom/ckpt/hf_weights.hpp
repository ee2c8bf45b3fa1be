#pragma once
// Moves parameter values to and from Hugging Face's tensor layout. Parameter names already are
// HF names; the one layout difference is GPT-2's Conv1D weights, which HF stores [in, out]
// while loom stores every linear weight [out, in] (those parameters carry `hf_transposed`).
#include <vector>

#include "loom/ckpt/safetensors.hpp"
#include "loom/core/dtype.hpp"
#include "loom/model/parameter.hpp"

namespace loom {

// One entry per parameter, in HF layout, converted to `dtype` (F32 or BF16).
std::vector<SafetensorsEntry> export_hf_weights(const ParameterList& params, DType dtype);

// Copies every parameter's values from `file` (HF layout, F32 or BF16). Everything is checked
// before anything is copied, so a bad file leaves the parameters untouched. Errors name the
// file and parameter: a missing tensor, a shape mismatch (found vs expected), an unsupported
// dtype, or a tensor the model has no parameter for. Tolerated extras: HF's non-parameter
// buffers (".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq") and "lm_head.weight"
// when the model ties embeddings (has no "lm_head.weight" parameter).
void import_hf_weights(const ParameterList& params, const SafetensorsFile& file);

// One HF entry (F32 or BF16) as f32 values in loom layout: `hf_transposed` entries are
// [in, out] in the file and come back [out, in].
std::vector<float> hf_entry_to_loom_values(const SafetensorsEntry& entry, bool hf_transposed);

}  // namespace loom
