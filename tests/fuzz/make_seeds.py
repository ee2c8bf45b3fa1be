#!/usr/bin/env python3
"""Writes the fuzzers' seed corpus: small valid inputs of every parser.

  make_seeds.py OUT_DIR [CHECKPOINT_DIR ...]

OUT_DIR/<target>/ gets the seeds of each fuzz target. Checkpoint directories (a single-file
and a sharded one, as `loom train` writes them) are packed into fuzz_checkpoint's input format:
a mode byte, then [name length: 1 byte][name][size: 4 bytes LE][bytes] per file.
The seeds committed under tests/fuzz/corpus/ were made with this script.
"""
import json
import os
import struct
import sys
import zlib


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def safetensors(entries, metadata=None, crc=True):
    """entries: [(name, dtype, shape, bytes)]; packed in name order, loom's CRC keys added."""
    header, data = {}, b""
    meta = dict(metadata or {})
    for name, dtype, shape, raw in sorted(entries):
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
        if crc:
            meta["loom.crc32." + name] = "%08x" % (zlib.crc32(raw) & 0xFFFFFFFF)
    if meta:
        header["__metadata__"] = meta
    text = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(text)) + text + data


def f32(values):
    return struct.pack("<%df" % len(values), *values)


def byte_to_unicode():
    """GPT-2's byte alphabet (openai/gpt-2 encoder.py, bytes_to_unicode)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def tokenizer_seed(merges):
    alphabet = byte_to_unicode()
    encoder = {alphabet[b]: b for b in range(256)}
    lines = ["#version: 0.2"]
    for left, right in merges:
        l = "".join(alphabet[b] for b in left.encode())
        r = "".join(alphabet[b] for b in right.encode())
        encoder.setdefault(l + r, len(encoder))
        lines.append(l + " " + r)
    encoder["<|endoftext|>"] = len(encoder)
    return json.dumps(encoder, ensure_ascii=False).encode() + b"\0" + ("\n".join(lines) + "\n").encode()


def tokenizer_json_seed(merges, llama3_style):
    """A small Hugging Face tokenizer.json of a byte-level BPE model: GPT-2's shape (ByteLevel
    pre-tokenizer, <|endoftext|> added) or Llama 3's (Split + ByteLevel, ignore_merges, BOS
    template, added tokens beyond the vocabulary)."""
    alphabet = byte_to_unicode()
    vocab = {alphabet[b]: b for b in range(256)}
    spelled_merges = []
    for left, right in merges:
        l = "".join(alphabet[b] for b in left.encode())
        r = "".join(alphabet[b] for b in right.encode())
        vocab.setdefault(l + r, len(vocab))
        spelled_merges.append(l + " " + r)
    def added(content, id):
        return {"id": id, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": False, "special": True}
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": not llama3_style}
    model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
             "merges": spelled_merges}
    if not llama3_style:
        vocab["<|endoftext|>"] = len(vocab)
        return json.dumps({"version": "1.0", "truncation": None, "padding": None,
                           "added_tokens": [added("<|endoftext|>", vocab["<|endoftext|>"])], "normalizer": None,
                           "pre_tokenizer": byte_level, "post_processor": byte_level, "decoder": byte_level,
                           "model": model}, ensure_ascii=False).encode()
    model["ignore_merges"] = True
    bos, eos = len(vocab), len(vocab) + 1
    split = {"type": "Split", "pattern": {"Regex": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"},
             "behavior": "Isolated", "invert": False}
    template = {"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                         {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [bos], "tokens": ["<|begin_of_text|>"]}}}
    return json.dumps({"version": "1.0", "truncation": None, "padding": None,
                       "added_tokens": [added("<|begin_of_text|>", bos), added("<|end_of_text|>", eos)], "normalizer": None,
                       "pre_tokenizer": {"type": "Sequence", "pretokenizers": [split, byte_level]},
                       "post_processor": {"type": "Sequence", "processors": [byte_level, template]},
                       "decoder": byte_level, "model": model}, ensure_ascii=False).encode()


def token_shard(tokens):
    header = [20240520, 1, len(tokens)] + [0] * 253
    return struct.pack("<256i", *header) + struct.pack("<%dH" % len(tokens), *tokens)


def wide_token_shard(tokens):
    """llm.c's Llama 3 format: magic 20240801, version 7, uint32 ids."""
    header = [20240801, 7, len(tokens)] + [0] * 253
    return struct.pack("<256i", *header) + struct.pack("<%dI" % len(tokens), *tokens)


def pack_checkpoint(directory, fix_manifest):
    out = bytes([1 if fix_manifest else 0])
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            data = f.read()
        out += bytes([len(name)]) + name.encode() + struct.pack("<I", len(data)) + data
    return out


