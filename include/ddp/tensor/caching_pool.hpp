// CachingPool<B>: a stream-aware caching allocator over a device backend B (CUDA in
// tensor/cuda/allocator.hpp, a fake device in the tests, so the bookkeeping is tested without a
// GPU).
// SPDX-License-Identifier: MIT
//
// Why: device malloc/free synchronise the device, and a training step allocates ~1,000 temporaries;
// after a warm-up step every request must be a cache hit and nothing may wait on the host. Reuse
// is safe by stream order:
// - A block belongs to the stream it was allocated on. Freed, it goes straight back to that
//   stream's cache: the next request on that stream is enqueued after every earlier use.
// - A block also used on another stream (record_stream(p, s), e.g. NCCL's stream reading a gradient
//   bucket) returns to its cache only once an event recorded on each such stream at free has
//   completed (checked without waiting, at the next allocate), as PyTorch's Tensor.record_stream.
// - Out of device memory: the pool waits for pending events, returns every cached block to the
//   device and tries once more; allocate returns nullptr if that fails too (the caller raises).
// Sizes are rounded up to a size class (round_size); blocks are not split and are reused only by
// requests of the same class on the same stream. Thread-safety: every member locks one mutex;
// deallocate never throws (it runs in destructors).
//
// The backend B provides (all calls made under the pool's lock):
//   using Stream = ...; using Event = ...;  // cheap, copyable handles (Stream: pointer or integer)
//   void* malloc(std::size_t bytes);         // nullptr when out of memory
//   void free(void* p) noexcept;
//   Event create_event();  void destroy_event(Event) noexcept;
//   void record(Event, Stream);              // completes when the stream reaches this point
//   bool query(Event);                       // completed? never blocks
//   void synchronize(Event);                 // blocks until completed
#pragma once

#include <algorithm>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "ddp/core/log.hpp"

namespace ddp {

template <class B>
concept PoolBackend = requires(B& b, std::size_t n, void* p, typename B::Event e,
                               typename B::Stream s) {
  { b.malloc(n) } -> std::same_as<void*>;
  b.free(p);
  { b.create_event() } -> std::same_as<typename B::Event>;
  b.destroy_event(e);
  b.record(e, s);
  { b.query(e) } -> std::same_as<bool>;
  b.synchronize(e);
};

// Counters of one pool, in bytes of rounded block sizes unless named otherwise.
struct PoolStats {
  std::size_t current_bytes = 0;  // handed out and not yet freed
  // high-water mark of current_bytes since construction or reset_peak()
  std::size_t peak_bytes = 0;
  std::size_t reserved_bytes = 0;  // obtained from the device: in use + cached + waiting for events
  std::size_t pending_blocks = 0;  // freed blocks waiting for another stream's events
  // backend malloc calls that succeeded (the steady state adds none)
  std::int64_t device_mallocs = 0;
  std::int64_t device_frees = 0;  // blocks returned to the backend
  std::int64_t cache_hits = 0;    // requests served from the cache
  // bytes the callers asked for, of the blocks handed out now
  std::size_t current_requested_bytes = 0;
  // high-water mark of current_requested_bytes (reset with peak_bytes)
  std::size_t peak_requested_bytes = 0;
};

// Which allocation holds an address (CachingPool::stamp): the block's start and the serial number
// of the allocate call that handed it out, unique over the pool's life. Equal stamps before and
// after some code mean the memory was not freed (nor freed and handed out again) in between: the
// DDP_CHECK_INPUTS check (nn/check_inputs.hpp).
struct BlockStamp {
  std::uintptr_t block = 0;
  std::uint64_t allocation = 0;
  friend bool operator==(const BlockStamp&, const BlockStamp&) = default;
};

// What a program reads about one device's tensor memory (cpu_memory_stats, cuda_memory_stats).
struct MemoryStats {
  // in use by live tensors now (size classes, see CachingPool::round_size)
  std::size_t current_bytes = 0;
  // high-water mark of current_bytes since start or the last reset
  std::size_t peak_bytes = 0;
  // obtained from the device (malloc, cudaMalloc): in use + cached for reuse
  std::size_t reserved_bytes = 0;
  // device allocations so far (constant once training reached steady state)
  std::int64_t device_mallocs = 0;
  // what live tensors asked for, before rounding to size classes
  std::size_t current_requested_bytes = 0;
  // its high-water mark (PyTorch's "requested_bytes.all.peak")
  std::size_t peak_requested_bytes = 0;

  static MemoryStats of(const PoolStats& s) noexcept {
    return {.current_bytes = s.current_bytes,
            .peak_bytes = s.peak_bytes,
            .reserved_bytes = s.reserved_bytes,
            .device_mallocs = s.device_mallocs,
            .current_requested_bytes = s.current_requested_bytes,
            .peak_requested_bytes = s.peak_requested_bytes};
  }
};

template <PoolBackend B>
class CachingPool {
 public:
  using Stream = typename B::Stream;
  using Event = typename B::Event;

