// samples/actor_squares.cpp — doc/actors.md's first example: a stream of numbers, an actor squaring
// them and one summing the squares, on one rank over a pool of two threads; checks the sum.
//
//   build/samples/actor_squares
#include <chrono>
#include <cstdio>

#include <flexpar/actor/executor.hpp>

int main() {
  // [snippet:model]
  flexpar::actor_graph g;  // one rank; actor_graph g(comm) spans ranks
  auto& numbers = g.add_actor<flexpar::out<int, 2>>("numbers", [i = 0](int& x) mutable {
    if (i == 100) return flexpar::fire_result::done;  // end of stream
    x = i++;
    return flexpar::fire_result::emit;
  });
  auto& square = g.add_actor<flexpar::in<int>, flexpar::out<long, 2>>(
      "square", [](const int& x, long& y) { y = long{x} * x; });  // void: always publish
  long sum = 0;
  auto& total = g.add_actor<flexpar::in<long>>("sum", [&sum](const long& y) { sum += y; });
  g.connect(numbers.output<0>(), square.input<0>());
  g.connect(square.output<0>(), total.input<0>());
  flexpar::actor_executor pool(2);  // no global pool, no thread per actor
  pool.run(g, flexpar::deadline_after(std::chrono::seconds(10)));
  // [/snippet:model]
  const long want = 99L * 100 * 199 / 6;  // 0^2 + 1^2 + ... + 99^2
  std::printf("sum of the squares of 0 .. 99: %ld (%s)\n", sum, sum == want ? "right" : "WRONG");
  return sum == want ? 0 : 1;
}
