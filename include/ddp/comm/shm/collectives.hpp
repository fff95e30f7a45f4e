// shm::Collectives: all-reduce, broadcast, all-gather and barrier through one shared-memory
// segment, for a communicator whose ranks all run on one host: the tcp backend (its TCP mesh stays
// open as the liveness channel) and the mpi backend (all-reduce, broadcast and barrier;
// docs/decisions/0055).
// SPDX-License-Identifier: MIT
//
// Segment layout (shm::Segment::create maps it on every rank):
//   [0, 4096)   control: the segment header, then one 128-byte line per rank: its barrier counter
//               (`arrive`, a futex word), how many ranks sleep on it, the op it announced, its pid
//               and pid namespace
//   then        2 sets x n slots x kSlotBytes of data; rank r writes only slot (set, r)
//
// The all-reduce runs one "round" per block of at most kSlotBytes of the user's buffer:
//   1. every rank copies its block, except its own segment r of it (even_segments: n pieces), into
//      its slot of set (round % 2), then arrives at a barrier;
//   2. rank r reduces segment r: its own buffer's copy (op) every peer's slot, in rank order, into
//      its own slot, then arrives at a second barrier;
//   3. every rank copies each segment j from slot j (where rank j left the result) into its buffer.
// Example, n = 2, 3 MiB of floats and 1 MiB slots: 3 rounds; in each, rank 0 copies the second 512
// KiB of the round into its slot and rank 1 the first; rank 0 sums its buffer's first 512 KiB with
// rank 1's slot, rank 1 the second, and both copy both halves out. Every segment is reduced by
// exactly one rank, so all ranks end bit-identical. A round's data is still in the shared cache
// when the next step reads it, so main memory sees little more than the user's buffer read and
// written once; leaving the own segment out of step 1 saves 1/n of the copy-in
// (docs/decisions/0056).
// Two sets make two barriers per round enough: a rank writes set s in round k+2 only after every
// rank passed round k+1's first barrier, which each reaches after its round-k copy-out. Broadcast,
// all-gather and a small all-reduce (CommOptions::small_allreduce_bytes: every rank reduces the
// whole block from all slots in rank order, n times the tiny arithmetic) use one barrier per round.
//
// Waiting: spin briefly (cores may be shared), then sleep on the peer's futex word for at most
// kNapTime. Between naps the waiter checks the op's deadline, the peer's liveness (Watch::check:
// tcp polls its sockets, a failing rank closes them; mpi tests the peer's pid), and the op the peer
// announced, so that a rank running another collective is a mismatch, not a timeout. How a failure
// is reported is the Watch's: tcp throws PeerFailure exactly like Mesh::run, mpi reports it through
// its fingerprint exchange.
#pragma once

#include <linux/futex.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__)
#  include <emmintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "ddp/comm/reduce.hpp"
#include "ddp/comm/shm/segment.hpp"
#include "ddp/comm/types.hpp"
#include "ddp/core/clock.hpp"
#include "ddp/core/net.hpp"
#include "ddp/core/str.hpp"