  explicit CachingPool(B backend = B{}) : b_(std::move(backend)) {}
  CachingPool(const CachingPool&) = delete;
  CachingPool& operator=(const CachingPool&) = delete;
  // Returns what is cached or pending to the backend; blocks still handed out are left alone
  // (their owners may outlive the pool at program exit).
  ~CachingPool() {
    std::lock_guard lk(mu_);
    release_cached_locked();
    for (Event e : spare_events_) b_.destroy_event(e);
  }

  // Size class of a request (docs/decisions/0062): up to kSmallSize (1 MiB) a multiple of 512 B, as
  // PyTorch rounds small blocks; above, kClassesPerOctave classes per power of two, with steps of
  // at most kLargeStep (2 MiB, PyTorch's rounding of large blocks). So a class is >= bytes and less
  // than max(512 B, min(bytes / 16, 2 MiB)) larger. E.g. 513 B -> 1 KiB, 1 MiB + 1 B -> 1 MiB + 64
  // KiB, 12.25 MiB (a 16x56x56x64 float activation) -> 12.5 MiB, 49 MiB (16x112x112x64) -> 50 MiB,
  // 196 MiB exact.
  static constexpr std::size_t round_size(std::size_t bytes) noexcept {
    if (bytes <= kMinBlock) return kMinBlock;
    const std::size_t step = bytes <= kSmallSize
                                 ? kMinBlock
                                 : std::min(kLargeStep, std::bit_floor(bytes) / kClassesPerOctave);
    return (bytes + step - 1) / step * step;
  }

  // A block of at least `bytes` for use on `stream`; nullptr for 0 bytes or when the device is out
  // of memory even after the cache was returned to it.
  void* allocate(std::size_t bytes, Stream stream) {
    if (bytes == 0) return nullptr;
    const std::size_t size = round_size(bytes);
    std::lock_guard lk(mu_);
    process_events_locked();
    auto& cached = free_[{key(stream), size}];
    Block* blk = nullptr;
    if (!cached.empty()) {
      blk = cached.back();
      cached.pop_back();
      ++stats_.cache_hits;
    } else {
      void* p = b_.malloc(size);
      if (!p) {
        release_cached_locked();  // waits for pending events, then frees every cached block
        p = b_.malloc(size);
        if (!p) return nullptr;
      }
      ++stats_.device_mallocs;
      stats_.reserved_bytes += size;
      blk = &blocks_
                 .emplace(reinterpret_cast<std::uintptr_t>(p),
                          Block{.ptr = p, .size = size, .stream = stream})
                 .first->second;
    }
    blk->in_use = true;
    blk->requested = bytes;
    blk->allocation = ++allocations_;
    stats_.current_bytes += size;
    stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.current_bytes);
    stats_.current_requested_bytes += bytes;
    stats_.peak_requested_bytes =
        std::max(stats_.peak_requested_bytes, stats_.current_requested_bytes);
    return blk->ptr;
  }

  // Marks the block holding `p` (any address inside a block handed out) as used on `stream` too, so
  // that its reuse after deallocate waits for that stream's work. Addresses the pool did not hand
  // out are ignored (memory the caller allocated some other way).
  void record_stream(const void* p, Stream stream) {
    std::lock_guard lk(mu_);
    Block* blk = find_locked(p);
    if (!blk || !blk->in_use || key(stream) == key(blk->stream)) return;
    if (std::find_if(blk->uses.begin(), blk->uses.end(),
                     [&](Stream s) { return key(s) == key(stream); }) == blk->uses.end())
      blk->uses.push_back(stream);
  }

  // `stream` is about to be destroyed (a communicator's own stream): every block in use that it
  // used (record_stream) takes an event recorded on it now instead, so that the block's later
  // deallocate never records on the destroyed stream (cudaEventRecord would crash). The stream must
  // touch those blocks no more.
  void retire_stream(Stream stream) {
    std::lock_guard lk(mu_);
    for (auto& [addr, blk] : blocks_) {
      if (!blk.in_use) continue;
      auto it = std::find_if(blk.uses.begin(), blk.uses.end(),
                             [&](Stream s) { return key(s) == key(stream); });
      if (it == blk.uses.end()) continue;
      Event e = take_event_locked();
      b_.record(e, stream);
      blk.retired.push_back(e);
      blk.uses.erase(it);
    }
  }

  // The stamp of the block handed out that contains address p; nullopt when the pool did not hand p
  // out or its block is free now.
  std::optional<BlockStamp> stamp(const void* p) {
    std::lock_guard lk(mu_);
    const Block* blk = find_locked(p);
    if (!blk || !blk->in_use) return std::nullopt;
    return BlockStamp{.block = reinterpret_cast<std::uintptr_t>(blk->ptr),
                      .allocation = blk->allocation};
  }

