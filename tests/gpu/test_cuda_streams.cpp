// Work on several CUDA streams (core/cuda/stream): the ops run on the calling thread's current
// stream, two streams issued interleaved compute bit for bit what the default stream does
// (each has its own cuBLASLt workspace), copies follow the current stream, and the caching
// allocator keeps a block to its stream until the other streams that used it are done.
#include <vector>

#include "gpu_test_support.hpp"
#include "loom/core/cuda/device_allocator.hpp"
#include "loom/core/cuda/stream.hpp"
#include "loom/core/device_memory.hpp"
#include "loom/core/tensor.hpp"
#include "loom/kernels/cuda/cublas_context.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/model/loss_sum.hpp"
#include "tensor_test_support.hpp"

namespace loom::cuda::test {
namespace {

using CudaStreams = CudaTest;

struct LinearResults {
  std::vector<float> y, dx, dw, db;
};

// A GPT-2-sized linear layer (768 -> 3072 over 512 rows) in bf16, forward and backward, its
// outputs allocated on the current stream.
struct LinearCase {
  Tensor x, w, b, dy;
  LinearCase(uint32_t seed, int64_t rows, int64_t in, int64_t out)
      : x(on_cuda(host_tensor(random_vector(rows * in, seed), {rows, in}), DType::BF16)),
        w(on_cuda(host_tensor(random_vector(out * in, seed + 1, -0.05f, 0.05f), {out, in}),
                  DType::BF16)),
        b(on_cuda(host_tensor(random_vector(out, seed + 2), {out}), DType::BF16)),
        dy(on_cuda(host_tensor(random_vector(rows * out, seed + 3), {rows, out}), DType::BF16)) {}

