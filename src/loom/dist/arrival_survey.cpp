#include "loom/dist/arrival_survey.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <list>
#include <sstream>
#include <thread>

#include "loom/core/error.hpp"

namespace loom::arrival {
namespace {

struct Channel {
  MPI_Comm comm;
  int users = 0;
  int64_t issued = 0;
  int query_tag = 0;   // the communicator's largest tag
  int answer_tag = 0;  // the one below it
};

// What a rank tells a rank that asks: how far it got on the communicator and what it is
// blocked in. Sent as bytes between processes of one build, so the layout is the same.
struct Answer {
  int64_t issued = 0;
  char waiting_in[120] = {};
};

struct PendingAnswer {
  Answer payload;
  MPI_Request request = MPI_REQUEST_NULL;
};

// Process-wide (one MPI process, one thread calling MPI): every communicator's count, the
// answers still being sent, and what this rank is blocked in.
std::list<Channel>& channels() {
  static std::list<Channel> all;
  return all;
}
std::list<PendingAnswer>& pending_answers() {
  static std::list<PendingAnswer> all;
  return all;
}
std::string& current_wait() {
  static std::string what;
  return what;
}

Channel* find(MPI_Comm comm) {
  for (Channel& c : channels())
    if (c.comm == comm) return &c;
  return nullptr;
}

Channel& find_attached(MPI_Comm comm) {
  Channel* c = find(comm);
  if (c == nullptr) throw_error("arrival survey: the communicator was never attached");
  return *c;
}

void answer_one(Channel& c, const MPI_Status& probed) {
  int64_t unused = 0;  // a query carries nothing: every answer says the same
  MPI_Recv(&unused, 1, MPI_INT64_T, probed.MPI_SOURCE, c.query_tag, c.comm, MPI_STATUS_IGNORE);
  PendingAnswer& answer = pending_answers().emplace_back();
  answer.payload.issued = c.issued;
  const std::string& what = current_wait();
  std::memcpy(answer.payload.waiting_in, what.data(),
              std::min(what.size(), sizeof answer.payload.waiting_in - 1));
  MPI_Isend(&answer.payload, sizeof(Answer), MPI_BYTE, probed.MPI_SOURCE, c.answer_tag, c.comm,
            &answer.request);
}

}  // namespace

void attach(MPI_Comm comm) {
  if (Channel* c = find(comm)) {
    ++c->users;
    return;
  }
  int* tag_upper_bound = nullptr;
  int found = 0;
  MPI_Comm_get_attr(comm, MPI_TAG_UB, &tag_upper_bound, &found);
  const int max_tag = found && tag_upper_bound != nullptr ? *tag_upper_bound : 32767;
  channels().push_back(Channel{comm, 1, 0, max_tag, max_tag - 1});
}

void detach(MPI_Comm comm) {
  auto& all = channels();
  for (auto it = all.begin(); it != all.end(); ++it)
    if (it->comm == comm && --it->users == 0) {
      all.erase(it);
      return;
    }
}

int first_reserved_tag(MPI_Comm comm) { return find_attached(comm).answer_tag; }

int64_t enter_collective(MPI_Comm comm) { return ++find_attached(comm).issued; }

WaitScope::WaitScope(const std::string& what) : previous_(std::move(current_wait())) {
  current_wait() = what;
}
WaitScope::~WaitScope() { current_wait() = std::move(previous_); }

void answer_queries() {
  for (Channel& c : channels()) {
    while (true) {
      int flag = 0;
      MPI_Status status;
      MPI_Iprobe(MPI_ANY_SOURCE, c.query_tag, c.comm, &flag, &status);
      if (!flag) break;
      answer_one(c, status);
    }
  }
  auto& pending = pending_answers();
  for (auto it = pending.begin(); it != pending.end();) {
    int done = 0;
    MPI_Test(&it->request, &done, MPI_STATUS_IGNORE);
    it = done ? pending.erase(it) : std::next(it);
  }
}

std::vector<PeerReport> ask(MPI_Comm comm, const std::vector<int>& peers, double grace_seconds) {
  Channel& c = find_attached(comm);
  const size_t n = peers.size();
  // The query's payload outlives this call: a send to a rank that never receives it may stay
  // pending until the job ends. Its value is not read by the answering side.
  static int64_t query = 0;
  std::vector<Answer> answers(n);
  std::vector<MPI_Request> receives(n, MPI_REQUEST_NULL);
  for (size_t i = 0; i < n; ++i) {
    MPI_Irecv(&answers[i], sizeof(Answer), MPI_BYTE, peers[i], c.answer_tag, comm, &receives[i]);
    MPI_Request send = MPI_REQUEST_NULL;
    MPI_Isend(&query, 1, MPI_INT64_T, peers[i], c.query_tag, comm, &send);
    MPI_Request_free(&send);  // completes on its own; nothing waits for it
  }

  std::vector<bool> answered(n, false);
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration<double>(grace_seconds);
  while (Clock::now() < deadline && std::count(answered.begin(), answered.end(), false) > 0) {
    for (size_t i = 0; i < n; ++i) {
      if (answered[i]) continue;
      int done = 0;
      MPI_Test(&receives[i], &done, MPI_STATUS_IGNORE);
      answered[i] = done != 0;
    }
    answer_queries();  // ranks surveying at the same time ask us too
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }

  std::vector<int> world_ranks(n, MPI_UNDEFINED);
  MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  MPI_Comm_group(comm, &group);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  MPI_Group_translate_ranks(group, static_cast<int>(n), peers.data(), world, world_ranks.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world);

  std::vector<PeerReport> reports(n);
  for (size_t i = 0; i < n; ++i) {
    reports[i].rank = peers[i];
    reports[i].world_rank = world_ranks[i];
    reports[i].answered = answered[i];
    if (!answered[i]) {
      MPI_Cancel(&receives[i]);
      MPI_Wait(&receives[i], MPI_STATUS_IGNORE);  // a cancelled receive completes locally
      continue;
    }
    answers[i].waiting_in[sizeof answers[i].waiting_in - 1] = '\0';
    reports[i].issued = answers[i].issued;
    reports[i].waiting_in = answers[i].waiting_in;
  }
  return reports;
}

std::vector<PeerReport> missing_ranks(MPI_Comm comm, int64_t seq, double grace_seconds) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  std::vector<int> others;
  for (int r = 0; r < size; ++r)
    if (r != rank) others.push_back(r);
  std::vector<PeerReport> missing;
  for (PeerReport& r : ask(comm, others, grace_seconds))
    if (!r.answered || r.issued < seq) missing.push_back(std::move(r));
  return missing;
}

