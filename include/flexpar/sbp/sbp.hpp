// flexpar/sbp/sbp.hpp — SBP global tensors (OneFlow's idea, as C++ types): the umbrella header.
//
//   parallel.hpp       split<I>, broadcast, partial<Op>, sbp<...>; printing S(0), B, P(sum)
//   buffer_pool.hpp    buffer_pool: the bounded cache of shard buffers a placement holds
//   placement.hpp      placement<N>: a mesh of ranks with one sub-communicator per mesh axis;
//                      static_mesh<E...>: the same with its extents in the type
//   layout.hpp         balanced splits, shard boxes, strided box copies
//   global_tensor.hpp  global_tensor<T, Sbp>: logical shape + my shard; from_full, scatter, to_full
//   boxing.hpp         to<NewSbp>(t): one overload per transform, nd routes, boxing_cost
//   local_math.hpp     the shards' GEMM (BLAS)
//   signature.hpp      the ops' signature tables as values (shared with dynamic.hpp and the search)
//   ops.hpp            matmul, add, mul, relu, softmax, embedding, reduce_sum with deduced SBPs
//   ops_nn.hpp         a transformer's ops (causal attention, cross-entropy) and the backward passes
#pragma once

#include <flexpar/sbp/boxing.hpp>
#include <flexpar/sbp/buffer_pool.hpp>
#include <flexpar/sbp/global_tensor.hpp>
#include <flexpar/sbp/layout.hpp>
#include <flexpar/sbp/ops.hpp>
#include <flexpar/sbp/parallel.hpp>
#include <flexpar/sbp/placement.hpp>
#include <flexpar/sbp/signature.hpp>
