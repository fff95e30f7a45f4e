// Consumer of an installed ddp (Conan test_package and tests/package/install): includes the umbrella header and uses a store.
// SPDX-License-Identifier: MIT
#include <ddp/ddp.hpp>

#include <iostream>

int main() {
  ddp::store::HashStore store;
  store.set("hello", std::string_view("world"));
  if (store.get_string("hello") != "world") return 1;
  std::cout << "consumer: ddp " << ddp::version_string() << " ok\n";
  return 0;
}
