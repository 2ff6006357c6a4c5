// lib/zero/bucket_plan.cpp — parameters packed into buckets in registration order (bucket_plan.hpp).
#include "bucket_plan.hpp"

namespace flexpar::zero::detail {

std::vector<bucket_layout> plan_buckets(std::span<member> members, std::size_t bucket_bytes) {
  const std::size_t limit = bucket_bytes / sizeof(float);
  std::vector<bucket_layout> buckets;
  for (std::size_t i = 0; i < members.size(); ++i) {
    member& m = members[i];
    if (buckets.empty() || buckets.back().elements + m.count > limit) buckets.emplace_back();
    bucket_layout& b = buckets.back();
    m.bucket = buckets.size() - 1;
    m.offset = b.elements;
    b.members.push_back(i);
    b.elements += m.count;
  }
  return buckets;
}

}  // namespace flexpar::zero::detail
