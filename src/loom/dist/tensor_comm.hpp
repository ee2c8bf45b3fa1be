#pragma once
// Collectives and transfers on Tensors of any device and dtype, over any ProcessGroup. A
// tensor the group takes as it is (f32, in the group's memory(): the host for MPI, the group's
// GPU for NCCL) goes straight to the group's call, so CPU training is exactly the float* path.
// Any other tensor (a CUDA tensor over MPI, several ranks sharing one GPU; a bf16 activation)
// is staged: copied into an f32 buffer in the group's memory before the call, and the result
// copied back out when wait() returns or test() first says true. The staging copies wait for
// the device (core/device_memory); in a process that computes on a GPU the host staging
// buffers (comm_buffers) are page-locked and cached, so they move at full bus speed.
// CUDA-aware MPI, which would skip the host, is still to come.
//
// Tensors handed to the group directly on a CUDA device (NCCL) are written by kernels on the
// default stream; the group orders its stream after them (an event, no host wait).
// Counts come from the tensors: a mismatch is a loom::Error naming the call and both shapes.
#include "loom/core/tensor.hpp"
#include "loom/dist/process_group.hpp"

namespace loom::comm {

WorkHandle all_reduce(ProcessGroup& group, const Tensor& data, ReduceOp op);
// in: size() blocks of out.numel(); out gets the reduction of every rank's own block.
WorkHandle reduce_scatter(ProcessGroup& group, const Tensor& in, const Tensor& out, ReduceOp op);
// out: size() blocks of in.numel(), block r from rank r.
WorkHandle all_gather(ProcessGroup& group, const Tensor& in, const Tensor& out);
// in and out: size() blocks; block j of this rank's in becomes block r(this rank) of rank j's out.
WorkHandle all_to_all(ProcessGroup& group, const Tensor& in, const Tensor& out);
// ProcessGroup::all_to_allv on tensors (counts in elements, blocks packed in rank order from
// each tensor's start; the tensors may hold more than the counts add up to).
WorkHandle all_to_allv(ProcessGroup& group, const Tensor& in,
                       const std::vector<int64_t>& send_counts, const Tensor& out,
                       const std::vector<int64_t>& recv_counts);
WorkHandle broadcast(ProcessGroup& group, const Tensor& data, int root);
WorkHandle send(ProcessGroup& group, const Tensor& data, int peer, int tag);
WorkHandle recv(ProcessGroup& group, const Tensor& data, int peer, int tag);
// ProcessGroup::send_recv on tensors: `to_send` to send_peer, `to_receive` from recv_peer.
WorkHandle send_recv(ProcessGroup& group, const Tensor& to_send, int send_peer,
                     const Tensor& to_receive, int recv_peer, int tag);

// Host f32 arrays (scalars, small statistics) on any group: the group's own call on a host
// group, staged through its memory otherwise (an NCCL group reads device memory only).
WorkHandle all_reduce(ProcessGroup& group, float* host, int64_t count, ReduceOp op);
WorkHandle broadcast(ProcessGroup& group, float* host, int64_t count, int root);
// host_out: size() blocks of count_per_rank.
WorkHandle all_gather(ProcessGroup& group, const float* host_in, float* host_out,
                      int64_t count_per_rank);

// Whether `group` takes `t` without staging.
bool takes_directly(const ProcessGroup& group, const Tensor& t);

}  // namespace loom::comm