namespace ddp::comm::shm {

inline constexpr std::size_t kSlotBytes = 1 << 20;
inline constexpr std::size_t kControlBytes = 4096;
// Ops this large copy results out with streaming stores; below it, cached stores were faster
// (32 MiB L3; docs/decisions/0056).
inline constexpr std::size_t kStreamBytes = 32 << 20;
inline constexpr int kMaxRanks = 31;  // control lines that fit in kControlBytes after the header
inline constexpr auto kNapTime = std::chrono::milliseconds(1);
// Waiting for a peer spins for up to kSpinTime before it sleeps on the futex: waking a sleeper
// costs a syscall on each side and the scheduler's latency (~30 us, against ~2 us for a 16 KiB
// all-reduce between spinning ranks). Each look at the peer is followed by one pause and a
// sched_yield, so a peer or compute thread sharing this core runs at once (~0.4 us when nothing
// else is runnable; yielding less often was slower: docs/decisions/0058).
inline constexpr auto kSpinTime = std::chrono::microseconds(100);

// One rank's control line. Written only by its rank, except `sleepers`.
struct alignas(128) RankLine {
  std::atomic<std::uint32_t> arrive;    // barriers this rank has arrived at (a futex word)
  std::atomic<std::uint32_t> sleepers;  // ranks sleeping on `arrive`: its rank wakes them when > 0
  std::atomic<std::uint64_t> version;   // seqlock over the announced op: odd while being written
  std::atomic<std::uint64_t> seq, meta, count;  // the collective this rank runs now (see announce)
  // the rank's process, for Watch::check (0: not yet known)
  std::atomic<std::int32_t> pid;
  // the inode of its pid namespace (0: unknown), written before pid
  std::atomic<std::uint64_t> pid_ns;
};
static_assert(sizeof(RankLine) == 128);
static_assert(std::atomic<std::uint32_t>::is_always_lock_free &&
              std::atomic<std::uint64_t>::is_always_lock_free);

namespace detail {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// This process's pid namespace (the inode of /proc/self/ns/pid; 0 where there is no such file).
// Ranks on one kernel that share /dev/shm may still sit in different pid namespaces (containers
// sharing IPC but not pids): their pids mean nothing to each other.
inline std::uint64_t pid_namespace() noexcept {
  struct stat st {};
  return ::stat("/proc/self/ns/pid", &st) == 0 ? static_cast<std::uint64_t>(st.st_ino) : 0;
}

inline void futex_wait(std::atomic<std::uint32_t>* addr, std::uint32_t expected,
                       std::chrono::microseconds t) {
  timespec ts{.tv_sec = static_cast<time_t>(t.count() / 1'000'000),
              .tv_nsec = static_cast<long>(t.count() % 1'000'000 * 1000)};
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(addr), FUTEX_WAIT, expected, &ts, nullptr,
            0);
}
inline void futex_wake_all(std::atomic<std::uint32_t>* addr) {
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(addr), FUTEX_WAKE, 0x7fffffff, nullptr,
            nullptr, 0);
}

// memcpy whose stores bypass the cache (x86-64: SSE2 streaming stores, then a fence): for buffers
// far larger than the caches it saves the read-for-ownership of every destination line, a third of
// the memory traffic of a copy. Elsewhere, or for small copies, plain memcpy.
inline void copy_streaming(std::byte* dst, const std::byte* src, std::size_t n) {
#if defined(__x86_64__)
  std::size_t head = (16 - reinterpret_cast<std::uintptr_t>(dst) % 16) % 16;
  if (n < 4096 || head > n) return static_cast<void>(std::memcpy(dst, src, n));
  std::memcpy(dst, src, head);
  dst += head, src += head, n -= head;
  auto* d = reinterpret_cast<__m128i*>(dst);
  const auto* s = reinterpret_cast<const __m128i*>(src);
  const std::size_t blocks = n / 64;
  for (std::size_t i = 0; i < blocks; ++i, d += 4, s += 4) {
    const __m128i a = _mm_loadu_si128(s), b = _mm_loadu_si128(s + 1), c = _mm_loadu_si128(s + 2),
                  e = _mm_loadu_si128(s + 3);
    _mm_stream_si128(d, a);
    _mm_stream_si128(d + 1, b);
    _mm_stream_si128(d + 2, c);
    _mm_stream_si128(d + 3, e);
  }
  std::memcpy(d, s, n % 64);
  _mm_sfence();  // streaming stores are weakly ordered: publish them before anyone is told
#else
  std::memcpy(dst, src, n);
#endif
}

inline std::uint64_t pack_meta(const Fingerprint& f) {
  return static_cast<std::uint64_t>(f.kind) | static_cast<std::uint64_t>(f.dtype) << 8 |
         static_cast<std::uint64_t>(f.has_reduce_op() ? f.op : ReduceOp::Sum) << 16 |
         static_cast<std::uint64_t>(static_cast<std::uint32_t>(f.root)) << 32;
}

}  // namespace detail

