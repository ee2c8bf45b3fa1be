#include "loom/cli/run_manifest.hpp"

#include <cstdio>
#include <filesystem>

#include "loom/ckpt/atomic_file.hpp"
#include "loom/core/error.hpp"
#include "loom/obs/progress.hpp"
#include "loom/train/lr_schedule.hpp"

namespace loom::cli {
namespace {

std::string absolute_path(const std::string& path) {
  if (path.empty()) return path;
  std::error_code ec;
  const std::filesystem::path absolute = std::filesystem::absolute(path, ec);
  return ec ? path : absolute.lexically_normal().string();
}

// A value of run.json as text: strings as they are, numbers as JSON prints them; absent or
// null gives "". Arrays and objects are not what any row expects.
std::string text_of(const nlohmann::json& object, const char* key, const std::string& source) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_number() || it->is_boolean()) return it->dump();
  throw_error("run manifest '", source, "': \"", key, "\" is ", it->dump().substr(0, 60),
              ", expected a string or a number");
}

std::string number_text(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%g", value);
  return buffer;
}

}  // namespace

nlohmann::json model_summary_json(const ModelConfig& model) {
  nlohmann::json summary = {{"arch", architecture_name(model.arch)},
                            {"n_layer", model.n_layer},
                            {"n_embd", model.n_embd},
                            {"n_head", model.n_head},
                            {"n_kv_head", model.n_kv_head},
                            {"ffn_hidden", model.ffn_hidden},
                            {"vocab_size", model.vocab_size},
                            {"max_seq_len", model.max_seq_len},
                            {"parameters", model.parameter_count()}};
  if (model.is_moe()) {
    summary["n_experts"] = model.n_experts;
    summary["experts_per_token"] = model.experts_per_token;
  }
  return summary;
}

std::string describe_model(const nlohmann::json& m) {
  auto number = [&](const char* key) -> std::optional<int64_t> {
    const auto it = m.find(key);
    if (it == m.end() || !it->is_number()) return std::nullopt;
    return it->get<int64_t>();
  };
  std::string text =
      m.contains("arch") && m["arch"].is_string() ? m["arch"].get<std::string>() : "model";
  if (const auto v = number("n_layer")) text += ", " + std::to_string(*v) + " layers";
  if (const auto v = number("n_embd")) text += ", d=" + std::to_string(*v);
  if (const auto v = number("n_head")) {
    text += ", " + std::to_string(*v) + " heads";
    if (const auto kv = number("n_kv_head"); kv && *kv != *v)
      text += " (" + std::to_string(*kv) + " kv)";
  }
  if (const auto v = number("ffn_hidden")) text += ", ffn " + std::to_string(*v);
  if (const auto v = number("n_experts"); v && *v > 0) {
    text += ", " + std::to_string(*v) + " experts";
    if (const auto k = number("experts_per_token")) text += " (top " + std::to_string(*k) + ")";
  }
  if (const auto v = number("vocab_size")) text += ", vocab " + std::to_string(*v);
  if (const auto v = number("parameters"))
    text += ", " + format_count(static_cast<double>(*v)) + " parameters";
  return text;
}

nlohmann::json run_manifest_json(const TrainConfig& config, const std::string& config_path,
                                 int64_t dp, int world_size) {
  ParallelLayout layout = config.layout();
  layout.dp = dp;
  nlohmann::json train_data;
  if (!config.train_data.empty()) {
    train_data = config.train_data;
  } else {
    train_data = nlohmann::json::array();
    for (const DataSource& source : config.train_sources)
      train_data.push_back({{"pattern", source.pattern}, {"weight", source.weight}});
  }
  return {{"config_file", absolute_path(config_path)},
          {"model", model_summary_json(config.model)},
          {"layout", layout.describe()},
          {"world_size", world_size},
          {"device", device_name(config.device)},
          {"precision", precision_name(config.precision)},
          {"steps", config.steps},
          {"batch_size", config.batch_size},
          {"seq_len", config.seq_len},
          {"grad_accum", config.grad_accum},
          {"dp", dp},
          {"tokens_per_step", config.tokens_per_step() * dp},
          {"lr", config.schedule.peak_lr},
          {"min_lr", config.schedule.min_lr},
          {"lr_schedule", lr_schedule_name(config.schedule.kind)},
          {"warmup_steps", config.schedule.warmup_steps},
          {"seed", config.seed},
          {"train_data", train_data},
          {"val_data", config.val_data},
          {"checkpoint_dir", absolute_path(config.checkpoint_dir)},
          {"trace", absolute_path(config.trace_path)}};
}

