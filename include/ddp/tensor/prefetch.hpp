// Prefetcher<D, T...>: host batches onto device D one step ahead of their use; PrefetchRing holds
// its slots.
// SPDX-License-Identifier: MIT
//
// Copying a pageable host batch on the compute stream stalls the step for the copy. The CUDA
// prefetcher instead copies the next batch into a pinned slot, uploads it on a copy stream while
// the current step computes, and makes the compute stream wait for the upload's event
// (docs/decisions/0050):
//   Prefetcher<D, float, std::int64_t> uploads(exec);  // D = Cuda: tensor/cuda/prefetcher.hpp
//   auto feed = prefetch_feed(uploads, [&] { return loader.next(); }, [](const data::Batch& b) {
//     return std::tuple(b.images.cview(), b.labels.cview());
//   });
//   while (const auto* b = feed.next())
//     step(std::get<0>(b->input), std::get<1>(b->input), b->host.step);
// A batch's tensors are views of device memory (for Cpu: of the host batch itself, no copy and no
// look-ahead), ordered before the exec's work enqueued after next(); they stay valid until the
// following next(). Shapes may change from one batch to the next (the last, smaller batch of an
// epoch); the element types are fixed by T....
//
// PrefetchRing<Backend, T...> is the GPU version's bookkeeping, written against a Backend so that a
// CPU unit test can drive it with fake streams and events (tests/unit/tensor/test_prefetch.cpp). It
// owns `slots` (>= 2) slots, each with a host staging buffer and a device buffer per tensor, an
// `uploaded` event (recorded on the copy stream after the slot's uploads) and a `consumed` event
// (recorded on the compute stream when the batch is released: the next pop(), release(), or
// discard(), which a new feed calls). Slots are filled and taken in ring order:
//   push(host...)  the next slot must be free (neither staged nor in use; else ValueError). If it
//                  held a batch, the host waits for its `uploaded` (the DMA that read the staging
//                  buffer) and the copy stream for its `consumed` (the compute stream's use of the
//                  device buffer). A tensor larger than the slot's buffers gets new ones
//                  (allocations() counts them); new device memory may have been freed by
//                  compute-stream work in flight, so `consumed` is then recorded first. Then:
//                  memcpy into the staging buffer, uploads on the copy stream, `uploaded`.
//   pop()          releases the batch taken before, makes the compute stream wait for the oldest
//                  staged slot's `uploaded` and returns views of its device buffers.
// The feed's look-ahead is slots - 1. After an exception (a CUDA error) the prefetcher's state is
// unknown: destroy it. Its destructor waits for the uploads in flight.
//
// The Backend (tensor/cuda/prefetcher.hpp: CudaUploadBackend) provides:
//   using device = Cuda;                          the device tag of the views pop() returns
//   using Event = ...;                            default-constructible, one per slot and side
//   template <class T> using HostBuffer = ...;    HostBuffer<T>(count), data(): pinned staging
//   template <class T> using DeviceBuffer = ...;  DeviceBuffer<T>(Shape{count}), data()
//   void upload(void* dst, const void* src, std::size_t bytes);   enqueued on the copy stream
//   void record_upload(Event&);  void copy_wait(const Event&);     on the copy stream
//   void record_compute(Event&); void compute_wait(const Event&);  on the compute stream
//   void host_wait(const Event&);                                  blocks the host until reached
//   void finish() noexcept;                                        the host waits for every upload
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/shape.hpp"
#include "ddp/tensor/view.hpp"

namespace ddp {

template <class Backend, class... T>
class PrefetchRing {
  static_assert(sizeof...(T) >= 1, "ddp: PrefetchRing needs at least one tensor per batch");
  static constexpr std::size_t kFields = sizeof...(T);
  using Event = typename Backend::Event;

 public:
  using device = typename Backend::device;
  using HostViews = std::tuple<TensorView<const T, Cpu>...>;
  using Views = std::tuple<TensorView<const T, device>...>;

  // Throws ValueError for fewer than 2 slots (one batch in use and one uploading is the point).
  PrefetchRing(Backend backend, std::size_t slots)
      : backend_(std::move(backend)), slots_(check_slots(slots)) {}
  PrefetchRing(const PrefetchRing&) = delete;
  PrefetchRing& operator=(const PrefetchRing&) = delete;
  // staging buffers are freed below: no DMA may still read them
  ~PrefetchRing() { backend_.finish(); }

  std::size_t slots() const noexcept { return slots_.size(); }
  // batches staged beyond the one in use
  std::size_t lookahead() const noexcept { return slots_.size() - 1; }
  std::size_t staged() const noexcept { return staged_; }
  // staging + device buffer pairs made
  std::size_t allocations() const noexcept { return allocations_; }