  // Queues the work on the current stream; the results are read after `done`.
  struct Pending {
    Tensor y, dx, dw, db;
  };
  Pending queue() const {
    const cudaStream_t s = current_stream();
    Pending p{Tensor::empty(dy.shape(), DType::BF16, MemCategory::Activations, Device::CUDA),
              Tensor::empty(x.shape(), DType::BF16, MemCategory::Activations, Device::CUDA),
              Tensor::empty(w.shape(), DType::F32, MemCategory::Gradients, Device::CUDA),
              Tensor::empty(b.shape(), DType::F32, MemCategory::Gradients, Device::CUDA)};
    LOOM_CUDA_CHECK(cudaMemsetAsync(p.dw.raw(), 0, p.dw.numel() * 4, s));
    LOOM_CUDA_CHECK(cudaMemsetAsync(p.db.raw(), 0, p.db.numel() * 4, s));
    ops::linear_forward(p.y, 0, x, w, &b);
    ops::linear_backward(p.dx, false, p.dw, p.db, dy, 0, x, w);
    return p;
  }
  static LinearResults read(const Pending& p) {
    return {p.y.to_f32_vector(), p.dx.to_f32_vector(), p.dw.to_f32_vector(), p.db.to_f32_vector()};
  }
};

TEST_F(CudaStreams, TwoStreamsInterleavedComputeWhatTheDefaultStreamDoesBitForBit) {
  ASSERT_GE(device_memory::select_cuda_device(0), 0);
  const LinearCase first(11, 512, 768, 3072), second(21, 512, 3072, 768);
  LOOM_CUDA_CHECK(cudaDeviceSynchronize());  // the inputs' uploads, queued on the default stream
  const LinearResults want_first = LinearCase::read(first.queue());
  const LinearResults want_second = LinearCase::read(second.queue());

  Stream a, b;
  LinearCase::Pending on_a, on_b;
  {
    // Issued one after the other from this thread; the GPU may run them at once.
    StreamGuard guard_a(a.get());
    on_a = first.queue();
    {
      StreamGuard guard_b(b.get());
      EXPECT_EQ(current_stream(), b.get());
      on_b = second.queue();
    }
    EXPECT_EQ(current_stream(), a.get()) << "the inner guard restores the outer stream";
  }
  EXPECT_EQ(current_stream(), nullptr) << "the legacy default stream again";
  a.synchronize();
  b.synchronize();
  const LinearResults got_first = LinearCase::read(on_a), got_second = LinearCase::read(on_b);
  EXPECT_EQ(got_first.y, want_first.y);
  EXPECT_EQ(got_first.dx, want_first.dx);
  EXPECT_EQ(got_first.dw, want_first.dw);
  EXPECT_EQ(got_first.db, want_first.db);
  EXPECT_EQ(got_second.y, want_second.y);
  EXPECT_EQ(got_second.dx, want_second.dx);
  EXPECT_EQ(got_second.dw, want_second.dw);
  EXPECT_EQ(got_second.db, want_second.db);

  CublasContext& context = cublas_context();
  void* workspace_a = cublas_workspace(context, a.get());
  EXPECT_NE(workspace_a, cublas_workspace(context, b.get()));
  EXPECT_NE(workspace_a, cublas_workspace(context, nullptr));
  EXPECT_EQ(workspace_a, cublas_workspace(context, a.get()));
}

// A copy to the host on the current stream comes after that stream's kernels, with no
// synchronisation by the caller: the stream is still busy with tens of milliseconds of 8192^3
// products when the copy is issued.
TEST_F(CudaStreams, CopiesFollowTheCurrentStream) {
  ASSERT_GE(device_memory::select_cuda_device(0), 0);
  const LinearCase busy(61, 8192, 8192, 8192), small(31, 512, 768, 3072);
  LOOM_CUDA_CHECK(cudaDeviceSynchronize());
  const LinearResults want = LinearCase::read(small.queue());
  Stream a;
  StreamGuard guard(a.get());
  std::vector<LinearCase::Pending> keep;
  for (int i = 0; i < 4; ++i) keep.push_back(busy.queue());
  const LinearCase::Pending pending = small.queue();
  ASSERT_EQ(cudaStreamQuery(a.get()), cudaErrorNotReady) << "the stream finished too soon to test";
  (void)cudaGetLastError();
  EXPECT_EQ(pending.y.to_f32_vector(), want.y);  // read at once
  EXPECT_EQ(pending.dw.to_f32_vector(), want.dw);
}

TEST_F(CudaStreams, TheAllocatorKeepsABlockToItsStreamUntilOtherStreamsAreDone) {
  ASSERT_GE(device_memory::select_cuda_device(0), 0);
  DeviceAllocator& alloc = DeviceAllocator::current();
  alloc.empty_cache();
  Stream a, b;
  void* block = alloc.allocate(1 << 20, MemCategory::Workspace, a.get());
  alloc.release(block, 1 << 20, MemCategory::Workspace);
  void* on_b = alloc.allocate(1 << 20, MemCategory::Workspace, b.get());
  EXPECT_NE(on_b, block) << "B's work would not queue behind A's";
  void* on_a = alloc.allocate(1 << 20, MemCategory::Workspace, a.get());
  EXPECT_EQ(on_a, block) << "A's next user queues behind A's kernels";
  alloc.release(on_b, 1 << 20, MemCategory::Workspace);

  // B reads the block while busy for tens of milliseconds (8192^3 bf16 products), then A
  // releases it: A may not have it back until B is done.
  const LinearCase busy(41, 8192, 8192, 8192);
  LOOM_CUDA_CHECK(cudaDeviceSynchronize());
  alloc.record_stream(on_a, b.get());
  std::vector<LinearCase::Pending> keep;
  {
    StreamGuard guard(b.get());
    for (int i = 0; i < 4; ++i) keep.push_back(busy.queue());
  }
  alloc.release(on_a, 1 << 20, MemCategory::Workspace);
  ASSERT_EQ(cudaStreamQuery(b.get()), cudaErrorNotReady) << "B finished too soon to test";
  (void)cudaGetLastError();
  void* while_busy = alloc.allocate(1 << 20, MemCategory::Workspace, a.get());
  EXPECT_NE(while_busy, block) << "handed back while B may still read it";
  b.synchronize();
  void* after = alloc.allocate(1 << 20, MemCategory::Workspace, a.get());
  EXPECT_EQ(after, block) << "cached for A once B was done";
  alloc.release(while_busy, 1 << 20, MemCategory::Workspace);
  alloc.release(after, 1 << 20, MemCategory::Workspace);
  keep.clear();  // B's blocks back to B's cache
  alloc.empty_cache();
  EXPECT_EQ(alloc.cached_bytes(), 0);
}

TEST_F(CudaStreams, EventsOrderOneStreamAfterAnother) {
  ASSERT_GE(device_memory::select_cuda_device(0), 0);
  const LinearCase big(51, 4096, 8192, 8192);
  LOOM_CUDA_CHECK(cudaDeviceSynchronize());
  const LinearResults want = LinearCase::read(big.queue());
  Stream producer, consumer;
  Tensor copy;
  {
    StreamGuard guard(producer.get());
    const LinearCase::Pending p = big.queue();
    Event ready;
    ready.record();
    ready.block(consumer.get());
    StreamGuard on_consumer(consumer.get());
    copy = Tensor::empty(p.y.shape(), DType::BF16, MemCategory::Activations, Device::CUDA);
    copy.copy_from(p.y);  // a device copy queued on the consumer, after the producer's GEMM
    DeviceAllocator::current().record_stream(p.y.raw(), consumer.get());
  }
  consumer.synchronize();
  producer.synchronize();
  EXPECT_EQ(copy.to_f32_vector(), want.y);
}

// The fused head adds its loss into a LossSum on the device without the host waiting: the call
// returns while the stream is still busy with 8192^3 products queued before it, and the one
// read gives what the waiting calls return (the same kernels, so the same doubles).
TEST_F(CudaStreams, TheHeadLossStaysOnTheDeviceUntilRead) {
  ASSERT_GE(device_memory::select_cuda_device(0), 0);
  const int64_t rows = 1024, dim = 768, vocab = 50257;
  const Tensor hidden =
      on_cuda(host_tensor(random_vector(rows * dim, 71), {rows, dim}), DType::BF16);
  const Tensor head = on_cuda(
      host_tensor(random_vector(vocab * dim, 72, -0.05f, 0.05f), {vocab, dim}), DType::BF16);
  std::vector<int32_t> targets(rows);
  for (int64_t i = 0; i < rows; ++i) targets[i] = int32_t((7919 * i + 13) % vocab);
  ops::CrossEntropyArgs args;
  args.hidden = hidden;
  args.weight = head;
  args.targets = targets.data();
  args.vocab_chunk = 16384;
  args.d_hidden = Tensor::empty({rows, dim}, DType::BF16, MemCategory::Activations, Device::CUDA);
  const double waited = ops::lm_head_cross_entropy(args);
  ASSERT_GT(waited, 0.0);

  const LinearCase busy(81, 8192, 8192, 8192);
  LOOM_CUDA_CHECK(cudaDeviceSynchronize());
  LossSum sum(Device::CUDA);
  std::vector<LinearCase::Pending> keep;
  for (int i = 0; i < 4; ++i) keep.push_back(busy.queue());
  args.loss_sum = sum.slot();
  EXPECT_EQ(ops::lm_head_cross_entropy(args), 0.0);
  EXPECT_EQ(ops::lm_head_cross_entropy(args), 0.0);
  ASSERT_EQ(cudaStreamQuery(current_stream()), cudaErrorNotReady)
      << "the head waited for the stream";
  (void)cudaGetLastError();
  EXPECT_EQ(sum.read(), 2 * waited);  // x + x is exact in double
  sum.reset();
  EXPECT_EQ(sum.read(), 0.0);
}

}  // namespace
}  // namespace loom::cuda::test
