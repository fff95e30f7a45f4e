// env: expansion of Slurm's compressed host lists and task counts.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <ddp/env/hostlist.hpp>
#include <string>
#include <vector>

using ddp::ConfigError;
using ddp::env::expand_hostlist;
using ddp::env::expand_tasks_per_node;
using Hosts = std::vector<std::string>;

TEST_SUITE("env") {
  TEST_CASE("host lists: plain names, ranges, zero padding, several groups") {
    struct Row {
      const char* list;
      Hosts hosts;
    };
    const Row rows[] = {
        {"node1", {"node1"}},
        {"a,b,c", {"a", "b", "c"}},
        {"node[1-3]", {"node1", "node2", "node3"}},
        {"node[01-03,07],gpu5", {"node01", "node02", "node03", "node07", "gpu5"}},
        {"n[9-11]", {"n9", "n10", "n11"}},
        {"n[098-101]", {"n098", "n099", "n100", "n101"}},
        {"n[007]", {"n007"}},
        {"rack[1-2]-n[8-9]", {"rack1-n8", "rack1-n9", "rack2-n8", "rack2-n9"}},
        {"gpu[1,3],cpu[10-11].local", {"gpu1", "gpu3", "cpu10.local", "cpu11.local"}},
        {"[1-2]x", {"1x", "2x"}},
        {"10.0.0.[1-2]", {"10.0.0.1", "10.0.0.2"}},
    };
    for (const auto& r : rows) {
      CAPTURE(r.list);
      CHECK(expand_hostlist(r.list) == r.hosts);
    }
  }

  TEST_CASE("host lists: a large range expands to the count an independent loop gives") {
    auto hosts = expand_hostlist("c[0001-1000],d[1-24]");
    REQUIRE(hosts.size() == 1024);
    CHECK(hosts.front() == "c0001");
    CHECK(hosts[999] == "c1000");
    CHECK(hosts.back() == "d24");
  }

  TEST_CASE("host lists: malformed values name the variable and say how to bypass") {
    struct Row {
      const char* list;
      const char* why;
    };
    const Row rows[] = {
        {"node[01-03", "'[' without ']'"},
        {"node01]", "']' without '['"},
        {"node[3-1]", "range '3-1' is empty or too large"},
        {"node[a-b]", "range 'a-b' is not N or N-M"},
        {"node[]", "range '' is not N or N-M"},
        {"node[1-]", "range '1-' is not N or N-M"},
        {"node[1,,2]", "range '' is not N or N-M"},
        {"a,,b", "it has an empty entry"},
        {"a[1[2]]", "nested '['"},
        {"n[0-9999999]", "it expands to too many hosts"},
        {"n[0-999999,0-999999]", "it expands to too many hosts"},        // bounded over all ranges of a group
        {"k[0-999][0-999],n[0-99999]", "it expands to too many hosts"},  // and over all items
        {"", "it is empty"},
    };
    for (const auto& r : rows) {
      CAPTURE(r.list);
      std::string want = std::string("ddp: SLURM_STEP_NODELIST='") + r.list +
                         "' (from Slurm srun) is not a Slurm host list: " + r.why +
                         ". Export MASTER_ADDR=<host of rank 0> to bypass it.";
      CHECK_THROWS_WITH_AS(expand_hostlist(r.list, "SLURM_STEP_NODELIST"), want.c_str(), ConfigError);
    }
  }

  TEST_CASE("host lists: long names are bounded by their total size, not only by their count") {
    // 100 000 hosts of 1 000 characters would be 100 MB: refused before anything is expanded.
    const std::string list = std::string(994, 'x') + "[00000-99999]";
    CHECK_THROWS_WITH_AS(expand_hostlist(list), doctest::Contains("it expands to too many hosts"), ConfigError);
    CHECK(expand_hostlist(std::string(100, 'x') + "[0-9999]").size() == 10000);  // 1 MB is fine
  }

  TEST_CASE("task counts: N and N(xK), comma separated") {
    CHECK(expand_tasks_per_node("4") == std::vector<int>{4});
    CHECK(expand_tasks_per_node("2(x3),1") == std::vector<int>{2, 2, 2, 1});
    CHECK(expand_tasks_per_node("3,2(x2)") == std::vector<int>{3, 2, 2});
    CHECK(expand_tasks_per_node("8(x2)") == std::vector<int>{8, 8});
  }

  TEST_CASE("task counts: malformed values are errors") {
    struct Row {
      const char* list;
      const char* why;
    };
    const Row rows[] = {
        {"2(x3", "entry '2(x3' is not N or N(xK)"},
        {"2(3)", "entry '2(3)' is not N or N(xK)"},
        {"x", "entry 'x' is not N or N(xK) with N, K >= 1"},
        {"0", "entry '0' is not N or N(xK) with N, K >= 1"},
        {"2(x0)", "entry '2(x0)' is not N or N(xK) with N, K >= 1"},
        {"2,", "entry '' is not N or N(xK) with N, K >= 1"},
        {"1(x2000000)", "it lists too many nodes"},
    };
    for (const auto& r : rows) {
      CAPTURE(r.list);
      std::string want = std::string("ddp: SLURM_STEP_TASKS_PER_NODE='") + r.list +
                         "' (from Slurm srun) is not a Slurm task count list like '2(x3),1': " + r.why +
                         ". srun sets it; do not set it by hand.";
      CHECK_THROWS_WITH_AS(expand_tasks_per_node(r.list), want.c_str(), ConfigError);
    }
  }
}
