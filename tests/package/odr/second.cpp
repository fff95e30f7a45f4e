// ODR test, second translation unit: the same headers again, so every non-inline definition would clash.
// SPDX-License-Identifier: MIT
#include <ddp/ddp.hpp>

int second_tu_uses_ddp() {
  ddp::store::HashStore store;
  return static_cast<int>(store.add("counter", 1));
}
