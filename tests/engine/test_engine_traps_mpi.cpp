// What a new user ran into with the engine (issue 40), under mpiexec, over the transport
// FLEXPAR_TRANSPORT names:
//  - row 2: one tensor mismatched among several in flight; the caller unwinds on the mismatch_error
//    and its buffers are unmapped at once. The engine must not touch them afterwards (it used to run
//    the others while the caller unwound: UCX then read freed memory and aborted the job);
//  - row 6: a timeline path that cannot be written is a usage_error when the engine starts.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <flexpar/engine/engine.hpp>
#include <flexpar/engine/gradient_sync.hpp>

namespace flexpar {
namespace {

/// Pages of its own for `count` elements, unmapped when it goes: the engine touching them after that
/// is a segfault (or, through UCX's cross-memory attach, a failed read that aborts the job), never
/// silent reuse of a freed heap block.
template <class T>
class unmapped_buffer {
 public:
  explicit unmapped_buffer(std::size_t count, T value) : count_(count) {
    const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    bytes_ = (std::max<std::size_t>(count * sizeof(T), 1) + page - 1) / page * page;
    void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    data_ = static_cast<T*>(p);
    std::fill(data_, data_ + count, value);
  }
  unmapped_buffer(const unmapped_buffer&) = delete;
  unmapped_buffer& operator=(const unmapped_buffer&) = delete;
  ~unmapped_buffer() { ::munmap(data_, bytes_); }
  std::span<T> span() noexcept { return {data_, count_}; }