// What an op needs from its backend while it waits: a small object per op, built by the caller.
//   fp(), deadline()       the op's fingerprint and when it must give up
//   check(peer)            called between naps while waiting for `peer`: throws when it is gone
//   mismatch(peer, f)      [[noreturn]]: `peer` runs collective `f` where this rank runs fp()
//   timed_out(peer, what)  [[noreturn]]: the deadline passed waiting for `peer` (`what`: where)
// (Checked on the type without reference and const: ops take the Watch by forwarding reference.)
template <class W>
concept Watch = requires(std::remove_cvref_t<W>& w, const std::remove_cvref_t<W>& cw, int peer,
                         const Fingerprint& f, std::string what) {
  { cw.fp() } -> std::convertible_to<const Fingerprint&>;
  { cw.deadline() } -> std::convertible_to<Clock::time_point>;
  w.check(peer);
  w.mismatch(peer, f);
  w.timed_out(peer, what);
};

class Collectives {
 public:
  // Bytes of the segment for n ranks.
  static std::size_t segment_bytes(int n) {
    return kControlBytes + 2 * static_cast<std::size_t>(n) * kSlotBytes;
  }

  // Blocks of at most small_bytes take the one-barrier all-reduce
  // (CommOptions::small_allreduce_bytes).
  Collectives(Segment seg, int rank, int size, std::size_t small_bytes)
      : seg_(std::move(seg)),
        rank_(rank),
        size_(size),
        small_bytes_(small_bytes),
        pid_ns_(detail::pid_namespace()) {
    line(rank_).pid_ns.store(pid_ns_, std::memory_order_relaxed);
    line(rank_).pid.store(static_cast<std::int32_t>(::getpid()), std::memory_order_release);
  }

  int rank() const noexcept { return rank_; }
  // Rank r's process id as this process can address it: 0 until its Collectives exists, and 0 when
  // it lives in another pid namespace (or either namespace is unknown), where its pid names some
  // other process or none.
  std::int32_t pid_of(int r) const noexcept {
    const std::int32_t pid = line(r).pid.load(std::memory_order_acquire);
    const std::uint64_t ns = line(r).pid_ns.load(std::memory_order_relaxed);
    return pid_ns_ != 0 && ns == pid_ns_ ? pid : 0;
  }

