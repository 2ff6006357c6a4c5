// lib/search/config.cpp — SOAP configs: their SBP signatures, the candidate space, the reference strategies and JSON.
#include <flexpar/core/error.hpp>
#include <flexpar/search/config.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <optional>

namespace flexpar::search {

using sbp::nd_parallel;
using sbp::parallel;

namespace {
struct axis_rule {
  parallel input, weight, output;
};

axis_rule rule_of(op_kind k, soap_dim d) {
  switch (d) {
    case soap_dim::sample: return {parallel::S(0), parallel::B(), parallel::S(0)};
    case soap_dim::parameter:
      if (k == op_kind::elementwise) return {parallel::S(1), parallel::B(), parallel::S(1)};
      if (k == op_kind::attention) return {parallel::B(), parallel::S(1), parallel::P()};
      if (k == op_kind::conv2d) return {parallel::B(), parallel::S(0), parallel::S(1)};  // weight [K, C, R, S]
      return {parallel::B(), parallel::S(1), parallel::S(1)};
    case soap_dim::attribute:
      if (k == op_kind::linear) return {parallel::S(1), parallel::S(0), parallel::P()};
      if (k == op_kind::embedding) return {parallel::B(), parallel::S(0), parallel::P()};
      if (k == op_kind::conv2d) return {parallel::S(1), parallel::S(1), parallel::P()};  // input channels
      return {parallel::S(2), parallel::B(), parallel::S(2)};
  }
  return {};
}

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

std::string op_context(std::string_view what, std::size_t i, std::string_view name) {
  return error_text(no_rank, std::string("search::").append(what), "op ", i, " '", name, "': ");
}
}  // namespace

sbp_signature signature_of(const op& o, const soap_config& c) {
  sbp_signature s;
  const std::pair<soap_dim, int> axes[] = {
      {soap_dim::sample, c.sample}, {soap_dim::attribute, c.attribute}, {soap_dim::parameter, c.parameter}};
  for (const auto& [dim, degree] : axes) {
    if (degree <= 1) continue;
    const axis_rule r = rule_of(o.kind, dim);
    const std::size_t d = s.mesh.size();
    s.mesh.push_back(degree);
    s.dims.push_back(dim);
    s.input[d] = r.input;
    s.weight[d] = r.weight;
    s.output[d] = r.output;
  }
  if (s.mesh.empty()) {  // one device: everything whole
    s.mesh.push_back(1);
    s.dims.push_back(soap_dim::sample);
  }
  s.input.rank = s.weight.rank = s.output.rank = s.mesh.size();
  return s;
}

std::string describe(const op& o, const soap_config& c) {
  const sbp_signature s = signature_of(o, c);
  std::string out;
  if (o.param_bytes > 0) {
    out.append("(").append(sbp::to_string(s.input)).append(", ").append(sbp::to_string(s.weight)).append(")");
  } else {
    out.append(sbp::to_string(s.input));
  }
  return out.append(" -> ").append(sbp::to_string(s.output));
}

std::string to_string(const soap_config& c) {
  std::string s("s=");
  s.append(std::to_string(c.sample))
      .append(" a=")
      .append(std::to_string(c.attribute))
      .append(" p=")
      .append(std::to_string(c.parameter))
      .append(" @[")
      .append(std::to_string(c.first_device))
      .append("..")
      .append(std::to_string(c.first_device + c.devices()))
      .append(")");
  return s;
}

bool valid(const op& o, const soap_config& c, const cluster& cl) {
  if (c.sample < 1 || c.attribute < 1 || c.parameter < 1 || c.first_device < 0) return false;
  const int n = c.devices();
  if (cl.devices() % n != 0 || c.first_device % n != 0 || c.first_device + n > cl.devices()) return false;
  if (static_cast<std::size_t>(c.sample) > o.batch) return false;
  if (static_cast<std::size_t>(c.parameter) > o.out_channels) return false;
  switch (o.kind) {
    case op_kind::attention: return c.attribute == 1;
    case op_kind::linear:
    case op_kind::conv2d:
    case op_kind::embedding: return static_cast<std::size_t>(c.attribute) <= o.in_channels;
    case op_kind::elementwise: return static_cast<std::size_t>(c.attribute) <= o.spatial;
  }
  return false;
}

std::vector<soap_config> candidates(const op& o, const cluster& cl) {
  std::vector<soap_config> out;
  const int devices = cl.devices();
  for (int n : divisors(devices))
    for (int s : divisors(n))
      for (int a : divisors(n / s)) {
        const int p = n / s / a;
        for (int first = 0; first + n <= devices; first += n) {
          const soap_config c{s, a, p, first};
          if (valid(o, c, cl)) out.push_back(c);
        }
      }
  return out;
}

strategy data_parallel(const graph& g, const cluster& cl) {
  strategy s;
  for (const op& o : g.ops) {
    int degree = 1;
    for (int d : divisors(cl.devices()))
      if (static_cast<std::size_t>(d) <= o.batch) degree = d;
    s.push_back({degree, 1, 1, 0});
  }
  return s;
}

strategy expert(const graph& g, const cluster& cl) {
  strategy s = data_parallel(g, cl);
  const int per_node = cl.devices_per_node, nodes = cl.nodes;
  int next_table_device = 0;
  auto model_parallel = [&](const op& o, bool row_parallel) {
    soap_config c{std::min<int>(nodes, static_cast<int>(o.batch)), 1, 1, 0};
    if (row_parallel)
      c.attribute = per_node;
    else
      c.parameter = per_node;
    if (c.sample * per_node != cl.devices() || !valid(o, c, cl)) return std::optional<soap_config>{};
    return std::optional<soap_config>{c};
  };
  for (std::size_t i = 0; i < g.ops.size(); ++i) {
    const op& o = g.ops[i];
    std::optional<soap_config> c;
    switch (o.kind) {
      case op_kind::attention: c = model_parallel(o, false); break;
      case op_kind::embedding: {  // one table per device, round robin (DLRM's model-parallel tables)
        const soap_config one{1, 1, 1, next_table_device};
        if (valid(o, one, cl)) {
          c = one;
          next_table_device = (next_table_device + 1) % cl.devices();
        }
        break;
      }
      case op_kind::linear: {
        double in_bytes = 0;
        for (std::size_t in : o.inputs) in_bytes += g.output_bytes(in);
        // Model parallel when the weights outweigh the activations, or inside a model-parallel region
        // (the input is already split over a model axis: Megatron's FFN after its attention).
        const bool in_region = !o.inputs.empty() && s[o.inputs[0]].parameter > 1;
        if (o.param_bytes <= in_bytes + g.output_bytes(i) && !in_region) break;
        // Row parallel after a column-parallel pair (Megatron's second FFN GEMM), else column parallel.
        const std::size_t before = o.inputs.empty() ? 0 : o.inputs[0];
        const bool after_column =
            o.inputs.size() == 1 && s[before].parameter > 1 && g.ops[before].kind == op_kind::elementwise &&
            !o.inputs.empty() && !g.ops[before].inputs.empty() &&
            g.ops[g.ops[before].inputs[0]].kind == op_kind::linear && s[g.ops[before].inputs[0]].parameter > 1;
        c = model_parallel(o, after_column);
        break;
      }
      case op_kind::elementwise: {
        // After a model-parallel op keep its mesh, channels split over the model axis: a column-parallel
        // producer's S(1) needs no boxing, a row-parallel / attention P(sum) becomes S(1) by a reduce-scatter
        // and the next model-parallel op gathers it back (together Megatron's one allreduce).
        if (o.inputs.empty()) break;
        const soap_config& in = s[o.inputs[0]];
        const op_kind producer = g.ops[o.inputs[0]].kind;
        const int model = std::max(in.parameter, in.attribute);
        if ((producer == op_kind::linear || producer == op_kind::attention) && model > 1) {
          const soap_config same{in.sample, 1, model, in.first_device};
          if (valid(o, same, cl)) c = same;
        }
        break;
      }
      case op_kind::conv2d: break;
    }
    if (c) s[i] = *c;
  }
  return s;
}

std::string to_json(const graph& g, const strategy& s) {
  if (s.size() != g.ops.size())
    throw usage_error(error_text(no_rank, "search::to_json", "the strategy has ")
                          .append(std::to_string(s.size()))
                          .append(" configs, the graph '")
                          .append(g.name)
                          .append("' ")
                          .append(std::to_string(g.ops.size()))
                          .append(" ops"));
  nlohmann::json ops = nlohmann::json::array();
  for (std::size_t i = 0; i < s.size(); ++i)
    ops.push_back({{"name", g.ops[i].name},
                   {"sample", s[i].sample},
                   {"attribute", s[i].attribute},
                   {"parameter", s[i].parameter},
                   {"first_device", s[i].first_device},
                   {"sbp", describe(g.ops[i], s[i])}});
  return nlohmann::json{{"graph", g.name}, {"ops", std::move(ops)}}.dump(1);
}

strategy strategy_from_json(std::string_view text, const graph& g, const cluster& cl) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw usage_error(error_text(no_rank, "search::strategy_from_json", "not JSON: ").append(e.what()));
  }
  if (!j.is_object() || !j.contains("ops") || !j["ops"].is_array() || j["ops"].size() != g.ops.size())
    throw usage_error(
        error_text(no_rank, "search::strategy_from_json", "expected {\"ops\": [...]} with one entry per op of '")
            .append(g.name)
            .append("' (")
            .append(std::to_string(g.ops.size()))
            .append(" ops)"));
  strategy s;
  for (std::size_t i = 0; i < g.ops.size(); ++i) {
    const nlohmann::json& jo = j["ops"][i];
    soap_config c;
    std::string name;
    try {
      name = jo.at("name").get<std::string>();
      c.sample = jo.at("sample").get<int>();
      c.attribute = jo.at("attribute").get<int>();
      c.parameter = jo.at("parameter").get<int>();
      c.first_device = jo.at("first_device").get<int>();
    } catch (const nlohmann::json::exception& e) {
      throw usage_error(op_context("strategy_from_json", i, g.ops[i].name).append(e.what()));
    }
    if (name != g.ops[i].name)
      throw usage_error(op_context("strategy_from_json", i, g.ops[i].name)
                            .append("the strategy names this op '")
                            .append(name)
                            .append("'"));
    if (!valid(g.ops[i], c, cl))
      throw usage_error(op_context("strategy_from_json", i, g.ops[i].name)
                            .append("config ")
                            .append(to_string(c))
                            .append(" is not valid on a cluster of ")
                            .append(std::to_string(cl.devices()))
                            .append(" devices"));
    s.push_back(c);
  }
  return s;
}

}  // namespace flexpar::search
