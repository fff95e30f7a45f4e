// MpiCommunicator: the mpi backend. Rank and size come from MPI itself; every op is a non-blocking MPI
// call (MPI_Iallreduce, ...) run by a progress thread that tests it against the op's deadline.
// SPDX-License-Identifier: MIT
//
// MPI runtime: if nobody initialised MPI, the first MpiCommunicator calls MPI_Init_thread (asking for
// MPI_THREAD_MULTIPLE, needing at least MPI_THREAD_SERIALIZED: only one thread at a time calls MPI, the
// progress thread) and MPI_Finalize runs at process exit.
// Reductions: float, double and the integers use MPI's built-in ops (Avg = MPI_SUM, then a division);
// bfloat16 and half travel as 16-bit words and reduce through MPI_Op_create'd ops that widen to float;
// uint8 reduces through our op too, so that sums wrap modulo 256 as on the tcp backend (and in PyTorch).
// Failure: MPI cannot cancel a collective, so an op that times out breaks the communicator; the process
// then ends with MPI_Abort at exit instead of hanging in MPI_Finalize, which makes mpirun stop every rank
// (docs/ARCHITECTURE.md D9). A rank that dies is handled by mpirun itself (it kills the job).
// Fingerprints (docs/ARCHITECTURE.md D9): MPI matches collectives by posting order only, so rank 0's all_reduce and
// rank 1's broadcast would meet and give garbage or hang. Before each collective's own call, the ranks
// all-gather its 32-byte fingerprint (kind|dtype|op, root, count, seq) on a second communicator, and
// every rank compares all of them: a difference fails the op on every rank with the same message,
// before any data moves. Cost: one small all-gather per collective (a few microseconds on one host;
// CommOptions::check_fingerprints = false skips it). Send/recv are matched by tag and are not checked.
// Ordering: fingerprints go out on fp_comm_ in issue order; bodies go out on comm_ in issue order too,
// each only after its fingerprint matched and every earlier op's body was posted, so all ranks post
// both communicators' calls in the same order.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <climits>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ddp/comm/checks.hpp"
#include "ddp/comm/communicator.hpp"
#include "ddp/comm/mpi/mpi_check.hpp"
#include "ddp/comm/reduce.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/log.hpp"

namespace ddp::comm {

namespace mpi {

// The process-wide MPI runtime (see the file comment).
class Runtime {
 public:
  static Runtime& instance() {
    static Runtime r;
    return r;
  }
  void mark_broken() noexcept { broken_ = true; }
  ~Runtime() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!owned_ || finalized) return;
    if (broken_) MPI_Abort(MPI_COMM_WORLD, 1);  // a pending collective would hang MPI_Finalize
    else MPI_Finalize();
  }

 private:
  Runtime() {
    int inited = 0;
    MPI_Initialized(&inited);
    int provided = 0;
    if (!inited) {
      DDP_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
      owned_ = true;
    } else {
      MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_SERIALIZED)
      throw ConfigError(ddp::detail::str("ddp: the mpi backend needs MPI_THREAD_SERIALIZED or better, but MPI provides "
                                         "level ", provided, "; call MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) "
                                         "yourself or use --backend tcp."));
  }
  bool owned_ = false;
  bool broken_ = false;
};

template <DType D, ReduceOp O>
void user_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  reduce_into(inout, in, static_cast<std::size_t>(*len), D, O);
}

}  // namespace mpi

class MpiCommunicator final : public Communicator {
 public:
  // A communicator over MPI_COMM_WORLD (duplicated, so our traffic never meets the application's).
  explicit MpiCommunicator(const CommOptions& opts = {}) : MpiCommunicator(dup_world(), opts) {}

  ~MpiCommunicator() override {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    if (broken_) return;  // a request may still be pending on them
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
    if (fp_comm_ != MPI_COMM_NULL) MPI_Comm_free(&fp_comm_);
  }

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  std::string_view backend() const noexcept override { return "mpi"; }
  MemoryKind memory() const noexcept override { return MemoryKind::Cpu; }

