// flexpar/search/graph.hpp — the op graph the strategy search works on: a model as a list of ops
// with their shapes, FLOPs and parameter bytes (FlexFlow's operator graph), plus builders for the
// reference models and JSON read/write.
//
// Every op produces one activation of logical shape [batch, channels, spatial]:
//   linear     y[N, out, P] = W applied at each of P positions to x[N, in, P] (P = 1: a plain FC layer;
//              a conv output is read flattened)
//   conv2d     y[N, Cout, H*W] from x[N, Cin, H'*W'], a k x k kernel
//   embedding  y[N, D, 1] = the sum of `lookups` rows of a [V, D] table per sample
//   attention  a self-attention block on [N, d, S]: Q, K, V, O projections (4 d x d) and the scores
//   elementwise relu, pooling, residual add, the DLRM interaction: no parameters, memory bound
//              (`function` says which: the executor runs relu and max_pool; a max_pool's output
//              positions are fewer than its input's: a `kernel` x `kernel` window, stride 1 or more)
// The SOAP dimensions of config.hpp refer to these axes: sample = N (tensor axis 0), parameter =
// channels (axis 1), attribute = spatial (axis 2) or, for linear, conv2d and embedding, the reduced axis.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace flexpar::search {

/// The kinds of op the simulator knows how to parallelise.
enum class op_kind : unsigned char { linear, conv2d, embedding, attention, elementwise };

/// "linear", "conv2d", ...
std::string_view name_of(op_kind k) noexcept;

/// What an elementwise op computes. The simulator needs only its FLOPs; execute.hpp runs relu and max_pool.
enum class elementwise_fn : unsigned char { other, relu, max_pool };

/// "other", "relu", "max_pool".
std::string_view name_of(elementwise_fn f) noexcept;

/// One op of the graph.
struct op {
  std::string name;                 ///< unique label (printed with its strategy)
  op_kind kind = op_kind::linear;   ///< what it computes
  std::vector<std::size_t> inputs;  ///< producer ops (indices of earlier ops); empty: reads the data
  std::size_t batch = 1;            ///< N: samples (tensor axis 0)
  std::size_t in_channels = 1;      ///< features read per position (embedding: the table's rows V)
  std::size_t out_channels = 1;     ///< output features / channels (tensor axis 1)
  std::size_t spatial = 1;          ///< output positions per sample (tensor axis 2): H*W, sequence, 1
  double forward_flops = 0;         ///< floating-point operations of the forward pass (whole batch)
  double param_bytes = 0;           ///< bytes of the op's parameters (0: none)
  std::size_t kernel = 1;           ///< conv2d: the k x k kernel; max_pool: the k x k window
  /// elementwise ops: what they compute
  elementwise_fn function = elementwise_fn::other;
};

/// A model: ops in topological order (every input index is smaller than the op's own).
struct graph {
  std::string name;               ///< the model's label
  std::size_t element_bytes = 4;  ///< bytes per activation / parameter element
  std::vector<op> ops;            ///< in topological order

  /// Appends `o` and returns its index. @throws usage_error when an input is not an earlier op or
  /// the name is taken.
  std::size_t add(op o);
  /// The ops reading op i's output.
  [[nodiscard]] std::vector<std::size_t> consumers(std::size_t i) const;
  /// Bytes of op i's output activation.
  [[nodiscard]] double output_bytes(std::size_t i) const;
};

/// Op builders with the FLOP and parameter formulas of the header comment (element bytes 4).
namespace make {
/// A fully-connected layer [batch, in, positions] -> [batch, out, positions].
op linear(std::string name, std::size_t batch, std::size_t in, std::size_t out, std::size_t positions = 1);
/// A k x k convolution, stride 1, 'same' padding: [batch, cin, hw] -> [batch, cout, hw].
op conv2d(std::string name, std::size_t batch, std::size_t cin, std::size_t cout, std::size_t hw, std::size_t k);
/// A table [vocab, dim], `lookups` rows summed per sample; output [batch, dim, 1].
op embedding(std::string name, std::size_t batch, std::size_t vocab, std::size_t dim, std::size_t lookups);
/// A self-attention block on [batch, hidden, seq].
op attention(std::string name, std::size_t batch, std::size_t hidden, std::size_t seq);
/// An element-wise op on [batch, channels, spatial] (flops_per_element operations per output element).
op elementwise(std::string name, std::size_t batch, std::size_t channels, std::size_t spatial,
               double flops_per_element = 1);
/// max(0, x) on [batch, channels, spatial] (function relu, 1 operation per element).
op relu(std::string name, std::size_t batch, std::size_t channels, std::size_t spatial = 1);
/// A `window` x `window` max pooling of a square input to `out_side` x `out_side` positions per channel
/// (the stride is what maps the input's side to out_side; k*k operations per output element).
op max_pool(std::string name, std::size_t batch, std::size_t channels, std::size_t out_side, std::size_t window);
}  // namespace make

/// Reference models (FlexFlow's evaluation set, scaled).
namespace reference {
/// An MLP: linear layers of `widths` (widths[0] is the input) with a relu between them.
graph mlp(std::size_t batch, const std::vector<std::size_t>& widths);
/// An AlexNet-like CNN: 5 convolutions with pooling, then fully-connected 9216 -> 4096 -> 4096 -> 1000
/// (the large FC layers hold ~95% of the parameters).
graph cnn(std::size_t batch);
/// The CNN's op kinds at a size CPU ranks run (execute.hpp): conv1 (3 -> `channels`, 3 x 3, on
/// `side` x `side`), relu1, pool1 (2 x 2 max, stride 2), conv2 (`channels` -> 2 `channels`, 3 x 3), pool2
/// (2 x 2, stride 2), fc3 (2 `channels` (side / 4)^2 -> `classes`, reading the pooled maps flattened).
/// @throws usage_error when side is not a multiple of 4.
graph cnn_small(std::size_t batch, std::size_t side = 8, std::size_t channels = 3, std::size_t classes = 10);
/// `layers` Transformer blocks (attention, residual, FFN hidden -> 4 hidden -> hidden, residual).
graph transformer(std::size_t layers, std::size_t batch, std::size_t seq, std::size_t hidden);
/// One pipeline stage of `transformer`: blocks block0 ... block0 + blocks - 1, after the input norm when
/// `first` (else after a stage input: the activation received), and the head and loss when `last`.
/// transformer(L, ...) is transformer_stage(L, true, true, ..., 0).
graph transformer_stage(std::size_t blocks, bool first, bool last, std::size_t batch, std::size_t seq,
                        std::size_t hidden, std::size_t block0);
/// A DLRM-like recommender: `tables` embedding tables of `vocab` x 64, a bottom MLP on the dense
/// features, the interaction, and a top MLP.
graph dlrm(std::size_t batch, std::size_t tables, std::size_t vocab);
}  // namespace reference

/// The graph as JSON text (its fields as in `op`, inputs by index).
std::string to_json(const graph& g);
/// Parses what to_json writes. @throws usage_error naming the op and field that is wrong.
graph graph_from_json(std::string_view text);

}  // namespace flexpar::search
