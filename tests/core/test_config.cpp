#include <gtest/gtest.h>

#include <map>

#include <flexpar/core/config.hpp>
#include <flexpar/core/error.hpp>

namespace flexpar {
namespace {

config from(std::map<std::string, std::string> vars) {
  return config::from_environment([&](std::string_view name) -> std::optional<std::string> {
    auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  });
}

TEST(config, defaults_when_nothing_is_set) {
  const config c = from({});
  const config d;
  EXPECT_EQ(c.timeout, d.timeout);
  EXPECT_EQ(c.timeout, std::chrono::seconds(300));
  EXPECT_EQ(c.transport, transport_kind::mpi);
  EXPECT_EQ(c.ranks_per_node, 0);
  EXPECT_EQ(c.spin, std::chrono::microseconds(100000));
}

TEST(config, reads_every_variable) {
  const config c = from({{"FLEXPAR_TIMEOUT", "2.5"},
                         {"FLEXPAR_TRANSPORT", "ucx"},
                         {"FLEXPAR_RANKS_PER_NODE", "4"},
                         {"FLEXPAR_SPIN_US", "0"}});
  EXPECT_EQ(c.timeout, std::chrono::milliseconds(2500));
  EXPECT_EQ(c.transport, transport_kind::ucx);
  EXPECT_EQ(c.ranks_per_node, 4);
  EXPECT_EQ(c.spin, std::chrono::microseconds(0));
}

TEST(config, reads_the_streaming_threshold) {
  EXPECT_EQ(config{}.streaming_min_bytes, std::size_t{4} << 20);
  EXPECT_EQ(from({{"FLEXPAR_STREAMING_MIN_BYTES", "0"}}).streaming_min_bytes, 0u);
  EXPECT_EQ(from({{"FLEXPAR_STREAMING_MIN_BYTES", "67108864"}}).streaming_min_bytes, std::size_t{64} << 20);
  EXPECT_THROW((void)from({{"FLEXPAR_STREAMING_MIN_BYTES", "4M"}}), usage_error);
  EXPECT_THROW((void)from({{"FLEXPAR_STREAMING_MIN_BYTES", "-1"}}), usage_error);
  EXPECT_FALSE(config{}.source_in_memory_min_bytes.has_value());  // the communicator resolves it
  EXPECT_EQ(from({{"FLEXPAR_SOURCE_IN_MEMORY_MIN_BYTES", "0"}}).source_in_memory_min_bytes, std::size_t{0});
  EXPECT_EQ(from({{"FLEXPAR_SOURCE_IN_MEMORY_MIN_BYTES", "16777216"}}).source_in_memory_min_bytes,
            std::size_t{16} << 20);
  EXPECT_THROW((void)from({{"FLEXPAR_SOURCE_IN_MEMORY_MIN_BYTES", "16M"}}), usage_error);
}

TEST(config, reads_the_heartbeat_variables) {
  EXPECT_EQ(config{}.heartbeat_interval, std::chrono::milliseconds(250));
  EXPECT_EQ(config{}.heartbeat_misses, 8);
  const config c = from({{"FLEXPAR_HEARTBEAT_MS", "100"}, {"FLEXPAR_HEARTBEAT_MISSES", "3"}});
  EXPECT_EQ(c.heartbeat_interval, std::chrono::milliseconds(100));
  EXPECT_EQ(c.heartbeat_misses, 3);
  EXPECT_EQ(from({{"FLEXPAR_HEARTBEAT_MS", "0"}}).heartbeat_interval, std::chrono::milliseconds(0));  // off
  EXPECT_THROW((void)from({{"FLEXPAR_HEARTBEAT_MS", "-5"}}), usage_error);
  EXPECT_THROW((void)from({{"FLEXPAR_HEARTBEAT_MISSES", "0"}}), usage_error);
  EXPECT_THROW((void)from({{"FLEXPAR_HEARTBEAT_MISSES", "2.5"}}), usage_error);
}

TEST(config, reads_the_blas_threads) {
  EXPECT_EQ(config{}.blas_threads, 0);  // auto
  EXPECT_EQ(from({{"FLEXPAR_BLAS_THREADS", "3"}}).blas_threads, 3);
  EXPECT_EQ(from({{"FLEXPAR_BLAS_THREADS", "-1"}}).blas_threads, -1);
  EXPECT_THROW((void)from({{"FLEXPAR_BLAS_THREADS", "-2"}}), usage_error);
  EXPECT_THROW((void)from({{"FLEXPAR_BLAS_THREADS", "1.5"}}), usage_error);
}

TEST(config, reads_the_engine_variables) {
  const config c = from({{"FLEXPAR_FUSION_THRESHOLD", "0"},
                         {"FLEXPAR_CYCLE_TIME_MS", "2.5"},
                         {"FLEXPAR_CACHE_CAPACITY", "7"},
                         {"FLEXPAR_STALL_WARNING_S", "0.5"},
                         {"FLEXPAR_STALL_SHUTDOWN_S", "0"},
                         {"FLEXPAR_TIMELINE", "/tmp/t.json"},
                         {"FLEXPAR_TIMELINE_MARK_CYCLES", "1"},
                         {"FLEXPAR_STEP_PLAN", "0"},
                         {"FLEXPAR_PLAN_PATIENCE_MS", "2.5"}});
  EXPECT_EQ(c.fusion_threshold, 0u);
  EXPECT_FALSE(c.step_plan);
  EXPECT_EQ(c.plan_patience, std::chrono::microseconds(2500));
  EXPECT_EQ(c.cycle_time, std::chrono::microseconds(2500));
  EXPECT_EQ(c.cache_capacity, 7u);
  EXPECT_EQ(c.stall_warning, std::chrono::milliseconds(500));
  EXPECT_EQ(c.stall_shutdown, std::chrono::milliseconds(0));
  EXPECT_EQ(c.timeline_path, "/tmp/t.json");
  EXPECT_TRUE(c.timeline_mark_cycles);
  const config d;
  EXPECT_EQ(d.fusion_threshold, std::size_t{128} << 20);
  EXPECT_EQ(d.stall_shutdown, std::chrono::seconds(300));
  EXPECT_TRUE(d.step_plan);
  EXPECT_EQ(d.plan_patience, std::chrono::seconds(1));
  EXPECT_THROW((void)from({{"FLEXPAR_TIMELINE_MARK_CYCLES", "yes"}}), usage_error);
  EXPECT_THROW((void)from({{"FLEXPAR_STEP_PLAN", "on"}}), usage_error);
  EXPECT_THROW((void)from({{"FLEXPAR_PLAN_PATIENCE_MS", "-1"}}), usage_error);
  EXPECT_THROW((void)from({{"FLEXPAR_FUSION_THRESHOLD", "1.5"}}), usage_error);
  EXPECT_THROW((void)from({{"FLEXPAR_STALL_WARNING_S", "0"}}), usage_error);
}

TEST(config, a_bad_value_names_the_variable_the_value_and_what_was_expected) {
  auto message_of = [](std::map<std::string, std::string> vars) -> std::string {
    try {
      (void)from(std::move(vars));
    } catch (const usage_error& e) {
      return e.what();
    }
    return "(no error)";
  };
  EXPECT_EQ(message_of({{"FLEXPAR_TRANSPORT", "tcp"}}),
            "FLEXPAR_TRANSPORT=\"tcp\" is not valid: expected \"mpi\" or \"ucx\"");
  EXPECT_EQ(message_of({{"FLEXPAR_TIMEOUT", "soon"}}),
            "FLEXPAR_TIMEOUT=\"soon\" is not valid: expected a number of seconds >= 0.001");
  EXPECT_EQ(message_of({{"FLEXPAR_TIMEOUT", "0"}}),
            "FLEXPAR_TIMEOUT=\"0\" is not valid: expected a number of seconds >= 0.001");
  EXPECT_EQ(message_of({{"FLEXPAR_RANKS_PER_NODE", "1.5"}}),
            "FLEXPAR_RANKS_PER_NODE=\"1.5\" is not valid: expected a whole number >= 0");
  EXPECT_EQ(message_of({{"FLEXPAR_SPIN_US", "-1"}}),
            "FLEXPAR_SPIN_US=\"-1\" is not valid: expected a number of microseconds >= 0");
}

TEST(config, settable_in_code) {
  config c;
  c.timeout = std::chrono::milliseconds(10);
  c.transport = transport_kind::inproc;
  EXPECT_EQ(name_of(c.transport), "inproc");
}

}  // namespace
}  // namespace flexpar
