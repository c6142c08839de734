// train/dist/dist.cpp — environment, TCP rendezvous and the local launcher (train/dist/dist.h).
#include "train/dist/dist.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "core/error.h"

namespace ffn::train {

namespace {

[[noreturn]] void env_error(const std::string& msg) {
  throw Error("[dist] " + msg, ErrorKind::config);
}

int env_int(const char* name, int def, int lo, int hi = 1 << 30) {
  const char* v = std::getenv(name);
  if (!v || !*v) return def;
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v, &end, 10);
  if (*end != '\0' || end == v)
    env_error(std::string(name) + "=" + v + " is not an integer");
  if (errno == ERANGE || x < lo || x > hi)
    env_error(std::string(name) + "=" + v + " is out of range [" + std::to_string(lo) + ", " +
              std::to_string(hi) + "]");
  return static_cast<int>(x);
}

using clock_t_ = std::chrono::steady_clock;

double seconds_left(clock_t_::time_point deadline) {
  return std::chrono::duration<double>(deadline - clock_t_::now()).count();
}

// Reads one line (up to '\n') or `n` raw bytes, within the deadline.
bool read_exact(int fd, char* buf, size_t n, clock_t_::time_point deadline) {
  size_t got = 0;
  while (got < n) {
    pollfd p{fd, POLLIN, 0};
    const int ms = static_cast<int>(std::max(0.0, seconds_left(deadline)) * 1000);
    if (poll(&p, 1, ms) <= 0) return false;
    const ssize_t r = ::recv(fd, buf + got, n - got, 0);
    if (r <= 0) return false;
    got += static_cast<size_t>(r);
  }
  return true;
}

std::string read_line(int fd, clock_t_::time_point deadline) {
  std::string s;
  char c;
  while (s.size() < 256 && read_exact(fd, &c, 1, deadline)) {
    if (c == '\n') return s;
    s += c;
  }
  return s;
}

void send_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t w = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (w <= 0) FFN_THROW("[rendezvous] send failed: ", std::strerror(errno));
    off += static_cast<size_t>(w);
  }
}

}  // namespace

DistEnv dist_env_from_environment() {
  DistEnv e;
  e.from_env = std::getenv("RANK") != nullptr || std::getenv("WORLD_SIZE") != nullptr;
  e.world = env_int("WORLD_SIZE", 1, 1);
  e.rank = env_int("RANK", 0, 0);
  e.local_rank = env_int("LOCAL_RANK", e.rank, 0);
  e.master_port = env_int("MASTER_PORT", 29500, 1, 65535);
  if (const char* a = std::getenv("MASTER_ADDR"); a && *a) e.master_addr = a;
  if (const char* n = std::getenv("FFN_RUN_NONCE"); n && *n) e.nonce = n;
  // Under torchrun (Note [Rendezvous under torchrun]).
  const char* run_id = std::getenv("TORCHELASTIC_RUN_ID");
  if (run_id && *run_id) {
    e.master_port = e.master_port == 65535 ? 65534 : e.master_port + 1;
    if (!std::getenv("FFN_RUN_NONCE")) {
      const char* restarts = std::getenv("TORCHELASTIC_RESTART_COUNT");
      e.nonce = std::string(run_id) + "/" + (restarts && *restarts ? restarts : "0");
    }
  }
  if (std::getenv("FFN_RDZV_PORT")) e.master_port = env_int("FFN_RDZV_PORT", 29501, 1, 65535);
  if (e.rank >= e.world)
    env_error("RANK=" + std::to_string(e.rank) + " is not below WORLD_SIZE=" + std::to_string(e.world));
  return e;
}

