// The kernels a published run names: its attention (flash, materialised, FlashAttention v1) and,
// where its source's labels say, whether RMSNorm ran fused; from the record's `attention` field
// or the "kernel: <label>" its notes give (Hagemann et al.'s sweeps record one per trial).
#include <regex>
#include <string>

#include "loom/plan/published_fields.hpp"

namespace loom::plan::published_detail {

namespace {

// A kernel the notes name as "kernel: <label>" (Hagemann et al.'s sweeps record one per trial),
// the whole label, lower case; empty when none is named. PyTorch's own attention ("torch") and
// Megatron's fused scale-mask-softmax ("fused") materialise the scores; FlashAttention v1
// ("flash_attentionv1.0.8") runs at half FlashAttention-2's rate (Dao 2023, arXiv 2307.08691:
// "around 2x faster than FlashAttention"); an unversioned label stays at v2's.
std::string kernel_label_of(const RunFields& f) {
  for (const char* field : {"measured.notes", "notes", "parallelism.notes"}) {
    const std::string text = lowercase(f.text(field));
    const size_t at = text.find("kernel:");
    if (at == std::string::npos) continue;
    const size_t from = text.find_first_not_of(' ', at + 7);
    if (from == std::string::npos) continue;
    const size_t to = text.find_first_of(";,\n", from);
    std::string kernel = text.substr(from, to == std::string::npos ? std::string::npos : to - from);
    while (!kernel.empty() && kernel.back() == ' ') kernel.pop_back();
    return kernel;
  }
  return {};
}

// Where the source's labels name the norm kernel ("flash_attention2 + RMS kernel"), a label
// without one ran RMSNorm as PyTorch ops (GpuJob::unfused_rmsnorm); a record with no label is
// read as the fused kernel, the sweeps' best configurations, and says so. Returns the label's
// attention part, what precedes " + ".
std::string read_norm_kernel(std::string kernel, PublishedRun& run) {
  if (kernel.empty()) {
    if (run.model.arch == Architecture::Llama)
      run.assumptions.push_back(
          "norms: the notes name no kernel: a fused RMSNorm kernel (the source's best layouts "
          "use one)");
    return kernel;
  }
  const size_t plus = kernel.find('+');
  const std::string extra = plus == std::string::npos ? "" : kernel.substr(plus);
  if (plus != std::string::npos) {
    kernel = kernel.substr(0, plus);
    while (!kernel.empty() && kernel.back() == ' ') kernel.pop_back();
  }
  if (run.model.arch != Architecture::Llama) return kernel;  // no RMSNorm to run either way
  run.unfused_rmsnorm = extra.find("rms") == std::string::npos;
  if (run.unfused_rmsnorm)
    run.assumptions.push_back("norms: kernel '" + kernel + extra +
                              "' names no RMSNorm kernel, so RMSNorm ran as PyTorch ops "
                              "(LLaMA's reference: an fp32 copy saved, 13 times a fused kernel's "
                              "HBM traffic)");
  return kernel;
}

}  // namespace

void read_kernels(const RunFields& f, const std::string& notes, const std::string& attention,
                  PublishedRun& run) {
  std::string kernel = kernel_label_of(f);
  if (run.conventions.kernel_label_names_norm) kernel = read_norm_kernel(kernel, run);
  if (attention.empty()) {
    const bool notes_flash = notes.find("flash") != std::string::npos;
    static const std::regex flash_v1(R"(^flash[_ ]?attention[_ ]?v?1(\.[0-9.]*)?$)");
    if (kernel == "torch") {
      run.flash_attention = false;
      // Counted op by op as LLaMA's reference writes it; a GPT-2's (with dropout) is not counted.
      run.unfused_softmax = run.model.arch == Architecture::Llama;
      run.assumptions.push_back(
          "attention: the notes name kernel 'torch', PyTorch ops that materialise the scores "
          "(LLaMA's reference: softmax in fp32, each op a trip through HBM)");
    } else if (kernel == "fused") {
      run.flash_attention = false;
      run.assumptions.push_back("attention: the notes name kernel '" + kernel +
                                "', which materialises the scores");
    } else if (std::regex_match(kernel, flash_v1)) {
      run.flash_attention = true;
      run.attention_kernel_speedup *= 0.5;
      run.assumptions.push_back("attention: FlashAttention v1 ('" + kernel +
                                "'), half FlashAttention-2's rate (Dao 2023)");
    } else if (notes_flash) {
      run.flash_attention = true;
    } else if (run.conventions.materialized_attention) {
      run.flash_attention = false;
      run.assumptions.push_back("attention not stated: materialized scores (" +
                                run.conventions.materialized_why + ")");
    } else {
      run.flash_attention = true;
      run.assumptions.push_back("attention not stated: flash");
    }
  } else {
    run.flash_attention = attention != "materialized";
  }
}

}  // namespace loom::plan::published_detail
