// Programs that must not compile: each FLEXPAR_CASE is a wrong parallel program, and the ctest that
// builds it (expect_compile_error.cmake) checks the text of the error. Case 0 is the control: the
// same code with the right boxing compiles (so a failure of the others is the diagnostic's, not a
// broken include path).
#include <flexpar/sbp/sbp.hpp>

using namespace flexpar::sbp;

void program(const placement<1>& mesh, const placement<2>& mesh2) {
  auto partial_x = global_tensor<float, partial_sum>::from_full(mesh, {4, 4}, std::vector<float>(16));
  auto rows = global_tensor<float, split<0>>::from_full(mesh, {4, 4}, std::vector<float>(16));
  auto whole = global_tensor<float, broadcast>::from_full(mesh, {4, 4}, std::vector<float>(16));
  (void)mesh2;
#if FLEXPAR_CASE == 0
  auto ok1 = matmul(partial_x, to<broadcast>(rows));  // (P, B) -> P
  auto ok2 = relu(to<broadcast>(partial_x));          // B -> B
  auto ok3 = mul(partial_x, whole);                   // (P, B) -> P
  auto ok4 = to<sbp<split<0>, broadcast>>(
      global_tensor<float, sbp<broadcast, broadcast>>::from_full(mesh2, {4, 4}, std::vector<float>(16)));
  auto images = global_tensor<float, split<0>>::from_full(mesh, {2, 1, 2, 2}, std::vector<float>(8));
  auto kernels = global_tensor<float, split<0>>::from_full(mesh, {1, 1, 1, 1}, std::vector<float>(1));
  auto ok5 = conv2d(images, to<broadcast>(kernels), 0);  // (S(0), B) -> S(0)
  auto ok6 = gelu(to<broadcast>(partial_x));             // B -> B
  auto ok7 = layer_norm<1>(rows);                        // S(0) -> S(0): rows whole
  auto labels = global_tensor<std::int64_t, split<0>>::from_full(mesh, {4}, std::vector<std::int64_t>(4));
  auto ok8 = cross_entropy(to<split<0>>(transpose(rows)), labels);  // (S(0), S(0)) -> S(0)
  auto ok9 = causal_attention(whole, whole, whole, 2, 2);           // B -> B
  (void)ok1, (void)ok2, (void)ok3, (void)ok4, (void)ok5, (void)ok6, (void)ok7, (void)ok8, (void)ok9;
#elif FLEXPAR_CASE == 1  // matmul with no signature: (P(sum), S(0))
  auto bad = matmul(partial_x, rows);
#elif FLEXPAR_CASE == 2  // relu of a partial sum
  auto bad = relu(partial_x);
#elif FLEXPAR_CASE == 3  // P * P
  auto bad = mul(partial_x, partial_x);
#elif FLEXPAR_CASE == 4  // boxing a 1-D tensor to a 2-axis nd-SBP
  auto bad = to<sbp<split<0>, broadcast>>(rows);
#elif FLEXPAR_CASE == 5  // conv2d with no signature: (S(0), S(0))
  auto images = global_tensor<float, split<0>>::from_full(mesh, {2, 1, 2, 2}, std::vector<float>(8));
  auto kernels = global_tensor<float, split<0>>::from_full(mesh, {1, 1, 1, 1}, std::vector<float>(1));
  auto bad = conv2d(images, kernels, 0);
#elif FLEXPAR_CASE == 6  // gelu of a partial sum
  auto bad = gelu(partial_x);
#elif FLEXPAR_CASE == 7  // layer_norm over the split axis
  auto bad = layer_norm<0>(rows);
#elif FLEXPAR_CASE == 8  // cross-entropy of logits split by classes (a vocabulary-parallel output)
  auto labels = global_tensor<std::int64_t, split<0>>::from_full(mesh, {4}, std::vector<std::int64_t>(4));
  auto bad = cross_entropy(transpose(rows), labels);
#elif FLEXPAR_CASE == 9  // attention on partial sums
  auto bad = causal_attention(partial_x, partial_x, partial_x, 2, 2);
#endif
}