namespace {

using Deadline = clock_t_::time_point;

// Rank 0: listen, accept a valid hello from every other rank, then hand each the payload.
std::string serve_rendezvous(const DistEnv& env, const std::string& payload, Deadline deadline,
                             const std::string& where, double timeout_s) {
  const int ls = ::socket(AF_INET, SOCK_STREAM, 0);
  FFN_CHECK(ls >= 0, "[rendezvous] socket: ", std::strerror(errno));
  const int one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(env.master_port));
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  if (::bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(ls, 64) != 0) {
    const std::string err = std::strerror(errno);
    ::close(ls);
    FFN_THROW("[rendezvous] rank 0 cannot listen on port ", env.master_port, ": ", err,
              " (another run on this port? set MASTER_PORT)");
  }
  std::set<int> joined;
  std::vector<int> conns;
  while (static_cast<int>(joined.size()) < env.world - 1) {
    pollfd p{ls, POLLIN, 0};
    const int ms = static_cast<int>(std::max(0.0, seconds_left(deadline)) * 1000);
    if (poll(&p, 1, ms) <= 0) {
      std::string missing;
      for (int r = 1; r < env.world; ++r)
        if (!joined.count(r)) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      for (int c : conns) ::close(c);
      ::close(ls);
      FFN_THROW("[rendezvous] timed out after ", timeout_s, " s on ", where,
                " waiting for rank(s) ", missing, " of ", env.world);
    }
    const int c = ::accept(ls, nullptr, nullptr);
    if (c < 0) continue;
    std::istringstream hello(read_line(c, deadline));
    std::string magic, nonce;
    int rank = -1, world = -1;
    hello >> magic >> nonce >> rank >> world;
    std::string why;
    if (magic != "FFNRDV1") why = "not a fused-ffn rendezvous";
    else if (nonce != env.nonce) why = "stale or foreign run (nonce " + nonce + ", expected " + env.nonce + ")";
    else if (world != env.world) why = "world size " + std::to_string(world) + " != " + std::to_string(env.world);
    else if (rank < 1 || rank >= env.world || joined.count(rank)) why = "rank " + std::to_string(rank) + " invalid or already joined";
    if (!why.empty()) {
      send_all(c, "REJECT " + why + "\n");
      ::close(c);
      continue;
    }
    joined.insert(rank);
    conns.push_back(c);
  }
  for (int c : conns) {
    send_all(c, "OK " + std::to_string(payload.size()) + "\n" + payload);
    ::close(c);
  }
  ::close(ls);
  return payload;
}

// Other ranks: connect (retrying while rank 0 starts), say hello, read the payload.
std::string join_rendezvous(const DistEnv& env, Deadline deadline, const std::string& where,
                            double timeout_s) {
  std::string last_error = "no attempt";
  while (seconds_left(deadline) > 0) {
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(env.master_addr.c_str(), std::to_string(env.master_port).c_str(), &hints, &res) != 0) {
      last_error = "cannot resolve MASTER_ADDR=" + env.master_addr;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      continue;
    }
    const int s = ::socket(AF_INET, SOCK_STREAM, 0);
    const bool ok = s >= 0 && ::connect(s, res->ai_addr, res->ai_addrlen) == 0;
    freeaddrinfo(res);
    if (!ok) {
      last_error = std::strerror(errno);
      if (s >= 0) ::close(s);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      continue;
    }
    send_all(s, "FFNRDV1 " + env.nonce + " " + std::to_string(env.rank) + " " +
                    std::to_string(env.world) + "\n");
    const std::string head = read_line(s, deadline);
    if (head.rfind("REJECT ", 0) == 0) {
      ::close(s);
      FFN_THROW("[rendezvous] rank 0 at ", where, " rejected rank ", env.rank, ": ", head.substr(7));
    }
    size_t n = 0;
    if (head.rfind("OK ", 0) == 0) n = std::stoul(head.substr(3));
    std::string payload_in(n, '\0');
    const bool got = n > 0 && read_exact(s, payload_in.data(), n, deadline);
    ::close(s);
    FFN_CHECK(got, "[rendezvous] rank ", env.rank, ": bad or cut answer from ", where);
    return payload_in;
  }
  FFN_THROW("[rendezvous] rank ", env.rank, " timed out after ", timeout_s,
            " s connecting to rank 0 at ", where, " (last error: ", last_error, ")");
}

}  // namespace

