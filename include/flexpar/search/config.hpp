// flexpar/search/config.hpp — SOAP parallelisation configs of one op and their SBP signatures.
//
// A config says how many parts an op is cut into along the sample (batch), attribute and parameter
// dimensions, and on which devices: `sample * attribute * parameter` consecutive devices starting at
// `first_device`, arranged as a row-major mesh whose axes are the degrees > 1 in the order
// (sample, attribute, parameter). That mesh is a flexpar::sbp placement, and the config is an SBP
// signature on it — per mesh axis:
//
//   axis        input            weight           output          op kinds
//   sample      S(0)             B (grad P(sum))  S(0)            all
//   parameter   B                S(1)             S(1)            linear, embedding
//   parameter   B                S(0) ([K,C,R,S]) S(1)            conv2d (output channels)
//   parameter   S(1)             -                S(1)            elementwise (channels)
//   parameter   B                S(1) heads       P(sum)          attention (Megatron: heads, then row-parallel O)
//   attribute   S(1)             S(0)             P(sum)          linear (row parallel: the reduced axis)
//   attribute   S(1)             S(1) ([K,C,R,S]) P(sum)          conv2d (input channels: the reduced axis)
//   attribute   B (ids)          S(0) rows        P(sum)          embedding (vocabulary split)
//   attribute   S(2)             B (grad P(sum))  S(2)            elementwise (spatial)
//
// conv2d's attribute is the reduced input-channel axis, not the spatial one: a spatial split needs halo
// exchanges that neither the simulator nor the SBP layer has, while the channel split is exact and runs
// (sbp::conv2d's (S(1), S(1)) -> P(sum)).
//
// so data-parallel linear is (S(0), B) -> S(0) with the weight gradient allreduced over the sample
// axis, and a 2-D (sample, parameter) linear is ((S(0), B), (B, S(1))) -> (S(0), S(1)).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include <flexpar/sbp/parallel.hpp>
#include <flexpar/search/cluster.hpp>
#include <flexpar/search/graph.hpp>

namespace flexpar::search {

/// Degrees of parallelism and the device set of one op (header comment).
struct soap_config {
  int sample = 1;        ///< parts along the batch
  int attribute = 1;     ///< parts along spatial positions, or the reduced axis (linear, conv2d, embedding)
  int parameter = 1;     ///< parts along output channels / heads
  int first_device = 0;  ///< the device set is [first_device, first_device + devices())

  /// sample * attribute * parameter.
  [[nodiscard]] int devices() const noexcept { return sample * attribute * parameter; }
  /// Same degrees and device set.
  friend bool operator==(const soap_config&, const soap_config&) = default;
};

/// Which mesh axis a degree became.
enum class soap_dim : unsigned char { sample, attribute, parameter };

/// The SBP signature of a config: its placement mesh and the nd-SBPs of input, weight and output.
struct sbp_signature {
  std::vector<int> mesh;       ///< mesh extents (1-D {1} for a single device)
  std::vector<soap_dim> dims;  ///< what each mesh axis cuts
  sbp::nd_parallel input;      ///< what the op needs its input(s) to be
  sbp::nd_parallel weight;     ///< its weight's layout (B on an axis: replicas whose gradients are allreduced)
  sbp::nd_parallel output;     ///< what it produces
};

/// The signature of `c` for `o` (table in the header comment).
sbp_signature signature_of(const op& o, const soap_config& c);
/// OneFlow notation: "(S(0), B) -> S(0)" for a 1-D mesh, "((S(0), B), (B, S(1))) -> (S(0), S(1))" for 2-D
/// ((input, weight) -> output; "input -> output" for ops without a weight).
std::string describe(const op& o, const soap_config& c);
/// "s=4 a=1 p=2 @[0..8)".
std::string to_string(const soap_config& c);

/// True when `c` is a config the search may give `o` on `cl` (degrees >= 1, not larger than the dimension
/// they cut, allowed for the kind, the device set inside the cluster and aligned to its size).
bool valid(const op& o, const soap_config& c, const cluster& cl);
/// Every valid config of `o` on `cl`: device counts dividing cl.devices(), every factorisation of them
/// into (sample, attribute, parameter), every aligned device set.
std::vector<soap_config> candidates(const op& o, const cluster& cl);

/// A strategy: one config per op of a graph.
using strategy = std::vector<soap_config>;

/// Data parallelism: every op sample = cl.devices() on all devices (capped at the batch).
strategy data_parallel(const graph& g, const cluster& cl);
/// The hand-made expert strategy: Megatron-style for attention and the linear layers around it
/// (parameter / attribute inside a node, sample across nodes), "one weird trick" for CNNs (convolutions
/// data parallel, large fully-connected layers parameter parallel inside a node), embedding tables
/// split by rows; everything else data parallel.
strategy expert(const graph& g, const cluster& cl);

/// The strategy as JSON text: {"graph": name, "ops": [{"name", "sample", "attribute", "parameter",
/// "first_device", "sbp"}]} ("sbp" is describe(), for readers).
std::string to_json(const graph& g, const strategy& s);
/// Parses what to_json(graph, strategy) writes, for `g` on `cl`. @throws usage_error naming the op when
/// an op name does not match the graph's or a config is not valid there.
strategy strategy_from_json(std::string_view text, const graph& g, const cluster& cl);

}  // namespace flexpar::search