 protected:
  Work send_impl(const OpCall& c) override {
    return submit(c, [this, b = c.in, dst = c.peer, tag = c.fp.root] {
      MPI_Request req;
      DDP_MPI_CHECK(MPI_Isend(b.data, count_of(b), mpi::datatype_of(b.dtype), dst, tag_of(tag), comm_, &req));
      return Pending{req, {}};
    });
  }
  Work recv_impl(const OpCall& c) override {
    return submit(c, [this, b = c.in, src = c.peer, tag = c.fp.root] {
      MPI_Request req;
      DDP_MPI_CHECK(MPI_Irecv(b.data, count_of(b), mpi::datatype_of(b.dtype), src, tag_of(tag), comm_, &req));
      return Pending{req, {}};
    });
  }
  Work broadcast_impl(const OpCall& c) override {
    return submit(c, [this, b = c.in, root = static_cast<int>(c.fp.root)] {
      MPI_Request req;
      DDP_MPI_CHECK(MPI_Ibcast(b.data, count_of(b), mpi::datatype_of(b.dtype), root, comm_, &req));
      return Pending{req, {}};
    });
  }
  Work all_reduce_impl(const OpCall& c) override {
    return submit(c, [this, b = c.in, op = c.fp.op] {
      MPI_Request req;
      DDP_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, b.data, count_of(b), mpi::datatype_of(b.dtype), op_of(b.dtype, op),
                                   comm_, &req));
      return Pending{req, [this, b, op] {
                       if (op == ReduceOp::Avg) divide_by(b.data, b.count, b.dtype, size_);
                     }};
    });
  }
  Work reduce_impl(const OpCall& c) override {
    return submit(c, [this, b = c.in, op = c.fp.op, root = static_cast<int>(c.fp.root)] {
      MPI_Request req;
      const bool me = rank_ == root;
      DDP_MPI_CHECK(MPI_Ireduce(me ? MPI_IN_PLACE : b.data, me ? b.data : nullptr, count_of(b),
                                mpi::datatype_of(b.dtype), op_of(b.dtype, op), root, comm_, &req));
      return Pending{req, [this, b, op, me] {
                       if (me && op == ReduceOp::Avg) divide_by(b.data, b.count, b.dtype, size_);
                     }};
    });
  }
  Work all_gather_impl(const OpCall& c) override {
    return submit(c, [this, in = c.in, out = c.out] {
      MPI_Request req;
      const MPI_Datatype t = mpi::datatype_of(in.dtype);
      DDP_MPI_CHECK(MPI_Iallgather(in.data, count_of(in), t, out.data, count_of(in), t, comm_, &req));
      return Pending{req, {}};
    });
  }
  Work reduce_scatter_impl(const OpCall& c) override {
    return submit(c, [this, in = c.in, out = c.out, op = c.fp.op] {
      MPI_Request req;
      DDP_MPI_CHECK(MPI_Ireduce_scatter_block(in.data, out.data, count_of(out), mpi::datatype_of(in.dtype),
                                              op_of(in.dtype, op), comm_, &req));
      return Pending{req, [this, out, op] {
                       if (op == ReduceOp::Avg) divide_by(out.data, out.count, out.dtype, size_);
                     }};
    });
  }
  Work all_to_all_impl(const OpCall& c) override {
    return submit(c, [this, in = c.in, out = c.out] {
      MPI_Request req;
      const MPI_Datatype t = mpi::datatype_of(in.dtype);
      const int block = static_cast<int>(in.count / static_cast<std::size_t>(size_));
      DDP_MPI_CHECK(MPI_Ialltoall(in.data, block, t, out.data, block, t, comm_, &req));
      return Pending{req, {}};
    });
  }
  Work barrier_impl(const OpCall& c) override {
    return submit(c, [this] {
      MPI_Request req;
      DDP_MPI_CHECK(MPI_Ibarrier(comm_, &req));
      return Pending{req, {}};
    });
  }

  std::unique_ptr<Communicator> new_group_impl(const std::vector<int>&, int index) override {
    MPI_Comm sub = MPI_COMM_NULL;
    // MPI_Comm_split is collective: it runs in op order on the progress thread like any other op, under a
    // barrier's fingerprint. Key rank_: the group's ranks keep this communicator's order, as `ranks` does.
    submit(OpCall{.fp = {.kind = OpKind::Barrier, .dtype = DType::U8, .op = ReduceOp::Max}}, [&] {
      DDP_MPI_CHECK(MPI_Comm_split(comm_, index >= 0 ? 0 : MPI_UNDEFINED, rank_, &sub));
      return Pending{};
    }).wait();
    if (index < 0) return nullptr;
    return std::unique_ptr<Communicator>(new MpiCommunicator(sub, opts_));
  }

 private:
  using Clock = std::chrono::steady_clock;
  // A started op: its request and what to do once it completes (the Avg division).
  struct Pending {
    MPI_Request req = MPI_REQUEST_NULL;
    std::function<void()> after;
  };
  using Body = std::function<Pending()>;  // posts the non-blocking call
  // Where a task is: its fingerprint all-gather in flight, matched and waiting for earlier bodies to
  // be posted, or its own MPI call posted.
  enum class Stage : std::uint8_t { Fingerprint, Ready, Posted };
  static constexpr std::size_t kFpWords = 4;  // packed Fingerprint, see pack()
  struct Task {
    std::shared_ptr<detail::WorkState> state;
    std::chrono::milliseconds timeout;
    Body body;
    Fingerprint fp;
    Pending pending;
    Clock::time_point deadline;
    Stage stage = Stage::Posted;
    MPI_Request fp_req = MPI_REQUEST_NULL;
    std::vector<std::uint64_t> fps;  // kFpWords per rank: mine first, then everyone's from the all-gather
  };

  static MPI_Comm dup_world() {
    mpi::Runtime::instance();
    MPI_Comm c;
    DDP_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &c));
    return c;
  }

  MpiCommunicator(MPI_Comm comm, const CommOptions& opts) : comm_(comm), opts_(opts) {
    DDP_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    DDP_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    DDP_MPI_CHECK(MPI_Comm_size(comm_, &size_));
    check_setup(rank_, size_, opts_);
    sequence_.emplace(rank_, size_);
    if (opts_.check_fingerprints) {
      DDP_MPI_CHECK(MPI_Comm_dup(comm_, &fp_comm_));
      DDP_MPI_CHECK(MPI_Comm_set_errhandler(fp_comm_, MPI_ERRORS_RETURN));
    }
    create_ops();
    thread_ = std::thread([this] { progress_loop(); });
  }

  static int count_of(const Buffer& b) { return static_cast<int>(b.count); }
  static int tag_of(std::int64_t tag) { return static_cast<int>(tag & 0x7fff); }  // MPI guarantees tags < 32768

  void create_ops() {
    auto make = [](MPI_User_function* f) {
      MPI_Op op;
      DDP_MPI_CHECK(MPI_Op_create(f, 1, &op));
      return op;
    };
    bf16_ops_[0] = make(&mpi::user_reduce<DType::BF16, ReduceOp::Sum>);
    bf16_ops_[1] = make(&mpi::user_reduce<DType::BF16, ReduceOp::Min>);
    bf16_ops_[2] = make(&mpi::user_reduce<DType::BF16, ReduceOp::Max>);
    bf16_ops_[3] = make(&mpi::user_reduce<DType::BF16, ReduceOp::Product>);
    f16_ops_[0] = make(&mpi::user_reduce<DType::F16, ReduceOp::Sum>);
    f16_ops_[1] = make(&mpi::user_reduce<DType::F16, ReduceOp::Min>);
    f16_ops_[2] = make(&mpi::user_reduce<DType::F16, ReduceOp::Max>);
    f16_ops_[3] = make(&mpi::user_reduce<DType::F16, ReduceOp::Product>);
    u8_ops_[0] = make(&mpi::user_reduce<DType::U8, ReduceOp::Sum>);
    u8_ops_[1] = make(&mpi::user_reduce<DType::U8, ReduceOp::Min>);
    u8_ops_[2] = make(&mpi::user_reduce<DType::U8, ReduceOp::Max>);
    u8_ops_[3] = make(&mpi::user_reduce<DType::U8, ReduceOp::Product>);
  }
  MPI_Op op_of(DType d, ReduceOp op) const {
    const int i = op == ReduceOp::Min ? 1 : op == ReduceOp::Max ? 2 : op == ReduceOp::Product ? 3 : 0;
    if (d == DType::BF16) return bf16_ops_[i];
    if (d == DType::F16) return f16_ops_[i];
    if (d == DType::U8) return u8_ops_[i];  // Open MPI's vectorised uint8 sum does not wrap modulo 256
    constexpr MPI_Op kBuiltin[] = {MPI_SUM, MPI_MIN, MPI_MAX, MPI_PROD};
    return kBuiltin[i];
  }

  // Numbers the call and queues it for the progress thread. The element count must fit MPI's int.
  Work submit(OpCall call, Body body) {
    for (const Buffer* b : {&call.in, &call.out})
      if (b->count > static_cast<std::size_t>(INT_MAX))
        throw ValueError(ddp::detail::str(who(rank_, size_), ": the mpi backend takes at most ", INT_MAX,
                                          " elements per call, got ", b->count, "; split the buffer."));
    std::unique_lock lock(mu_);
    std::string label = sequence_->number(call);
    Task t{.state = std::make_shared<detail::WorkState>(std::move(label)),
           .timeout = call.timeout.count() > 0 ? call.timeout : opts_.timeout,
           .body = std::move(body),
           .fp = call.fp};
    Work work(t.state);
    queue_.push_back(std::move(t));
    lock.unlock();
    cv_.notify_all();
    return work;
  }

  // How the progress thread works: it starts queued ops in issue order (for a collective, that posts
  // its fingerprint all-gather; for send/recv, the call itself), keeps them in flight, and tests them
  // all. A collective whose fingerprints matched posts its own call once every earlier op has posted
  // its own (MPI matches non-blocking collectives by posting order). An op completes when its request
  // does, so an irecv posted before a send never blocks that send. The thread naps 20 us between tests
  // once nothing has progressed for a while, and sleeps on the condition variable when idle.
  void progress_loop() {
    std::deque<Task> in_flight;
    int idle_spins = 0;
    for (;;) {
      {
        std::unique_lock lock(mu_);
        if (in_flight.empty()) cv_.wait(lock, [&] { return !queue_.empty() || stop_; });
        if (stop_ && queue_.empty() && in_flight.empty()) return;
        while (!queue_.empty()) {
          in_flight.push_back(std::move(queue_.front()));
          queue_.pop_front();
          start(in_flight.back(), in_flight);
          idle_spins = 0;
        }
      }
      bool progressed = false;
      for (auto it = in_flight.begin(); it != in_flight.end();) {
        if (test(*it, in_flight)) {
          it = in_flight.erase(it);
          progressed = true;
        } else {
          ++it;
        }
      }
      // Post the bodies of matched collectives, in issue order, up to the first one still waiting.
      for (Task& t : in_flight) {
        if (t.stage == Stage::Fingerprint) break;
        if (t.stage == Stage::Ready) {
          post(t, in_flight);
          progressed = true;
        }
      }
      if (progressed) idle_spins = 0;
      else if (++idle_spins > 200) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  void start(Task& t, const std::deque<Task>& in_flight) {
    t.deadline = Clock::now() + t.timeout;
    if (failed_)
      return fail(t, CommError(ddp::detail::str(t.state->label, " was not run: this communicator failed earlier: ",
                                                first_error_)), in_flight);
    if (fp_comm_ == MPI_COMM_NULL || t.fp.is_p2p()) return post(t, in_flight);
    t.stage = Stage::Fingerprint;
    t.fps.assign(kFpWords * (static_cast<std::size_t>(size_) + 1), 0);
    pack(t.fp, t.fps.data());
    if (const int rc = MPI_Iallgather(t.fps.data(), kFpWords, MPI_UINT64_T, t.fps.data() + kFpWords, kFpWords,
                                      MPI_UINT64_T, fp_comm_, &t.fp_req);
        rc != MPI_SUCCESS)
      fail(t, CommError(ddp::detail::str(t.state->label, " failed: ", mpi::error_text(rc))), in_flight);
  }

  void post(Task& t, const std::deque<Task>& in_flight) {
    t.stage = Stage::Posted;
    if (failed_)
      return fail(t, CommError(ddp::detail::str(t.state->label, " was not run: this communicator failed earlier: ",
                                                first_error_)), in_flight);
    try {
      t.pending = t.body();
    } catch (const std::exception& e) {
      fail(t, CommError(ddp::detail::str(t.state->label, " failed: ", e.what())), in_flight);
    }
  }

  // 32 bytes that every rank must agree on. seq is included so that a rank that skipped an op is seen.
  static void pack(const Fingerprint& f, std::uint64_t* w) {
    w[0] = static_cast<std::uint64_t>(f.kind) | static_cast<std::uint64_t>(f.dtype) << 8 |
           static_cast<std::uint64_t>(f.op) << 16;
    w[1] = static_cast<std::uint64_t>(f.root);
    w[2] = f.count;
    w[3] = f.seq;
  }
  static Fingerprint unpack(const std::uint64_t* w) {
    return {.kind = static_cast<OpKind>(w[0] & 0xff),
            .dtype = static_cast<DType>((w[0] >> 8) & 0xff),
            .op = static_cast<ReduceOp>((w[0] >> 16) & 0xff),
            .root = static_cast<std::int64_t>(w[1]),
            .count = w[2],
            .seq = w[3]};
  }

  // The gathered fingerprints: empty when all agree, else the message every rank raises. It names the
  // first rank whose op differs from this rank's, and when this rank is the odd one out, says so.
  std::string compare_fingerprints(const Task& t) const {
    const std::uint64_t* mine = t.fps.data();
    const std::uint64_t* all = t.fps.data() + kFpWords;
    std::vector<int> differ;
    for (int r = 0; r < size_; ++r)
      if (!std::equal(mine, mine + kFpWords, all + kFpWords * static_cast<std::size_t>(r))) differ.push_back(r);
    if (differ.empty()) return {};
    const int j = differ.front();
    std::string msg = ddp::detail::str(who(rank_, size_), ": ", t.fp.full_label(), " does not match rank ", j, ", which ran ",
                                       unpack(all + kFpWords * static_cast<std::size_t>(j)).full_label(),
                                       " at this point");
    if (differ.size() > 1)
      msg += ddp::detail::str(" (", differ.size(), " of ", size_, " ranks differ from this one: ",
                              ddp::detail::join(differ, ", "), ")");
    return msg + ". Every rank must call the same collectives in the same order with the same dtype, count, root "
                 "and op.";
  }

  // True when the task is finished (completed, failed or timed out).
  bool test(Task& t, const std::deque<Task>& in_flight) {
    if (t.state->is_done()) return true;
    if (t.stage == Stage::Ready) return false;
    if (t.stage == Stage::Fingerprint) {
      int done = 0;
      if (const int rc = MPI_Test(&t.fp_req, &done, MPI_STATUS_IGNORE); rc != MPI_SUCCESS) {
        fail(t, CommError(ddp::detail::str(t.state->label, " failed: ", mpi::error_text(rc))), in_flight);
        return true;
      }
      if (done) {
        if (std::string msg = compare_fingerprints(t); !msg.empty()) {
          fail(t, CommError(msg), in_flight);
          return true;
        }
        t.stage = Stage::Ready;
        return false;
      }
    } else {
      int done = 1;
      if (t.pending.req != MPI_REQUEST_NULL) {
        if (const int rc = MPI_Test(&t.pending.req, &done, MPI_STATUS_IGNORE); rc != MPI_SUCCESS) {
          fail(t, CommError(ddp::detail::str(t.state->label, " failed: ", mpi::error_text(rc))), in_flight);
          return true;
        }
      }
      if (done) {
        try {
          if (t.pending.after) t.pending.after();
          t.state->complete();
        } catch (const std::exception& e) {
          fail(t, CommError(ddp::detail::str(t.state->label, " failed: ", e.what())), in_flight);
        }
        return true;
      }
    }
    if (Clock::now() > t.deadline) {
      fail(t, TimeoutError(ddp::detail::str(t.state->label, " timed out after ", t.timeout.count(), " ms",
                                            t.stage == Stage::Fingerprint ? " waiting for the other ranks to reach it"
                                                                          : "",
                                            ". MPI cannot cancel it, so this process ends with MPI_Abort at exit. "
                                            "Raise --timeout-ms (DDP_TIMEOUT_MS) if the op is just slow.")),
           in_flight);
      return true;
    }
    return false;
  }

  // Fails the task and the communicator. When an MPI request is still pending anywhere (this task's or
  // another in-flight one's), MPI cannot cancel it, so the runtime is marked broken (MPI_Abort at exit);
  // a fingerprint mismatch leaves nothing pending, so such a program can still exit normally.
  template <class E>
  void fail(Task& t, const E& e, const std::deque<Task>& in_flight) {
    if (!failed_) {
      failed_ = true;
      first_error_ = e.what();
    }
    auto pending = [](const Task& x) {
      return !x.state->is_done() && (x.fp_req != MPI_REQUEST_NULL || x.pending.req != MPI_REQUEST_NULL);
    };
    bool any = false;
    for (const Task& x : in_flight) any = any || pending(x);
    if (any && !broken_) {
      broken_ = true;
      mpi::Runtime::instance().mark_broken();
    }
    t.state->complete(std::make_exception_ptr(e));
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  CommOptions opts_;
  int rank_ = 0, size_ = 1;
  MPI_Op bf16_ops_[4] = {}, f16_ops_[4] = {}, u8_ops_[4] = {};
  MPI_Comm fp_comm_ = MPI_COMM_NULL;  // fingerprints only (see the file comment)
  bool failed_ = false;               // touched only by the progress thread
  bool broken_ = false;               // ditto: a request was left pending (see fail)
  std::string first_error_;           // ditto

  std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  std::optional<OpSequence> sequence_;  // set once rank and size are known
  std::deque<Task> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace ddp::comm
