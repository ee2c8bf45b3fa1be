#pragma once
// The CUDA execution model on the host, for checking kernels' logic in sessions without a GPU:
// a kernel's own source, compiled by the host compiler with LOOM_CUDA_EMULATION defined, runs
// each CTA as one std::thread per thread of the block. __syncthreads is a barrier of the block;
// warp-wide instructions (__shfl_xor_sync, mma.sync.m16n8k16 bf16 -> f32, ldmatrix .x4 with and
// without .trans) exchange their operands through the warp and decode them with the fragment
// layouts of the PTX ISA, written here independently of the kernels' own index arithmetic.
//
// It is adversarial where it can be: shared memory starts as NaN bytes (a read of anything
// never written shows), cp.async copies are performed only when a cp.async.wait_group lets them
// complete (the latest moment the hardware may), every shared address is bounds- and
// alignment-checked, and a warp instruction that not all 32 lanes reach hangs rather than
// passes. What it cannot show: timing, bank conflicts, register pressure, and races that the
// host's scheduling happens not to expose.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <array>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

namespace emulation {

[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "emulation: %s\n", what);
  std::abort();
}

constexpr size_t kSharedCapacity = 232448;  // an H100's 227 KB per block
// The kernels' `extern __shared__ unsigned char smem[]` is an array of the kernel file's own
// namespace; the harness defines it (kSharedCapacity bytes) and points this at it.
inline unsigned char* shared_memory = nullptr;
inline size_t shared_bytes = 0;  // the launch's dynamic size: addresses past it are errors

inline dim3 grid_dim, block_dim;

struct Copy {
  void* dst;
  const void* src;
  int bytes;
  bool valid;
};

// One CTA's collective state.
struct Block {
  explicit Block(int threads) : barrier(threads), slots(static_cast<size_t>(threads / 32)) {
    for (int w = 0; w < threads / 32; ++w)
      warp_barriers.emplace_back(std::make_unique<std::barrier<>>(32));
  }
  struct Slot {
    uint32_t a[4];
    uint32_t b[2];
    const void* address;
    uint64_t value;
  };
  std::barrier<> barrier;
  std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
  std::vector<std::array<Slot, 32>> slots;
};

struct ThreadState {
  uint3 thread{0, 0, 0}, block{0, 0, 0};
  Block* cta = nullptr;
  std::vector<Copy> open;                  // issued since the last commit
  std::vector<std::vector<Copy>> pending;  // committed groups, oldest first
};
inline thread_local ThreadState state;

inline int lane() { return static_cast<int>(state.thread.x % 32); }
inline int warp() { return static_cast<int>(state.thread.x / 32); }
inline void warp_sync() {
  state.cta->warp_barriers[static_cast<size_t>(warp())]->arrive_and_wait();
}
inline Block::Slot& my_slot() {
  return state.cta->slots[static_cast<size_t>(warp())][static_cast<size_t>(lane())];
}
inline Block::Slot& slot_of(int l) {
  return state.cta->slots[static_cast<size_t>(warp())][static_cast<size_t>(l)];
}

inline void check_shared(const void* p, size_t bytes, size_t alignment, const char* what) {
  const auto* c = static_cast<const unsigned char*>(p);
  if (c < shared_memory || c + bytes > shared_memory + shared_bytes) {
    std::fprintf(stderr, "emulation: %s at shared offset %td, outside the %zu bytes launched\n",
                 what, c - shared_memory, shared_bytes);
    std::abort();
  }
  if ((c - shared_memory) % static_cast<std::ptrdiff_t>(alignment) != 0) fail(what);
}

inline float bf16_bits_to_float(uint16_t bits) {
  const uint32_t wide = uint32_t{bits} << 16;
  float f;
  std::memcpy(&f, &wide, sizeof f);
  return f;
}
inline uint16_t half_of(uint32_t word, int which) {
  return static_cast<uint16_t>(which ? word >> 16 : word & 0xffffu);
}

// D = A B + C for one m16n8k16 (A row-major 16 x 16, B 16 x 8), each lane's registers laid out
// as the PTX ISA's "Matrix fragments for mma.m16n8k16 with floating point type" figures: A's
// register i of lane (4 g + t) holds row g + 8 (i % 2), columns 2 t + 8 (i / 2) + {0, 1}; B's
// register i holds rows (k) 2 t + 8 i + {0, 1} of column (n) g; C's element i holds row
// g + 8 (i / 2), column 2 t + (i % 2). Products are summed in double and added to C in f32.
inline void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  Block::Slot& mine = my_slot();
  std::memcpy(mine.a, a, sizeof mine.a);
  mine.b[0] = b0;
  mine.b[1] = b1;
  warp_sync();
  auto a_at = [](int row, int k) {
    const int owner = (row % 8) * 4 + (k % 8) / 2, reg = row / 8 + 2 * (k / 8);
    return bf16_bits_to_float(half_of(slot_of(owner).a[reg], k % 2));
  };
  auto b_at = [](int k, int n) {
    const int owner = n * 4 + (k % 8) / 2, reg = k / 8;
    return bf16_bits_to_float(half_of(slot_of(owner).b[reg], k % 2));
  };
  const int g = lane() / 4, t = lane() % 4;
  float out[4];
  for (int e = 0; e < 4; ++e) {
    const int row = g + 8 * (e / 2), col = 2 * t + e % 2;
    double sum = 0.0;
    for (int k = 0; k < 16; ++k) sum += double(a_at(row, k)) * b_at(k, col);
    out[e] = static_cast<float>(double(c[e]) + sum);
  }
  warp_sync();  // every lane has read every slot
  std::memcpy(c, out, sizeof out);
}

// ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16: lane 8 i + j gives the address of row j of
// matrix i (16 bytes, 16-byte aligned); register i of lane 4 g + t receives row g, elements
// 2 t and 2 t + 1 of matrix i, or with .trans elements g of rows 2 t and 2 t + 1.
inline void load_matrices(uint32_t (&r)[4], const __nv_bfloat16* p, bool transposed) {
  check_shared(p, 16, 16, "ldmatrix row address");
  my_slot().address = p;
  warp_sync();
  const int g = lane() / 4, t = lane() % 4;
  for (int i = 0; i < 4; ++i) {
    uint16_t lo, hi;
    auto element = [&](int row, int col) {
      uint16_t bits;
      std::memcpy(&bits, static_cast<const unsigned char*>(slot_of(8 * i + row).address) + 2 * col,
                  sizeof bits);
      return bits;
    };
    if (!transposed) {
      lo = element(g, 2 * t);
      hi = element(g, 2 * t + 1);
    } else {
      lo = element(2 * t, g);
      hi = element(2 * t + 1, g);
    }
    r[i] = uint32_t{lo} | (uint32_t{hi} << 16);
  }
  warp_sync();
}

inline void copy_async(void* dst, const void* src, int bytes, bool valid) {
  check_shared(dst, static_cast<size_t>(bytes), static_cast<size_t>(bytes), "cp.async destination");
  if (reinterpret_cast<uintptr_t>(src) % static_cast<uintptr_t>(bytes) != 0)
    fail("cp.async source not aligned to its size");
  state.open.push_back({dst, src, bytes, valid});
}
inline void commit_copies() {
  state.pending.push_back(std::move(state.open));
  state.open.clear();
}
inline void wait_copies(int allowed_pending) {
  while (static_cast<int>(state.pending.size()) > allowed_pending) {
    for (const Copy& c : state.pending.front()) {
      if (c.valid)
        std::memcpy(c.dst, c.src, static_cast<size_t>(c.bytes));
      else
        std::memset(c.dst, 0, static_cast<size_t>(c.bytes));
    }
    state.pending.erase(state.pending.begin());
  }
}

template <typename T>
T shfl_xor(T v, int lane_mask) {
  static_assert(sizeof(T) <= sizeof(uint64_t));
  std::memcpy(&my_slot().value, &v, sizeof v);
  warp_sync();
  T out;
  std::memcpy(&out, &slot_of(lane() ^ lane_mask).value, sizeof out);
  warp_sync();
  return out;
}

// Runs `kernel()` (a call of the kernel with its arguments) over the grid, one CTA at a time.
template <typename Kernel>
void launch(dim3 grid, dim3 block, size_t dynamic_shared, Kernel kernel) {
  if (!shared_memory) fail("no shared memory array set");
  if (dynamic_shared > kSharedCapacity) fail("dynamic shared memory beyond 227 KB");
  if (block.y != 1 || block.z != 1 || block.x % 32 != 0) fail("blocks of whole warps along x only");
  grid_dim = grid;
  block_dim = block;
  shared_bytes = dynamic_shared;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        std::memset(shared_memory, 0xff, kSharedCapacity);  // NaN in bf16 and f32
        Block cta(static_cast<int>(block.x));
        std::vector<std::thread> threads;
        for (unsigned i = 0; i < block.x; ++i)
          threads.emplace_back([&, i] {
            state = ThreadState{};
            state.thread = {i, 0, 0};
            state.block = {x, y, z};
            state.cta = &cta;
            kernel();
            bool unwaited = !state.open.empty();
            for (const auto& group : state.pending) unwaited = unwaited || !group.empty();
            if (unwaited) fail("a thread ended with cp.async copies never waited for");
          });
        for (std::thread& t : threads) t.join();
      }
}

}  // namespace emulation

// The device-side names the kernels use.
#define threadIdx (::emulation::state.thread)
#define blockIdx (::emulation::state.block)
#define blockDim (::emulation::block_dim)
#define gridDim (::emulation::grid_dim)
#undef __global__
#define __global__
#define __launch_bounds__(...)
#undef __shared__
#define __shared__
#undef __align__
#define __align__(n) __attribute__((aligned(n)))
inline void __syncthreads() { ::emulation::state.cta->barrier.arrive_and_wait(); }
[[noreturn]] inline void __trap() { ::emulation::fail("__trap"); }
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int = 32) {
  if (mask != 0xffffffffu) ::emulation::fail("__shfl_xor_sync with a partial mask");
  return ::emulation::shfl_xor(v, lane_mask);
}
inline size_t __cvta_generic_to_shared(const void*) {
  ::emulation::fail("a shared address taken outside the emulated instructions");
}
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
