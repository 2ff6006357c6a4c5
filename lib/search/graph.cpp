// lib/search/graph.cpp — the op graph: builders, reference models and JSON (nlohmann-json stays inside libflexpar).
#include <flexpar/core/error.hpp>
#include <flexpar/search/graph.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <utility>

namespace flexpar::search {

namespace {
constexpr double f32 = 4;

std::string numbered(std::string_view prefix, std::size_t n) {
  std::string s(prefix);
  return s.append(std::to_string(n));
}

std::string op_context(std::string_view what, std::size_t i, std::string_view name) {
  return error_text(no_rank, std::string("search::").append(what), "op ", i, " '", name, "': ");
}
}  // namespace

std::string_view name_of(op_kind k) noexcept {
  switch (k) {
    case op_kind::linear: return "linear";
    case op_kind::conv2d: return "conv2d";
    case op_kind::embedding: return "embedding";
    case op_kind::attention: return "attention";
    case op_kind::elementwise: return "elementwise";
  }
  return "?";
}

namespace {
/// The enumerator of `all` named `text` (name_of). @throws usage_error naming the op, the field and the choices.
template <class E, std::size_t N>
E parse_named(const E (&all)[N], const std::string& text, std::string_view field, std::size_t i,
              std::string_view op_name) {
  std::string choices;
  for (E e : all) {
    if (name_of(e) == text) return e;
    choices.append(choices.empty() ? "" : ", ").append(name_of(e));
  }
  throw usage_error(op_context("graph_from_json", i, op_name)
                        .append(field)
                        .append(" '")
                        .append(text)
                        .append("' is not one of ")
                        .append(choices));
}
}  // namespace

std::string_view name_of(elementwise_fn f) noexcept {
  switch (f) {
    case elementwise_fn::other: return "other";
    case elementwise_fn::relu: return "relu";
    case elementwise_fn::max_pool: return "max_pool";
  }
  return "?";
}

std::size_t graph::add(op o) {
  const std::size_t i = ops.size();
  for (std::size_t in : o.inputs)
    if (in >= i)
      throw usage_error(op_context("graph::add", i, o.name)
                            .append("input ")
                            .append(std::to_string(in))
                            .append(" is not an earlier op (the graph has ")
                            .append(std::to_string(i))
                            .append(" ops; ops are added in topological order)"));
  for (const op& x : ops)
    if (x.name == o.name) throw usage_error(op_context("graph::add", i, o.name).append("the name is taken"));
  if (o.batch == 0 || o.out_channels == 0 || o.spatial == 0 || o.in_channels == 0)
    throw usage_error(op_context("graph::add", i, o.name).append("batch, channels and spatial must be >= 1"));
  ops.push_back(std::move(o));
  return i;
}

std::vector<std::size_t> graph::consumers(std::size_t i) const {
  std::vector<std::size_t> out;
  for (std::size_t j = i + 1; j < ops.size(); ++j)
    if (std::find(ops[j].inputs.begin(), ops[j].inputs.end(), i) != ops[j].inputs.end()) out.push_back(j);
  return out;
}

double graph::output_bytes(std::size_t i) const {
  const op& o = ops[i];
  return static_cast<double>(o.batch * o.out_channels * o.spatial * element_bytes);
}

namespace make {
namespace {
// The fields every builder sets: what the op is and the shape of its output.
op shaped(std::string name, op_kind kind, std::size_t batch, std::size_t in, std::size_t out, std::size_t spatial) {
  op o;
  o.name = std::move(name);
  o.kind = kind;
  o.batch = batch;
  o.in_channels = in;
  o.out_channels = out;
  o.spatial = spatial;
  return o;
}
}  // namespace

op linear(std::string name, std::size_t batch, std::size_t in, std::size_t out, std::size_t positions) {
  op o = shaped(std::move(name), op_kind::linear, batch, in, out, positions);
  o.forward_flops = 2.0 * double(batch) * double(positions) * double(in) * double(out);
  o.param_bytes = f32 * double(in) * double(out);
  return o;
}
op conv2d(std::string name, std::size_t batch, std::size_t cin, std::size_t cout, std::size_t hw, std::size_t k) {
  op o = shaped(std::move(name), op_kind::conv2d, batch, cin, cout, hw);
  o.forward_flops = 2.0 * double(batch) * double(hw) * double(cin) * double(cout) * double(k * k);
  o.param_bytes = f32 * double(cin) * double(cout) * double(k * k);
  o.kernel = k;
  return o;
}
op embedding(std::string name, std::size_t batch, std::size_t vocab, std::size_t dim, std::size_t lookups) {
  op o = shaped(std::move(name), op_kind::embedding, batch, vocab, dim, 1);
  o.forward_flops = double(batch) * double(lookups) * double(dim);
  o.param_bytes = f32 * double(vocab) * double(dim);
  return o;
}
op attention(std::string name, std::size_t batch, std::size_t hidden, std::size_t seq) {
  op o = shaped(std::move(name), op_kind::attention, batch, hidden, hidden, seq);
  const double n = double(batch), d = double(hidden), s = double(seq);
  o.forward_flops = 2.0 * n * s * 4.0 * d * d + 4.0 * n * s * s * d;
  o.param_bytes = f32 * 4.0 * d * d;
  return o;
}
op elementwise(std::string name, std::size_t batch, std::size_t channels, std::size_t spatial,
               double flops_per_element) {
  op o = shaped(std::move(name), op_kind::elementwise, batch, channels, channels, spatial);
  o.forward_flops = flops_per_element * double(batch) * double(channels) * double(spatial);
  return o;
}
op relu(std::string name, std::size_t batch, std::size_t channels, std::size_t spatial) {
  op o = elementwise(std::move(name), batch, channels, spatial, 1);
  o.function = elementwise_fn::relu;
  return o;
}
op max_pool(std::string name, std::size_t batch, std::size_t channels, std::size_t out_side, std::size_t window) {
  op o = elementwise(std::move(name), batch, channels, out_side * out_side, double(window * window));
  o.function = elementwise_fn::max_pool;
  o.kernel = window;
  return o;
}
}  // namespace make

namespace reference {
namespace {
op with_inputs(op o, std::vector<std::size_t> inputs) {
  o.inputs = std::move(inputs);
  return o;
}
}  // namespace

graph mlp(std::size_t batch, const std::vector<std::size_t>& widths) {
  if (widths.size() < 2)
    throw error_on<usage_error>(no_rank, "search::reference::mlp", "needs at least two widths (input and output)");
  graph g;
  g.name = "mlp";
  std::vector<std::size_t> prev;
  for (std::size_t l = 0; l + 1 < widths.size(); ++l) {
    const std::size_t fc =
        g.add(with_inputs(make::linear(numbered("fc", l + 1), batch, widths[l], widths[l + 1]), prev));
    prev = {fc};
    if (l + 2 < widths.size())
      prev = {g.add(with_inputs(make::relu(numbered("relu", l + 1), batch, widths[l + 1]), prev))};
  }
  return g;
}

graph cnn(std::size_t batch) {
  graph g;
  g.name = "cnn";
  struct conv_layer {
    const char* name;
    std::size_t cin, cout, hw, k;
    const char* pool;
    std::size_t pooled_side;  // 3 x 3 max pooling, stride 2
  };
  const conv_layer layers[] = {{"conv1", 3, 64, 55 * 55, 11, "pool1", 27},
                               {"conv2", 64, 192, 27 * 27, 5, "pool2", 13},
                               {"conv3", 192, 384, 13 * 13, 3, nullptr, 0},
                               {"conv4", 384, 256, 13 * 13, 3, nullptr, 0},
                               {"conv5", 256, 256, 13 * 13, 3, "pool5", 6}};
  std::vector<std::size_t> prev;
  for (const conv_layer& c : layers) {
    prev = {g.add(with_inputs(make::conv2d(c.name, batch, c.cin, c.cout, c.hw, c.k), prev))};
    if (c.pool) prev = {g.add(with_inputs(make::max_pool(c.pool, batch, c.cout, c.pooled_side, 3), prev))};
  }
  prev = {g.add(with_inputs(make::linear("fc6", batch, 256 * 36, 4096), prev))};
  prev = {g.add(with_inputs(make::relu("relu6", batch, 4096), prev))};
  prev = {g.add(with_inputs(make::linear("fc7", batch, 4096, 4096), prev))};
  prev = {g.add(with_inputs(make::relu("relu7", batch, 4096), prev))};
  prev = {g.add(with_inputs(make::linear("fc8", batch, 4096, 1000), prev))};
  g.add(with_inputs(make::elementwise("softmax", batch, 1000, 1, 5), prev));
  return g;
}

graph cnn_small(std::size_t batch, std::size_t side, std::size_t channels, std::size_t classes) {
  if (side == 0 || side % 4 != 0)
    throw usage_error(error_text(no_rank, "search::reference::cnn_small", "side ")
                          .append(std::to_string(side))
                          .append(" is not a positive multiple of 4 (two 2 x 2 poolings)"));
  graph g;
  g.name = "cnn_small";
  const std::size_t half = side / 2, quarter = side / 4;
  std::size_t x = g.add(make::conv2d("conv1", batch, 3, channels, side * side, 3));
  x = g.add(with_inputs(make::relu("relu1", batch, channels, side * side), {x}));
  x = g.add(with_inputs(make::max_pool("pool1", batch, channels, half, 2), {x}));
  x = g.add(with_inputs(make::conv2d("conv2", batch, channels, 2 * channels, half * half, 3), {x}));
  x = g.add(with_inputs(make::max_pool("pool2", batch, 2 * channels, quarter, 2), {x}));
  g.add(with_inputs(make::linear("fc3", batch, 2 * channels * quarter * quarter, classes), {x}));
  return g;
}

graph transformer(std::size_t layers, std::size_t batch, std::size_t seq, std::size_t hidden) {
  return transformer_stage(layers, true, true, batch, seq, hidden, 0);
}

graph transformer_stage(std::size_t blocks, bool first, bool last, std::size_t batch, std::size_t seq,
                        std::size_t hidden, std::size_t block0) {
  graph g;
  g.name = "transformer";
  std::size_t x = g.add(first ? make::elementwise("input_norm", batch, hidden, seq, 5)
                              : make::elementwise(numbered("stage_input_", block0), batch, hidden, seq, 1));
  for (std::size_t l = block0; l < block0 + blocks; ++l) {
    const std::string p = numbered("l", l).append(".");
    const std::size_t attn = g.add(with_inputs(make::attention(p + "attention", batch, hidden, seq), {x}));
    const std::size_t res1 = g.add(with_inputs(make::elementwise(p + "residual1", batch, hidden, seq, 5), {attn, x}));
    const std::size_t ffn1 = g.add(with_inputs(make::linear(p + "ffn1", batch, hidden, 4 * hidden, seq), {res1}));
    const std::size_t gelu = g.add(with_inputs(make::elementwise(p + "gelu", batch, 4 * hidden, seq, 8), {ffn1}));
    const std::size_t ffn2 = g.add(with_inputs(make::linear(p + "ffn2", batch, 4 * hidden, hidden, seq), {gelu}));
    x = g.add(with_inputs(make::elementwise(p + "residual2", batch, hidden, seq, 5), {ffn2, res1}));
  }
  if (last) {
    const std::size_t head = g.add(with_inputs(make::linear("head", batch, hidden, 1000, seq), {x}));
    g.add(with_inputs(make::elementwise("loss", batch, 1000, seq, 5), {head}));
  }
  return g;
}

graph dlrm(std::size_t batch, std::size_t tables, std::size_t vocab) {
  graph g;
  g.name = "dlrm";
  constexpr std::size_t dim = 64;
  std::vector<std::size_t> features;
  for (std::size_t t = 0; t < tables; ++t)
    features.push_back(g.add(make::embedding(numbered("table", t), batch, vocab, dim, 8)));
  std::size_t b = g.add(make::linear("bottom1", batch, 13, 512));
  b = g.add(with_inputs(make::relu("bottom_relu1", batch, 512), {b}));
  b = g.add(with_inputs(make::linear("bottom2", batch, 512, 256), {b}));
  b = g.add(with_inputs(make::relu("bottom_relu2", batch, 256), {b}));
  b = g.add(with_inputs(make::linear("bottom3", batch, 256, dim), {b}));
  features.push_back(b);
  const std::size_t pairs = (tables + 1) * tables / 2 + dim;
  op inter = make::elementwise("interaction", batch, pairs, 1, 2.0 * double(dim));
  inter.inputs = features;
  std::size_t t = g.add(std::move(inter));
  t = g.add(with_inputs(make::linear("top1", batch, pairs, 1024), {t}));
  t = g.add(with_inputs(make::relu("top_relu1", batch, 1024), {t}));
  t = g.add(with_inputs(make::linear("top2", batch, 1024, 1024), {t}));
  t = g.add(with_inputs(make::relu("top_relu2", batch, 1024), {t}));
  t = g.add(with_inputs(make::linear("top3", batch, 1024, 1), {t}));
  return g;
}
}  // namespace reference

std::string to_json(const graph& g) {
  nlohmann::json j;
  j["name"] = g.name;
  j["element_bytes"] = g.element_bytes;
  nlohmann::json ops = nlohmann::json::array();
  for (const op& o : g.ops) {
    ops.push_back({{"name", o.name},
                   {"kind", std::string(name_of(o.kind))},
                   {"inputs", o.inputs},
                   {"batch", o.batch},
                   {"in_channels", o.in_channels},
                   {"out_channels", o.out_channels},
                   {"spatial", o.spatial},
                   {"forward_flops", o.forward_flops},
                   {"param_bytes", o.param_bytes},
                   {"kernel", o.kernel},
                   {"function", std::string(name_of(o.function))}});
  }
  j["ops"] = std::move(ops);
  return j.dump(1);
}

graph graph_from_json(std::string_view text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw usage_error(error_text(no_rank, "search::graph_from_json", "not JSON: ").append(e.what()));
  }
  graph g;
  if (!j.is_object() || !j.contains("ops") || !j["ops"].is_array())
    throw error_on<usage_error>(no_rank, "search::graph_from_json", "expected an object with an \"ops\" array");
  g.name = j.value("name", std::string("graph"));
  g.element_bytes = j.value("element_bytes", std::size_t{4});
  std::size_t i = 0;
  for (const nlohmann::json& jo : j["ops"]) {
    op o;
    const std::string name = jo.is_object() ? jo.value("name", std::string()) : std::string();
    try {
      o.name = jo.at("name").get<std::string>();
      constexpr op_kind kinds[] = {op_kind::linear, op_kind::conv2d, op_kind::embedding, op_kind::attention,
                                   op_kind::elementwise};
      o.kind = parse_named(kinds, jo.at("kind").get<std::string>(), "kind", i, name);
      o.inputs = jo.value("inputs", std::vector<std::size_t>{});
      o.batch = jo.at("batch").get<std::size_t>();
      o.in_channels = jo.at("in_channels").get<std::size_t>();
      o.out_channels = jo.at("out_channels").get<std::size_t>();
      o.spatial = jo.value("spatial", std::size_t{1});
      o.forward_flops = jo.at("forward_flops").get<double>();
      o.param_bytes = jo.value("param_bytes", 0.0);
      o.kernel = jo.value("kernel", std::size_t{1});
      constexpr elementwise_fn functions[] = {elementwise_fn::other, elementwise_fn::relu, elementwise_fn::max_pool};
      o.function = parse_named(functions, jo.value("function", std::string("other")), "function", i, name);
    } catch (const nlohmann::json::exception& e) {
      throw usage_error(op_context("graph_from_json", i, name).append(e.what()));
    }
    g.add(std::move(o));
    ++i;
  }
  return g;
}

}  // namespace flexpar::search