def main():
    out = sys.argv[1]
    write(f"{out}/safetensors/two_f32", safetensors([("a.weight", "F32", [2, 3], f32(range(6))), ("b", "F32", [3], f32([1, 2, 3]))]))
    write(f"{out}/safetensors/mixed_dtypes", safetensors(
        [("w", "BF16", [2, 2], struct.pack("<4H", 0x3F80, 0x4000, 0x4040, 0x4080)), ("i", "I32", [2], struct.pack("<2i", 7, -1)),
         ("j", "I64", [1], struct.pack("<q", 5)), ("s", "F32", [], f32([0.5]))], {"format": "pt"}))
    write(f"{out}/safetensors/no_crc", safetensors([("x", "F32", [1, 1], f32([3]))], crc=False))
    write(f"{out}/safetensors/empty", safetensors([]))

    write(f"{out}/token_shard/small", token_shard([1, 2, 3, 50256, 7, 9]))
    write(f"{out}/token_shard/empty", token_shard([]))
    write(f"{out}/token_shard/wide", wide_token_shard([128000, 1, 2, 70000, 50256]))

    write(f"{out}/tokenizer/bytes_only", tokenizer_seed([]))
    write(f"{out}/tokenizer/merges", tokenizer_seed([("h", "e"), ("l", "l"), ("he", "ll"), (" ", "w"), ("o", "r"), (" w", "or")]))
    merges = [("h", "e"), ("l", "l"), ("he", "ll"), (" ", "w"), ("o", "r"), (" w", "or")]
    write(f"{out}/tokenizer_json/gpt2_style", tokenizer_json_seed(merges, False))
    write(f"{out}/tokenizer_json/llama3_style", tokenizer_json_seed(merges, True))
    write(f"{out}/tokenizer_json/bytes_only", tokenizer_json_seed([], False))

    here = os.path.dirname(os.path.abspath(__file__))
    for name in ("demo.toml", "pipeline.toml"):
        with open(os.path.join(here, "..", "..", "configs", name), "rb") as f:
            write(f"{out}/config/{name}", f.read())
    write(f"{out}/config/layouts.toml", """[model]
arch = "llama"
vocab_size = 1000
max_seq_len = 64
n_layer = 4
n_embd = 64
n_head = 4
n_kv_head = 2
n_experts = 4
experts_per_token = 2
[data]
train = "x_*.bin"
[train]
batch_size = 2
seq_len = 64
grad_accum = 4
[parallel]
layout = "tp=2 pp=2 dp=1 zero=1 mbs=2 recompute=selective sp 1f1b"
pp_layers = [2, 2]
[bad_steps]
loss_spike_factor = 2.5
rollback_after = 3
[checkpoint]
dir = "ckpt"
[debug]
inject_nan_at_steps = [3, 5]
""")

    # published_runs: one record per file, a record of every kind and source loom reads (the
    # repository's published/ files).
    published = os.path.join(here, "..", "..", "published")
    picks = {"public_runs.json": ["narayanan21_t1_1.7B", "mpt_h100_80gb_30b_seq8192_8gpu", "zero_fig1_7.5B_64gpu_P_os",
                                  "hagemann_13B_seq8192_64gpu_tp1_pp1_mbs4_disabled_sp1_132876",
                                  "korthikanti22_t4_22B_layer_selective_recompute", "llama3_405B_8192gpu_seq8192",
                                  "automodel_h100_bf16_deepseekv3_1024gpu", "nemo2407_h100_fp8_LLAMA3-8B_8gpu",
                                  "torchtitan_h100_202412_t1_fsdp_compile", "zero_100B_400gpu",
                                  "zero_t2_maxmodel_mp8_512gpu", "korthikanti22_fig1_mem_22B_seqpar_selective"],
             "loom_added_runs.json": ["apertus70b_gh200_4096gpu"],
             "loom_megatron_readme_table.json": ["megatron_readme_h100_462B"],
             "loom_torchtitan_tables.json": ["torchtitan_h100_202412_t5_inter", "torchtitan_h100_202412_t6_cp2"],
             "loom_megatron_bridge_tables.json": ["mbridge2511_gb200_llama405b_256gpu"],
             "loom_megatron_bridge_nvfp4.json": ["mbridge2604_gb300_LLAMA3_70B_64gpu_NVFP4",
                                                 "mbridge2604_gb300_LLAMA3_70B_64gpu_MXFP8"],
             "loom_nemo_tables.json": ["automodel_h100_bf16_nemotronv3super120b_64gpu"]}
    for name, ids in picks.items():
        with open(os.path.join(published, name)) as f:
            runs = {r["id"]: r for r in json.load(f)}
        for run_id in ids:
            write(f"{out}/published_runs/{run_id.replace(' ', '_')}",
                  json.dumps([runs[run_id]], separators=(",", ":")).encode())

    # A record as a new user copies it from a table: empty cells, separators, units, notes.
    with open(os.path.join(published, "loom_megatron_bridge_tables.json")) as f:
        cells = next(r for r in json.load(f) if r["id"] == "mbridge2511_gb200_llama405b_256gpu")
    cells["id"] = "table_cells"
    cells["parallelism"].update(tp="4 (SP)", vp="n/a", cp="-", ep="", fsdp=0, sequence_parallel="no")
    cells["global_batch"] = "1,536"
    cells["hardware"]["gpu_mem_gb"] = "186 GB"
    cells["measured"]["tokens_per_s_per_gpu"] = "~5,984"
    write(f"{out}/published_runs/table_cells", json.dumps([cells], separators=(",", ":")).encode())

    for i, directory in enumerate(sys.argv[2:]):
        write(f"{out}/checkpoint/ckpt{i}_as_is", pack_checkpoint(directory, False))
        write(f"{out}/checkpoint/ckpt{i}_fixed", pack_checkpoint(directory, True))


if __name__ == "__main__":
    main()