void write_run_manifest(const TrainConfig& config, const std::string& config_path, int64_t dp,
                        int world_size) {
  std::filesystem::create_directories(config.run_dir);
  atomic_write_file(config.run_dir + "/" + kRunManifestFile,
                    run_manifest_json(config, config_path, dp, world_size).dump(2) + "\n");
}

std::vector<std::pair<std::string, std::string>> run_manifest_rows(const nlohmann::json& manifest,
                                                                   const std::string& source) {
  std::vector<std::pair<std::string, std::string>> rows;
  auto add = [&](const char* label, const std::string& value) {
    if (!value.empty()) rows.emplace_back(label, value);
  };
  if (const auto model = manifest.find("model"); model != manifest.end()) {
    if (!model->is_object())
      throw_error("run manifest '", source, "': \"model\" is ", model->dump().substr(0, 60),
                  ", expected an object");
    add("model", describe_model(*model));
  }
  std::string layout = text_of(manifest, "layout", source);
  if (const std::string world = text_of(manifest, "world_size", source); !world.empty())
    layout += (layout.empty() ? "" : ", ") + world + (world == "1" ? " rank" : " ranks");
  add("layout", layout);
  std::string precision = text_of(manifest, "precision", source);
  if (const std::string device = text_of(manifest, "device", source); !device.empty())
    precision += (precision.empty() ? "" : " on ") + device;
  add("precision", precision);
  add("steps", text_of(manifest, "steps", source));
  std::string tokens = text_of(manifest, "tokens_per_step", source);
  const std::string batch = text_of(manifest, "batch_size", source),
                    seq = text_of(manifest, "seq_len", source),
                    accum = text_of(manifest, "grad_accum", source),
                    dp = text_of(manifest, "dp", source);
  if (!tokens.empty() && !batch.empty() && !seq.empty() && !accum.empty() && !dp.empty())
    tokens += " (" + batch + " sequences x " + seq + " tokens x " + accum + " micro-batches x dp " +
              dp + ")";
  add("tokens/step", tokens);
  if (const auto lr = manifest.find("lr"); lr != manifest.end() && lr->is_number()) {
    std::string text = number_text(lr->get<double>()) + " peak";
    if (const std::string schedule = text_of(manifest, "lr_schedule", source); !schedule.empty())
      text += ", " + schedule;
    if (const std::string warmup = text_of(manifest, "warmup_steps", source); !warmup.empty())
      text += ", warmup " + warmup;
    add("learning rate", text);
  }
  if (const auto data = manifest.find("train_data"); data != manifest.end()) {
    if (data->is_string()) {
      add("train data", data->get<std::string>());
    } else if (data->is_array()) {
      std::string text;
      for (const nlohmann::json& s : *data)
        if (s.is_object() && s.contains("pattern") && s["pattern"].is_string())
          text += (text.empty() ? "" : "; ") + s["pattern"].get<std::string>() +
                  (s.contains("weight") && s["weight"].is_number()
                       ? " x " + number_text(s["weight"].get<double>())
                       : "");
      add("train data", text);
    }
  }
  add("val data", text_of(manifest, "val_data", source));
  add("checkpoints", text_of(manifest, "checkpoint_dir", source));
  add("trace", text_of(manifest, "trace", source));
  add("config file", text_of(manifest, "config_file", source));
  return rows;
}

}  // namespace loom::cli