std::string describe_peer(const PeerReport& peer, const std::string& group, double grace_seconds) {
  std::ostringstream out;
  out << "rank " << peer.rank;
  if (peer.world_rank != peer.rank) out << " (world rank " << peer.world_rank << ")";
  out << " of group '" << group << "' ";
  if (!peer.answered)
    out << "did not answer within " << grace_seconds
        << " s: busy outside communication, hung or gone";
  else if (peer.waiting_in.empty())
    out << "is not waiting in communication";
  else
    out << "is waiting in " << peer.waiting_in;
  return out.str();
}

std::string describe_missing(const std::vector<PeerReport>& missing, const std::string& group,
                             const std::string& operation, double grace_seconds) {
  std::ostringstream out;
  if (missing.empty()) {
    out << "every rank of group '" << group << "' reached " << operation;
    return out.str();
  }
  out << (missing.size() == 1 ? "rank " : "ranks ");
  for (size_t i = 0; i < missing.size(); ++i) out << (i ? ", " : "") << missing[i].rank;
  out << " (of group '" << group << "') did not reach " << operation << " (";
  for (size_t i = 0; i < missing.size(); ++i) {
    const PeerReport& r = missing[i];
    out << (i ? "; " : "") << "rank " << r.rank;
    if (r.world_rank != r.rank) out << " (world rank " << r.world_rank << ")";
    out << ": ";
    if (!r.answered)
      out << "no answer within " << grace_seconds << " s: busy outside communication, hung or gone";
    else
      out << "had issued " << r.issued << " collectives on the group, "
          << (r.waiting_in.empty() ? std::string("not waiting") : "waiting in " + r.waiting_in);
  }
  out << ")";
  return out.str();
}

}  // namespace loom::arrival