  // Stages one batch: host memory -> the next slot's staging buffer -> its device buffer on the
  // copy stream. The host views may be freed when push returns.
  void push(TensorView<const T, Cpu>... host) { push(HostViews{host...}); }
  void push(const HostViews& host) { push(host, std::index_sequence_for<T...>{}); }

  // The oldest staged batch on the device, ordered before the compute stream's later work; the
  // batch popped before it is released. Throws ValueError when none is staged.
  Views pop() {
    if (staged_ == 0)
      throw ValueError("ddp: Prefetcher::pop: no batch is staged; push() one first");
    release();
    Slot& s = slots_[take_];
    backend_.compute_wait(s.uploaded);
    s.state = State::InUse;
    in_use_ = take_;
    take_ = next(take_);
    --staged_;
    return views(s, std::index_sequence_for<T...>{});
  }

  // The batch popped last is done: every use of it is enqueued on the compute stream.
  void release() {
    if (!in_use_) return;
    Slot& s = slots_[*in_use_];
    backend_.record_compute(s.consumed);
    s.state = State::Free;
    in_use_.reset();
  }

  // Releases the batch in use and drops the staged ones (an epoch left early). A dropped slot's
  // upload may still be in flight; refilling it waits for that as for any other.
  void discard() {
    release();
    for (std::size_t i = 0; staged_ > 0; ++i, --staged_)
      slots_[(take_ + i) % slots_.size()].state = State::Free;
    take_ = fill_;
  }

 private:
  // Empty: never filled. Free: filled before, its batch released or dropped. Staged: uploading or
  // uploaded, not popped. InUse: popped, not released.
  enum class State { Empty, Free, Staged, InUse };
  template <class U>
  struct Buffers {
    typename Backend::template HostBuffer<U> host;
    typename Backend::template DeviceBuffer<U> dev;
  };
  struct Slot {
    std::tuple<Buffers<T>...> buffers;
    std::array<std::size_t, kFields> capacity{};  // elements of each tensor's two buffers
    std::array<Shape, kFields> shapes{};
    Event uploaded, consumed;
    State state = State::Empty;
  };

  static std::size_t check_slots(std::size_t n) {
    if (n < 2)
      throw ValueError(detail::str(
          "ddp: Prefetcher: needs at least 2 slots (one batch in use, one uploading), got ", n));
    return n;
  }
  std::size_t next(std::size_t i) const noexcept { return (i + 1) % slots_.size(); }

  template <std::size_t... K>
  void push(const HostViews& host, std::index_sequence<K...>) {
    Slot& s = slots_[fill_];
    if (s.state == State::Staged || s.state == State::InUse)
      throw ValueError(detail::str("ddp: Prefetcher::push: all ", slots_.size(),
                                   " slots hold batches (", staged_, " staged, ", in_use_ ? 1 : 0,
                                   " in use); pop() one before pushing another, "
                                   "or give the prefetcher more slots"));
    // New device memory (first fill, larger tensor) may have been freed by work still in flight.
    bool fresh = s.state == State::Empty;
    // the last DMA out of the staging buffers is done
    if (s.state == State::Free) backend_.host_wait(s.uploaded);
    s.state = State::Free;
    ((fresh = grow<K>(s, std::get<K>(host).numel()) || fresh), ...);
    if (fresh) backend_.record_compute(s.consumed);
    backend_.copy_wait(s.consumed);
    (stage<K>(s, std::get<K>(host)), ...);
    backend_.record_upload(s.uploaded);
    s.shapes = {std::get<K>(host).shape()...};
    s.state = State::Staged;
    fill_ = next(fill_);
    ++staged_;
  }

  // Tensor K's buffers in slot s, larger ones when they cannot hold `numel` elements (the old
  // staging buffer's DMA is done: push waited for it). True when new ones were made.
  template <std::size_t K>
  bool grow(Slot& s, std::int64_t numel) {
    using U = std::tuple_element_t<K, std::tuple<T...>>;
    const auto need = static_cast<std::size_t>(numel);
    if (need <= s.capacity[K]) return false;
    auto& b = std::get<K>(s.buffers);
    b.host = typename Backend::template HostBuffer<U>(need);
    b.dev = typename Backend::template DeviceBuffer<U>(Shape{static_cast<std::int64_t>(need)});
    s.capacity[K] = need;
    ++allocations_;
    return true;
  }

