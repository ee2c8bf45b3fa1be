// Hybrid Mamba-2 / attention models (ModelConfig::hybrid_pattern): NVIDIA's Nemotron-H,
// Nemotron Nano 2 and Nemotron 3 families, as Megatron-Bridge builds them.
#include <string>

#include "loom/plan/published_model_shapes.hpp"

namespace loom::plan::published_model_table {

namespace {

const char* const kNemotronH =
    "NVIDIA 2025, 'Nemotron-H: A Family of Accurate and Efficient Hybrid Mamba-Transformer Models' "
    "(arXiv "
    "2504.03624); layer patterns and widths from Megatron-Bridge "
    "recipes/nemotronh/h100/nemotronh.py (067f987), "
    "vocabulary 131,072 from the released config.json";
const char* const kNemotronNano2 =
    "NVIDIA 2025, 'NVIDIA Nemotron Nano 2' (arXiv 2508.14444); Megatron-Bridge "
    "recipes/nemotronh/h100/nemotron_nano_v2.py (067f987)";
const char* const kNemotron3 =
    "NVIDIA 2025-26, Nemotron 3 Nano 30B-A3B / Super 120B-A12B / Ultra 550B-A55B; Megatron-Bridge "
    "recipes/nemotronh/h100/nemotron_3_nano.py and its Super / Ultra unit tests, Megatron-LM "
    "examples/post_training/modelopt/conf/nvidia/NVIDIA-Nemotron-3-{Nano,Super,Ultra}-*.sh; MTP as "
    "Megatron-Bridge's recipes train it (mtp_num_layers 2, one repeated '*E' layer)";
const char* const kHybridApprox =
    "its Mamba-2 scans charged as chunked matmuls at a fused attention kernel's rate (ModelConfig::"
    "mamba_scan_flops_per_token)";

// A hybrid of `pattern` (one symbol a layer) on a Llama-style stream: RMSNorm, no biases, no
// position embedding (the Mamba layers carry position), untied head, squared-ReLU MLPs, heads of
// 128.
ModelConfig hybrid(const char* pattern, int64_t hidden, int64_t heads, int64_t kv_heads,
                   int64_t ffn, int64_t mamba_heads, int64_t mamba_head_dim, int64_t mamba_state) {
  ModelConfig c = heads_of(llama_shape(static_cast<int64_t>(std::string(pattern).size()), hidden,
                                       heads, kv_heads, ffn, 131072, 8192),
                           128);
  c.hybrid_pattern = pattern;
  c.squared_relu_mlp = true;
  c.mamba_heads = mamba_heads;
  c.mamba_head_dim = mamba_head_dim;
  c.mamba_state = mamba_state;
  c.mamba_groups = 8;
  c.mamba_conv = 4;
  c.mamba_chunk = 128;
  return c;
}

// Nemotron 3's mixtures: `experts` of `expert_ffn` (top-k), one shared expert twice as wide, a
// latent width (Super, Ultra) and MTP depths.
ModelConfig nemotron3(ModelConfig c, int64_t experts, int64_t top_k, int64_t expert_ffn,
                      int64_t latent, int64_t mtp) {
  c = experts_of(c, experts, top_k, expert_ffn);
  c.n_shared_experts = 2;
  c.moe_router = MoeRouter::Sigmoid;
  c.moe_latent = latent;
  c.mtp_layers = mtp;
  return c;
}

// Every entry here is matched by its variant and, where the name states one, its size: the
// Llama-based "Nemotron Nano 8B", "Super 49B" and "Ultra 253B" are none of these.
const char* const kNemotronHVariant = R"(nemotron[\s_-]*h([^a-z]|$))";
const char* const kNano2Variant = R"((^|[^a-z])nano([^a-z]|$))";

const char* const kNano3Pattern = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME";

}  // namespace

const std::vector<Entry>& hybrid_entries() {
  static const std::vector<Entry> table = {
      // Nemotron 3 by variant (Megatron-Bridge's tables write "Nemotron_3_Nano" with no size); a
      // Nano with a size ("Nemotron Nano 9B v2") is matched by it below.
      {"nemotronhybrid",
       30,
       {"Nemotron 3 Nano 30B-A3B",
        nemotron3(hybrid(kNano3Pattern, 2688, 32, 2, 1856, 64, 64, 128), 128, 6, 1856, 0, 0), 0,
        kNemotron3, "", kHybridApprox},
       R"((^|[^a-z])nano([^a-z]|$))",
       true},
      {"nemotronhybrid",
       30,
       {"Nemotron 3.5 Lightning 30B-A3B",
        nemotron3(hybrid(kNano3Pattern, 2688, 32, 2, 1856, 64, 64, 128), 128, 6, 1856, 0, 2), 0,
        "Megatron-Bridge examples/models/nemotron/nemotron_3/lightning/README.md: Nemotron 3 "
        "Nano's "
        "architecture, trained with MTP",
        "", kHybridApprox},
       R"(lightning)",
       true},
      {"nemotronhybrid",
       120,
       {"Nemotron 3 Super 120B-A12B",
        nemotron3(hybrid("MEMEMEM*EMEMEMEM*EMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*"
                         "EMEMEMEM*EMEMEMEME",
                         4096, 32, 2, 2688, 128, 64, 128),
                  512, 22, 2688, 1024, 2),
        0, kNemotron3, "", kHybridApprox},
       R"((^|[^a-z])super([^a-z]|$))",
       true},
      {"nemotronhybrid",
       550,
       {"Nemotron 3 Ultra 550B-A55B",
        nemotron3(hybrid("MEMEMEM*EMEMEM*EMEMEMEM*EMEMEMEM*EMEMEM*EMEMEMEM*EMEMEMEM*EMEMEM*"
                         "EMEMEMEM*EMEMEMEM*EMEMEM*"
                         "EMEMEMEM*EMEMEMEME",
                         8192, 64, 2, 5120, 256, 64, 128),
                  512, 22, 5120, 2048, 2),
        0, kNemotron3, "", kHybridApprox},
       R"((^|[^a-z])ultra([^a-z]|$))",
       true},
      {"nemotronhybrid",
       8,
       {"Nemotron-H 8B",
        hybrid("M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-", 4096, 32, 8, 21504, 128, 64,
               128),
        0, kNemotronH, "", kHybridApprox},
       kNemotronHVariant,
       true},
      {"nemotronhybrid",
       47,
       {"Nemotron-H 47B",
        hybrid("M-M-M-M-M-M-M-M-M*-M-M-M-M-M-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-M-M---MM---"
               "M-M*-M-M-M-M-M-",
               8192, 64, 8, 30720, 256, 64, 256),
        0, kNemotronH, "", kHybridApprox},
       kNemotronHVariant,
       true},
      {"nemotronhybrid",
       56,
       {"Nemotron-H 56B",
        hybrid("M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-"
               "M*-M-M-M-M-M*-M-"
               "M-M-M-M*-M-M-M-M-M-",
               8192, 64, 8, 32768, 256, 64, 256),
        0, kNemotronH, "", kHybridApprox},
       kNemotronHVariant,
       true},
      {"nemotronhybrid",
       9,
       {"Nemotron Nano 2 9B",
        hybrid("M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-", 4480, 40, 8, 15680, 128,
               80, 128),
        0, kNemotronNano2, "", kHybridApprox},
       kNano2Variant,
       true},
      {"nemotronhybrid",
       12,
       {"Nemotron Nano 2 12B",
        hybrid("M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M-", 5120, 40, 8, 20480,
               128, 80, 128),
        0, kNemotronNano2, "", kHybridApprox},
       kNano2Variant,
       true},
  };
  return table;
}

}  // namespace loom::plan::published_model_table
