// ODR test, first translation unit: uses the library and calls into the second one.
// SPDX-License-Identifier: MIT
#include <ddp/ddp.hpp>

#include <iostream>

int second_tu_uses_ddp();

int main() {
  ddp::store::HashStore store;
  store.set("k", std::string_view("v"));
  std::cout << "odr ok: " << ddp::version_string() << ' ' << second_tu_uses_ddp() + store.num_keys() << '\n';
  return 0;
}
