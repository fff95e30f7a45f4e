// POSIX process plumbing for ddprun: owned descriptors, pipes, PATH lookup, fork/exec of one worker
// in its own process group, and a signalfd that turns SIGINT/SIGTERM/SIGCHLD into readable events.
// SPDX-License-Identifier: MIT (Linux only: signalfd, prctl)
//
// spawn_process() and async-signal safety: between fork and exec the child of a process that may
// have threads (the store server's) may only call async-signal-safe functions, so everything that
// allocates (argv, envp, the resolved path) is built before fork. If execve fails the child writes
// its errno into a close-on-exec pipe; the parent reads 0 bytes on success (exec closed the pipe)
// or the errno, and throws. PR_SET_PDEATHSIG makes the kernel SIGKILL the worker if ddprun dies,
// even by SIGKILL; the getppid() check covers a parent that died before prctl ran.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/core/fd.hpp"
#include "ddp/core/str.hpp"

namespace ddp::launch {

using Fd = ddp::Fd;

struct Pipe {
  Fd read, write;
};

inline std::string errno_text(int err) {
  return ddp::detail::str(std::strerror(err), " (errno ", err, ")");
}

// Close-on-exec; the read end is non-blocking so a supervisor loop never stalls on one worker.
inline Pipe make_pipe(bool nonblocking_read = true) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    throw Error(ddp::detail::str("ddp: ddprun: pipe2 failed: ", errno_text(errno),
                                 ". Too many open files? Check `ulimit -n`."));
  Pipe p{Fd(fds[0]), Fd(fds[1])};
  if (nonblocking_read) ::fcntl(p.read.get(), F_SETFL, ::fcntl(p.read.get(), F_GETFL) | O_NONBLOCK);
  return p;
}

// Finds `program` as execvp would (a name with '/' as is, else each PATH entry), before fork so
// the child needs no allocation. Throws ConfigError when nothing executable is found.
inline std::string resolve_program(const std::string& program, std::string_view path_env) {
  auto executable = [](const std::string& p) {
    struct stat st {};
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
  };
  if (program.empty()) throw ConfigError("ddp: ddprun: the PROGRAM name is empty.");
  if (program.find('/') != std::string::npos) {
    if (executable(program)) return program;
    throw ConfigError(
        ddp::detail::str("ddp: ddprun: cannot execute ", ddp::detail::quoted(program),
                         ": not an executable file. Check the path and its x permission."));
  }
  std::size_t start = 0;
  while (start <= path_env.size()) {
    std::size_t end = path_env.find(':', start);
    if (end == std::string_view::npos) end = path_env.size();
    std::string dir(path_env.substr(start, end - start));
    std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + program;
    if (executable(candidate)) return candidate;
    start = end + 1;
  }
  throw ConfigError(ddp::detail::str("ddp: ddprun: program ", ddp::detail::quoted(program),
                                     " not found in PATH. Give a path such as ./", program, "."));
}

struct SpawnRequest {
  std::string path;               // resolved by resolve_program
  std::vector<std::string> argv;  // argv[0] included
  std::vector<std::string> envp;  // "KEY=VALUE"
  int stdout_fd = 1;              // becomes the child's fd 1
  int stderr_fd = 2;              // becomes the child's fd 2
};

