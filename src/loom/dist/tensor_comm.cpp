#include "loom/dist/tensor_comm.hpp"

#include <utility>

#include "loom/core/device_memory.hpp"
#include "loom/core/error.hpp"

namespace loom::comm {
namespace {

// The group's operation on staged copies: the result goes back into `target` once, when the
// operation is first seen complete. Dropping it unwaited waits for the transfer (the staged
// buffers live here) but leaves `target` alone.
class StagedWork final : public Work {
 public:
  StagedWork(WorkHandle inner, Tensor staged_result, Tensor target, Tensor staged_input,
             float* host_target = nullptr)
      : inner_(std::move(inner)),
        staged_result_(std::move(staged_result)),
        target_(std::move(target)),
        staged_input_(std::move(staged_input)),
        host_target_(host_target) {}
  void wait() override {
    inner_->wait();
    finish();
  }
  bool test() override {
    if (!inner_->test()) return false;
    finish();
    return true;
  }

 private:
  void finish() {
    if (done_) return;
    done_ = true;
    if (target_.defined()) target_.copy_from(staged_result_);
    if (host_target_)
      device_memory::copy(host_target_, Device::CPU, staged_result_.raw(), staged_result_.device(),
                          staged_result_.nbytes());
  }
  WorkHandle inner_;
  Tensor staged_result_, target_, staged_input_;
  float* host_target_ = nullptr;
  bool done_ = false;
};

// A staged copy of `t` in the group's memory, in f32 (values copied when `with_values`).
Tensor staged(const ProcessGroup& group, const Tensor& t, bool with_values) {
  Tensor copy = Tensor::empty(t.shape(), DType::F32, MemCategory::CommBuffers, group.memory());
  if (with_values) copy.copy_from(t);
  return copy;
}

void check_defined(const char* op, const ProcessGroup& group, const Tensor& t, const char* what) {
  if (!t.defined())
    throw_error("comm::", op, " on group '", group.name(), "': ", what, " is undefined");
}

void check_blocks(const char* op, const ProcessGroup& group, const Tensor& blocks,
                  const Tensor& block) {
  if (blocks.numel() != block.numel() * group.size())
    throw_error("comm::", op, " on group '", group.name(), "': ", shape_to_string(blocks.shape()),
                " is not ", group.size(), " blocks of ", shape_to_string(block.shape()));
}

}  // namespace

bool takes_directly(const ProcessGroup& group, const Tensor& t) {
  return t.dtype() == DType::F32 && t.device() == group.memory();
}

WorkHandle all_reduce(ProcessGroup& group, const Tensor& data, ReduceOp op) {
  check_defined("all_reduce", group, data, "the tensor");
  if (takes_directly(group, data)) {
    return group.all_reduce(data.f32(), data.numel(), op);
  }
  Tensor buffer = staged(group, data, true);
  WorkHandle work = group.all_reduce(buffer.f32(), buffer.numel(), op);
  return std::make_shared<StagedWork>(std::move(work), buffer, data, Tensor{});
}

WorkHandle reduce_scatter(ProcessGroup& group, const Tensor& in, const Tensor& out, ReduceOp op) {
  check_defined("reduce_scatter", group, in, "the input");
  check_defined("reduce_scatter", group, out, "the output");
  check_blocks("reduce_scatter", group, in, out);
  if (takes_directly(group, in) && takes_directly(group, out)) {
    return group.reduce_scatter(in.f32(), out.f32(), out.numel(), op);
  }
  Tensor staged_in = takes_directly(group, in) ? in : staged(group, in, true);
  Tensor staged_out = staged(group, out, false);
  WorkHandle work = group.reduce_scatter(staged_in.f32(), staged_out.f32(), out.numel(), op);
  return std::make_shared<StagedWork>(std::move(work), staged_out, out, staged_in);
}

WorkHandle all_to_all(ProcessGroup& group, const Tensor& in, const Tensor& out) {
  check_defined("all_to_all", group, in, "the input");
  check_defined("all_to_all", group, out, "the output");
  if (in.numel() != out.numel() || in.numel() % group.size() != 0)
    throw_error("comm::all_to_all on group '", group.name(), "': ", shape_to_string(in.shape()),
                " in and ", shape_to_string(out.shape()), " out are not ", group.size(),
                " equal blocks each");
  const int64_t block = in.numel() / group.size();
  if (takes_directly(group, in) && takes_directly(group, out))
    return group.all_to_all(in.f32(), out.f32(), block);
  Tensor staged_in = takes_directly(group, in) ? in : staged(group, in, true);
  Tensor staged_out = staged(group, out, false);
  WorkHandle work = group.all_to_all(staged_in.f32(), staged_out.f32(), block);
  return std::make_shared<StagedWork>(std::move(work), staged_out, out, staged_in);
}

WorkHandle all_to_allv(ProcessGroup& group, const Tensor& in,
                       const std::vector<int64_t>& send_counts, const Tensor& out,
                       const std::vector<int64_t>& recv_counts) {
  check_defined("all_to_allv", group, in, "the input");
  check_defined("all_to_allv", group, out, "the output");
  int64_t sent = 0, received = 0;
  for (int64_t n : send_counts) sent += n;
  for (int64_t n : recv_counts) received += n;
  if (sent > in.numel() || received > out.numel())
    throw_error("comm::all_to_allv on group '", group.name(), "': ", sent,
                " elements to send from ", shape_to_string(in.shape()), ", ", received,
                " to receive into ", shape_to_string(out.shape()));
  if (takes_directly(group, in) && takes_directly(group, out))
    return group.all_to_allv(in.f32(), send_counts, out.f32(), recv_counts);
  Tensor staged_in = takes_directly(group, in) ? in : staged(group, in, true);
  // With its values: the staged copy goes back whole, and what the counts leave out must stay.
  Tensor staged_out = staged(group, out, true);
  WorkHandle work = group.all_to_allv(staged_in.f32(), send_counts, staged_out.f32(), recv_counts);
  return std::make_shared<StagedWork>(std::move(work), staged_out, out, staged_in);
}

WorkHandle all_gather(ProcessGroup& group, const Tensor& in, const Tensor& out) {
  check_defined("all_gather", group, in, "the input");
  check_defined("all_gather", group, out, "the output");
  check_blocks("all_gather", group, out, in);
  if (takes_directly(group, in) && takes_directly(group, out)) {
    return group.all_gather(in.f32(), out.f32(), in.numel());
  }
  Tensor staged_in = takes_directly(group, in) ? in : staged(group, in, true);
  Tensor staged_out = staged(group, out, false);
  WorkHandle work = group.all_gather(staged_in.f32(), staged_out.f32(), in.numel());
  return std::make_shared<StagedWork>(std::move(work), staged_out, out, staged_in);
}

WorkHandle broadcast(ProcessGroup& group, const Tensor& data, int root) {
  check_defined("broadcast", group, data, "the tensor");
  if (takes_directly(group, data)) {
    return group.broadcast(data.f32(), data.numel(), root);
  }
  Tensor buffer = staged(group, data, group.rank() == root);
  WorkHandle work = group.broadcast(buffer.f32(), buffer.numel(), root);
  return std::make_shared<StagedWork>(std::move(work), buffer, data, Tensor{});
}

WorkHandle send(ProcessGroup& group, const Tensor& data, int peer, int tag) {
  check_defined("send", group, data, "the tensor");
  if (takes_directly(group, data)) {
    return group.send(data.f32(), data.numel(), peer, tag);
  }
  Tensor buffer = staged(group, data, true);
  WorkHandle work = group.send(buffer.f32(), buffer.numel(), peer, tag);
  return std::make_shared<StagedWork>(std::move(work), Tensor{}, Tensor{}, buffer);
}

WorkHandle recv(ProcessGroup& group, const Tensor& data, int peer, int tag) {
  check_defined("recv", group, data, "the tensor");
  if (takes_directly(group, data)) {
    return group.recv(data.f32(), data.numel(), peer, tag);
  }
  Tensor buffer = staged(group, data, false);
  WorkHandle work = group.recv(buffer.f32(), buffer.numel(), peer, tag);
  return std::make_shared<StagedWork>(std::move(work), buffer, data, Tensor{});
}

WorkHandle send_recv(ProcessGroup& group, const Tensor& to_send, int send_peer,
                     const Tensor& to_receive, int recv_peer, int tag) {
  check_defined("send_recv", group, to_send, "the tensor to send");
  check_defined("send_recv", group, to_receive, "the tensor to receive into");
  const bool send_direct = takes_directly(group, to_send),
             recv_direct = takes_directly(group, to_receive);
  const Tensor send_buffer = send_direct ? to_send : staged(group, to_send, true);
  const Tensor recv_buffer = recv_direct ? to_receive : staged(group, to_receive, false);
  WorkHandle work = group.send_recv(send_buffer.f32(), send_buffer.numel(), send_peer,
                                    recv_buffer.f32(), recv_buffer.numel(), recv_peer, tag);
  if (send_direct && recv_direct) return work;
  return std::make_shared<StagedWork>(std::move(work), recv_direct ? Tensor{} : recv_buffer,
                                      recv_direct ? Tensor{} : to_receive,
                                      send_direct ? Tensor{} : send_buffer);
}

namespace {
// A copy of `count` host floats in the group's memory (values copied when `with_values`).
Tensor staged_host(const ProcessGroup& group, const float* host, int64_t count, bool with_values) {
  Tensor copy = Tensor::empty({count}, DType::F32, MemCategory::CommBuffers, group.memory());
  if (with_values)
    device_memory::copy(copy.raw(), copy.device(), host, Device::CPU, copy.nbytes());
  return copy;
}
}  // namespace

WorkHandle all_reduce(ProcessGroup& group, float* host, int64_t count, ReduceOp op) {
  if (group.memory() == Device::CPU) return group.all_reduce(host, count, op);
  Tensor buffer = staged_host(group, host, count, true);
  WorkHandle work = group.all_reduce(buffer.f32(), count, op);
  return std::make_shared<StagedWork>(std::move(work), buffer, Tensor{}, Tensor{}, host);
}

WorkHandle broadcast(ProcessGroup& group, float* host, int64_t count, int root) {
  if (group.memory() == Device::CPU) return group.broadcast(host, count, root);
  Tensor buffer = staged_host(group, host, count, group.rank() == root);
  WorkHandle work = group.broadcast(buffer.f32(), count, root);
  return std::make_shared<StagedWork>(std::move(work), buffer, Tensor{}, Tensor{}, host);
}

WorkHandle all_gather(ProcessGroup& group, const float* host_in, float* host_out,
                      int64_t count_per_rank) {
  if (group.memory() == Device::CPU) return group.all_gather(host_in, host_out, count_per_rank);
  Tensor in = staged_host(group, host_in, count_per_rank, true);
  Tensor out = staged_host(group, host_out, count_per_rank * group.size(), false);
  WorkHandle work = group.all_gather(in.f32(), out.f32(), count_per_rank);
  return std::make_shared<StagedWork>(std::move(work), out, Tensor{}, in, host_out);
}

}  // namespace loom::comm
