// Must NOT compile: an out<float, 2> connected to an in<int>. The test actor_compile_fail.type_mismatch
// builds this file and expects the static_assert's sentence in the compiler's output. With
// FLEXPAR_COMPILE_FAIL_CONTROL the types match and the file must compile (actor_compile_fail.control:
// the failure above is the type check, not a broken setup).
#include <flexpar/actor/actor_graph.hpp>

#ifdef FLEXPAR_COMPILE_FAIL_CONTROL
using consumed = float;
#else
using consumed = int;
#endif

int main() {
  flexpar::actor_graph g;
  auto& producer = g.add_actor<flexpar::out<float, 2>>("producer", [](float& x) { x = 1.0f; });
  auto& consumer = g.add_actor<flexpar::in<consumed>>("consumer", [](const consumed&) {});
  g.connect(producer.output<0>(), consumer.input<0>());
}