// Forks and execs one process in a new process group (pgid == pid), with PR_SET_PDEATHSIG =
// SIGKILL, an empty signal mask, SIGPIPE at its default, and no descriptors but 0, 1, 2. Returns
// the pid; throws Error when fork fails or the program cannot be executed (child reaped first).
inline pid_t spawn_process(const SpawnRequest& req) {
  std::vector<char*> argv, envp;
  for (const auto& a : req.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : req.envp) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  Pipe exec_status = make_pipe(false);
  const pid_t parent = ::getpid();
  const int out_fd = req.stdout_fd, err_fd = req.stderr_fd, status_fd = exec_status.write.get();
  const char* path = req.path.c_str();

  const pid_t pid = ::fork();
  if (pid < 0) throw Error(ddp::detail::str("ddp: ddprun: fork failed: ", errno_text(errno)));
  if (pid == 0) {
    // Child: async-signal-safe calls only (see the file comment).
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // ddprun died before prctl took effect
    sigset_t none;
    ::sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::signal(SIGPIPE, SIG_DFL);
    // Move the pipes above 2 first (so dup2 never clobbers one with the other), then onto 1 and 2.
    int out = ::fcntl(out_fd, F_DUPFD, 3), err = ::fcntl(err_fd, F_DUPFD, 3);
    if (out < 0 || err < 0 || ::dup2(out, 1) < 0 || ::dup2(err, 2) < 0) {
      int e = errno;
      [[maybe_unused]] auto n = ::write(status_fd, &e, sizeof e);
      ::_exit(127);
    }
    // Close everything else except the exec-status pipe, which is close-on-exec.
    if (status_fd > 3) ::syscall(SYS_close_range, 3u, static_cast<unsigned>(status_fd - 1), 0u);
    ::syscall(SYS_close_range, static_cast<unsigned>(status_fd + 1), ~0u, 0u);
    ::execve(path, argv.data(), envp.data());
    int e = errno;
    [[maybe_unused]] auto n = ::write(status_fd, &e, sizeof e);
    ::_exit(127);
  }
  // also from the parent: whichever runs first, the group exists before we signal it
  ::setpgid(pid, pid);
  exec_status.write.reset();
  int child_errno = 0;
  ssize_t n;
  do {
    n = ::read(exec_status.read.get(), &child_errno, sizeof child_errno);
  } while (n < 0 && errno == EINTR);
  if (n > 0) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    throw Error(ddp::detail::str("ddp: ddprun: cannot execute ", ddp::detail::quoted(req.path),
                                 ": ", errno_text(child_errno), "."));
  }
  return pid;
}

// Exit status as a shell reports it: the exit code, or 128 + signal number for a signal.
inline int exit_code_of(int wait_status) noexcept {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return 1;
}

// Human-readable: "exit code 3" or "signal 9 (SIGKILL)".
inline std::string describe_status(int wait_status) {
  if (WIFSIGNALED(wait_status)) {
    const char* abbrev = ::sigabbrev_np(WTERMSIG(wait_status));
    return ddp::detail::str("signal ", WTERMSIG(wait_status), " (SIG", abbrev ? abbrev : "?", ")");
  }
  return ddp::detail::str("exit code ", exit_code_of(wait_status));
}

// Blocks `signals` in the calling thread and reads them from a signalfd instead of running
// handlers. Threads created afterwards inherit the mask, which signalfd needs (a process-directed
// signal goes to any thread that does not block it): create this before starting threads such as
// the store server. The destructor restores the previous mask. Not copyable; one per supervisor.
class SignalChannel {
 public:
  explicit SignalChannel(std::initializer_list<int> signals) {
    sigset_t set;
    ::sigemptyset(&set);
    for (int s : signals) ::sigaddset(&set, s);
    if (int rc = ::pthread_sigmask(SIG_BLOCK, &set, &old_mask_); rc != 0)
      throw Error(ddp::detail::str("ddp: ddprun: pthread_sigmask failed: ", errno_text(rc)));
    fd_ = Fd(::signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC));
    if (!fd_.valid()) {
      int e = errno;
      ::pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
      throw Error(ddp::detail::str("ddp: ddprun: signalfd failed: ", errno_text(e)));
    }
  }
  SignalChannel(const SignalChannel&) = delete;
  SignalChannel& operator=(const SignalChannel&) = delete;
  // Pending signals are consumed before the mask is restored, so a SIGPIPE from writing to a closed
  // stdout cannot kill the process on its way out (SIGINT/SIGTERM were acted on while running).
  ~SignalChannel() {
    signalfd_siginfo info;
    while (::read(fd_.get(), &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
    }
    fd_.reset();
    ::pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
  }

  int fd() const noexcept { return fd_.get(); }

  // Signals since the last call (non-blocking), in arrival order; SIGCHLDs may be coalesced.
  std::vector<int> drain() {
    std::vector<int> out;
    signalfd_siginfo info;
    while (::read(fd_.get(), &info, sizeof info) == static_cast<ssize_t>(sizeof info))
      out.push_back(static_cast<int>(info.ssi_signo));
    return out;
  }

 private:
  Fd fd_;
  sigset_t old_mask_{};
};

}  // namespace ddp::launch
