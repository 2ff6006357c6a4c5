// The MPI transport: MPI_Isend/MPI_Irecv (large-count variants) on a flexpar-owned duplicate.
#include <flexpar/core/check_mpi.hpp>
#include <flexpar/core/mpi_comm.hpp>
#include <flexpar/transport/mpi.hpp>

#include <climits>
#include <string>

namespace flexpar {
namespace {

class mpi_request final : public detail::request_state {
 public:
  mpi_request(const detail::request_info& info, MPI_Request handle) : request_state(info), handle_(handle) {}

  bool test() override {
    int done = 0;
    MPI_Status status;
    FLEXPAR_CHECK_MPI(MPI_Test(&handle_, &done, &status));
    if (!done) return false;
    if (info_.direction == message_direction::recv) {
      MPI_Count count = 0;
      FLEXPAR_CHECK_MPI(MPI_Get_count_c(&status, MPI_BYTE, &count));
      received_ = static_cast<std::size_t>(count);
    }
    return true;
  }

  void abandon() noexcept override {
    if (handle_ == MPI_REQUEST_NULL) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (info_.direction == message_direction::recv) {
      // A receive can be cancelled; wait for the cancellation so the buffer is no longer ours.
      MPI_Cancel(&handle_);
      MPI_Wait(&handle_, MPI_STATUS_IGNORE);
    } else {
      MPI_Request_free(&handle_);  // the send may still complete later
    }
  }

  [[nodiscard]] std::size_t bytes() const noexcept override {
    return info_.direction == message_direction::recv ? received_ : info_.size;
  }

 private:
  MPI_Request handle_;
  std::size_t received_ = 0;
};

class mpi_transport final : public transport {
 public:
  mpi_transport(detail::owned_mpi_comm comm, const config& cfg) : comm_(std::move(comm)), config_(cfg) {
    FLEXPAR_CHECK_MPI(MPI_Comm_rank(comm_.get(), &rank_));
    FLEXPAR_CHECK_MPI(MPI_Comm_size(comm_.get(), &size_));
    int* tag_ub = nullptr;
    int found = 0;
    FLEXPAR_CHECK_MPI(MPI_Comm_get_attr(comm_.get(), MPI_TAG_UB, &tag_ub, &found));
    max_tag_ = found && tag_ub ? static_cast<tag_t>(*tag_ub) : 32767;  // MPI guarantees at least 32767
  }

  [[nodiscard]] int rank() const noexcept override { return rank_; }
  [[nodiscard]] int size() const noexcept override { return size_; }
  [[nodiscard]] transport_kind kind() const noexcept override { return transport_kind::mpi; }
  [[nodiscard]] tag_t max_tag() const noexcept override { return max_tag_; }

  [[nodiscard]] std::unique_ptr<transport> split(int color, int key) override {
    detail::owned_mpi_comm sub = detail::split_for_flexpar(comm_.get(), color, key);
    if (sub.get() == MPI_COMM_NULL) return nullptr;
    return std::make_unique<mpi_transport>(std::move(sub), config_);
  }

 protected:
  // The peer is not checked here on purpose: MPI checks it and says so in its own words.
  request do_isend(int peer, tag_t tag, std::span<const std::byte> data) override {
    MPI_Request handle = MPI_REQUEST_NULL;
    FLEXPAR_CHECK_MPI(MPI_Isend_c(data.data(), static_cast<MPI_Count>(data.size()), MPI_BYTE, peer,
                                  static_cast<int>(tag), comm_.get(), &handle));
    return request(std::make_unique<mpi_request>(info(message_direction::send, peer, tag, data.size()), handle));
  }

  request do_irecv(int peer, tag_t tag, std::span<std::byte> data) override {
    MPI_Request handle = MPI_REQUEST_NULL;
    FLEXPAR_CHECK_MPI(MPI_Irecv_c(data.data(), static_cast<MPI_Count>(data.size()), MPI_BYTE, peer,
                                  static_cast<int>(tag), comm_.get(), &handle));
    return request(std::make_unique<mpi_request>(info(message_direction::recv, peer, tag, data.size()), handle));
  }

 private:
  [[nodiscard]] detail::request_info info(message_direction d, int peer, tag_t tag, std::size_t size) const {
    return {"mpi", d, rank_, peer, tag, size, config_.spin};
  }

  detail::owned_mpi_comm comm_;
  config config_;
  int rank_ = 0;
  int size_ = 0;
  tag_t max_tag_ = 0;
};

}  // namespace

std::unique_ptr<transport> make_mpi_transport(MPI_Comm comm, const config& cfg) {
  return std::make_unique<mpi_transport>(detail::duplicate_for_flexpar(comm), cfg);
}

}  // namespace flexpar