  template <std::size_t K>
  void stage(Slot& s,
             const TensorView<const std::tuple_element_t<K, std::tuple<T...>>, Cpu>& host) {
    if (host.numel() == 0) return;
    auto& b = std::get<K>(s.buffers);
    std::memcpy(b.host.data(), host.data(), host.bytes());
    backend_.upload(b.dev.data(), b.host.data(), host.bytes());
  }

  template <std::size_t... K>
  Views views(Slot& s, std::index_sequence<K...>) {
    return Views{TensorView<const T, device>(std::get<K>(s.buffers).dev.data(), s.shapes[K])...};
  }

  // declared first: destroyed last, after the buffers and events that use its streams
  Backend backend_;
  std::vector<Slot> slots_;
  std::size_t fill_ = 0;  // the slot push() fills next
  std::size_t take_ = 0;  // the slot pop() takes next (staged_ slots from here on are staged)
  std::size_t staged_ = 0;
  std::optional<std::size_t> in_use_;
  std::size_t allocations_ = 0;
};

// The prefetcher of device D for batches of T... tensors (Cuda: tensor/cuda/prefetcher.hpp).
template <Device D, class... T>
class Prefetcher;

// On the CPU pop() returns views of the pushed host tensors (no copy, no look-ahead); the caller
// keeps them alive until it has finished with them (prefetch_feed does).
template <class... T>
class Prefetcher<Cpu, T...> {
 public:
  using device = Cpu;
  using HostViews = std::tuple<TensorView<const T, Cpu>...>;
  using Views = HostViews;

  explicit Prefetcher(const Exec<Cpu>& /*exec*/ = {}) {}
  std::size_t lookahead() const noexcept { return 0; }
  std::size_t staged() const noexcept { return staged_.size(); }
  void push(TensorView<const T, Cpu>... host) { staged_.emplace_back(host...); }
  void push(const HostViews& host) { staged_.push_back(host); }
  Views pop() {
    if (staged_.empty())
      throw ValueError("ddp: Prefetcher::pop: no batch is staged; push() one first");
    Views v = staged_.front();
    staged_.pop_front();
    return v;
  }
  void release() noexcept {}
  void discard() noexcept { staged_.clear(); }

 private:
  std::deque<HostViews> staged_;
};

// The loop side of a prefetcher: host batches from `source` (a callable returning
// std::optional<HostBatch>, nullopt at the end), their tensors `fields(batch)` (a tuple of host
// views in the prefetcher's order) staged lookahead() batches ahead. next() returns the next batch
// (the host batch, moved out of the source's result, and its device views), or nullptr at the end;
// both stay valid until the following next(). A feed starts by discarding what an earlier feed left
// in the prefetcher (one per epoch).
template <class Pf, class Source, class Fields>
class PrefetchFeed {
 public:
  using HostBatch = typename std::invoke_result_t<Source&>::value_type;
  struct Item {
    HostBatch host;
    typename Pf::Views input;
  };

  PrefetchFeed(Pf& uploads, Source source, Fields fields)
      : uploads_(&uploads), source_(std::move(source)), fields_(std::move(fields)) {
    uploads_->discard();
  }
  PrefetchFeed(const PrefetchFeed&) = delete;
  PrefetchFeed& operator=(const PrefetchFeed&) = delete;

  const Item* next() {
    if (ahead_.empty()) top_up(1);
    if (ahead_.empty()) {
      uploads_->release();
      return nullptr;
    }
    auto input = uploads_->pop();
    item_.emplace(Item{std::move(ahead_.front()), std::move(input)});
    ahead_.pop_front();
    top_up(uploads_->lookahead());  // these uploads overlap the caller's step
    return &*item_;
  }

 private:
  // Fetches and stages batches until n are staged or the source ends. A host batch is moved into
  // ahead_ after its push: moving it keeps its tensors' memory, which the CPU prefetcher's views
  // point into.
  void top_up(std::size_t n) {
    while (!ended_ && ahead_.size() < n) {
      std::optional<HostBatch> b = source_();
      if (!b) {
        ended_ = true;
        return;
      }
      uploads_->push(fields_(std::as_const(*b)));
      ahead_.push_back(std::move(*b));
    }
  }

  Pf* uploads_;
  Source source_;
  Fields fields_;
  std::deque<HostBatch> ahead_;  // staged, not yet returned
  std::optional<Item> item_;     // the batch next() returned last
  bool ended_ = false;
};

template <class Pf, class Source, class Fields>
PrefetchFeed<Pf, Source, Fields> prefetch_feed(Pf& uploads, Source source, Fields fields) {
  return PrefetchFeed<Pf, Source, Fields>(uploads, std::move(source), std::move(fields));
}

}  // namespace ddp