 private:
  T* data_ = nullptr;
  std::size_t count_ = 0, bytes_ = 0;
};

struct traps : ::testing::Test {
  config cfg = [] {
    config c = config::from_environment();
    c.timeout = std::chrono::seconds(30);
    return c;
  }();
  communicator comm = communicator::from_mpi(MPI_COMM_WORLD, cfg, thread_need::multiple);
};

constexpr std::size_t tensor_count = 64 * 1024;  // 256 KiB of floats: a rendezvous over MPI and UCX
constexpr int tensors = 4, mismatched = 1;

/// Four tensors of `kind` submitted at once, tensor 1 three elements longer on rank 1; the handles
/// waited for in order, so that the mismatch_error of tensor 1 leaves the scope with tensors 2 and 3
/// submitted. Their buffers are unmapped as the scope unwinds. Then the engine still runs a tensor.
void one_mismatch_among_four(communicator& comm, const config& cfg, collective_kind kind) {
  const int p = comm.size(), me = comm.rank();
  engine eng(comm, cfg);
  std::string what;
  try {
    std::vector<std::unique_ptr<unmapped_buffer<float>>> in, out;
    std::vector<std::unique_ptr<unmapped_buffer<double>>> doubles;
    std::vector<handle> handles;
    for (int t = 0; t < tensors; ++t) {
      const std::size_t n = tensor_count + (t == mismatched && me == 1 ? 3 : 0);
      in.push_back(std::make_unique<unmapped_buffer<float>>(n, static_cast<float>(me + 1)));
      out.push_back(std::make_unique<unmapped_buffer<float>>(n * static_cast<std::size_t>(p) + 3, 0.0f));
      const std::string name = std::string("t").append(std::to_string(t));
      std::span<float> i = in.back()->span(), o = out.back()->span();
      switch (kind) {
        case collective_kind::allreduce: handles.push_back(eng.allreduce_async(name, i, reduce_op::sum)); break;
        case collective_kind::broadcast: handles.push_back(eng.broadcast_async(name, i, 0)); break;
        case collective_kind::reduce_scatter:
          handles.push_back(eng.reduce_scatter_async(name, std::span<const float>(i), o, reduce_op::sum));
          break;
        case collective_kind::alltoall: {
          // alltoall's count must divide by p: the mismatched one differs by p elements instead
          const std::size_t block = tensor_count / static_cast<std::size_t>(p) * static_cast<std::size_t>(p);
          const std::size_t m = block + (t == mismatched && me == 1 ? static_cast<std::size_t>(p) : 0);
          handles.push_back(eng.alltoall_async(name, std::span<const float>(i.first(m)), o));
          break;
        }
        case collective_kind::allgather:
          // allgather's counts may differ: tensor 1 differs in its dtype on rank 1 instead
          if (t == mismatched && me == 1) {
            doubles.push_back(
                std::make_unique<unmapped_buffer<double>>(tensor_count * static_cast<std::size_t>(p), 0.0));
            std::span<double> d = doubles.back()->span();
            handles.push_back(eng.allgather_async(name, std::span<const double>(d.first(tensor_count)), d));
          } else {
            handles.push_back(eng.allgather_async(name, std::span<const float>(i.first(tensor_count)), o));
          }
          break;
      }
    }
    for (auto& h : handles) h.wait();
    ADD_FAILURE() << name_of(kind) << ": no error for the mismatched tensor";
  } catch (const mismatch_error& e) {
    what = e.what();
  }
  // The buffers are gone. The mismatch names the tensor and rank 1's value.
  EXPECT_NE(what.find("[rank " + std::to_string(me) + "]"), std::string::npos) << what;
  EXPECT_NE(what.find("\"t1\""), std::string::npos) << what;
  EXPECT_NE(what.find("rank {1}"), std::string::npos) << what;
  std::vector<float> after(8, 1.0f);
  eng.allreduce_async("after", std::span(after), reduce_op::sum).wait();
  EXPECT_EQ(after, std::vector<float>(8, static_cast<float>(p)));
}

TEST_F(traps, allreduce_mismatch_leaves_no_transfer_on_freed_buffers) {
  one_mismatch_among_four(comm, cfg, collective_kind::allreduce);
}
TEST_F(traps, broadcast_mismatch_leaves_no_transfer_on_freed_buffers) {
  one_mismatch_among_four(comm, cfg, collective_kind::broadcast);
}
TEST_F(traps, allgather_mismatch_leaves_no_transfer_on_freed_buffers) {
  one_mismatch_among_four(comm, cfg, collective_kind::allgather);
}
TEST_F(traps, reduce_scatter_mismatch_leaves_no_transfer_on_freed_buffers) {
  one_mismatch_among_four(comm, cfg, collective_kind::reduce_scatter);
}
TEST_F(traps, alltoall_mismatch_leaves_no_transfer_on_freed_buffers) {
  one_mismatch_among_four(comm, cfg, collective_kind::alltoall);
}

// Row 2 as the user wrote it: broadcast_parameters over four parameters of 64 Ki floats, the second
// three elements longer on rank 1, parameters and engine going out of scope on the error.
TEST_F(traps, broadcast_parameters_mismatch_then_scope_ends) {
  std::string what;
  try {
    engine eng(comm, cfg);
    gradient_sync sync(eng);
    std::vector<std::unique_ptr<unmapped_buffer<float>>> weights, grads;
    for (int t = 0; t < tensors; ++t) {
      const std::size_t n = tensor_count + (t == mismatched && comm.rank() == 1 ? 3 : 0);
      weights.push_back(std::make_unique<unmapped_buffer<float>>(n, static_cast<float>(comm.rank())));
      grads.push_back(std::make_unique<unmapped_buffer<float>>(n, 0.0f));
      sync.register_parameter(std::string("w").append(std::to_string(t)), weights.back()->span(), grads.back()->span());
    }
    sync.broadcast_parameters(0);
    ADD_FAILURE() << "no error for the mismatched parameter";
  } catch (const mismatch_error& e) {
    what = e.what();
  }
  EXPECT_NE(what.find("broadcast \"param.w1\": count"), std::string::npos) << what;
}

// Row 6: FLEXPAR_TIMELINE=/nonexistent/dir/t.json gave no file, no message, exit 0.
TEST_F(traps, unwritable_timeline_path_is_a_usage_error_on_every_rank) {
  cfg.timeline_path = "/nonexistent/dir/t.json";
  try {
    engine eng(comm, cfg);
    FAIL() << "the engine started with a timeline it cannot write";
  } catch (const usage_error& e) {
    const std::string what = e.what();
    EXPECT_NE(
        what.find("[rank " + std::to_string(comm.rank()) + "] engine: the timeline file \"/nonexistent/dir/t.json\""),
        std::string::npos)
        << what;
    EXPECT_NE(what.find("FLEXPAR_TIMELINE"), std::string::npos) << what;
    EXPECT_NE(what.find("No such file or directory"), std::string::npos) << what;
  }
  // The ranks are still in step: an engine with a writable path runs.
  cfg.timeline_path.clear();
  engine eng(comm, cfg);
  std::vector<int> v(3, 1);
  eng.allreduce_async("ok", std::span(v), reduce_op::sum).wait();
  EXPECT_EQ(v[0], comm.size());
}

}  // namespace
}  // namespace flexpar
