#pragma once
// Sharded checkpoints, written by every rank at once, and one reader for every checkpoint.
//
// A sharded checkpoint directory holds, besides config.json and trainer_state.json:
//   shard-<rank>-of-<world>.safetensors  one per rank: one 1-D F32 entry per tensor it holds
//                                        pieces of ("<param>", "<param>.exp_avg", ...), the
//                                        pieces one after another
//   index.json                           for every tensor, its global shape (loom layout,
//                                        row-major) and the pieces that hold it: file, first
//                                        element, element count, offset in the file's entry
//   manifest.json                        byte size and CRC32 of every file above
// The slices of a tensor cover it exactly once, so a checkpoint written on one layout can be
// read back on any other: a reader asks for any element range and gets it from whichever
// files hold it. The single-file format (checkpoint.hpp) reads through the same interface.
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "loom/ckpt/checkpoint.hpp"
#include "loom/ckpt/ranged_file.hpp"
#include "loom/ckpt/safetensors.hpp"
#include "loom/model/config.hpp"

namespace loom {

// One rank's piece of one tensor: elements [start, start + count) of `tensor` flattened.
struct ShardSlice {
  std::string tensor;
  Shape shape;  // the whole tensor's
  int64_t start = 0, count = 0;
  const float* data = nullptr;
};

// "shard-00003-of-00004.safetensors"
std::string shard_file_name(int rank, int world);

// Each rank, into the shared temp directory: its shard file and a small description of it
// (pieces, bytes, CRC32) that finish_sharded_checkpoint folds into index.json and the manifest.
// The description is written last and atomically: it is the rank's "done" marker, and a temp
// directory that lacks one is a partial checkpoint. `after_file` (checkpoint.hpp) is called
// between the two. Returns the shard file's byte count.
uint64_t write_checkpoint_shard(const std::filesystem::path& temp_dir, int rank, int world,
                                const std::vector<ShardSlice>& slices,
                                const AfterFileHook& after_file = {});

// Rank 0, after every rank's write_checkpoint_shard returned: checks that the pieces cover
// every tensor exactly once, writes index.json, config.json, trainer_state.json and the
// manifest, then installs the directory under `root` like save_checkpoint does.
std::string finish_sharded_checkpoint(const std::filesystem::path& temp_dir, const std::filesystem::path& root,
                                      int64_t step, int world, const ModelConfig& config,
                                      const nlohmann::json& trainer_state, int keep_last);

// How the reader should see one tensor: its loom shape, and whether a single-file
// checkpoint's model.safetensors stores it transposed (HF Conv1D).
struct TensorLayout {
  std::string name;
  Shape shape;
  bool hf_transposed = false;
};

// Opens a checkpoint directory (or a root's latest) of either format. Every file is verified
// against the manifest before anything is parsed, except a sharded checkpoint's shard files
// when opened from a directory: of those only the size (against the manifest) and the header
// are read at first, and each tensor entry a read() needs is read by byte range (pread) and
// checked against its CRC32 when first used. A loading rank so reads the entries that hold
// its pieces, not every shard file in full.
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& dir_or_root);
  // The same from files already in memory (name -> bytes, manifest.json among them), as a
  // directory named `dir` would hold them; what the file reader parses, and what
  // tests/fuzz/ feeds malformed input to.
  static CheckpointReader from_files(const std::string& dir, const std::map<std::string, std::vector<uint8_t>>& files);
  // A Hugging Face model directory (what `save_pretrained` and `loom export` write): config.json
  // and model.safetensors, or model.safetensors.index.json and the files its weight_map names;
  // F32 or BF16 weights in HF layout. No manifest and no trainer state. GPT-2 files that name
  // tensors without the "transformer." prefix (the hub's gpt2) are read under loom's names.
  static CheckpointReader hugging_face_model(const std::string& dir);
  const std::string& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }
  const nlohmann::json& trainer_state() const { return trainer_state_; }
  bool sharded() const { return sharded_; }
  int world_size() const { return world_; }  // ranks that wrote it; 1 for the single-file format
  bool has(const std::string& tensor) const;
  // Elements [start, start + count) of the tensor flattened in loom layout, as f32. Errors name
  // the checkpoint and the tensor: missing, a shape other than layout.shape, a range outside it.
  void read(const TensorLayout& layout, int64_t start, int64_t count, float* out) const;
  // Names of every tensor the checkpoint holds.
  std::vector<std::string> tensor_names() const;
  // A tensor's shape as stored (a single-file checkpoint's transposed weights in HF layout);
  // throws naming the checkpoint when it has no such tensor.
  const Shape& stored_shape(const std::string& tensor) const;
  // Tensor bytes read from shard files by byte range so far (headers not counted).
  uint64_t tensor_bytes_read() const { return tensor_bytes_read_; }

 private:
  // A shard file's tensor entry, read on first use.
  struct RangedEntry {
    const RangedFile* file;
    SafetensorsLayout::Entry layout;
    mutable std::vector<uint8_t> bytes;
    mutable bool loaded = false;
  };
  struct Piece {
    const SafetensorsEntry* entry;  // in memory; null for a ranged entry
    int64_t start, count;
    int64_t offset;  // first element of the piece inside its entry
    const RangedEntry* ranged = nullptr;
  };
  // The entry of `tensor` in shard file `file`: nullopt when the manifest lists no such file.
  struct EntryRef {
    const SafetensorsEntry* entry = nullptr;
    const RangedEntry* ranged = nullptr;
  };
  using EntryLookup =
      std::function<std::optional<EntryRef>(const std::string& file, const std::string& tensor)>;
  const uint8_t* entry_bytes(const Piece& piece) const;
  struct Stored {
    Shape shape;  // loom layout (single-file model weights: HF layout until converted)
    std::vector<Piece> pieces;
    bool model_weight = false;  // single-file model.safetensors: may need transposing
  };
  const std::vector<float>& converted(const std::string& name, const Stored& stored, bool transposed) const;
  CheckpointReader() = default;
  // Parses a checkpoint directory `dir` whose files `read_file` returns (unverified bytes);
  // with `ranged`, a sharded checkpoint's shard files are opened under `dir` and read by range.
  void load(const std::filesystem::path& dir,
            const std::function<std::vector<uint8_t>(const std::string&)>& read_file,
            bool ranged = false);
  void open_ranged_shard(const std::filesystem::path& dir, const std::string& name,
                         const nlohmann::json& manifest);
  void load_index(const std::filesystem::path& dir, const nlohmann::json& index,
                  const EntryLookup& lookup);

  std::string dir_;
  ModelConfig config_;
  nlohmann::json trainer_state_;
  bool sharded_ = false;
  int world_ = 1;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, Stored> tensors_;
  mutable std::map<std::string, std::vector<float>> converted_;  // single-file model weights
  std::vector<std::unique_ptr<RangedFile>> ranged_files_;
  std::map<std::string, std::map<std::string, RangedEntry>>
      ranged_entries_;  // file -> tensor -> entry
  mutable uint64_t tensor_bytes_read_ = 0;
};

}  // namespace loom