  // Publishes the collective this rank is about to run (every collective, through shm or not), so
  // that a peer waiting in a shm op can tell a mismatch from a slow rank.
  void announce(const Fingerprint& f) noexcept {
    RankLine& l = line(rank_);
    const std::uint64_t v = l.version.load(std::memory_order_relaxed);
    l.version.store(v + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    l.seq.store(f.seq, std::memory_order_relaxed);
    l.meta.store(detail::pack_meta(f), std::memory_order_relaxed);
    l.count.store(f.count, std::memory_order_relaxed);
    l.version.store(v + 2, std::memory_order_release);
  }

  // In-place all-reduce of count elements (see the file comment).
  template <Watch W>
  void all_reduce(W&& w, std::byte* data, std::size_t count) {
    const Fingerprint& fp = w.fp();
    const std::size_t es = dtype_size(fp.dtype);
    const std::size_t per_round = kSlotBytes / es;
    std::size_t off = 0;
    // at least one round, so that mismatched counts meet (and are reported) even when one is 0
    do {
      const std::size_t blk = std::min(per_round, count - off);
      const auto seg = even_segments(blk, size_);
      const int set = next_set();
      std::byte* const user = data + off * es;
      std::byte* const own = slot(set, rank_);
      const bool small = blk * es <= small_bytes_;
      if (small) {
        copy_bytes(own, user, blk * es);
      } else {  // all but my segment: the peers reduce theirs from it, mine I reduce from my buffer
        copy_bytes(own, user, seg[rank_] * es);
        copy_bytes(own + seg[rank_ + 1] * es, user + seg[rank_ + 1] * es,
                   (blk - seg[rank_ + 1]) * es);
      }
      barrier(w);
      if (off == 0) verify_peers(w);
      if (small) {  // latency-bound: everyone reduces everything, no second barrier
        copy_bytes(user, slot(set, 0), blk * es);
        for (int j = 1; j < size_; ++j) reduce_into(user, slot(set, j), blk, fp.dtype, fp.op);
        if (fp.op == ReduceOp::Avg) divide_by(user, blk, fp.dtype, size_);
        off += blk;
        continue;
      }
      // My segment, into my slot: my buffer's copy first, then every peer's in rank order.
      std::byte* const mine = own + seg[rank_] * es;
      const std::size_t mine_n = seg[rank_ + 1] - seg[rank_];
      const int first = rank_ == 0 ? 1 : 0;
      reduce_from(mine, user + seg[rank_] * es, slot(set, first) + seg[rank_] * es, mine_n,
                  fp.dtype, fp.op);
      for (int j = first + 1; j < size_; ++j)
        if (j != rank_) reduce_into(mine, slot(set, j) + seg[rank_] * es, mine_n, fp.dtype, fp.op);
      if (fp.op == ReduceOp::Avg) divide_by(mine, mine_n, fp.dtype, size_);
      barrier(w);
      for (int j = 0; j < size_; ++j)
        copy_out(data + (off + seg[j]) * es, slot(set, j) + seg[j] * es, (seg[j + 1] - seg[j]) * es,
                 count * es);
      off += blk;
    } while (off < count);
  }

  // In-place broadcast of `bytes` from root.
  template <Watch W>
  void broadcast(W&& w, std::byte* data, std::size_t bytes, int root) {
    std::size_t off = 0;
    do {
      const std::size_t blk = std::min(kSlotBytes, bytes - off);
      const int set = next_set();
      if (rank_ == root) copy_bytes(slot(set, root), data + off, blk);
      barrier(w);
      if (off == 0) verify_peers(w);
      if (rank_ != root) copy_out(data + off, slot(set, root), blk, bytes);
      off += blk;
    } while (off < bytes);
  }

  // out = every rank's `in` (in_bytes each) in rank order.
  template <Watch W>
  void all_gather(W&& w, const std::byte* in, std::byte* out, std::size_t in_bytes) {
    std::size_t off = 0;
    do {
      const std::size_t blk = std::min(kSlotBytes, in_bytes - off);
      const int set = next_set();
      copy_bytes(slot(set, rank_), in + off, blk);
      barrier(w);
      if (off == 0) verify_peers(w);
      for (int j = 0; j < size_; ++j)
        copy_out(out + static_cast<std::size_t>(j) * in_bytes + off, slot(set, j), blk,
                 in_bytes * static_cast<std::size_t>(size_));
      off += blk;
    } while (off < in_bytes);
  }

  // The barrier() collective: one barrier plus the fingerprint check.
  template <Watch W>
  void barrier_op(W&& w) {
    barrier(w);
    verify_peers(w);
  }

 private:
  struct Announced {
    std::uint64_t seq, meta, count;
  };

  // Arrives at the next barrier and waits for every other rank to arrive there too.
  template <Watch W>
  void barrier(W& w) {
    const std::uint32_t target = ++epoch_;
    RankLine& me = line(rank_);
    me.arrive.store(target, std::memory_order_seq_cst);
    if (me.sleepers.load(std::memory_order_seq_cst) > 0) detail::futex_wake_all(&me.arrive);
    for (int j = 0; j < size_; ++j)
      if (j != rank_) wait_for(j, target, w);
  }

  RankLine& line(int r) const {
    // the first 128 bytes hold the header
    return reinterpret_cast<RankLine*>(seg_.data() + 128)[r];
  }
  std::byte* slot(int set, int r) const {
    return seg_.data() + kControlBytes +
           (static_cast<std::size_t>(set) * static_cast<std::size_t>(size_) +
            static_cast<std::size_t>(r)) *
               kSlotBytes;
  }
  int next_set() { return static_cast<int>(round_++ & 1); }
  // Results of ops larger than kStreamBytes would not stay in cache anyway: stream them out.
  static void copy_out(std::byte* dst, const std::byte* src, std::size_t n, std::size_t op_bytes) {
    if (op_bytes >= kStreamBytes)
      detail::copy_streaming(dst, src, n);
    else
      copy_bytes(dst, src, n);
  }

  static bool reached(std::uint32_t v, std::uint32_t target) noexcept {
    return static_cast<std::int32_t>(v - target) >= 0;  // wrap-safe
  }

  template <Watch W>
  void wait_for(int j, std::uint32_t target, W& w) {
    RankLine& l = line(j);
    // the clock only once it is late
    if (reached(l.arrive.load(std::memory_order_acquire), target)) return;
    for (const auto spin_until = Clock::now() + kSpinTime; Clock::now() < spin_until;) {
      detail::cpu_relax();
      sched_yield();
      if (reached(l.arrive.load(std::memory_order_acquire), target)) return;
    }
    for (;;) {
      check_peer(j, target, w);
      l.sleepers.fetch_add(1, std::memory_order_seq_cst);
      const std::uint32_t v = l.arrive.load(std::memory_order_seq_cst);
      if (!reached(v, target)) detail::futex_wait(&l.arrive, v, kNapTime);
      l.sleepers.fetch_sub(1, std::memory_order_seq_cst);
      if (reached(l.arrive.load(std::memory_order_acquire), target)) return;
    }
  }

  Announced read_announce(int j) const {
    const RankLine& l = line(j);
    for (;;) {  // seqlock read: retry while the owner is writing
      const std::uint64_t v1 = l.version.load(std::memory_order_acquire);
      Announced a{l.seq.load(std::memory_order_relaxed), l.meta.load(std::memory_order_relaxed),
                  l.count.load(std::memory_order_relaxed)};
      std::atomic_thread_fence(std::memory_order_acquire);
      if (v1 % 2 == 0 && v1 == l.version.load(std::memory_order_relaxed)) return a;
      detail::cpu_relax();
    }
  }
  static bool matches(const Announced& a, const Fingerprint& fp) {
    return a.seq == fp.seq && a.meta == detail::pack_meta(fp) && a.count == fp.count;
  }
  static Fingerprint unpack(const Announced& a) {
    return {.kind = static_cast<OpKind>(a.meta & 0xff),
            .dtype = static_cast<DType>((a.meta >> 8) & 0xff),
            .op = static_cast<ReduceOp>((a.meta >> 16) & 0xff),
            .root = static_cast<std::int32_t>(static_cast<std::uint32_t>(a.meta >> 32)),
            .count = a.count,
            .seq = a.seq};
  }

  // After an op's first barrier every peer has announced this op (or, when its seq is higher,
  // already checked ours and moved on). Anything else is a mismatch.
  template <Watch W>
  void verify_peers(W& w) {
    for (int j = 0; j < size_; ++j) {
      if (j == rank_) continue;
      const Announced a = read_announce(j);
      if (a.seq > w.fp().seq || matches(a, w.fp())) continue;
      w.mismatch(j, unpack(a));
    }
  }

  // While waiting for rank j at barrier `target`: a mismatch when j announced another op under this
  // op's number, or a later op without having arrived here (it ran this one without shared memory,
  // so it is another op); the deadline; the Watch's liveness check, unless j has arrived by then.
  template <Watch W>
  void check_peer(int j, std::uint32_t target, W& w) {
    const Announced a = read_announce(j);
    // The arrival is re-read after the announcement: a peer publishes the next op only after
    // arriving here.
    if ((a.seq == w.fp().seq && !matches(a, w.fp())) ||
        (a.seq > w.fp().seq && !reached(line(j).arrive.load(std::memory_order_acquire), target)))
      w.mismatch(j, unpack(a));
    if (Clock::now() >= w.deadline())
      w.timed_out(
          j, ddp::detail::str("waiting for rank ", j, " in shared memory (barrier ", epoch_, ")"));
    try {
      w.check(j);
    } catch (...) {
      // A peer that arrived and then finished (its process may exit right after its last op) is no
      // failure: its arrival may have landed between this wait's last look and the liveness check.
      if (reached(line(j).arrive.load(std::memory_order_acquire), target)) return;
      throw;
    }
  }

  Segment seg_;
  int rank_, size_;
  std::size_t small_bytes_;
  std::uint64_t pid_ns_;     // detail::pid_namespace() of this process
  std::uint32_t epoch_ = 0;  // barriers passed; identical on every rank
  std::uint64_t round_ = 0;  // data rounds run; picks the slot set
};

}  // namespace ddp::comm::shm
