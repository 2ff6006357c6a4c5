// conv2d under mpiexec (MPICH): every signature of conv2d and its two gradients, static and run-time
// forms, against the direct serial convolution (the same checks as test_conv_inproc on real processes).
#include <gtest/gtest.h>
#include <mpi.h>

#include "conv_checks.hpp"
#include "support/machine_skip.hpp"

namespace flexpar::sbp {
namespace {

TEST(sbp_conv_mpi, every_signature_matches_the_serial_convolution) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) FLEXPAR_MACHINE_SKIP("not under mpiexec");
  communicator comm = communicator::from_mpi(MPI_COMM_WORLD);
  placement<1> mesh(comm, {comm.size()});
  testing_support::check_every_conv_signature(mesh);
}

}  // namespace
}  // namespace flexpar::sbp
