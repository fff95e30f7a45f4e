// The tcp backend's collectives over a Mesh: ring (bandwidth-optimal all-reduce), recursive
// doubling (latency-optimal all-reduce), binomial-tree broadcast and reduce, pairwise all-to-all.
// Each takes the op's OpContext (fingerprint, deadline); Mesh::run throws PeerFailure.
// SPDX-License-Identifier: MIT
#pragma once

#include <bit>
#include <cstddef>
#include <cstring>
#include <vector>

#include "ddp/comm/reduce.hpp"
#include "ddp/comm/tcp/mesh.hpp"

namespace ddp::comm::tcp {

// Two reusable temporary buffers, grown on demand; used only by the thread running the op.
struct Scratch {
  std::vector<std::byte> recv, acc;
  static std::byte* sized(std::vector<std::byte>& v, std::size_t bytes) {
    if (v.size() < bytes) v.resize(bytes);
    return v.data();
  }
};

inline int mod(int a, int n) { return ((a % n) + n) % n; }

using comm::copy_bytes;
using comm::even_segments;

// ---- ring ----
// The buffer is cut into n segments (offs). Reduce-scatter: in step s (n-1 steps) rank r sends
// segment (r - s + shift) to r+1 and receives (r - s - 1 + shift) from r-1, combining it while the
// bytes arrive (Transfer::reduce_dst) and its own send is in flight, so every link carries data
// both ways. Rank r then holds the full reduction of segment (r + 1 + shift); all-gather passes the
// finished segments on the same way, receiving straight into place. Each rank sends 2(n-1)/n of
// the buffer, the minimum. Example, n = 3, shift 0, segments A B C, rank k's values a_k b_k c_k:
//   RS step 0: r0 sends A, gets C: c0+c2 | r1 sends B, gets A: a0+a1 | r2 sends C, gets B: b1+b2
//   RS step 1: r0 sends C, gets B: b0+b1+b2 | r1: C = c0+c1+c2 | r2: A = a0+a1+a2
//   r0 owns B, r1 C, r2 A; AG steps 0 and 1 pass them on.
// A segment is combined along one chain of ranks and then copied, so every rank ends bit-identical.
inline void ring_reduce_scatter(Mesh& mesh, const OpContext& ctx, std::byte* data,
                                const std::vector<std::size_t>& offs, int shift, Scratch& scratch) {
  const int n = mesh.size(), r = mesh.rank();
  const std::size_t es = dtype_size(ctx.fp.dtype);
  std::size_t max_seg = 0;
  for (int i = 0; i < n; ++i) max_seg = std::max(max_seg, offs[i + 1] - offs[i]);
  const std::size_t stage = max_seg * es > kStageBytes ? kStageBytes : 0;
  std::byte* tmp = Scratch::sized(scratch.recv, stage ? stage : max_seg * es);
  for (int s = 0; s < n - 1; ++s) {
    const int send_seg = mod(r - s + shift, n), recv_seg = mod(r - s - 1 + shift, n);
    Transfer xs[2] = {
        {.peer = mod(r + 1, n),
         .is_send = true,
         .data = data + offs[send_seg] * es,
         .bytes = (offs[send_seg + 1] - offs[send_seg]) * es},
        {.peer = mod(r - 1, n),
         .is_send = false,
         .data = tmp,
         .bytes = (offs[recv_seg + 1] - offs[recv_seg]) * es,
         .reduce_dst = data + offs[recv_seg] * es,
         .stage_bytes = stage},
    };
    mesh.run(xs, ctx);
  }
}

inline void ring_all_gather(Mesh& mesh, const OpContext& ctx, std::byte* data,
                            const std::vector<std::size_t>& offs, int shift) {
  const int n = mesh.size(), r = mesh.rank();
  const std::size_t es = dtype_size(ctx.fp.dtype);
  for (int s = 0; s < n - 1; ++s) {
    const int send_seg = mod(r + 1 + shift - s, n), recv_seg = mod(r + shift - s, n);
    Transfer xs[2] = {
        {.peer = mod(r + 1, n),
         .is_send = true,
         .data = data + offs[send_seg] * es,
         .bytes = (offs[send_seg + 1] - offs[send_seg]) * es},
        {.peer = mod(r - 1, n),
         .is_send = false,
         .data = data + offs[recv_seg] * es,
         .bytes = (offs[recv_seg + 1] - offs[recv_seg]) * es},
    };
    mesh.run(xs, ctx);
  }
}

// In-place ring all-reduce of count elements; Avg divides the owned segment before the all-gather.
inline void ring_all_reduce(Mesh& mesh, const OpContext& ctx, std::byte* data, std::size_t count,
                            Scratch& scratch) {
  const int n = mesh.size();
  const auto offs = even_segments(count, n);
  ring_reduce_scatter(mesh, ctx, data, offs, 0, scratch);
  if (ctx.fp.op == ReduceOp::Avg) {
    const int own = mod(mesh.rank() + 1, n);
    const std::size_t es = dtype_size(ctx.fp.dtype);
    divide_by(data + offs[own] * es, offs[own + 1] - offs[own], ctx.fp.dtype, n);
  }
  ring_all_gather(mesh, ctx, data, offs, 0);
}

// ---- recursive doubling ----
// With p = n a power of two, in round k rank r swaps its whole buffer with r ^ (1 << k) and
// combines: log2(p) message latencies instead of the ring's 2(n-1), better for small buffers.
// Otherwise (p the largest power of two below n, rem = n - p) the 2*rem lowest ranks pair up first:
// each even r sends to r+1 and sits out; the p remaining ranks run the rounds with new ranks (odd
// r < 2*rem -> r/2, r >= 2*rem -> r - rem), then each odd rank sends the result back. Example,
// n = 3: r0 sends x0 to r1; r1 and r2 swap and combine; r1 sends x0+x1+x2 to r0. Partners combine
// the same two values in opposite order, which IEEE arithmetic makes bit-identical.
inline void recursive_doubling_all_reduce(Mesh& mesh, const OpContext& ctx, std::byte* data,
                                          std::size_t count, Scratch& scratch) {
  const int n = mesh.size(), r = mesh.rank();
  const std::size_t bytes = count * dtype_size(ctx.fp.dtype);
  const int p = static_cast<int>(std::bit_floor(static_cast<unsigned>(n)));
  const int rem = n - p;
  std::byte* tmp = Scratch::sized(scratch.recv, bytes);
  int newrank;
  if (r < 2 * rem) {
    if (r % 2 == 0) {
      Transfer x{.peer = r + 1, .is_send = true, .data = data, .bytes = bytes};
      mesh.run({&x, 1}, ctx);
      newrank = -1;
    } else {
      Transfer x{.peer = r - 1, .is_send = false, .data = tmp, .bytes = bytes, .reduce_dst = data};
      mesh.run({&x, 1}, ctx);
      newrank = r / 2;
    }
  } else {
    newrank = r - rem;
  }
  if (newrank >= 0) {
    for (int mask = 1; mask < p; mask <<= 1) {
      const int pn = newrank ^ mask;
      const int peer = pn < rem ? pn * 2 + 1 : pn + rem;
      // Receive into tmp and combine afterwards: `data` is being sent during the exchange.
      Transfer xs[2] = {{.peer = peer, .is_send = true, .data = data, .bytes = bytes},
                        {.peer = peer, .is_send = false, .data = tmp, .bytes = bytes}};
      mesh.run(xs, ctx);
      reduce_into(data, tmp, count, ctx.fp.dtype, ctx.fp.op);
    }
  }
  if (ctx.fp.op == ReduceOp::Avg) divide_by(data, count, ctx.fp.dtype, n);
  if (r < 2 * rem) {
    Transfer x{
        .peer = r % 2 == 0 ? r + 1 : r - 1, .is_send = r % 2 != 0, .data = data, .bytes = bytes};
    mesh.run({&x, 1}, ctx);
  }
}

// ---- binomial trees ----
// Broadcast: with root renumbered 0 (vr = r - root mod n), rank vr receives from vr minus its
// lowest set bit, then sends to vr + 2^k for every 2^k below that bit, all sends at once.
// Example, n = 4: 0 -> 2, then 0 -> 1 and 2 -> 3. Reduce mirrors it; each parent combines in turn.
inline void binomial_broadcast(Mesh& mesh, const OpContext& ctx, std::byte* data, std::size_t bytes,
                               int root) {
  const int n = mesh.size(), vr = mod(mesh.rank() - root, n);
  int mask = 1;
  while (mask < n) {
    if (vr & mask) {
      Transfer x{.peer = mod(vr - mask + root, n), .is_send = false, .data = data, .bytes = bytes};
      mesh.run({&x, 1}, ctx);
      break;
    }
    mask <<= 1;
  }
  std::vector<Transfer> sends;
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (vr + mask < n)
      sends.push_back(
          {.peer = mod(vr + mask + root, n), .is_send = true, .data = data, .bytes = bytes});
  if (!sends.empty()) mesh.run(sends, ctx);
}

// Reduces into acc on root (acc = the rank's own contribution on entry; clobbered on non-roots).
inline void binomial_reduce(Mesh& mesh, const OpContext& ctx, std::byte* acc, std::size_t count,
                            int root, Scratch& scratch) {
  const int n = mesh.size(), vr = mod(mesh.rank() - root, n);
  const std::size_t bytes = count * dtype_size(ctx.fp.dtype);
  std::byte* tmp = Scratch::sized(scratch.recv, bytes);
  for (int mask = 1; mask < n; mask <<= 1) {
    if (vr & mask) {
      Transfer x{.peer = mod(vr - mask + root, n), .is_send = true, .data = acc, .bytes = bytes};
      mesh.run({&x, 1}, ctx);
      return;
    }
    if (vr + mask < n) {
      Transfer x{.peer = mod(vr + mask + root, n),
                 .is_send = false,
                 .data = tmp,
                 .bytes = bytes,
                 .reduce_dst = acc};
      mesh.run({&x, 1}, ctx);
    }
  }
  if (ctx.fp.op == ReduceOp::Avg) divide_by(acc, count, ctx.fp.dtype, n);
}

// ---- all-to-all ----
// Every pair exchanges its blocks directly; all 2(n-1) transfers overlap in one poll loop.
inline void pairwise_all_to_all(Mesh& mesh, const OpContext& ctx, const std::byte* in,
                                std::byte* out, std::size_t block_bytes) {
  const int n = mesh.size(), r = mesh.rank();
  copy_bytes(out + static_cast<std::size_t>(r) * block_bytes,
             in + static_cast<std::size_t>(r) * block_bytes, block_bytes);
  std::vector<Transfer> xs;
  for (int j = 0; j < n; ++j) {
    if (j == r) continue;
    const std::size_t off = static_cast<std::size_t>(j) * block_bytes;
    xs.push_back({.peer = j,
                  .is_send = true,
                  .data = const_cast<std::byte*>(in) + off,
                  .bytes = block_bytes});
    xs.push_back({.peer = j, .is_send = false, .data = out + off, .bytes = block_bytes});
  }
  if (!xs.empty()) mesh.run(xs, ctx);
}

}  // namespace ddp::comm::tcp
