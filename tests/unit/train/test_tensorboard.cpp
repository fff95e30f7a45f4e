// train: the TensorBoard event-file writer: CRC32C against published vectors, the protobuf bytes of an Event and the
// TFRecord framing against what protobuf and TensorBoard's own code produce, the flush policy, and MetricsWriter's
// mapping of a metrics record to scalars. tests/interop/tensorboard reads real runs back with TensorBoard itself.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <ddp/core/crc32c.hpp>
#include <ddp/train/metrics.hpp>
#include <ddp/train/tensorboard.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/files.hpp"
#include "support/temp_dir.hpp"

namespace fs = std::filesystem;
using ddp::train::Scalar;
namespace tfevents = ddp::train::tfevents;

namespace {

std::string hex(std::string_view bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (const char c : bytes) {
    const auto b = static_cast<unsigned char>(c);
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

std::span<const std::uint8_t> as_bytes(std::string_view s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

// Splits an event file into its records' data, checking both CRCs of each (what TensorBoard's reader does).
std::vector<std::string> read_records(const std::string& bytes) {
  std::vector<std::string> out;
  std::size_t at = 0;
  const auto u32 = [&](std::size_t p) {
    std::uint32_t v = 0;
    std::memcpy(&v, bytes.data() + p, 4);
    return v;
  };
  while (at < bytes.size()) {
    REQUIRE(bytes.size() - at >= 12);
    std::uint64_t len = 0;
    std::memcpy(&len, bytes.data() + at, 8);
    CHECK(u32(at + 8) == ddp::masked_crc32c(as_bytes(std::string_view(bytes).substr(at, 8))));
    REQUIRE(bytes.size() - at >= 16 + len);
    const std::string data = bytes.substr(at + 12, len);
    CHECK(u32(at + 12 + len) == ddp::masked_crc32c(as_bytes(data)));
    out.push_back(data);
    at += 16 + len;
  }
  return out;
}

}  // namespace

TEST_CASE("crc32c: published check values (RFC 3720 B.4 and the CRC catalogue)") {
  CHECK(ddp::crc32c("123456789") == 0xE3069283u);
  CHECK(ddp::crc32c(std::string(32, '\0')) == 0x8A9136AAu);
  CHECK(ddp::crc32c(std::string(32, '\xff')) == 0x62A8AB43u);
  std::string ascending, descending;
  for (int i = 0; i < 32; ++i) {
    ascending += static_cast<char>(i);
    descending += static_cast<char>(31 - i);
  }
  CHECK(ddp::crc32c(ascending) == 0x46DD794Eu);
  CHECK(ddp::crc32c(descending) == 0x113FDB5Cu);
  CHECK(ddp::crc32c("") == 0u);
  // Incremental: any split gives the whole.
  const std::string s = "The quick brown fox jumps over the lazy dog";
  for (std::size_t cut : {0, 1, 9, 43})
    CHECK(ddp::crc32c_update(ddp::crc32c(std::string_view(s).substr(0, cut)),
                             as_bytes(std::string_view(s).substr(cut))) == ddp::crc32c(s));
  // TFRecord's mask: the values TensorBoard's own masked_crc32c (compat/tensorflow_stub) returns.
  CHECK(ddp::masked_crc32c(as_bytes("123456789")) == 0xC78AB0E5u);
  CHECK(ddp::masked_crc32c(as_bytes(ascending)) == 0x951F7892u);
}

TEST_CASE("tfevents: an Event's bytes are protobuf's own serialisation") {
  // Expected bytes from tensorboard.compat.proto.event_pb2.Event(...).SerializeToString() (tensorboard 2.21).
  const std::vector<Scalar> scalars{{"loss", 0.25f}, {"lr", -2.0f}};
  CHECK(hex(tfevents::encode_event(1.5, 7, {}, scalars)) ==
        "09000000000000f83f10072a180a0b0a046c6f7373150000803e0a090a026c7215000000c0");
  CHECK(hex(tfevents::encode_event(1.5, 0, tfevents::kFileVersion, {})) ==
        "09000000000000f83f1a0d627261696e2e4576656e743a32");
  // A negative int64 is ten bytes of varint (two's complement), as protobuf writes it.
  std::string neg;
  tfevents::put_int64(neg, 2, -1);
  CHECK(hex(neg) == "10ffffffffffffffffff01");
  std::string big;
  tfevents::put_varint(big, 300);
  CHECK(hex(big) == "ac02");
}

TEST_CASE("tfevents: record framing is length, masked CRC of the length, data, masked CRC of the data") {
  // Built with struct.pack and TensorBoard's masked_crc32c.
  CHECK(hex(tfevents::frame_record("hello")) == "0500000000000000eab2043e68656c6c6fbb1f1c19");
  CHECK(read_records(tfevents::frame_record("")) == std::vector<std::string>{""});
}

TEST_CASE("TensorBoardWriter: file name, version record, every scalar, flushed by count, interval and close") {
  ddp::test::TempDir tmp("ddp_tb_");
  const std::string dir = tmp.file("runs/a");  // created with its parent
  std::string path;
  {
    ddp::train::TensorBoardWriter tb(dir, {.flush_every = 3, .flush_interval = std::chrono::hours(1)});
    REQUIRE(tb.enabled());
    path = tb.path();
    const std::string name = fs::path(path).filename().string();
    CHECK(name.rfind("events.out.tfevents.", 0) == 0);
    CHECK(fs::path(path).parent_path() == fs::path(dir));
    // The version record is on disk at once; the next two events wait for the third.
    const auto header = fs::file_size(path);
    CHECK(read_records(ddp::test::slurp(path)).size() == 1);
    tb.add_scalars(1, {{"loss", 2.5f}, {"lr", 0.1f}});
    tb.add_scalar("loss", 2.25f, 2);
    CHECK(fs::file_size(path) == header);
    tb.add_scalars(3, {{"loss", 2.0f}});
    CHECK(read_records(ddp::test::slurp(path)).size() == 4);
    tb.add_scalar("loss", 1.5f, 4);  // written by the destructor
    CHECK(read_records(ddp::test::slurp(path)).size() == 4);
  }
  const auto records = read_records(ddp::test::slurp(path));
  REQUIRE(records.size() == 5);
  CHECK(records[0].find("brain.Event:2") != std::string::npos);
  CHECK(records[4].find(std::string("loss")) != std::string::npos);
  const std::vector<Scalar> last{{"loss", 1.5f}};
  // The same bytes as encoding it here, bar the wall time (the first 9 bytes).
  CHECK(records[4].substr(9) == tfevents::encode_event(0.0, 4, {}, last).substr(9));

  // flush_interval 0: every event reaches the file at once.
  ddp::train::TensorBoardWriter eager(tmp.file("eager"), {.flush_every = 1000, .flush_interval = {}});
  eager.add_scalar("x", 1.0f, 0);
  CHECK(read_records(ddp::test::slurp(eager.path())).size() == 2);
}

TEST_CASE("TensorBoardWriter: disabled with no directory; an unusable directory is an IoError naming the flag") {
  ddp::train::TensorBoardWriter off;
  CHECK_FALSE(off.enabled());
  off.add_scalar("loss", 1.0f, 1);  // no-op
  off.close();
  ddp::test::TempDir tmp("ddp_tb_");
  std::ofstream(tmp.file("file")) << "x";  // a file where the directory should be
  try {
    ddp::train::TensorBoardWriter tb(tmp.file("file/sub"));
    FAIL("expected IoError");
  } catch (const ddp::IoError& e) {
    CHECK(std::string(e.what()).find("--tensorboard-dir") != std::string::npos);
  }
}

TEST_CASE("MetricsWriter: one record goes to the JSON line and, as scalars, to TensorBoard") {
  const nlohmann::json record{{"epoch", 1}, {"step", 3},   {"global_step", 23}, {"loss", 2.5},
                              {"lr", 0.1},  {"note", "x"}, {"resumed", true}};
  const auto scalars = ddp::train::tensorboard_scalars(record);
  std::vector<std::string> tags;
  for (const auto& s : scalars) tags.push_back(s.tag);
  CHECK(tags == std::vector<std::string>{"epoch", "loss", "lr"});  // json keeps keys sorted; no steps, no text
  CHECK(ddp::train::tensorboard_step(record, -1) == 23);
  CHECK(ddp::train::tensorboard_step({{"step", 4}}, -1) == 4);
  CHECK(ddp::train::tensorboard_step({{"loss", 1.0}}, 9) == 9);

  ddp::test::TempDir tmp("ddp_tb_");
  std::string event_file;
  {
    ddp::train::MetricsWriter m(tmp.file("m.jsonl"), tmp.file("tb"));
    REQUIRE(m.enabled());
    event_file = m.tensorboard().path();
    m.write(record);
    m.write({{"loss", 1.0}});  // no step: the record count (1)
  }
  CHECK(ddp::test::slurp(tmp.file("m.jsonl")).find("\"global_step\":23") != std::string::npos);
  const auto records = read_records(ddp::test::slurp(event_file));
  REQUIRE(records.size() == 3);
  CHECK(records[1].substr(9) == tfevents::encode_event(0.0, 23, {}, scalars).substr(9));
  const std::vector<Scalar> second{{"loss", 1.0f}};
  CHECK(records[2].substr(9) == tfevents::encode_event(0.0, 1, {}, second).substr(9));

  ddp::train::MetricsWriter tb_only({}, tmp.file("tb2"));
  CHECK(tb_only.enabled());
}

namespace {
ddp::MemoryStats fake_device_memory() { return {.current_bytes = 3u << 20, .peak_bytes = (5u << 20) + (1u << 19)}; }
}  // namespace

TEST_CASE("step_record: the examples' common fields, from the step's times, its DDP trace and the device's memory") {
  using ms = std::chrono::milliseconds;
  const ddp::Clock::time_point t0{};
  ddp::parallel::StepTrace trace;  // one bucket in flight 2..6 ms; finish() waited 5..7 ms
  trace.step = 4;
  trace.completions_known = true;
  trace.buckets.push_back({.launched = t0 + ms(2), .completed = t0 + ms(6)});
  trace.backward_end = t0 + ms(5);
  trace.finished = t0 + ms(7);

  const nlohmann::json r = ddp::train::step_record(
      {{"loss", 2.5}}, {.start = t0, .got_batch = t0 + ms(1), .done = t0 + ms(9)}, trace, &fake_device_memory);
  CHECK(r["loss"] == 2.5);
  CHECK(r["step_ms"].get<double>() == doctest::Approx(9.0));
  CHECK(r["data_ms"].get<double>() == doctest::Approx(1.0));
  CHECK(r["comm_ms"].get<double>() == doctest::Approx(4.0));
  CHECK(r["comm_exposed_ms"].get<double>() == doctest::Approx(2.0));
  CHECK(r["gpu_memory_mib"].get<double>() == 3.0);
  CHECK(r["gpu_memory_peak_mib"].get<double>() == 5.5);

  // No batch time, no device memory, a step before the first synchronised one: only step_ms is added.
  const nlohmann::json bare =
      ddp::train::step_record({{"loss", 1.0}}, {.start = t0, .done = t0 + ms(3)}, ddp::parallel::StepTrace{});
  CHECK(bare == nlohmann::json{{"loss", 1.0}, {"step_ms", 3.0}});
}
