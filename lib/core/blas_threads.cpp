// lib/core/blas_threads.cpp — the BLAS's thread count (flexpar/core/blas_threads.hpp). OpenBLAS's
// thread control is declared weak here: with another BLAS (-DBLA_VENDOR=...) it is null and the
// threads are left alone.
#include <sched.h>

#include <algorithm>

#include <flexpar/core/blas_threads.hpp>

extern "C" {
void openblas_set_num_threads(int);
int openblas_get_num_threads(void);
}
#pragma weak openblas_set_num_threads
#pragma weak openblas_get_num_threads

extern "C" float cblas_sdot(int n, const float* x, int incx, const float* y, int incy);

namespace {
// A strong reference to the BLAS (every CBLAS has cblas_sdot): an --as-needed link keeps a library only
// for a strong reference, and with the weak ones above alone a program that calls nothing else of the
// BLAS would run without it, its thread control null.
__attribute__((used)) float (*const keeps_the_blas_linked)(int, const float*, int, const float*, int) = &cblas_sdot;
}  // namespace

namespace flexpar {

int size_blas_threads(int blas_threads, int ranks_on_node, std::optional<std::string> (*lookup)(std::string_view)) {
  if (blas_threads < 0 || openblas_set_num_threads == nullptr) return 0;
  int n = blas_threads;
  if (n == 0) {
    for (const char* name : {"OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"})
      if (lookup(name)) return 0;  // the user's choice rules
    cpu_set_t mine;
    CPU_ZERO(&mine);
    const int cores = ::sched_getaffinity(0, sizeof mine, &mine) == 0 ? CPU_COUNT(&mine) : 1;
    n = std::max(1, cores / std::max(1, ranks_on_node));
  }
  openblas_set_num_threads(n);
  return n;
}

int blas_threads_now() { return openblas_get_num_threads != nullptr ? openblas_get_num_threads() : 0; }

}  // namespace flexpar
