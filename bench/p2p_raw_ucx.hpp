// A bare ucp tag-API ping-pong peer for bench/flexpar_p2p: what flexpar's UCX transport is
// compared against in the same run. Busy-polls (the fastest a raw UCX user gets).
#pragma once

#include <mpi.h>
#include <ucp/api/ucp.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include <flexpar/core/check_mpi.hpp>
#include <flexpar/core/check_ucx.hpp>

namespace flexpar::bench {

class raw_ucx_pair {
 public:
  /// Collective over `comm`: a context, a worker and an endpoint to every rank.
  explicit raw_ucx_pair(MPI_Comm comm) {
    MPI_Comm_rank(comm, &rank_);
    int size = 0;
    MPI_Comm_size(comm, &size);
    ucp_config_t* cfg = nullptr;
    // The same settings as flexpar's UCX transport: UCX_*, then FLEXPAR_P2P_UCX_* on top.
    FLEXPAR_CHECK_UCX(rank_, ucp_config_read("FLEXPAR_P2P", nullptr, &cfg));
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_TAG;
    const ucs_status_t init = ucp_init(&params, cfg, &context_);
    ucp_config_release(cfg);
    FLEXPAR_CHECK_UCX(rank_, init);
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    FLEXPAR_CHECK_UCX(rank_, ucp_worker_create(context_, &wp, &worker_));
    ucp_address_t* address = nullptr;
    std::size_t length = 0;
    FLEXPAR_CHECK_UCX(rank_, ucp_worker_get_address(worker_, &address, &length));
    int my_length = static_cast<int>(length);
    std::vector<int> lengths(static_cast<std::size_t>(size)), offsets(static_cast<std::size_t>(size));
    FLEXPAR_CHECK_MPI(MPI_Allgather(&my_length, 1, MPI_INT, lengths.data(), 1, MPI_INT, comm));
    int total = 0;
    for (int r = 0; r < size; ++r) {
      offsets[static_cast<std::size_t>(r)] = total;
      total += lengths[static_cast<std::size_t>(r)];
    }
    std::vector<std::byte> all(static_cast<std::size_t>(total));
    FLEXPAR_CHECK_MPI(
        MPI_Allgatherv(address, my_length, MPI_BYTE, all.data(), lengths.data(), offsets.data(), MPI_BYTE, comm));
    ucp_worker_release_address(worker_, address);
    for (int r = 0; r < size; ++r) {
      ucp_ep_params_t ep{};
      ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
      ep.address = reinterpret_cast<const ucp_address_t*>(all.data() + offsets[static_cast<std::size_t>(r)]);
      ucp_ep_h handle = nullptr;
      FLEXPAR_CHECK_UCX(rank_, ucp_ep_create(worker_, &ep, &handle));
      endpoints_.push_back(handle);
    }
    FLEXPAR_CHECK_MPI(MPI_Barrier(comm));
    comm_ = comm;
  }

  raw_ucx_pair(const raw_ucx_pair&) = delete;
  raw_ucx_pair& operator=(const raw_ucx_pair&) = delete;

  ~raw_ucx_pair() {
    MPI_Barrier(comm_);  // nobody closes while a peer still sends
    for (ucp_ep_h ep : endpoints_) {
      ucp_request_param_t param{};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      param.flags = UCP_EP_CLOSE_FLAG_FORCE;
      void* request = ucp_ep_close_nbx(ep, &param);
      if (UCS_PTR_IS_PTR(request)) {
        while (ucp_request_check_status(request) == UCS_INPROGRESS) ucp_worker_progress(worker_);
        ucp_request_free(request);
      }
    }
    ucp_worker_destroy(worker_);
    ucp_cleanup(context_);
  }

  void send(int peer, std::uint64_t tag, const void* data, std::size_t size) {
    ucp_request_param_t param{};
    finish(ucp_tag_send_nbx(endpoints_[static_cast<std::size_t>(peer)], data, size, tag, &param));
  }

  void recv(std::uint64_t tag, void* data, std::size_t size) {
    ucp_request_param_t param{};
    finish(ucp_tag_recv_nbx(worker_, data, size, tag, ~std::uint64_t{0}, &param));
  }

 private:
  void finish(ucs_status_ptr_t request) {
    if (request == nullptr) return;
    if (UCS_PTR_IS_ERR(request)) FLEXPAR_CHECK_UCX(rank_, UCS_PTR_STATUS(request));
    ucs_status_t status;
    while ((status = ucp_request_check_status(request)) == UCS_INPROGRESS) ucp_worker_progress(worker_);
    ucp_request_free(request);
    FLEXPAR_CHECK_UCX(rank_, status);
  }

  int rank_ = 0;
  MPI_Comm comm_ = MPI_COMM_NULL;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::vector<ucp_ep_h> endpoints_;
};

}  // namespace flexpar::bench