std::string rendezvous(const DistEnv& env, const std::string& payload, double timeout_s) {
  if (env.world == 1) return payload;
  const Deadline deadline =
      clock_t_::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  const std::string where = env.master_addr + ":" + std::to_string(env.master_port);
  return env.rank == 0 ? serve_rendezvous(env, payload, deadline, where, timeout_s)
                       : join_rendezvous(env, deadline, where, timeout_s);
}

namespace {
volatile sig_atomic_t g_signal = 0;   // the first signal the launcher received
volatile sig_atomic_t g_signals = 0;  // how many
void on_signal(int s) {
  if (g_signal == 0) g_signal = s;
  g_signals = g_signals + 1;
}
}  // namespace

int launch_local(int nproc, const std::vector<std::string>& argv, double grace_s) {
  std::random_device rd;
  const std::string nonce = std::to_string(rd()) + std::to_string(rd());
  // A free port: bind to 0 and read it back (a tiny race with other programs is accepted).
  int port = 29500;
  {
    const int s = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (s >= 0 && ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
        getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) == 0)
      port = ntohs(a.sin_port);
    if (s >= 0) ::close(s);
  }
  std::vector<pid_t> pids;
  for (int r = 0; r < nproc; ++r) {
    const pid_t pid = fork();
    FFN_CHECK(pid >= 0, "[launch] fork failed: ", std::strerror(errno));
    if (pid == 0) {
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      setenv("FFN_RUN_NONCE", nonce.c_str(), 1);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv("/proc/self/exe", args.data());
      std::perror("execv");
      std::_Exit(127);
    }
    pids.push_back(pid);
  }
  // Note [Graceful stop]: a SIGTERM or SIGINT to the launcher is passed to every worker as
  // SIGTERM (they finish the step, checkpoint and exit 0), and so is a later one, which makes
  // them abort. A worker that fails stops the others: SIGTERM, then SIGKILL after grace_s.
  signal(SIGINT, on_signal);
  signal(SIGTERM, on_signal);
  int result = 0;
  size_t alive = pids.size();
  bool stopping = false;
  sig_atomic_t forwarded = 0;
  auto stop_deadline = clock_t_::now();
  while (alive > 0) {
    int st = 0;
    const pid_t done = waitpid(-1, &st, WNOHANG);
    if (done > 0) {
      --alive;
      const int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      if (code != 0 && result == 0) {
        result = code;
        size_t r = 0;
        while (r < pids.size() && pids[r] != done) ++r;
        std::fprintf(stderr, "[launch] worker %zu (pid %d) exited with %d; stopping the others\n", r,
                     static_cast<int>(done), code);
      }
      for (pid_t& p : pids)
        if (p == done) p = -1;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (g_signals > forwarded) {
      std::fprintf(stderr, "[launch] %s: passing SIGTERM to the workers (%s)\n",
                   forwarded == 0 ? (g_signal == SIGINT ? "SIGINT" : "SIGTERM") : "again",
                   forwarded == 0 ? "they stop after their step, with a checkpoint" : "they abort");
      forwarded = g_signals;
      for (pid_t p : pids)
        if (p > 0) kill(p, SIGTERM);
    }
    if (result != 0 && !stopping) {
      stopping = true;
      stop_deadline = clock_t_::now() + std::chrono::milliseconds(static_cast<int64_t>(grace_s * 1000));
      for (pid_t p : pids)
        if (p > 0) kill(p, SIGTERM);
    }
    if (stopping && clock_t_::now() > stop_deadline)
      for (pid_t p : pids)
        if (p > 0) kill(p, SIGKILL);
  }
  return result;
}

}  // namespace ffn::train
