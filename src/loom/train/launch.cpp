#include "loom/train/launch.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "loom/core/error.hpp"

namespace loom {
namespace {

namespace fs = std::filesystem;

const char* env_or_null(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

std::string rank_from_environment() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"})
    if (const char* value = env_or_null(name)) return value;
  return "0";
}

volatile sig_atomic_t g_child = 0;
volatile sig_atomic_t g_stop_signal = 0;

void forward_signal(int signal_number) {
  g_stop_signal = signal_number;
  if (g_child > 0) ::kill(static_cast<pid_t>(g_child), signal_number);
}

std::string describe_status(int status) {
  std::ostringstream out;
  if (WIFEXITED(status)) {
    out << "exit code " << WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    out << "killed by signal " << WTERMSIG(status) << " (" << strsignal(WTERMSIG(status)) << ")";
  } else {
    out << "status " << status;
  }
  return out.str();
}

// What the ranks of a failed attempt wrote, one line per rank, in rank order.
std::string rank_reports(const fs::path& dir) {
  std::vector<std::pair<std::string, std::string>> reports;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("rank-", 0) != 0) continue;
    std::ifstream in(entry.path());
    std::string message((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    while (!message.empty() && (message.back() == '\n' || message.back() == '\r')) message.pop_back();
    reports.emplace_back(name.substr(5, name.size() - 9), message);  // "rank-R.txt" -> R
  }
  std::sort(reports.begin(), reports.end(),
            [](const auto& a, const auto& b) { return std::atoll(a.first.c_str()) < std::atoll(b.first.c_str()); });
  std::string out;
  for (const auto& [rank, message] : reports) out += "\n  rank " + rank + ": " + message;
  return out;
}

std::string joined(const std::vector<std::string>& words) {
  std::string out;
  for (const std::string& w : words) out += (out.empty() ? "" : " ") + w;
  return out;
}

}  // namespace

int64_t launch_attempt() {
  const char* value = env_or_null("LOOM_LAUNCH_ATTEMPT");
  return value != nullptr ? std::atoll(value) : 0;
}

void mark_launch_started() {
  if (const char* dir = env_or_null("LOOM_LAUNCH_DIR")) std::ofstream(fs::path(dir) / "started").put('\n');
}

void report_launch_failure(const std::string& message) {
  if (const char* dir = env_or_null("LOOM_LAUNCH_DIR"))
    std::ofstream(fs::path(dir) / ("rank-" + rank_from_environment() + ".txt")) << message << "\n";
}

int launch_with_restarts(const LaunchOptions& options) {
  if (options.command.empty()) throw_error("loom launch: no command given (loom launch [options] -- COMMAND ...)");
  if (options.max_restarts < 0) throw_error("loom launch: --max-restarts ", options.max_restarts, " is negative");
  if (!(options.backoff_s >= 0)) throw_error("loom launch: --backoff ", options.backoff_s, " must be >= 0 seconds");
  struct sigaction action{};
  action.sa_handler = forward_signal;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);

  const fs::path dir = fs::temp_directory_path() / ("loom_launch_" + std::to_string(::getpid()));
  double backoff = options.backoff_s;
  int last_code = 1;
  for (int64_t attempt = 0; attempt <= options.max_restarts; ++attempt) {
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::printf("loom launch: attempt %lld of %lld: %s\n", static_cast<long long>(attempt + 1),
                static_cast<long long>(options.max_restarts + 1), joined(options.command).c_str());
    std::fflush(stdout);
    const auto start = std::chrono::steady_clock::now();
    const pid_t child = ::fork();
    if (child < 0) throw_error("loom launch: fork failed: ", std::strerror(errno));
    if (child == 0) {
      ::setenv("LOOM_LAUNCH_DIR", dir.c_str(), 1);
      ::setenv("LOOM_LAUNCH_ATTEMPT", std::to_string(attempt).c_str(), 1);
      std::vector<char*> argv;
      for (const std::string& word : options.command) argv.push_back(const_cast<char*>(word.c_str()));
      argv.push_back(nullptr);
      ::execvp(argv[0], argv.data());
      std::fprintf(stderr, "loom launch: cannot run '%s': %s\n", argv[0], std::strerror(errno));
      ::_exit(127);
    }
    g_child = child;
    int status = 0;
    while (::waitpid(child, &status, 0) < 0) {
      if (errno != EINTR) throw_error("loom launch: waitpid failed: ", std::strerror(errno));
    }
    g_child = 0;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      std::printf("loom launch: attempt %lld succeeded after %.1f s\n", static_cast<long long>(attempt + 1), seconds);
      fs::remove_all(dir);
      return 0;
    }
    last_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    const std::string reports = rank_reports(dir);
    std::printf("loom launch: attempt %lld failed after %.1f s: %s%s\n", static_cast<long long>(attempt + 1), seconds,
                describe_status(status).c_str(),
                reports.empty() ? " (no rank reported a cause: a rank was killed, or the launcher failed)"
                                : reports.c_str());
    const bool started = fs::exists(dir / "started");
    fs::remove_all(dir);
    if (g_stop_signal != 0) {
      std::printf("loom launch: stopped by signal %d; not relaunching\n", static_cast<int>(g_stop_signal));
      return last_code;
    }
    if (!started) {
      std::printf("loom launch: not relaunching: the run failed before its first training step (a configuration "
                  "or setup error, which would fail again)\n");
      return last_code;
    }
    if (attempt == options.max_restarts) break;
    std::printf("loom launch: relaunching in %.1f s; the run resumes from its newest complete checkpoint\n", backoff);
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::duration<double>(backoff));
    backoff = std::min(backoff * 2, options.max_backoff_s);
  }
  std::printf("loom launch: giving up after %lld attempts\n", static_cast<long long>(options.max_restarts + 1));
  return last_code;
}

}  // namespace loom