  // Returns the block starting at `p` to the cache (at once, or after the events of the other
  // streams that used it). Never throws; a pointer the pool does not know, or a double free, is
  // logged and ignored.
  void deallocate(void* p) noexcept {
    if (!p) return;
    try {
      std::lock_guard lk(mu_);
      auto it = blocks_.find(reinterpret_cast<std::uintptr_t>(p));
      if (it == blocks_.end() || !it->second.in_use) {
        log::write(log::Level::Error, "caching allocator: free of ", p,
                   it == blocks_.end() ? ", which it never handed out" : ", which is already free",
                   "; ignored (a double free or memory from another allocator)");
        return;
      }
      Block& blk = it->second;
      blk.in_use = false;
      stats_.current_bytes -= blk.size;
      stats_.current_requested_bytes -= blk.requested;
      if (blk.uses.empty() && blk.retired.empty()) {
        free_[{key(blk.stream), blk.size}].push_back(&blk);
        return;
      }
      Pending pend{.block = &blk, .events = std::exchange(blk.retired, {})};
      for (Stream s : blk.uses) {
        Event e = take_event_locked();
        b_.record(e, s);
        pend.events.push_back(e);
      }
      blk.uses.clear();
      pending_.push_back(std::move(pend));
      ++stats_.pending_blocks;
    } catch (const std::exception& e) {
      log::write(log::Level::Error, "caching allocator: free of ", p, " failed: ", e.what(),
                 "; the block is leaked");
    }
  }

  // Waits for pending events and returns every cached block to the device (e.g. before measuring
  // another model's peak). Returns the bytes given back.
  std::size_t release_cached() {
    std::lock_guard lk(mu_);
    return release_cached_locked();
  }

  PoolStats stats() const {
    std::lock_guard lk(mu_);
    return stats_;
  }
  void reset_peak() {
    std::lock_guard lk(mu_);
    stats_.peak_bytes = stats_.current_bytes;
    stats_.peak_requested_bytes = stats_.current_requested_bytes;
  }

  static constexpr std::size_t kMinBlock = 512;
  static constexpr std::size_t kSmallSize = std::size_t{1} << 20;
  static constexpr std::size_t kLargeStep = std::size_t{2} << 20;
  static constexpr std::size_t kClassesPerOctave = 16;

 private:
  struct Block {
    void* ptr = nullptr;
    std::size_t size = 0;       // rounded size class
    std::size_t requested = 0;  // what the caller of allocate asked for while in use (<= size)
    // serial number of the allocate call that handed it out (BlockStamp)
    std::uint64_t allocation = 0;
    Stream stream{};           // the stream it was allocated on: its cache
    std::vector<Stream> uses;  // other streams that used it since it was handed out
    // events recorded on used streams that were destroyed since (retire_stream)
    std::vector<Event> retired;
    bool in_use = false;
  };
  struct Pending {
    Block* block = nullptr;
    std::vector<Event> events;  // one per other stream; the block is free once all completed
  };

  static std::uintptr_t key(Stream s) noexcept {
    if constexpr (std::is_pointer_v<Stream>)
      return reinterpret_cast<std::uintptr_t>(s);
    else
      return static_cast<std::uintptr_t>(s);
  }

  // The block containing address p, or nullptr.
  Block* find_locked(const void* p) {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    auto it = blocks_.upper_bound(a);
    if (it == blocks_.begin()) return nullptr;
    --it;
    return a < it->first + it->second.size ? &it->second : nullptr;
  }

  Event take_event_locked() {
    if (spare_events_.empty()) return b_.create_event();
    Event e = spare_events_.back();
    spare_events_.pop_back();
    return e;
  }

  // Moves every pending block whose events all completed back to its stream's cache; no waiting.
  void process_events_locked() {
    auto done = [&](Pending& pd) {
      for (Event e : pd.events)
        if (!b_.query(e)) return false;
      return true;
    };
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (!done(*it)) {
        ++it;
        continue;
      }
      finish_pending_locked(*it);
      it = pending_.erase(it);
    }
  }

  void finish_pending_locked(Pending& pd) {
    for (Event e : pd.events) spare_events_.push_back(e);
    free_[{key(pd.block->stream), pd.block->size}].push_back(pd.block);
    --stats_.pending_blocks;
  }

  std::size_t release_cached_locked() {
    for (Pending& pd : pending_) {
      for (Event e : pd.events) b_.synchronize(e);
      finish_pending_locked(pd);
    }
    pending_.clear();
    std::size_t freed = 0;
    for (auto& [k, list] : free_) {
      for (Block* blk : list) {
        b_.free(blk->ptr);
        freed += blk->size;
        stats_.reserved_bytes -= blk->size;
        ++stats_.device_frees;
        blocks_.erase(reinterpret_cast<std::uintptr_t>(blk->ptr));
      }
    }
    free_.clear();
    return freed;
  }

  mutable std::mutex mu_;
  B b_;
  std::map<std::uintptr_t, Block> blocks_;  // every block obtained from the device, by address
  // (stream, size) -> cached
  std::map<std::pair<std::uintptr_t, std::size_t>, std::vector<Block*>> free_;
  std::vector<Pending> pending_;
  std::vector<Event> spare_events_;  // recorded events are reused, not destroyed
  PoolStats stats_;
  std::uint64_t allocations_ = 0;  // allocate calls that handed out a block
};

}  // namespace ddp
